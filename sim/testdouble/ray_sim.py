"""TEST DOUBLE of Ray (``ray`` CLI + ``import ray``), stdlib only. This is NOT Ray.

A Ray "cluster" here is a node registry over TCP:

* ``ray start --head --port P --node-ip-address IP [--num-gpus N]``: a head process listens on
  ``0.0.0.0:P`` and counts itself as one node (IP, GPUs). Without ``--block`` the head runs in the
  background (log: ``$RAY_TMPDIR/session_latest/logs/ray-head.log``, or stderr with
  ``RAY_LOG_TO_STDERR=1``) and ``ray start`` returns 0 once it listens; it records its address in
  ``$RAY_TMPDIR/ray_current_cluster`` (``RAY_TMPDIR`` defaults to ``/tmp/ray``).
* ``ray start --address A:P --node-ip-address IP [--num-gpus N] [--block]``: registers a node with
  the head (retrying for up to ``DSPARK_RAY_CONNECT_TIMEOUT`` = 300 s while the head is not up) and
  keeps the connection with heartbeats; exits 1 when the head goes away. The head marks a node dead
  when its connection closes or is silent for ``NODE_TIMEOUT_S``.
* ``ray status`` prints the alive nodes; ``ray stop`` stops the background processes ``ray start``
  left on this machine. Unknown flags exit 2 (flag table ``flags.RAY_START_FLAGS``).

Wire protocol (one JSON object per line): ``{"op": "nodes"}`` -> one line with the node list;
``{"op": "register", ...}`` -> ``{"op": "registered", "node_id": ...}`` then ``{"op": "ping"}`` both
ways every ``HEARTBEAT_S``.

Python API (``import ray``): ``init(address=None | "auto" | "ip:port" | "local")``, ``nodes()``,
``cluster_resources()``, ``available_resources()``, ``is_initialized()``, ``shutdown()``.
Node dicts: ``NodeID``, ``Alive``/``alive``, ``NodeManagerAddress``, ``NodeManagerHostname``,
``Resources`` (``GPU`` only when the node has GPUs, as in Ray), ``IsHead`` (test double only).
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import flags, openai_api

__version__ = "2.49.0+test-double"
HEARTBEAT_S = 1.0
NODE_TIMEOUT_S = 10.0
DEFAULT_PORT = 6379
CONNECT_TIMEOUT_S = 300.0
INIT_TIMEOUT_S = 10.0


# ------------------------------------------------------------------------------- helpers ----
def log(role: str, msg: str) -> None:
    openai_api.emit(f"ray-sim test-double {role}", msg)


def tmp_dir() -> Path:
    return Path(os.environ.get("RAY_TMPDIR") or "/tmp/ray")


def new_node_id() -> str:
    return os.urandom(28).hex()  # 56 hex characters, like Ray's NodeID


def split_address(address: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    address = address.strip()
    if "://" in address:
        raise ValueError(f"unsupported Ray address {address!r} (the test double has no Ray Client)")
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, default_port
    return host, int(port)


def local_ip(target: str | None = None) -> str:
    """The address this machine uses to reach ``target`` (like Ray's node IP autodetection)."""
    for dest in ([target] if target else []) + ["10.255.255.255"]:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((dest, 9))
                return s.getsockname()[0]
        except OSError:
            continue
    return "127.0.0.1"


def detect_gpus() -> int:
    """Ray's GPU autodetection, simulated: CUDA_VISIBLE_DEVICES if set, else one GB10 per Spark."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return len([d for d in cvd.split(",") if d.strip() and d.strip() != "-1"])
    return 1


def _send(conn: socket.socket, obj) -> None:
    conn.sendall((json.dumps(obj) + "\n").encode())


def query(address: str, timeout: float = 5.0) -> list[dict]:
    """One ``nodes`` request to the head at ``ip:port`` (raises OSError / ValueError)."""
    host, port = split_address(address)
    with socket.create_connection((host, port), timeout=timeout) as conn:
        _send(conn, {"op": "nodes"})
        data = conn.makefile("rb").readline()
    if not data:
        raise ConnectionError(f"Ray head at {address} closed the connection")
    return json.loads(data)


# ---------------------------------------------------------------------------------- head ----
class Head:
    """The node registry (the double's GCS). ``start()`` binds and serves in daemon threads."""

    def __init__(self, ip: str, port: int, gpus: int, cpus: int | None = None, bind: str = "0.0.0.0",
                 role: str | None = None):
        self.ip, self.port, self.bind = ip, port, bind
        self.role = role or f"head {ip}"
        self.lock = threading.Lock()
        self.nodes: dict[str, dict] = {}
        self.head_id = new_node_id()
        self.srv: socket.socket | None = None
        self._add(self.head_id, ip, socket.gethostname(), gpus, cpus, head=True)

    def log(self, msg: str) -> None:
        log(self.role, msg)

    def _add(self, node_id: str, ip: str, hostname: str, gpus, cpus, head: bool = False) -> dict:
        res: dict[str, float] = {"CPU": float(cpus if cpus is not None else (os.cpu_count() or 1))}
        if gpus:
            res["GPU"] = float(gpus)
        res[f"node:{ip}"] = 1.0
        if head:
            res["node:__internal_head__"] = 1.0
        node = {"NodeID": node_id, "Alive": True, "alive": True, "NodeManagerAddress": ip,
                "NodeManagerHostname": hostname, "NodeManagerPort": 0, "NodeName": ip,
                "Resources": res, "IsHead": head, "DeathReasonMessage": ""}
        with self.lock:
            self.nodes[node_id] = node
        return node

    def snapshot(self) -> list[dict]:
        with self.lock:
            return [dict(n, Resources=dict(n["Resources"])) for n in self.nodes.values()]

    def alive_count(self) -> int:
        with self.lock:
            return sum(1 for n in self.nodes.values() if n["Alive"])

    def start(self) -> "Head":
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((self.bind, self.port))
        srv.listen(64)
        self.port = srv.getsockname()[1]
        self.srv = srv
        threading.Thread(target=self._accept, daemon=True).start()
        self.log(f"head node {self.head_id[:8]} ({self.ip}, GPU {self.snapshot()[0]['Resources'].get('GPU', 0):g}) "
                 f"listening on {self.bind}:{self.port}")
        return self

    def stop(self) -> None:
        if self.srv:
            try:
                self.srv.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                conn, addr = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(conn, addr), daemon=True).start()

    def _conn(self, conn: socket.socket, addr) -> None:
        conn.settimeout(NODE_TIMEOUT_S)
        f = conn.makefile("rb")
        try:
            msg = json.loads(f.readline() or b"null")
        except (OSError, ValueError):
            msg = None
        if not isinstance(msg, dict):
            conn.close()
            return
        if msg.get("op") == "nodes":
            try:
                _send(conn, self.snapshot())
            except OSError:
                pass
            conn.close()
            return
        if msg.get("op") != "register":
            conn.close()
            return
        ip = str(msg.get("ip") or addr[0])
        node = self._add(str(msg.get("node_id") or new_node_id()), ip, str(msg.get("hostname") or ip),
                         msg.get("gpus") or 0, msg.get("cpus"))
        nid = node["NodeID"]
        try:
            _send(conn, {"op": "registered", "node_id": nid, "head": f"{self.ip}:{self.port}"})
        except OSError:
            pass
        self.log(f"node {nid[:8]} ({ip}, GPU {node['Resources'].get('GPU', 0):g}) joined: "
                 f"{self.alive_count()} alive node(s)")
        stop = threading.Event()

        def beat():
            while not stop.wait(HEARTBEAT_S):
                try:
                    _send(conn, {"op": "ping"})
                except OSError:
                    return

        threading.Thread(target=beat, daemon=True).start()
        reason = "connection closed"
        while True:
            try:
                data = f.readline()
            except socket.timeout:
                reason = f"no heartbeat for {NODE_TIMEOUT_S:.0f}s"
                break
            except OSError as e:
                reason = f"connection error: {e}"
                break
            if not data:
                break
        stop.set()
        with self.lock:
            node["Alive"] = node["alive"] = False
            node["DeathReasonMessage"] = reason
        try:
            conn.close()
        except OSError:
            pass
        self.log(f"node {nid[:8]} ({ip}) lost ({reason}): {self.alive_count()} alive node(s)")


# -------------------------------------------------------------------------------- worker ----
def run_worker(address: str, ip: str, gpus: int, cpus: int | None, connect_timeout: float,
               on_registered=None) -> int:
    """Register with the head and stay connected; returns 1 when the head goes away."""
    host, port = split_address(address)
    role = f"worker {ip}"
    deadline = time.monotonic() + connect_timeout
    last_note = 0.0
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=5)
            conn.settimeout(NODE_TIMEOUT_S)
            _send(conn, {"op": "register", "node_id": new_node_id(), "ip": ip, "hostname": socket.gethostname(),
                         "gpus": gpus, "cpus": cpus})
            f = conn.makefile("rb")
            reply = json.loads(f.readline() or b"null")
            if not isinstance(reply, dict) or reply.get("op") != "registered":
                raise ConnectionError(f"unexpected reply {reply!r}")
            break
        except (OSError, ValueError) as e:
            now = time.monotonic()
            if now > deadline:
                log(role, f"Ray head at {host}:{port} not reachable after {connect_timeout:.0f}s: {e}")
                return 1
            if now - last_note > 10:
                log(role, f"waiting for the Ray head at {host}:{port} ({e})")
                last_note = now
            time.sleep(1)
    nid = reply["node_id"]
    log(role, f"registered node {nid[:8]} ({ip}, GPU {gpus:g}) with the head at {host}:{port}")
    if on_registered:
        on_registered(nid)

    def beat():
        while True:
            time.sleep(HEARTBEAT_S)
            try:
                _send(conn, {"op": "ping"})
            except OSError:
                return

    threading.Thread(target=beat, daemon=True).start()
    while True:
        try:
            data = f.readline()
        except socket.timeout:
            data, why = b"", f"no heartbeat from the head for {NODE_TIMEOUT_S:.0f}s"
        except OSError as e:
            data, why = b"", str(e)
        else:
            why = "connection closed"
        if not data:
            log(role, f"lost the Ray head at {host}:{port} ({why}); "
                      "Some Ray subprocesses exited unexpectedly: raylet [exit code=1]")
            return 1


