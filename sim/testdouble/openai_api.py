"""Shared HTTP / OpenAI-compatible API of the TEST DOUBLE engines (sglang-sim, vllm-sim), stdlib only.

``make_handler(Api(...))`` returns a ``BaseHTTPRequestHandler`` class. Every request goes, in the real engines'
order, through: the body read whole; ``authorize(method, path, Authorization header)`` (the engine's API-key
middleware: None lets it through, 401/403 answer ``{"error": "Unauthorized"|"Forbidden"}`` before any routing, so
a guarded path that no route serves is 401 too); ``gate`` (engine state before routing, e.g. SGLang's 503 until the
rank group formed); then the route table ``routes`` (path -> method -> handler function; a path with another method
is 405 ``{"detail": "Method Not Allowed"}``, an unknown path 404 ``{"detail": "Not Found"}``, as FastAPI answers)
and ``prefix_routes`` (any method on any path starting with the prefix: the engines' ``/metrics`` mount). The path is
percent-decoded first, as ASGI servers hand it to the app, for both the key check and the routing.

Engine-independent handlers live on the handler class and engines reference them in their tables:
``models`` (``/v1/models``), ``chat`` (``/v1/chat/completions``, non-streaming and SSE), ``completion``
(``/v1/completions``), ``metrics_text`` and the JSON/empty/text writers. ``openai_routes()`` is the table of the
three OpenAI routes both doubles serve.

* ``check_model``: reject a request naming an unknown model with vLLM's 404 error shape;
* ``hold``: called before a generation starts (vLLM's ``/pause`` and ``/sleep`` hold new requests until resumed);
* ``metrics``: the engine's Prometheus families (``metric_families.EngineMetrics``, the real engines'
  names, types and labels), fed by every valid generation (running from the moment it starts generating until
  its response or stream is written, or the client went away, exact under concurrency; its tokens, time to first
  token, inter-token gaps and end-to-end latency).

Every log line goes through :func:`emit` (one whole line per event, never interleaved).
"""
from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator

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

# The doubles' tokenizer: one token per UTF-8 byte (ids 0-255), so /tokenize and /detokenize round-trip.
VOCAB_SIZE = 256


def tokenize(text: str) -> list[int]:
    return list(text.encode())


def detokenize(ids: list[int]) -> str:
    return bytes(ids).decode(errors="replace")


def prompt_text(prompt) -> str:
    """The text of a completion request's ``prompt`` (a string, or a list of strings)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return ""


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> dict:
    """vLLM's ErrorResponse (also the shape the doubles use for their own request errors)."""
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


Route = Callable[[BaseHTTPRequestHandler], None]


class Answered(Exception):
    """Raised by a route helper that already answered the request (e.g. 400 for a body that is not JSON)."""


@dataclass
class Api:
    engine: str                                   # "sglang" | "vllm"
    model_names: list[str]                        # first one is the default model of a request
    root: str | None = None                       # checkpoint path reported by /v1/models
    max_model_len: int | None = None
    # the engine's API-key middleware: (method, decoded path, Authorization header) -> None, or 401/403
    authorize: Callable[[str, str, str | None], int | None] = lambda method, path, header: None
    routes: dict[str, dict[str, Route]] = field(default_factory=dict)   # path -> method -> handler
    prefix_routes: list[tuple[str, Route]] = field(default_factory=list)  # any method, path starting with it
    gate: Callable[[BaseHTTPRequestHandler, str, str], bool] | None = None  # True when it answered
    hold: Callable[[], None] | None = None        # before a generation starts (vLLM: paused / sleeping)
    check_model: bool = False
    log: Callable[[str], None] = print
    debug: bool = False
    owned_by: str = ""
    extra_model_fields: dict = field(default_factory=dict)
    metrics: EngineMetrics | None = None          # None: no /metrics (the engine leaves it out of its table)


def openai_routes() -> dict[str, dict[str, Route]]:
    """The OpenAI routes both doubles serve (both engines guard them when a key is set)."""
    return {"/v1/models": {"GET": lambda h: h.models()},
            "/v1/chat/completions": {"POST": lambda h: h.chat()},
            "/v1/completions": {"POST": lambda h: h.completion()}}


def docs_routes(title: str = "FastAPI") -> dict[str, dict[str, Route]]:
    """FastAPI's documentation routes (open on both engines): a minimal OpenAPI document of the double's table."""
    def openapi(h):
        h.send_json(200, {"openapi": "3.1.0", "info": {"title": title, "version": "0.1.0"},
                          "paths": {p: {m.lower(): {} for m in ms if m != "HEAD"} for p, ms in h.api_routes().items()}})

    def page(kind):
        return lambda h: h.send_text(200, f"<!DOCTYPE html><html><head><title>{title} - {kind}</title></head>"
                                          f"<body>{kind} of /openapi.json (TEST DOUBLE)</body></html>",
                                     "text/html; charset=utf-8")

    both = ("GET", "HEAD")
    return {"/openapi.json": dict.fromkeys(both, openapi), "/docs": dict.fromkeys(both, page("Swagger UI")),
            "/docs/oauth2-redirect": dict.fromkeys(both, page("OAuth2 redirect")),
            "/redoc": dict.fromkeys(both, page("ReDoc"))}


