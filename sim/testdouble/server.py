"""TEST DOUBLE of a tensor-parallel launcher (``python3 -m sglang.launch_server``), stdlib only.

Rank group: rank 0 listens on the port of ``--dist-init-addr`` (all interfaces); other ranks
connect there (retrying until ``--dist-timeout`` or 600 s) and send ``JOIN <rank> <nnodes>``.
When all ``--nnodes`` ranks joined, rank 0 answers ``FORMED`` to everyone. Both sides then
exchange ``PING`` heartbeats; if any rank disappears after formation every rank exits non-zero.

HTTP (``--host:--port``): rank 0 serves the routes of SGLang's app the project relies on (``make_handler``):
``/health`` and ``/health_generate`` (503 until formed and NCCL is up, then a one-token generation), ``/ready``,
``/ping``, ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions`` (non-streaming and SSE), ``/generate``,
SageMaker's ``/invocations``, ``/get_model_info``, ``/get_server_info`` (and their new names), ``/flush_cache``,
``/update_weights_from_disk``, and with ``--enable-metrics`` ``/metrics`` (Prometheus text: the real SGLang
families of ``metric_families.SGLANG``: requests running (streams included) and queued (0), tokens, time to
first token, latencies, the KV pool obtained and its usage; without the flag 404, as SGLang). Auth as SGLang's
API-key middleware (``decide_request_auth``): paths starting with ``/health``, ``/ready`` or ``/metrics`` and
OPTIONS pass; with ``--api-key`` everything else needs ``Authorization: Bearer <key>``; the admin routes
(``/flush_cache``, ``/update_weights_from_disk``) take ``--admin-api-key`` instead when it is set. Worker ranks
serve SGLang's dummy health server: ``/ping``, ``/health``, ``/health_generate`` (and ``/metrics``), no key.

Once the group formed, every rank of a multi-rank group does what a real rank does next: torch's Gloo CPU
group (``GLOO_SOCKET_IFNAME``) and its NCCL communicator (``nccl.comm_init``: ``NCCL_SOCKET_IFNAME``,
``NCCL_NET``, ``NCCL_IB_HCA``, ``NCCL_IB_GID_INDEX``... against the node's interfaces and
/sys/class/infiniband); a failure is printed as the engine would and the rank exits 1 (the others then
lose it and exit too). Rank 0 reports the engine's boot phases only after that.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from . import flags, metric_families, nccl, openai_api
from .openai_api import answer_for, message_text  # noqa: F401  (re-exported: shared with vllm-sim)

HEARTBEAT_S = 2.0
STARTED = time.time()
PEER_TIMEOUT_S = 10.0
FIXED_ANSWER = openai_api.fixed_answer("sglang")


def log(engine: str, rank: int, msg: str) -> None:
    openai_api.emit(f"{engine}-sim test-double rank {rank}", msg)


def die(engine: str, rank: int, msg: str, code: int = 1) -> None:
    log(engine, rank, msg)
    sys.stdout.flush()
    os._exit(code)


class Group:
    """Rank-group state shared by the coordinator threads and the HTTP handler."""

    def __init__(self, engine: str, rank: int, nnodes: int):
        self.engine, self.rank, self.nnodes = engine, rank, nnodes
        self.formed = threading.Event()
        self.ready = threading.Event()  # formed, and this rank's Gloo/NCCL init done
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


def kv_share() -> float:
    """The double's memory model: it obtains this share of the KV pool it was pinned to (1.0; lower it
    with DSPARK_SIM_KV_SHARE to model memory held on the node, e.g. page cache or another process)."""
    return float(os.environ.get("DSPARK_SIM_KV_SHARE", "1") or 1)


def kv_pool(args) -> int:
    """The KV pool (tokens) the double obtains: its pin (--max-total-tokens) times kv_share()."""
    return int(int(args.max_total_tokens or 0) * kv_share())


def context_len(args) -> int:
    return int(args.context_length or 131072)


def boot_report(args) -> list[str]:
    """What real SGLang logs once its pools exist (scheduler.py on tp rank 0; dspark_worker_v2.py when
    DSPARK is on), with the double's figures."""
    # resolved values, as the real scheduler prints them (the doubles' defaults where a flag is absent)
    lines = [f"max_total_num_tokens={kv_pool(args)}, chunked_prefill_size={int(args.chunked_prefill_size or 8192)}, "
             f"max_prefill_tokens=16384, max_running_requests={int(args.max_running_requests or 48)}, "
             f"context_len={context_len(args)}, available_gpu_mem=3.20 GB"]
    if str(args.speculative_algorithm or "").upper() == "DSPARK":
        lines.insert(0, f"Initialized DSpark draft runner. attention_backend=dsv4, model={args.model_path}, "
                        f"gamma={args.speculative_dspark_block_size}, verify_num_draft_tokens="
                        f"{int(args.speculative_dspark_block_size or 0) + 1}")
    return lines


