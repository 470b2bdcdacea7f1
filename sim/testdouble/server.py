"""TEST DOUBLE of a tensor-parallel launcher (``python3 -m sglang.launch_server``), stdlib only.

Rank group: rank 0 listens on the port of ``--dist-init-addr`` (all interfaces); other ranks
connect there (retrying until ``--dist-timeout`` or 600 s) and send ``JOIN <rank> <nnodes>``.
When all ``--nnodes`` ranks joined, rank 0 answers ``FORMED`` to everyone. Both sides then
exchange ``PING`` heartbeats; if any rank disappears after formation every rank exits non-zero.

HTTP (``--host:--port``): rank 0 serves ``/health`` (503 until formed and NCCL is up), ``/v1/models`` and
``/v1/chat/completions`` (non-streaming and SSE), and with ``--enable-metrics`` ``/metrics`` (Prometheus
text: the real SGLang families of ``metric_families.SGLANG``: requests running (streams included) and queued
(0), tokens, time to first token, latencies, the KV pool obtained and its usage; without the flag 404, as
SGLang). With
``--api-key`` every path except those starting with ``/health`` or ``/metrics`` needs
``Authorization: Bearer <key>`` (SGLang's API-key middleware exempts both). Workers serve a dummy ``/health``.

Once the group formed, every rank of a multi-rank group does what a real rank does next: torch's Gloo CPU
group (``GLOO_SOCKET_IFNAME``) and its NCCL communicator (``nccl.comm_init``: ``NCCL_SOCKET_IFNAME``,
``NCCL_NET``, ``NCCL_IB_HCA``, ``NCCL_IB_GID_INDEX``... against the node's interfaces and
/sys/class/infiniband); a failure is printed as the engine would and the rank exits 1 (the others then
lose it and exit too). Rank 0 reports the engine's boot phases only after that.
"""
from __future__ import annotations

import json
import os
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


def make_handler(args, group: Group, engine: str):
    full_api = args.node_rank == 0

    def pre_route(h, method: str, path: str) -> bool:
        if path.startswith("/health"):
            if group.ready.is_set() or not full_api:
                h.send_json(200, {"status": "ok", "rank": args.node_rank})
            else:
                h.send_json(503, {"status": "waiting for ranks", "rank": 0})
        elif not full_api:
            h.send_json(404, {"error": "worker rank serves /health only"})
        elif not group.ready.is_set():
            h.send_json(503, {"error": "rank group not formed yet"})
        else:
            return False
        return True

    model = args.served_model_name or args.model_path or "default"
    # SGLang serves /metrics only with --enable-metrics (its scheduler's and tokenizer's collectors)
    metrics = (metric_families.EngineMetrics("sglang", model, kv_pool(args), context_len(args))
               if args.enable_metrics else None)  # fmt: skip
    return openai_api.make_handler(openai_api.Api(
        engine=engine, model_names=[model],
        root=args.model_path, max_model_len=int(args.context_length or 0) or None, api_key=args.api_key,
        guarded=lambda path: not path.startswith(("/health", "/metrics")), pre_route=pre_route, log=group.log,
        debug=(args.log_level or "").lower() == "debug",
        metrics=metrics))


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
    what = "API" if rank == 0 else "dummy /health"
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
