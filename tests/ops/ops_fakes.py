"""Test doubles for dspark: nodes that answer the commands dspark sends over ssh (parsed with
shlex, as a shell would, so a badly quoted command fails here), and a local OpenAI-compatible
endpoint on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Optional

from programs import probe
from dspark import nodes as dnodes

ROOT = Path(__file__).resolve().parents[2]
# The real node runner, for the one test that puts a stub `ssh` first on PATH (conftest.py's guard
# replaces probe.on_node in every test).
REAL_ON_NODE = probe.on_node
KEY = "sk-ops-test-5f1e0c9a7b3d42e8a6c1f0b9d8e7a6c5"


def state(status: str = "running", exit_code: int = 0, started: str = "2025-06-01T10:00:00.123456789Z",
          finished: str = "0001-01-01T00:00:00Z", oom: bool = False) -> dict:  # fmt: skip
    return {"Status": status, "Running": status == "running", "Paused": False, "Restarting": False,
            "OOMKilled": oom, "Dead": status == "dead", "Pid": 4242 if status == "running" else 0,
            "ExitCode": exit_code, "Error": "", "StartedAt": started, "FinishedAt": finished}  # fmt: skip


@dataclass
class FakeContainer:
    state: dict
    labels: dict
    log: str = ""


@dataclass
class FakeNode:
    containers: dict[str, FakeContainer] = field(default_factory=dict)
    files: set[str] = field(default_factory=set)
    volumes: dict[str, dict] = field(default_factory=dict)  # name -> {"mountpoint", "mounted", "stat"}
    gpu: str = "0\n"  # output of the memory.used query
    gpu_apps: str = ""  # output of the compute-apps query
    preflight_ok: list[str] = field(default_factory=lambda: ["docker", "gpu", "gpu-idle", "infiniband"])
    preflight_fail: list[tuple[str, str]] = field(default_factory=list)
    unreachable: bool = False
    meminfo: tuple[int, int, int] = (124620, 118000, 900)  # MemTotal, MemAvailable, Cached in MiB
    gateway_admin: dict[str, tuple[int, str]] = field(default_factory=dict)  # keys|usage -> gateway_admin.py's reply
    texts: dict[str, str] = field(default_factory=dict)  # path -> content: what `cat` reads (the guard's journal)
    fence: str = "fence live=present saved=same boot=ok"  # what the doctor's fence check reads (as planned)


class FakeCluster:
    """A Runner: `(target, port, ssh_opts, remote) -> (code, output)` played from FakeNode data."""

    def __init__(self, nodes: dict[str, FakeNode]):
        self.nodes = nodes  # by host
        self.calls: list[tuple[str, int, list[str], str]] = []
        self.lock = threading.Lock()

    def __call__(self, target: str, port: int, ssh_opts: list[str], remote: str) -> tuple[int, str]:
        with self.lock:
            self.calls.append((target, port, list(ssh_opts), remote))
        user, _, host = target.partition("@")
        node = self.nodes[host]
        if node.unreachable:
            return 255, f"ssh: connect to host {host} port {port}: No route to host\n"
        if remote == dnodes.GPU_MEMORY:
            return 0, node.gpu + "---\n" + node.gpu_apps
        argv = shlex.split(remote)
        if argv[:2] == ["docker", "inspect"]:
            assert argv[2:4] == ["--format", dnodes.INSPECT_FORMAT] and len(argv) == 5, argv
            c = node.containers.get(argv[4])
            if c is None:
                return 1, f"Error: No such object: {argv[4]}\n"
            return 0, json.dumps(c.state) + " " + json.dumps(c.labels) + "\n"
        if argv[:2] == ["docker", "logs"]:
            assert argv[-1] == "2>&1", argv
            args = argv[2:-1]
            name = args[-1]
            c = node.containers.get(name)
            if c is None:
                return 1, f"Error response from daemon: No such container: {name}\n"
            lines = c.log.splitlines()
            if "--tail" in args:
                n = args[args.index("--tail") + 1]
                if n != "all":
                    lines = lines[-int(n):] if int(n) else []
            return 0, "".join(line + "\n" for line in lines)
        if argv[:2] == ["docker", "exec"]:  # gateway_admin.py in the gateway container (dspark status)
            from planning import gateway

            assert argv[3:] == [*shlex.split(gateway.ADMIN), "--wait", "0", argv[-1]], argv
            if argv[2] not in node.containers:
                return 1, f"Error response from daemon: No such container: {argv[2]}\n"
            return node.gateway_admin[argv[-1]]
        if argv[:2] == ["sh", "-c"] and len(argv) == 3:
            return self._script(node, argv[2])
        raise AssertionError(f"unexpected remote command: {remote!r}")

    def _script(self, node: FakeNode, script: str) -> tuple[int, str]:
        if script.endswith("\nDSPARK_MEMGATE\n"):  # the memory gate's own program, on a fake /proc/meminfo
            command, _, rest = script.partition(" <<'DSPARK_MEMGATE'\n")
            assert command.startswith("python3 - ") and rest.removesuffix("\nDSPARK_MEMGATE\n") == memgate_source()
            return run_memgate(shlex.split(command)[2:], *node.meminfo)
        if "preflight $node" in script:
            name = shlex.split(re.search(r"^node=(.*?); failed=0$", script, re.M).group(1))[0]
            out = "".join(f"preflight {name}: ok {c}\n" for c in node.preflight_ok)
            out += "".join(f"preflight {name}: FAIL {c}: {m}\n" for c, m in node.preflight_fail)
            if node.preflight_fail:
                out += f"preflight {name}: failed, nothing was changed on the node\n"
            return (1 if node.preflight_fail else 0), out
        m = re.match(r"^for f in (.*?); do ", script)
        if m:
            out = ""
            for path in shlex.split(m.group(1)):
                out += f"{'present' if path in node.files else 'missing'} {path}\n"
            return 0, out
        m = re.search(r"docker volume inspect --format '\{\{\.Mountpoint\}\}' (.*?) 2>&1\)", script)
        if m:
            (name,) = shlex.split(m.group(1))
            v = node.volumes.get(name)
            if v is None:
                return 0, f"volume missing Error response from daemon: get {name}: no such volume\n"
            out = f"mountpoint {v['mountpoint']}\nmounted {'yes' if v.get('mounted') else 'no'}\n"
            return 0, out + (f"stat {v.get('stat', 'ok')}\n")
        argv = shlex.split(script)
        if argv and argv[0] == "sudo":
            argv = argv[2:] if argv[1] == "-n" else argv[1:]
        if len(argv) == 2 and argv[0] == "cat":  # the guard's journal
            text = node.texts.get(argv[1])
            return (0, text) if text is not None else (1, f"cat: {argv[1]}: No such file or directory\n")
        if script.endswith('echo "fence live=$l saved=$s boot=$b"'):  # the node's fence (dspark doctor)
            return 0, node.fence + "\n"
        if script.startswith('echo "token $('):  # the guard's files (dspark doctor)
            token = re.search(r"stat -c \"%a %s\" (\S+)", script).group(1)
            archive = re.search(r"sha256sum (\S+)", script).group(1)
            mode = node.texts.get(shlex.split(token)[0])
            digest = node.texts.get(shlex.split(archive)[0], "")
            return 0, f"token {mode or 'missing'}\narchive {digest}\n"
        m = re.search(r"printf '%s\\n' (.*?) \| (?:sudo -n )?tee (\S+) >/dev/null && (?:sudo -n )?mv \S+ (\S+)$", script)
        if m:  # dspark guard pause: the maintenance marker
            node.texts[shlex.split(m.group(3))[0]] = shlex.split(m.group(1))[0]
            return 0, ""
        m = re.match(r"^(?:sudo -n )?rm -f (\S+) && (?:sudo -n )?touch (\S+)$", script)
        if m:  # dspark guard resume
            node.texts.pop(shlex.split(m.group(1))[0], None)
            node.texts[shlex.split(m.group(2))[0]] = ""
            return 0, ""
        raise AssertionError(f"unexpected script: {script[:200]!r}")

    @contextlib.contextmanager
    def forward(self, target: str, port: int, ssh_opts: list[str], host: str, remote_port: int):
        """A tunnel through a fake node to its inner port: the fake endpoints listen on this machine's loopback, so
        the tunnel's local end is the port itself (recorded like a command)."""
        with self.lock:
            self.calls.append((target, port, list(ssh_opts), f"ssh -N -L {host}:{remote_port}"))
        assert host == "127.0.0.1", host  # nothing leaves this machine
        yield remote_port

    def hosts_called(self) -> set[str]:
        return {t.partition("@")[2] for t, *_ in self.calls}


