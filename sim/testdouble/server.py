"""TEST DOUBLE of a tensor-parallel launcher (``python3 -m sglang.launch_server``), stdlib only.

Rank group: rank 0 listens on the port of ``--dist-init-addr`` (all interfaces); other ranks
connect there (retrying until ``--dist-timeout`` or 600 s) and send ``JOIN <rank> <nnodes>``.
When all ``--nnodes`` ranks joined, rank 0 answers ``FORMED`` to everyone. Both sides then
exchange ``PING`` heartbeats; if any rank disappears after formation every rank exits non-zero.

HTTP (``--host:--port``): rank 0 serves ``/health`` (503 until formed), ``/v1/models`` and
``/v1/chat/completions`` (non-streaming and SSE). With ``--api-key`` every path except those
starting with ``/health`` needs ``Authorization: Bearer <key>``. Workers serve a dummy ``/health``.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import flags

HEARTBEAT_S = 2.0
PEER_TIMEOUT_S = 10.0
FIXED_ANSWER = "This is the sglang-sim test double; it does not run a model."


_LOG_LOCK = threading.Lock()


def log(engine: str, rank: int, msg: str) -> None:
    with _LOG_LOCK:  # one whole line per event, never interleaved between threads
        sys.stdout.write(f"[{engine}-sim test-double rank {rank}] {msg}\n")
        sys.stdout.flush()


def die(engine: str, rank: int, msg: str, code: int = 1) -> None:
    log(engine, rank, msg)
    sys.stdout.flush()
    os._exit(code)


def answer_for(text: str) -> str:
    if "19" in text and "23" in text and "+" in text:
        return "42"
    return FIXED_ANSWER


def message_text(messages) -> str:
    parts = []
    for m in messages or []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(p.get("text", "") for p in c if isinstance(p, dict))
    return "\n".join(parts)


class Group:
    """Rank-group state shared by the coordinator threads and the HTTP handler."""

    def __init__(self, engine: str, rank: int, nnodes: int):
        self.engine, self.rank, self.nnodes = engine, rank, nnodes
        self.formed = threading.Event()
        self.lock = threading.Lock()
        self.peers: dict[int, socket.socket] = {}

    def log(self, msg: str) -> None:
        log(self.engine, self.rank, msg)

    # ---- rank 0 -------------------------------------------------------------------------
    def serve_coordinator(self, port: int) -> None:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", port))
        srv.listen(64)
        self.log(f"waiting for {self.nnodes - 1} worker rank(s) on 0.0.0.0:{port}")
        threading.Thread(target=self._heartbeat_all, daemon=True).start()
        while True:
            conn, addr = srv.accept()
            threading.Thread(target=self._handle_peer, args=(conn, addr), daemon=True).start()

    def _handle_peer(self, conn: socket.socket, addr) -> None:
        f = conn.makefile("rb")
        conn.settimeout(PEER_TIMEOUT_S)
        try:
            line = f.readline().decode(errors="replace").split()
        except OSError:
            conn.close()
            return
        if len(line) != 3 or line[0] != "JOIN":
            conn.close()
            return
        peer, peer_n = int(line[1]), int(line[2])
        if peer_n != self.nnodes or not 0 < peer < self.nnodes:
            self.log(f"rejected rank {peer} from {addr[0]} (nnodes {peer_n}, expected {self.nnodes})")
            conn.close()
            return
        with self.lock:
            if self.formed.is_set() or peer in self.peers:
                self.log(f"rejected duplicate/late rank {peer} from {addr[0]}")
                conn.close()
                return
            self.peers[peer] = conn
            n = len(self.peers) + 1
            self.log(f"joined rank {peer} from {addr[0]} ({n}/{self.nnodes})")
            if n == self.nnodes:
                for c in self.peers.values():
                    try:
                        c.sendall(b"FORMED\n")
                    except OSError:
                        pass
                self.formed.set()
                self.log(f"group formed ({self.nnodes}/{self.nnodes} ranks)")
        while True:
            try:
                data = f.readline()
            except OSError:
                data = b""
            if not data:
                break
        with self.lock:
            if self.formed.is_set():
                die(self.engine, self.rank, f"lost rank {peer} ({addr[0]}); tensor-parallel group broken, exiting")
            self.peers.pop(peer, None)
            self.log(f"rank {peer} left before the group formed")
        conn.close()

    def _heartbeat_all(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self.lock:
                items = list(self.peers.items())
            for _, c in items:
                try:
                    c.sendall(b"PING\n")
                except OSError:
                    pass  # the reader thread notices

    # ---- worker ---------------------------------------------------------------------------
    def join(self, host: str, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        self.log(f"connecting to rank 0 at {host}:{port}")
        while True:
            try:
                conn = socket.create_connection((host, port), timeout=5)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    die(self.engine, self.rank, f"rank 0 at {host}:{port} not reachable after {timeout_s:.0f}s: {e}")
                time.sleep(1)
        conn.sendall(f"JOIN {self.rank} {self.nnodes}\n".encode())
        conn.settimeout(PEER_TIMEOUT_S)
        f = conn.makefile("rb")
        self.log(f"joined group at {host}:{port}")

        def beat():
            while True:
                time.sleep(HEARTBEAT_S)
                try:
                    conn.sendall(b"PING\n")
                except OSError:
                    return

        threading.Thread(target=beat, daemon=True).start()

        def reader():
            while True:
                try:
                    data = f.readline()
                except socket.timeout:
                    if not self.formed.is_set() and time.monotonic() < deadline:
                        continue
                    data = b""
                except OSError:
                    data = b""
                if not data:
                    die(self.engine, self.rank, f"lost connection to rank 0 at {host}:{port}; exiting")
                if data.strip() == b"FORMED" and not self.formed.is_set():
                    self.formed.set()
                    self.log(f"group formed ({self.nnodes}/{self.nnodes} ranks)")

        threading.Thread(target=reader, daemon=True).start()


def make_handler(args, group: Group, engine: str):
    model_name = args.served_model_name or args.model_path or "default"
    api_key = args.api_key
    full_api = args.node_rank == 0

    class Handler(BaseHTTPRequestHandler):
        server_version = f"{engine}-sim-test-double"
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # one line per request only at debug level
            if (args.log_level or "").lower() == "debug":
                group.log("http " + (fmt % a))

        def _json(self, code: int, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self) -> bool:
            if self.path.startswith("/health") or not api_key:
                return True
            return self.headers.get("Authorization", "") == f"Bearer {api_key}"

        def _route(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            if not self._authorized():
                return self._json(401, {"error": "Unauthorized"})
            if path.startswith("/health"):
                if group.formed.is_set() or not full_api:
                    return self._json(200, {"status": "ok", "rank": args.node_rank})
                return self._json(503, {"status": "waiting for ranks", "rank": 0})
            if not full_api:
                return self._json(404, {"error": "worker rank serves /health only"})
            if not group.formed.is_set():
                return self._json(503, {"error": "rank group not formed yet"})
            if path == "/v1/models" and method == "GET":
                return self._json(200, {"object": "list", "data": [
                    {"id": model_name, "object": "model", "created": 0, "owned_by": "sglang-sim-test-double",
                     "root": args.model_path, "max_model_len": int(args.context_length or 0) or None}]})
            if path == "/v1/chat/completions" and method == "POST":
                return self._chat()
            return self._json(404, {"error": f"no route {method} {path}"})

        def _chat(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(n) or b"{}")
            except json.JSONDecodeError:
                return self._json(400, {"error": "invalid JSON"})
            text = message_text(req.get("messages"))
            answer = answer_for(text)
            usage = {"prompt_tokens": max(1, len(re.findall(r"\S+", text))),
                     "completion_tokens": len(answer.split()),
                     "total_tokens": 0}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            cid, created = "chatcmpl-sim-" + uuid.uuid4().hex[:16], int(time.time())
            model = req.get("model") or model_name
            if not req.get("stream"):
                return self._json(200, {
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
                chunk({"content": word if i == 0 else " " + word})
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


def main(argv: list[str] | None = None, engine: str = "sglang") -> int:
    args = flags.parse_args(sys.argv[1:] if argv is None else argv, engine)
    rank, nnodes = args.node_rank, args.nnodes
    group = Group(engine, rank, nnodes)
    signal.signal(signal.SIGTERM, lambda *_: die(engine, rank, "SIGTERM received, shutting down", 0))
    if nnodes < 1 or not 0 <= rank < nnodes:
        die(engine, rank, f"invalid --node-rank {rank} for --nnodes {nnodes}", 2)
    group.log(f"TEST DOUBLE starting: model {args.model_path} tp {args.tp or args.tp_size} "
              f"nnodes {nnodes} node-rank {rank}")
    if nnodes > 1:
        if not args.dist_init_addr or ":" not in args.dist_init_addr:
            die(engine, rank, "--dist-init-addr host:port is required when --nnodes > 1", 2)
        host, port_s = args.dist_init_addr.rsplit(":", 1)
        if rank == 0:
            threading.Thread(target=group.serve_coordinator, args=(int(port_s),), daemon=True).start()
        else:
            group.join(host, int(port_s), float(args.dist_timeout or 600))
    else:
        group.formed.set()
        group.log("group formed (1/1 ranks)")
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(args, group, engine))
    httpd.daemon_threads = True
    what = "API" if rank == 0 else "dummy /health"
    group.log(f"serving {what} on {args.host}:{args.port}")
    if rank == 0:
        def announce():
            group.formed.wait()
            group.log(f"ready: serving API for model {args.served_model_name or args.model_path}")
        threading.Thread(target=announce, daemon=True).start()
    httpd.serve_forever()
    return 0