CACHE_FILE = "flashinfer/dspark-sim-autotune.json"


def compile_cache(group: Group, home: str | None = None) -> None:
    """The real engines JIT-compile and autotune kernels at boot into ~/.cache (FlashInfer, Triton, torch
    inductor, DeepGEMM) and reuse what they find there. The double keeps one file standing for it."""
    path = Path(home or os.environ.get("HOME") or "/root") / ".cache" / CACHE_FILE
    if path.is_file():
        group.log(f"compile cache: reusing {path} (tuned at {json.loads(path.read_text())['tuned_at']}), "
                  "JIT and autotune skipped")
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"tuned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                    "rank": group.rank}))  # fmt: skip
        group.log(f"compile cache: empty, kernels compiled and autotuned, saved to {path}")
    except OSError as exc:
        group.log(f"compile cache: cannot save to {path}: {exc}")


def leak_on_sigusr1(group: Group) -> None:
    """TEST DOUBLE fault: SIGUSR1 makes this rank allocate (and touch) memory until something stops it, a
    runaway rank standing in for a KV or activation blow-up; its container's limit is what should."""
    def grow():
        hog = []
        while True:
            block = bytearray(16 << 20)
            block[::4096] = b"\x01" * len(range(0, len(block), 4096))
            hog.append(block)
            time.sleep(0.005)

    def handler(*_):
        group.log("SIGUSR1: allocating memory without bound (test-double fault)")
        threading.Thread(target=grow, daemon=True).start()

    signal.signal(signal.SIGUSR1, handler)


def crash_at_boot(group: Group) -> None:
    """TEST DOUBLE fault (`python -m sim crash-at-boot NODE`, through the node's runtime shim): the rank dies while it
    loads its weights, at every start, as a rank does on a node with a bad driver or a corrupt shard."""
    message = os.environ.get("DSPARK_SIM_CRASH_AT_BOOT", "")
    if message:
        group.log("Load weight begin.")
        time.sleep(0.5)
        die(group.engine, group.rank, f"Traceback (most recent call last): {message}")


def fabric_init(args, group: Group, engine: str) -> None:
    """torch.distributed's Gloo group + NCCL communicator of this rank (one GPU per node)."""
    nranks = max(int(args.tp_size or 1), group.nnodes)
    if nranks <= 1:
        return
    rc = nccl.rank_init(group.rank, nranks, group.nnodes, log=lambda m: openai_api.emit(
        f"{engine}-sim test-double rank {group.rank}", m))
    if rc:
        die(engine, group.rank, "NCCL/Gloo init failed (see above); tensor-parallel group broken, exiting")
    group.log(f"NCCL communicator ready (rank {group.rank}/{nranks})")


# ------------------------------------------------------------------------------------------ HTTP ----
# sglang/srt/utils/auth.py (0.5.23): these prefixes pass without a key (probes and Prometheus scrapes)
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
NORMAL, ADMIN_OPTIONAL = "normal", "admin_optional"


def _bearer(header: str | None, key: str) -> bool:
    parts = (header or "").split(" ", 1)
    return len(parts) == 2 and parts[0].lower() == "bearer" and secrets.compare_digest(parts[1], key)


def decide_request_auth(method: str, path: str, header: str | None, api_key: str | None,
                        admin_api_key: str | None, level: str) -> int | None:
    """SGLang's decide_request_auth: None (allowed) or the status refused with (no route here is ADMIN_FORCE, so
    always 401). OPTIONS and OPEN_PREFIXES pass; an ADMIN_OPTIONAL route takes only the admin key when one is set,
    else the API key, else is open; any other route takes the API key when one is set (the admin key does not
    unlock it), else is open."""
    if method == "OPTIONS" or path.startswith(OPEN_PREFIXES):
        return None
    if level == ADMIN_OPTIONAL:
        key = admin_api_key or api_key
        return None if not key or _bearer(header, key) else 401
    return None if not api_key or _bearer(header, api_key) else 401


def model_config(path: str | None) -> dict:
    try:
        with open(os.path.join(path or "", "config.json")) as f:
            cfg = json.load(f)
        return cfg if isinstance(cfg, dict) else {}
    except (OSError, ValueError):
        return {}