# ------------------------------------------------------------------- background processes ----
def _pid_dir() -> Path:
    return tmp_dir() / "dspark-ray-pids"


def _spawn_background(argv: list[str], timeout: float) -> int:
    """Run ``ray _serve <argv>`` in a new session; wait for its readiness line on a pipe."""
    r, w = os.pipe()
    pkg = __package__ or "dspark_testdouble"
    root = Path(os.path.abspath(__file__)).parents[pkg.count(".") + 1]  # the dir holding the top package
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    logs = tmp_dir() / "session_latest" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    to_stderr = os.environ.get("RAY_LOG_TO_STDERR") == "1"
    logf = None if to_stderr else open(logs / ("ray-head.log" if "--head" in argv else "ray-worker.log"), "ab")
    try:
        proc = subprocess.Popen([sys.executable, "-m", f"{pkg}.ray_sim", "_serve", "--ready-fd", str(w), *argv],
                                env=env, pass_fds=(w,), start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=logf or None, stderr=subprocess.STDOUT if logf else None)
    finally:
        os.close(w)
        if logf:
            logf.close()
    line = b""
    with os.fdopen(r, "rb") as rf:
        ready, _, _ = select.select([rf], [], [], timeout)
        if ready:
            line = rf.readline()
    if not line.startswith(b"ok"):
        if proc.poll() is None:
            proc.terminate()
        where = "stderr" if to_stderr else str(logs)
        msg = line.decode(errors="replace").strip() or f"background process exited (code {proc.poll()}); see {where}"
        print(f"ray start failed: {msg}", file=sys.stderr)
        return 1
    _pid_dir().mkdir(parents=True, exist_ok=True)
    (_pid_dir() / str(proc.pid)).write_text(" ".join(argv) + "\n")
    return 0