MEMGATE_LOCK = threading.Lock()


def memgate_source() -> str:
    from planning import stackplan

    return stackplan.MEMGATE_PROGRAM


def run_memgate(args: list[str], total: int, available: int, cached: int) -> tuple[int, str]:
    """programs/memgate.py's main on a /proc/meminfo with these figures (MiB); (exit code, stdout + stderr)."""
    import contextlib
    import io
    import tempfile

    from programs import memgate

    with tempfile.TemporaryDirectory() as d:
        info = Path(d) / "meminfo"
        info.write_text(f"MemTotal: {total * 1024} kB\nMemFree: {(available - cached) * 1024} kB\n"
                        f"MemAvailable: {available * 1024} kB\nCached: {cached * 1024} kB\n")
        out = io.StringIO()
        # doctor checks the nodes in threads; redirect_stdout swaps sys.stdout for all of them: one at a time
        with MEMGATE_LOCK, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = memgate.main(args, meminfo_path=str(info), proc=d)
    return code, out.getvalue()


def cluster_for(cfg, stack: str, revision: str, log: str = "", gpu: str = "40960\n") -> FakeCluster:
    """Every rank running with `revision`, every shard present, every volume healthy."""
    from planning import plan

    fake = {}
    for rank, n in enumerate(cfg.nodes):
        name = plan.container_name(stack, rank)
        labels = {plan.REVISION_LABEL: revision, "deepseek-spark.stack": stack, "deepseek-spark.rank": str(rank),
                  "deepseek-spark.role": "head" if rank == 0 else "worker", "deepseek-spark.engine": cfg.engine}  # fmt: skip
        files = set()
        if cfg.engram is not None:
            files = {f"{cfg.engram.dir}/{f}" for f in plan.shard_files(rank, cfg.serving.tp_size)}
        guard = FakeContainer(state(), {"deepseek-spark.stack": stack, "deepseek-spark.role": "guard"})
        fake[n.host] = FakeNode(
            containers={name: FakeContainer(state(), labels, log), f"{stack}-guard": guard},
            files=files,
            volumes={plan.checkpoint_volume_name(stack): {
                "mountpoint": f"/var/lib/docker/volumes/{stack}-checkpoint/_data", "mounted": True, "stat": "ok"}},
            gpu=gpu,
        )  # fmt: skip
    if cfg.serving.self_heal.enabled:  # the leader's journal on the head: serving, no heal yet
        from planning import guard

        head = fake[cfg.nodes[0].host]
        head.texts[guard.directory(cfg, 0, stack) + "/journal.json"] = journal("serving", "every rank runs")
        for rank, n in enumerate(cfg.nodes):  # what `cat`-like reads of the guard's files find: mode and size, digest
            d = guard.directory(cfg, rank, stack)
            fake[n.host].texts.update({f"{d}/{guard.TOKEN}": "600 65", f"{d}/{guard.ARCHIVE}": guard.DIGEST})
    return FakeCluster(fake)