def health_generation_on() -> bool:
    """SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION (default true): /health generates a token too, else answers 200."""
    return os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").strip().lower() not in (
        "0", "false", "no", "off", "n", "f")


def worker_routes(args) -> tuple[dict, list]:
    """A worker rank's HTTP port (node_rank >= 1): launch_dummy_health_check_server, no auth: GET /ping, /health,
    /health_generate answer 200, FastAPI's docs, and with --enable-metrics the /metrics mount; anything else 404."""
    ok = {"GET": lambda h: h.send_empty(200)}
    routes = {"/ping": ok, "/health": ok, "/health_generate": ok, **openai_api.docs_routes()}  # FastAPI's docs too
    return routes, ([("/metrics", lambda h: h.metrics_text())] if args.enable_metrics else [])


def make_handler(args, group: Group, engine: str):
    """Rank 0: the routes of SGLang's http_server app the project relies on, behind its API-key middleware
    (``--api-key``, ``--admin-api-key``; ``decide_request_auth``): ``/health`` and ``/health_generate`` (open: 503
    until the group is ready, then a one-token generation), ``/ready`` (open), ``/metrics`` (open, with
    ``--enable-metrics``); ``/ping``, ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/generate``,
    ``/invocations`` (SageMaker: a chat completion), ``/get_model_info``, ``/model_info``, ``/get_server_info``,
    ``/server_info``, FastAPI's docs (API key); ``/flush_cache`` and ``/update_weights_from_disk`` (admin key when
    set, else API key). Worker ranks: ``worker_routes``."""
    full_api = args.node_rank == 0
    model = args.served_model_name or args.model_path or "default"
    # SGLang serves /metrics only with --enable-metrics (its scheduler's and tokenizer's collectors)
    metrics = (metric_families.EngineMetrics("sglang", model, kv_pool(args), context_len(args))
               if args.enable_metrics else None)  # fmt: skip
    common = dict(engine=engine, model_names=[model], root=args.model_path,
                  max_model_len=int(args.context_length or 0) or None, log=group.log,
                  debug=(args.log_level or "").lower() == "debug", metrics=metrics)
    if not full_api:
        routes, prefixes = worker_routes(args)
        return openai_api.make_handler(openai_api.Api(routes=routes, prefix_routes=prefixes, **common))

    weights = {"model_path": args.model_path, "version": args.weight_version or "default"}

    def health(h):
        if not group.ready.is_set():
            return h.send_empty(503)
        if h.route_path == "/health" and not health_generation_on():
            return h.send_empty(200)
        answer_for("", engine)  # one token, max_new_tokens=1, not counted in the metrics (log_metrics=False)
        time.sleep(openai_api.DECODE_SECONDS_PER_TOKEN)
        h.send_empty(200)

    def model_info(h):
        cfg = model_config(weights["model_path"])
        h.send_json(200, {
            "model_path": weights["model_path"], "served_model_name": model,
            "tokenizer_path": args.tokenizer_path or args.model_path, "is_generation": True,
            "preferred_sampling_params": args.preferred_sampling_params, "weight_version": weights["version"],
            "load_format": args.load_format, "reasoning_parser": args.reasoning_parser,
            "tool_call_parser": args.tool_call_parser, "disaggregation_mode": args.disaggregation_mode,
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": cfg.get("model_type"), "architectures": cfg.get("architectures")})

    def server_info(h):
        # the resolved server args (the keys included, as the real one: only watermark secrets are redacted)
        fields = {k: v if isinstance(v, (str, int, float, bool, type(None), list, dict)) else str(v)
                  for k, v in sorted(vars(args).items())}
        command = " ".join(["python3", "-m", "sglang.launch_server"] + sys.argv[1:])
        h.send_json(200, {**fields, "launch_command": command,
                          "max_total_num_tokens": kv_pool(args), "kv_events": None,
                          "startup_time": STARTED, "internal_states": [{"last_gen_throughput": 0.0}],
                          "version": flags.version_of("sglang"), "frontend": "python"})

    def flush_cache(h):
        h.send_text(200, "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                         "waiting requests, the operation will not be performed.)\n", "text/plain; charset=utf-8")

    def update_weights_from_disk(h):
        req = h.json_body()
        path = req.get("model_path")
        if not isinstance(path, str):
            return h.send_json(400, {"object": "error", "message": "model_path: Field required", "type": "Bad Request",
                                     "param": None, "code": 400})
        if not os.path.isdir(path):
            return h.send_json(400, {"success": False, "num_paused_requests": 0, "message":
                                     f"Failed to get weights iterator: {path} (repository not found)."})
        weights.update(model_path=path, version=req.get("weight_version") or weights["version"])
        h.send_json(200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0})

    get = lambda fn: {"GET": fn}  # noqa: E731
    routes = {
        "/health": get(health), "/health_generate": get(health),
        "/ready": get(lambda h: h.send_empty(200 if group.ready.is_set() else 503)),
        "/ping": get(lambda h: h.send_empty(200 if group.ready.is_set() else 503)),
        "/get_model_info": get(model_info), "/model_info": get(model_info),
        "/get_server_info": get(server_info), "/server_info": get(server_info),
        "/flush_cache": {"GET": flush_cache, "POST": flush_cache},
        "/update_weights_from_disk": {"POST": update_weights_from_disk},
        "/invocations": {"POST": lambda h: h.chat()},
        "/generate": {"POST": lambda h: h.generate(), "PUT": lambda h: h.generate()},
        **openai_api.openai_routes(), **openai_api.docs_routes(),
    }
    admin = {("/flush_cache", "GET"), ("/flush_cache", "POST"), ("/update_weights_from_disk", "POST")}

    def authorize(method: str, path: str, header: str | None) -> int | None:
        level = ADMIN_OPTIONAL if (path, method) in admin else NORMAL
        return decide_request_auth(method, path, header, args.api_key, args.admin_api_key, level)

    def gate(h, method: str, path: str) -> bool:
        if group.ready.is_set() or path in ("/health", "/health_generate", "/ready", "/ping"):
            return False
        h.send_json(503, {"error": "rank group not formed yet"})
        return True

    return openai_api.make_handler(openai_api.Api(
        authorize=authorize, gate=gate, routes=routes,
        prefix_routes=[("/metrics", lambda h: h.metrics_text())] if metrics else [], **common))


def http_api(argv: list[str], ready: bool = True, engine: str = "sglang"):
    """The handler of the HTTP API of ``launch_server <argv>`` (its ``--node-rank``'s), with the rank group formed
    and ready (or not yet), without forming one (tests run it in-process with ``openai_api.serve_local``)."""
    args = flags.parse_args(argv, engine)
    group = Group(engine, args.node_rank, args.nnodes)
    if ready:
        group.formed.set()
        group.ready.set()
    return make_handler(args, group, engine)


def main(argv: list[str] | None = None, engine: str = "sglang") -> int:
    args = flags.parse_args(sys.argv[1:] if argv is None else argv, engine)
    rank, nnodes = args.node_rank, args.nnodes
    group = Group(engine, rank, nnodes)
    signal.signal(signal.SIGTERM, lambda *_: die(engine, rank, "SIGTERM received, shutting down", 0))
    if nnodes < 1 or not 0 <= rank < nnodes:
        die(engine, rank, f"invalid --node-rank {rank} for --nnodes {nnodes}", 2)
    group.log(f"TEST DOUBLE starting: model {args.model_path} tp {args.tp_size} "
              f"nnodes {nnodes} node-rank {rank}")
    leak_on_sigusr1(group)
    compile_cache(group)
    crash_at_boot(group)
    if nnodes > 1:
        if not args.dist_init_addr or ":" not in args.dist_init_addr:
            die(engine, rank, "--dist-init-addr host:port is required when --nnodes > 1", 2)
        host, port_s = args.dist_init_addr.rsplit(":", 1)
        if rank == 0:
            threading.Thread(target=group.serve_coordinator, args=(int(port_s),), daemon=True).start()
        else:
            group.join(host, int(port_s), float(getattr(args, "dist_timeout", None) or 600))
    else:
        group.formed.set()
        group.log("group formed (1/1 ranks)")
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(args, group, engine))
    httpd.daemon_threads = True
    what = "API" if rank == 0 else "dummy health server"
    group.log(f"serving {what} on {args.host}:{args.port}")
    if rank == 0:
        def announce():
            group.formed.wait()
            fabric_init(args, group, engine)
            group.ready.set()
            # The real engine's boot phases (its log lines), so status and readiness have them to read.
            for line in ("Load weight begin.", "Load weight end.", "Capture cuda graph begin.",
                         "Capture cuda graph end.", *boot_report(args), "The server is fired up and ready to roll!"):
                group.log(line)
            group.log(f"ready: serving API for model {args.served_model_name or args.model_path}")
        threading.Thread(target=announce, daemon=True).start()
    else:
        def worker_ready():
            group.formed.wait()
            fabric_init(args, group, engine)
            group.ready.set()
        threading.Thread(target=worker_ready, daemon=True).start()
    httpd.serve_forever()
    return 0