def _serve(argv: list[str]) -> int:
    """The background process behind ``ray start`` without ``--block``."""
    p = argparse.ArgumentParser(prog="ray _serve", allow_abbrev=False)
    p.add_argument("--ready-fd", type=int, required=True)
    flags.add_table(p, "ray start")
    a = p.parse_args(argv)
    ready = os.fdopen(a.ready_fd, "wb")

    def say(text: str) -> None:
        try:
            ready.write(text.encode() + b"\n")
            ready.close()
        except OSError:
            pass

    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if a.head:
        try:
            head = _start_head(a)
        except OSError as e:
            say(f"err cannot listen on 0.0.0.0:{a.port}: {e}")
            return 1
        say(f"ok {head.port}")
        threading.Event().wait()
    return run_worker(a.address, a.node_ip_address or local_ip(split_address(a.address)[0]),
                      a.num_gpus if a.num_gpus is not None else detect_gpus(), a.num_cpus,
                      float(os.environ.get("DSPARK_RAY_CONNECT_TIMEOUT", CONNECT_TIMEOUT_S)),
                      on_registered=lambda nid: say(f"ok {nid}"))


def _start_head(a) -> Head:
    ip = a.node_ip_address or local_ip()
    head = Head(ip, a.port, a.num_gpus if a.num_gpus is not None else detect_gpus(), a.num_cpus).start()
    d = tmp_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / "ray_current_cluster").write_text(f"{ip}:{head.port}\n")
    return head