def make_handler(api: Api) -> type[BaseHTTPRequestHandler]:
    owned_by = api.owned_by or f"{api.engine}-sim-test-double"

    class Handler(BaseHTTPRequestHandler):
        server_version = f"{api.engine}-sim-test-double"
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # one line per request only at debug level
            if api.debug:
                api.log("http " + (fmt % a))

        # ---- writers (a HEAD request gets the headers only) ----------------------------------------------
        def _body(self, body: bytes) -> None:
            if self.command != "HEAD":
                self.wfile.write(body)

        def start_stream(self) -> None:
            """The head of a server-sent event stream, as the engines send it: 200, no cache, closed at its end."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def send_json(self, code: int, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self._body(body)

        def send_text(self, code: int, text: str, content_type: str) -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self._body(body)

        def send_empty(self, code: int) -> None:
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        # ---- request ----------------------------------------------------------------------------------
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

        def json_body(self) -> dict:
            """The request body as a JSON object (an empty body is {}); when it is not one, 400 is answered and
            Answered raised (the route is done)."""
            try:
                obj = json.loads(self.body or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError):
                obj = None
            if not isinstance(obj, dict):
                self.send_json(400, error_body("the request body must be a JSON object"))
                raise Answered
            return obj

        def api_routes(self) -> dict[str, list[str]]:
            return {p: sorted(ms) for p, ms in api.routes.items()}

        def _route(self, method: str) -> None:
            raw, _, query = self.path.partition("?")
            path = self.route_path = urllib.parse.unquote(raw)  # what an ASGI server hands the app (scope["path"])
            self.query = urllib.parse.parse_qs(query)
            try:
                self.body = self._read_body()
            except ValueError:
                self.close_connection = True
                return self.send_json(400, {"error": "invalid body framing"})
            denied = api.authorize(method, path, self.headers.get("Authorization"))
            if denied:
                return self.send_json(denied, {"error": "Unauthorized" if denied == 401 else "Forbidden"})
            if api.gate and api.gate(self, method, path):
                return None
            by_method = api.routes.get(path)
            fn = by_method.get(method) if by_method else None
            fn = fn or next((f for prefix, f in api.prefix_routes if path.startswith(prefix)), None)
            if fn:
                try:
                    return fn(self)
                except Answered:
                    return None
            if by_method:
                return self.send_json(405, {"detail": "Method Not Allowed"})
            return self.send_json(404, {"detail": "Not Found"})

        # ---- engine-independent routes -----------------------------------------------------------------
        def models(self) -> None:
            self.send_json(200, {"object": "list", "data": [
                dict({"id": name, "object": "model", "created": 0, "owned_by": owned_by,
                      "root": api.root, "max_model_len": api.max_model_len}, **api.extra_model_fields)
                for name in api.model_names]})

        def metrics_text(self) -> None:
            self.send_text(200, api.metrics.text() if api.metrics else "", PROMETHEUS_CONTENT_TYPE)

        def chat(self, req: dict | None = None) -> None:
            self._generate("chat", req)

        def completion(self, req: dict | None = None) -> None:
            self._generate("completion", req)

        def generate(self, req: dict | None = None) -> None:
            """SGLang's native /generate (``text`` or ``input_ids``, ``sampling_params``)."""
            self._generate("generate", req)

        def _generate(self, kind: str, req: dict | None) -> None:
            req = self.json_body() if req is None else req
            model = req.get("model") or api.model_names[0]
            if api.check_model and model not in api.model_names:
                return self.send_json(404, error_body(f"The model `{model}` does not exist.", "NotFoundError", 404))
            if kind == "generate":
                ids = req.get("input_ids")
                text = prompt_text(req.get("text")) or (detokenize(ids) if isinstance(ids, list) and all(
                    isinstance(i, int) and 0 <= i < VOCAB_SIZE for i in ids) else "")
                sp = req.get("sampling_params") if isinstance(req.get("sampling_params"), dict) else {}
                opts = {"ignore_eos": sp.get("ignore_eos"), "max_tokens": sp.get("max_new_tokens"),
                        "min_tokens": sp.get("min_new_tokens")}
            else:
                text = message_text(req.get("messages")) if kind == "chat" else prompt_text(req.get("prompt"))
                opts = req
            answer = answer_for(text, api.engine)
            if opts.get("ignore_eos") or opts.get("min_tokens"):  # as the engines do: generate max_tokens tokens
                want = int(opts.get("max_tokens") or opts.get("min_tokens") or 0)
                words = answer.split(" ")
                answer = " ".join(words + ["tok"] * max(0, want - len(words)))
            if api.hold:
                api.hold()
            usage = {"prompt_tokens": max(1, len(re.findall(r"\S+", text))),
                     "completion_tokens": len(answer.split()),
                     "total_tokens": 0}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            prefix = {"chat": "chatcmpl-sim-", "completion": "cmpl-sim-"}.get(kind, "")  # /generate: a bare rid
            cid, created = prefix + uuid.uuid4().hex[:16 if prefix else 32], int(time.time())
            m = api.metrics
            # generating: counted until the answer is written or the client is gone
            r = m.started(usage["prompt_tokens"], bool(req.get("stream"))) if m else None
            done = False
            try:
                self._answer(kind, req, model, answer, usage, cid, created, r)
                done = True
            except ConnectionError:  # broken pipe / reset: the client disconnected
                self.close_connection = True
                if api.debug:
                    api.log(f"client went away during {cid}")
            finally:
                if m:
                    (m.finished if done else m.aborted)(r)

        def _answer(self, kind: str, req: dict, model: str, answer: str, usage: dict, cid: str, created: int,
                    r) -> None:
            m = api.metrics
            chat = kind == "chat"
            if kind == "generate":
                return self._answer_native(req, answer, usage, cid, r)
            if not req.get("stream"):
                if m:
                    m.answer(r, usage["completion_tokens"])
                choice = ({"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop",
                           "logprobs": None} if chat else
                          {"index": 0, "text": answer, "finish_reason": "stop", "logprobs": None})
                return self.send_json(200, {
                    "id": cid, "object": "chat.completion" if chat else "text_completion", "created": created,
                    "model": model, "choices": [choice], "usage": usage})
            self.start_stream()

            def chunk(delta, finish=None, use=None):
                part = {"delta": delta} if chat else {"text": delta.get("content", "")}
                obj = {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion",
                       "created": created, "model": model,
                       "choices": [dict({"index": 0}, **part, finish_reason=finish, logprobs=None)]}
                if use is not None:
                    obj["choices"], obj["usage"] = [], use
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

            if chat:
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

        def _answer_native(self, req: dict, answer: str, usage: dict, rid: str, r) -> None:
            """SGLang's /generate answer: {"text", "output_ids", "meta_info"}; streamed, the text so far per chunk."""
            m, started = api.metrics, time.monotonic()

            def obj(text: str, n: int, done: bool) -> dict:
                return {"text": text, "output_ids": tokenize(text), "meta_info": {
                    "id": rid, "finish_reason": {"type": "stop", "matched": None} if done else None,
                    "prompt_tokens": usage["prompt_tokens"], "weight_version": "default", "completion_tokens": n,
                    "cached_tokens": 0, "e2e_latency": round(time.monotonic() - started, 6)}}

            if not req.get("stream"):
                if m:
                    m.answer(r, usage["completion_tokens"])
                return self.send_json(200, obj(answer, usage["completion_tokens"], True))
            self.start_stream()
            words = answer.split(" ")
            for i in range(len(words)):
                if i:
                    time.sleep(DECODE_SECONDS_PER_TOKEN)
                out = obj(" ".join(words[:i + 1]), i + 1, i == len(words) - 1)
                self.wfile.write(b"data: " + json.dumps(out).encode() + b"\n\n")
                self.wfile.flush()
                if m:
                    m.token(r)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def do_PUT(self):
            self._route("PUT")

        def do_DELETE(self):
            self._route("DELETE")

        def do_PATCH(self):
            self._route("PATCH")

        def do_HEAD(self):
            self._route("HEAD")

        def do_OPTIONS(self):
            self._route("OPTIONS")

    return Handler


def serve_local(handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1") -> tuple[ThreadingHTTPServer, str]:
    """A double's HTTP API in this process, on a free port of ``host`` (tests): the server (``shutdown()`` and
    ``server_close()`` it) and its base URL."""
    httpd = ThreadingHTTPServer((host, 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://{host}:{httpd.server_address[1]}"


@contextlib.contextmanager
def local_servers(host: str = "127.0.0.1") -> Iterator[Callable[[type[BaseHTTPRequestHandler]], str]]:
    """start(handler) -> base URL of a double's HTTP API served in this process (serve_local); every server
    started is stopped on leaving (tests' fixtures)."""
    started: list[ThreadingHTTPServer] = []

    def start(handler: type[BaseHTTPRequestHandler]) -> str:
        httpd, base = serve_local(handler, host)
        started.append(httpd)
        return base

    try:
        yield start
    finally:
        for httpd in started:
            httpd.shutdown()
            httpd.server_close()
