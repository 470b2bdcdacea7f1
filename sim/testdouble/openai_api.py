"""Shared HTTP / OpenAI-compatible API of the TEST DOUBLE engines (sglang-sim, vllm-sim), stdlib only.

``make_handler(Api(...))`` returns a ``BaseHTTPRequestHandler`` class serving ``/v1/models`` and
``/v1/chat/completions`` (non-streaming and SSE). Engine-specific behaviour is injected:

* ``guarded(path) -> bool``: whether the path needs ``Authorization: Bearer <api_key>``
  (SGLang: everything but ``/health*``; vLLM: only paths starting with ``/v1``);
* ``pre_route(handler, method, path) -> bool``: engine routes tried first (``/health``, readiness);
  return True when it answered;
* ``check_model``: reject a request naming an unknown model with vLLM's 404 error shape;
* ``metrics``: the engine's Prometheus families (``metric_families.EngineMetrics``, the real engines'
  names, types and labels): when set, ``GET /metrics`` serves them, fed by every valid request (running
  from the moment it starts generating until its response or stream is written, or the client went away,
  exact under concurrency; its tokens, time to first token, inter-token gaps and end-to-end latency).
  Unset: ``/metrics`` is 404, like SGLang without ``--enable-metrics``.

Every log line goes through :func:`emit` (one whole line per event, never interleaved).
"""
from __future__ import annotations

import json
import re
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Callable

from .metric_families import EngineMetrics

_LOG_LOCK = threading.Lock()


# Streamed tokens come at a steady pace, like a decoding engine (100 tokens/s per stream), so
# time-to-first-token and decode rates measured against the double are finite and ordered.
DECODE_SECONDS_PER_TOKEN = 0.01


def emit(tag: str, msg: str) -> None:
    with _LOG_LOCK:  # one whole line per event, never interleaved between threads
        sys.stdout.write(f"[{tag}] {msg}\n")
        sys.stdout.flush()


def fixed_answer(engine: str) -> str:
    return f"This is the {engine}-sim test double; it does not run a model."


def answer_for(text: str, engine: str = "sglang") -> str:
    if "19" in text and "23" in text and "+" in text:
        return "42"
    return fixed_answer(engine)


def message_text(messages) -> str:
    parts = []
    for m in messages or []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(p.get("text", "") for p in c if isinstance(p, dict))
    return "\n".join(parts)


PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Api:
    engine: str                                   # "sglang" | "vllm"
    model_names: list[str]                        # first one is the default model of a request
    root: str | None = None                       # checkpoint path reported by /v1/models
    max_model_len: int | None = None
    api_key: str | None = None
    guarded: Callable[[str], bool] = lambda path: True
    pre_route: Callable[[BaseHTTPRequestHandler, str, str], bool] | None = None
    check_model: bool = False
    log: Callable[[str], None] = print
    debug: bool = False
    owned_by: str = ""
    extra_model_fields: dict = field(default_factory=dict)
    metrics: EngineMetrics | None = None          # None: no /metrics route (404)


def make_handler(api: Api) -> type[BaseHTTPRequestHandler]:
    owned_by = api.owned_by or f"{api.engine}-sim-test-double"

    class Handler(BaseHTTPRequestHandler):
        server_version = f"{api.engine}-sim-test-double"
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # one line per request only at debug level
            if api.debug:
                api.log("http " + (fmt % a))

        def send_json(self, code: int, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def send_text(self, code: int, text: str, content_type: str) -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def send_empty(self, code: int) -> None:
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _authorized(self) -> bool:
            if not api.api_key or not api.guarded(self.path):
                return True
            return self.headers.get("Authorization", "") == f"Bearer {api.api_key}"

        def _read_body(self) -> bytes:
            """The whole request body (Content-Length or chunked), read before any answer: a keep-alive
            client (a router's connection pool) must not find an unread body parsed as its next request."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                data = b""
                while True:
                    size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline().strip():  # trailers, then the blank line
                            pass
                        return data
                    data += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _route(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            try:
                self.body = self._read_body()
            except ValueError:
                self.close_connection = True
                return self.send_json(400, {"error": "invalid body framing"})
            if not self._authorized():
                return self.send_json(401, {"error": "Unauthorized"})
            if api.pre_route and api.pre_route(self, method, path):
                return None
            if path == "/v1/models" and method == "GET":
                return self.send_json(200, {"object": "list", "data": [
                    dict({"id": name, "object": "model", "created": 0, "owned_by": owned_by,
                          "root": api.root, "max_model_len": api.max_model_len}, **api.extra_model_fields)
                    for name in api.model_names]})
            if path == "/v1/chat/completions" and method == "POST":
                return self._chat()
            if path == "/metrics" and method == "GET" and api.metrics:
                return self.send_text(200, api.metrics.text(), PROMETHEUS_CONTENT_TYPE)
            return self.send_json(404, {"error": f"no route {method} {path}"})

        def _chat(self) -> None:
            try:
                req = json.loads(self.body or b"{}")
            except json.JSONDecodeError:
                return self.send_json(400, {"error": "invalid JSON"})
            model = req.get("model") or api.model_names[0]
            if api.check_model and model not in api.model_names:
                return self.send_json(404, {"error": {"message": f"The model `{model}` does not exist.",
                                                      "type": "NotFoundError", "param": None, "code": 404}})
            text = message_text(req.get("messages"))
            answer = answer_for(text, api.engine)
            if req.get("ignore_eos") or req.get("min_tokens"):  # as the engines do: generate max_tokens tokens
                want = int(req.get("max_tokens") or req.get("min_tokens") or 0)
                words = answer.split(" ")
                answer = " ".join(words + ["tok"] * max(0, want - len(words)))
            usage = {"prompt_tokens": max(1, len(re.findall(r"\S+", text))),
                     "completion_tokens": len(answer.split()),
                     "total_tokens": 0}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            cid, created = "chatcmpl-sim-" + uuid.uuid4().hex[:16], int(time.time())
            m = api.metrics
            # generating: counted until the answer is written or the client is gone
            r = m.started(usage["prompt_tokens"], bool(req.get("stream"))) if m else None
            done = False
            try:
                self._answer(req, model, answer, usage, cid, created, r)
                done = True
            except ConnectionError:  # broken pipe / reset: the client disconnected
                self.close_connection = True
                if api.debug:
                    api.log(f"client went away during {cid}")
            finally:
                if m:
                    (m.finished if done else m.aborted)(r)

        def _answer(self, req: dict, model: str, answer: str, usage: dict, cid: str, created: int, r) -> None:
            m = api.metrics
            if not req.get("stream"):
                if m:
                    m.answer(r, usage["completion_tokens"])
                return self.send_json(200, {
                    "id": cid, "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                 "finish_reason": "stop", "logprobs": None}],
                    "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def chunk(delta, finish=None, use=None):
                obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
                if use is not None:
                    obj["choices"], obj["usage"] = [], use
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            chunk({"role": "assistant", "content": ""})
            for i, word in enumerate(answer.split(" ")):
                if i:
                    time.sleep(DECODE_SECONDS_PER_TOKEN)
                chunk({"content": word if i == 0 else " " + word})
                if m:
                    m.token(r)
            chunk({}, finish="stop")
            if (req.get("stream_options") or {}).get("include_usage"):
                chunk({}, use=usage)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

    return Handler