# ----------------------------------------------------------------------------------- CLI ----
def build_cli() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="ray", allow_abbrev=False,
                                  description="TEST DOUBLE of the Ray CLI (dspark-sim); this is NOT Ray")
    top.add_argument("--version", action="version", version=f"ray, version {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    flags.add_table(sub.add_parser("start", allow_abbrev=False, help="start a head or worker node"), "ray start")
    st = sub.add_parser("status", allow_abbrev=False, help="print the alive nodes")
    st.add_argument("--address", default=None)
    sp = sub.add_parser("stop", allow_abbrev=False, help="stop background processes started by ray start")
    sp.add_argument("-f", "--force", action="store_true")
    return top


def _start(a, argv: list[str]) -> int:
    if a.head and a.address:
        print("ray start: --head and --address are mutually exclusive", file=sys.stderr)
        return 1
    if not a.head and not a.address:
        print("ray start: pass --head to start a head node or --address <head ip:port> to join one",
              file=sys.stderr)
        return 1
    if a.head:
        ip = a.node_ip_address or local_ip()
        print(f"Local node IP: {ip}", flush=True)
        if a.block:
            signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
            try:
                _start_head(a)
            except OSError as e:
                print(f"ray start failed: cannot listen on 0.0.0.0:{a.port}: {e}", file=sys.stderr)
                return 1
            print("\n--------------------\nRay runtime started (TEST DOUBLE).\n--------------------\n"
                  "--block: this command will now block until terminated by a signal.", flush=True)
            threading.Event().wait()
        rc = _spawn_background(argv, 30)
        if rc == 0:
            print("\n--------------------\nRay runtime started (TEST DOUBLE).\n--------------------\n\n"
                  f"To add another node to this Ray cluster, run\n  ray start --address='{ip}:{a.port}'\n\n"
                  "To terminate the Ray runtime, run\n  ray stop", flush=True)
        return rc
    host, _ = split_address(a.address)
    ip = a.node_ip_address or local_ip(host)
    print(f"Local node IP: {ip}", flush=True)
    timeout = float(os.environ.get("DSPARK_RAY_CONNECT_TIMEOUT", CONNECT_TIMEOUT_S))
    if a.block:
        signal.signal(signal.SIGTERM, lambda *_: (log(f"worker {ip}", "SIGTERM received, stopping"), os._exit(0)))
        gpus = a.num_gpus if a.num_gpus is not None else detect_gpus()
        return run_worker(a.address, ip, gpus, a.num_cpus, timeout,
                          on_registered=lambda nid: print(
                              "\n--------------------\nRay runtime started (TEST DOUBLE).\n--------------------\n"
                              "--block: this command will now block until terminated by a signal.", flush=True))
    rc = _spawn_background(argv, timeout + 30)
    if rc == 0:
        print("\n--------------------\nRay runtime started (TEST DOUBLE).\n--------------------\n\n"
              "To terminate the Ray runtime, run\n  ray stop", flush=True)
    return rc


def _status(address: str | None) -> int:
    try:
        addr = resolve_address(address or "auto")
        nodes = query(addr)
    except (OSError, ValueError) as e:
        print(f"Ray cluster is not found at {address or 'auto'} ({e})", file=sys.stderr)
        return 1
    alive = [n for n in nodes if n["Alive"]]
    dead = [n for n in nodes if not n["Alive"]]
    gpus = sum(n["Resources"].get("GPU", 0.0) for n in alive)
    cpus = sum(n["Resources"].get("CPU", 0.0) for n in alive)
    lines = [f"======== Cluster status: {time.strftime('%Y-%m-%d %H:%M:%S')} (TEST DOUBLE, {addr}) ========",
             "Node status", "-" * 60, "Active:"]
    lines += [f" 1 node_{n['NodeID']} {n['NodeManagerAddress']} GPU {n['Resources'].get('GPU', 0.0):g}"
              f"{' (head)' if n.get('IsHead') else ''}" for n in alive]
    lines += ["Pending:", " (no pending nodes)", "Recent failures:"]
    lines += [f" node_{n['NodeID']} {n['NodeManagerAddress']}: {n.get('DeathReasonMessage') or 'dead'}"
              for n in dead] or [" (no failures)"]
    lines += ["", "Resources", "-" * 60, "Usage:", f" 0.0/{cpus:g} CPU", f" 0.0/{gpus:g} GPU"]
    print("\n".join(lines))
    return 0


def _stop() -> int:
    d = _pid_dir()
    stopped = 0
    for p in sorted(d.glob("*")) if d.is_dir() else []:
        try:
            os.kill(int(p.name), signal.SIGTERM)
            stopped += 1
        except (ValueError, ProcessLookupError, PermissionError):
            pass
        p.unlink(missing_ok=True)
    (tmp_dir() / "ray_current_cluster").unlink(missing_ok=True)
    print(f"Stopped all {stopped} Ray processes." if stopped else "Did not find any active Ray processes.")
    return 0


def cli_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_serve"]:
        return _serve(argv[1:])
    a = build_cli().parse_args(argv)
    if a.command == "start":
        return _start(a, argv[1:])
    if a.command == "status":
        return _status(a.address)
    return _stop()


# ---------------------------------------------------------------------------- Python API ----
_state: dict = {"address": None, "local_head": None}


def resolve_address(address: str | None) -> str | None:
    """``"auto"``/None -> ``$RAY_ADDRESS`` or the local head's recorded address (None if neither)."""
    if address not in (None, "auto"):
        return address
    env = os.environ.get("RAY_ADDRESS")
    if env and env != "auto":
        return env
    f = tmp_dir() / "ray_current_cluster"
    if f.exists() and f.read_text().strip():
        return f.read_text().strip()
    if address == "auto":
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to by "
                              "setting `--address` flag or `RAY_ADDRESS` environment variable.")
    return None