def journal(state: str, reason: str, heartbeat: Optional[float] = None, **extra) -> str:
    """The guard leader's journal as it writes it (programs/guard/journal.py)."""
    doc = {"version": 1, "armed": [], "state": state, "reason": reason,
           "heartbeat": time.time() if heartbeat is None else heartbeat, "memory": {"attempts": 0},
           "healing": None, "heals": [], "counts": {}, **extra}  # fmt: skip
    return json.dumps(doc)


# ---------------------------------------------------------------------------------- endpoint


class FakeEndpoint:
    """/health and /v1/chat/completions (plain and SSE) on 127.0.0.1; records the auth headers."""

    def __init__(self, key: str = KEY, answer: str = "42", health: int = 200, first_token_delay: float = 0.0,
                 token_delay: float = 0.0, usage: bool = True, model: str = "deepseek-v4.1-flash",
                 health_path: str = "/health"):  # fmt: skip
        self.key, self.answer, self.health, self.health_path = key, answer, health, health_path
        self.first_token_delay, self.token_delay, self.usage, self.model = first_token_delay, token_delay, usage, model
        self.auth: list[Optional[str]] = []
        self.requests: list[dict] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _json(self, code: int, obj: dict) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == endpoint.health_path:
                    return self._json(endpoint.health, {"status": endpoint.health})
                return self._json(404, {"error": "no route"})

            def do_POST(self):
                endpoint.auth.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != f"Bearer {endpoint.key}":
                    return self._json(401, {"error": "Unauthorized"})
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                endpoint.requests.append(req)
                words = endpoint.answer.split(" ")
                usage = {"prompt_tokens": 7, "completion_tokens": len(words) + 1, "total_tokens": 8 + len(words)}
                if not req.get("stream"):
                    time.sleep(endpoint.first_token_delay)
                    return self._json(200, {"choices": [{"index": 0, "message": {"role": "assistant",
                                                          "content": endpoint.answer}, "finish_reason": "stop"}],
                                            **({"usage": usage} if endpoint.usage else {})})  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True

                def chunk(obj):
                    self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                    self.wfile.flush()

                chunk({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})  # no text yet
                time.sleep(endpoint.first_token_delay)
                for i, w in enumerate(words):
                    if i:
                        time.sleep(endpoint.token_delay)
                    chunk({"choices": [{"index": 0, "delta": {"content": w if i == 0 else " " + w}}]})
                chunk({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                if endpoint.usage and (req.get("stream_options") or {}).get("include_usage"):
                    chunk({"choices": [], "usage": usage})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "FakeEndpoint":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def outputs(path: Path, endpoint: str, revision: Optional[str], key: str = KEY, model: str = "deepseek-v4.1-flash",
            client_config: bool = True) -> str:  # fmt: skip
    """Write a stack outputs file as `pulumi stack output --json --show-secrets` prints it."""
    data = {"endpoint": endpoint, "model": model, "api_key": key, "memory_plan": {}, "nodes": []}
    if revision is not None:
        data["group_revision"] = revision
    if client_config:
        data["client_config"] = {"base_url": endpoint, "api_key": key, "model": model}
    path.write_text(json.dumps(data))
    return str(path)


# ---------------------------------------------------------------------------------- dspark diagnose


class DiagnoseCluster(FakeCluster):
    """FakeCluster plus what `dspark diagnose` asks: each node's versions, the first lines of a long log, the rails
    its preflight finds; a host in `hang` never answers (until `release` is set)."""

    VERSIONS = {"kernel": "6.11.0-1016-nvidia", "os": "Ubuntu 24.04.2 LTS", "docker": "28.3.3",
                "driver": "580.95.05", "gpu": "NVIDIA GB10"}  # fmt: skip

    def __init__(self, nodes: dict[str, FakeNode], hang: tuple[str, ...] = ()):
        super().__init__(nodes)
        self.hang = set(hang)
        self.release = threading.Event()

    def __call__(self, target: str, port: int, ssh_opts: list[str], remote: str) -> tuple[int, str]:
        host = target.partition("@")[2]
        if host in self.hang:
            with self.lock:
                self.calls.append((target, port, list(ssh_opts), remote))
            self.release.wait(60)
            return 255, f"ssh: connect to host {host} port {port}: Connection timed out\n"
        return super().__call__(target, port, ssh_opts, remote)

    def _script(self, node: FakeNode, script: str) -> tuple[int, str]:
        from dspark import cmd_diagnose
        from programs import rails

        if script.startswith(cmd_diagnose.VERSIONS_MARK + "\n"):
            names = re.findall(r"^printf '%s %s\\n' (\w+) ", script, re.M)
            container = shlex.split(re.search(r"--format '\{\{\.Image\}\}' (\S+)\)", script).group(1))[0]
            running = container in node.containers
            values = {**self.VERSIONS,
                      "container_image": "sha256:" + "ab12" * 16 if running else f"Error: No such object: {container}",
                      "image": "sha256:" + "ab12" * 16 + ' ["registry/engine@sha256:' + "cd34" * 16 + '"]',
                      "engine_version": "0.5.23" if running else f"Error response from daemon: No such container"}  # fmt: skip
            return 0, "".join(f"{n} {values.get(n, '')}\n" for n in names)
        m = re.fullmatch(r"docker logs (\S+) 2>&1 \| head -n (\d+)", script)
        if m:
            c = node.containers.get(shlex.split(m.group(1))[0])
            lines = c.log.splitlines()[: int(m.group(2))] if c else [f"Error: No such container: {m.group(1)}"]
            return 0, "".join(line + "\n" for line in lines)
        code, out = super()._script(node, script)
        if "preflight $node" in script:  # the rails its fabric check found
            report = {"fabric_netdev": "enp1s0f1np1", "hca": "rocep1s0f1,roceP2p1s0f1", "socket_ifname": None,
                      "gid_index": 3, "ports": {}, "rails": [
                          {"hca": "rocep1s0f1", "netdev": "enp1s0f1np1", "pci": "0000:01:00.1", "state": "ACTIVE",
                           "ip": "10.99.1.11", "gid_index": 3}]}  # fmt: skip
            out += f"{rails.REPORT_PREFIX} {json.dumps(report, sort_keys=True)}\n"
        return code, out


def fake_pulumi(bindir: Path, answers: dict[str, object]) -> Path:
    """A `pulumi` on PATH (put `bindir` first) that answers `pulumi <args> [--stack S]` from `answers`, keyed by the
    args without `--stack S` ("stack output --json", "config --show-secrets --json", "version", ...): a string is
    its stdout, anything else is printed as JSON; an unknown command fails. Each call's argv is appended to
    `bindir/calls`."""
    import sys

    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / "answers.json").write_text(json.dumps(answers))
    script = bindir / "pulumi"
    script.write_text(f"#!{sys.executable}\n" + (
        "import json, sys, pathlib\n"
        "here = pathlib.Path(__file__).parent\n"
        "args = sys.argv[1:]\n"
        "with open(here / 'calls', 'a') as f:\n"
        "    f.write(json.dumps(args) + '\\n')\n"
        "if '--stack' in args:\n"
        "    i = args.index('--stack')\n"
        "    del args[i:i + 2]\n"
        "answers = json.loads((here / 'answers.json').read_text())\n"
        "key = ' '.join(args)\n"
        "if key not in answers:\n"
        "    sys.stderr.write('error: no answer for pulumi ' + key + '\\n')\n"
        "    sys.exit(255)\n"
        "value = answers[key]\n"
        "sys.stdout.write(value if isinstance(value, str) else json.dumps(value))\n"
    ))  # fmt: skip
    script.chmod(0o755)
    return script