def is_initialized() -> bool:
    return _state["address"] is not None


def init(address: str | None = None, *, ignore_reinit_error: bool = False, **_kwargs):
    """Connect to the head at ``address`` (``"auto"``: ``$RAY_ADDRESS`` or the local head).

    ``None``/``"local"`` with no cluster found starts an in-process single-node "cluster" (as
    ``ray.init()`` starts a local Ray instance), with the autodetected GPUs.
    """
    if is_initialized():
        if ignore_reinit_error:
            return None
        raise RuntimeError("Maybe you called ray.init twice by accident? This error can be suppressed by passing "
                           "in 'ignore_reinit_error=True' or by calling 'ray.shutdown()' prior to 'ray.init()'.")
    addr = None if address == "local" else resolve_address(address)
    if addr is None:
        head = Head("127.0.0.1", 0, detect_gpus(), bind="127.0.0.1", role="local").start()
        _state.update(address=f"127.0.0.1:{head.port}", local_head=head)
        log("driver", f"Started a local Ray instance at {_state['address']} (GPU {detect_gpus()}).")
        return None
    log("driver", f"Connecting to existing Ray cluster at address: {addr}...")
    deadline = time.monotonic() + float(os.environ.get("DSPARK_RAY_INIT_TIMEOUT", INIT_TIMEOUT_S))
    while True:
        try:
            query(addr)
            break
        except (OSError, ValueError) as e:
            if time.monotonic() > deadline:
                raise ConnectionError(f"Failed to connect to the Ray head (GCS) at {addr}: {e}") from e
            time.sleep(0.5)
    _state["address"] = addr
    log("driver", f"Connected to Ray cluster at {addr}.")
    return None


def address() -> str:
    if not is_initialized():
        raise RuntimeError("Ray has not been started yet. You can start Ray with 'ray.init()'.")
    return _state["address"]


def nodes() -> list[dict]:
    addr = address()
    last: Exception | None = None
    for _ in range(3):
        try:
            return query(addr)
        except (OSError, ValueError) as e:
            last = e
            time.sleep(0.5)
    raise ConnectionError(f"lost the Ray head (GCS) at {addr}: {last}")


def cluster_resources() -> dict[str, float]:
    total: dict[str, float] = {}
    for n in nodes():
        if n["Alive"]:
            for k, v in n["Resources"].items():
                total[k] = total.get(k, 0.0) + v
    return total


available_resources = cluster_resources  # nothing is ever scheduled on the double


def shutdown() -> None:
    head = _state.get("local_head")
    if head:
        head.stop()
    _state.update(address=None, local_head=None)


if __name__ == "__main__":
    sys.exit(cli_main())
