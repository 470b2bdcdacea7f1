"""Node access: run one command on a node over the system ssh, the way the program reaches nodes.

A `Runner` is `(target, port, ssh_opts, remote) -> (exit code, stdout+stderr)`; the default is
`programs.probe.on_node` (system `ssh`, `commands.ssh_opts(cfg)`, `-p <sshPort>`,
`<sshUser>@<host>`), so the stack's known_hosts file is what ssh checks. A `Streamer` is the same
call returning the output line by line as it arrives (for `logs --follow`). Tests inject fakes.

Every remote command is one shell string; every interpolated value goes through shlex.quote.
Scripts run under `sh -c` so the ssh user's login shell does not matter.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, TypeVar

from planning import commands, fabric, plan
from programs import memgate, probe, rails
from declared.cluster import ClusterConfig

q = shlex.quote

Runner = Callable[[str, int, list[str], str], tuple[int, str]]
Streamer = Callable[[str, int, list[str], str], Iterator[str]]

SECRET = probe.SECRET
redact = probe.redact  # one redaction for the program's probe and this CLI
SSH_FAILED = 255  # ssh's own exit code when it could not connect or authenticate

T = TypeVar("T")


def sh_c(script: str) -> str:
    """A script as one remote command, run by POSIX sh whatever the login shell is."""
    return "sh -c " + q(script)


def stream_on_node(target: str, port: int, ssh_opts: list[str], remote: str) -> Iterator[str]:
    """Run `remote` on a node through the system ssh and yield its output lines as they arrive."""
    argv = probe.ssh_argv(target, port, ssh_opts, remote)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            yield line.rstrip("\n")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()


@dataclass(frozen=True)
class Node:
    rank: int
    name: str
    host: str
    user: str
    port: int
    container: str

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}"

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"

    def label(self) -> str:
        return f"rank{self.rank} {self.name}"


class Nodes:
    """The stack's nodes and how to reach them."""

    def __init__(self, cfg: ClusterConfig, stack: str, runner: Optional[Runner] = None,
                 streamer: Optional[Streamer] = None, forward: Optional[Callable] = None):  # fmt: skip
        """`forward`: how to reach a node's inner port (programs.tunnel.forward's shape: an ssh tunnel by default)."""
        self.cfg = cfg
        self.forward = forward
        self.stack = stack
        self.ssh_opts = commands.ssh_opts(cfg)
        self._runner = runner
        self._streamer = streamer
        self.nodes = [
            Node(rank, n.name, n.host, n.ssh_user, n.ssh_port, plan.container_name(stack, rank))
            for rank, n in enumerate(cfg.nodes)
        ]

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, rank: int) -> Node:
        return self.nodes[rank]

    def run(self, node: Node, remote: str) -> tuple[int, str]:
        runner = self._runner or probe.on_node
        return runner(node.target, node.port, list(self.ssh_opts), remote)

    def stream(self, node: Node, remote: str) -> Iterator[str]:
        streamer = self._streamer or stream_on_node
        return streamer(node.target, node.port, list(self.ssh_opts), remote)

    def each(self, fn: Callable[[Node], T], subset: Optional[list[Node]] = None) -> list[T]:
        """fn(node) for every node (or those of `subset`) in parallel, results in that order."""
        targets = self.nodes if subset is None else subset
        with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
            return list(pool.map(fn, targets))

    def ssh_hint(self, node: Node) -> str:
        return shlex.join(["ssh", *self.ssh_opts, "-p", str(node.port), node.target, "true"])


# ------------------------------------------------------------------------------ remote commands

INSPECT_FORMAT = "{{json .State}} {{json .Config.Labels}}"
GPU_MEMORY = (
    "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null; echo ---; "
    "nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits 2>/dev/null; true"
)
_DURATION = re.compile(
    r"^(?:(?:\d+(?:\.\d+)?(?:ns|us|ms|s|m|h))+|\d+|\d{4}-\d{2}-\d{2}(?:T[0-9:.]+(?:Z|[+-]\d{2}:\d{2})?)?)$"
)


def valid_since(value: str) -> bool:
    """What `docker logs --since` takes: a Go duration (10m, 1h30m), a unix time, or an RFC 3339 date."""
    return bool(_DURATION.match(value))


def inspect_cmd(container: str) -> str:
    return f"docker inspect --format {q(INSPECT_FORMAT)} {q(container)}"


def logs_cmd(container: str, tail: Optional[str] = None, since: Optional[str] = None, follow: bool = False) -> str:
    parts = ["docker", "logs"]
    if follow:
        parts.append("--follow")
    if tail is not None:
        parts += ["--tail", str(tail)]
    if since:
        parts += ["--since", since]
    parts.append(container)
    return " ".join(q(p) for p in parts) + " 2>&1"


def files_cmd(paths: list[str]) -> str:
    """Prints `present <path>` or `missing <path>` for each file."""
    quoted = " ".join(q(p) for p in paths)
    return sh_c(f'for f in {quoted}; do if [ -f "$f" ]; then echo "present $f"; else echo "missing $f"; fi; done')


def volume_probe_cmd(volume: str, sudo: str = "") -> str:
    """The volume's mountpoint, whether it is mounted, and whether `stat -f` answers within 5 s
    (a stale or hung NFS mount does not). Output lines: `mountpoint <p>`, `mounted yes|no`,
    `stat ok` or `stat fail <exit code> <message>`; `volume missing <message>` if there is none."""
    return sh_c(
        f"mp=$(docker volume inspect --format '{{{{.Mountpoint}}}}' {q(volume)} 2>&1) || "
        '{ echo "volume missing $mp"; exit 0; }\n'
        'echo "mountpoint $mp"\n'
        'if grep -q " $mp " /proc/mounts 2>/dev/null; then echo "mounted yes"; else echo "mounted no"; fi\n'
        f'if out=$({sudo}timeout -k 2 5 stat -f "$mp" 2>&1); then echo "stat ok"; '
        'else rc=$?; echo "stat fail $rc $(printf %s "$out" | head -n 1)"; fi\n'
    )


def preflight_cmd(script: str) -> str:
    return sh_c(script)


def memory_cmd(gate: str, program: str) -> str:
    """The memory gate's command line (commands.memgate, report-only) with programs/memgate.py fed to it
    in a quoted heredoc, as the stack's gate feeds it on stdin."""
    return sh_c(f"{gate} <<'DSPARK_MEMGATE'\n{program}\nDSPARK_MEMGATE\n")


def parse_memory(out: str) -> dict | None:
    """The memory gate's figures (its `deepseek-spark memory:` line), None when it printed none."""
    for line in reversed(out.splitlines()):
        if line.startswith(memgate.REPORT_PREFIX):
            try:
                return json.loads(line[len(memgate.REPORT_PREFIX):])
            except ValueError:
                return None
    return None


# ------------------------------------------------------------------------------ parsing

@dataclass
class Container:
    """One rank container as `docker inspect` sees it. `state` is docker's State.Status, or
    `missing` (no such container), `unreachable` (ssh failed) or `error` (inspect failed)."""

    state: str
    exit_code: Optional[int] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    oom_killed: bool = False
    error: Optional[str] = None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def exists(self) -> bool:
        return self.state not in ("missing", "unreachable", "error")

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def known(self) -> bool:
        return self.state not in ("unreachable", "error")


def _time(value: object) -> Optional[str]:
    """docker's RFC 3339 time to seconds; None for its zero time (never started / finished)."""
    if not isinstance(value, str) or not value or value.startswith("0001-01-01"):
        return None
    m = re.match(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})", value)
    return (m.group(1) + ("Z" if value.endswith("Z") else "")) if m else value


def parse_inspect(code: int, out: str) -> Container:
    if code != 0:
        text = out.strip().splitlines()[-1] if out.strip() else f"exit code {code}"
        if "No such object" in out or "No such container" in out:
            return Container("missing", error=text)
        if code == SSH_FAILED:
            return Container("unreachable", error=text)
        return Container("error", error=text)
    decoder = json.JSONDecoder()
    try:
        text = out.strip()
        state, end = decoder.raw_decode(text)
        labels, _ = decoder.raw_decode(text[end:].lstrip())
    except ValueError:
        return Container("error", error=f"unexpected docker inspect output: {out.strip()[:200]!r}")
    if not isinstance(state, dict):
        return Container("error", error="docker inspect printed no State")
    return Container(
        state=str(state.get("Status") or "unknown"),
        exit_code=state.get("ExitCode") if isinstance(state.get("ExitCode"), int) else None,
        started_at=_time(state.get("StartedAt")),
        finished_at=_time(state.get("FinishedAt")),
        oom_killed=bool(state.get("OOMKilled")),
        error=(state.get("Error") or None),
        labels=labels if isinstance(labels, dict) else {},
    )


def parse_gpu(code: int, out: str) -> tuple[Optional[int], Optional[str]]:
    """(MiB in use, source): nvidia-smi's memory.used, else the sum of its compute apps' used
    memory (a GB10 reports memory.used as [N/A]: its memory is unified); (None, None) when neither."""
    if code != 0:
        return None, None
    gpu_part, _, apps_part = out.partition("---")
    values = [int(v) for v in re.findall(r"^\s*(\d+)\s*$", gpu_part, re.M)]
    if values:
        return sum(values), "memory.used"
    apps = [int(v) for v in re.findall(r"^\s*(\d+)\s*$", apps_part, re.M)]
    if apps:
        return sum(apps), "compute-apps"
    return None, None


def parse_files(out: str) -> tuple[list[str], list[str]]:
    present, missing = [], []
    for line in out.splitlines():
        word, _, path = line.partition(" ")
        if word == "present":
            present.append(path)
        elif word == "missing":
            missing.append(path)
    return present, missing


def parse_preflight(out: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(passed checks, [(failed check, message)]) from the preflight script's output."""
    ok, failed = [], []
    for line in out.splitlines():
        m = re.match(r"^preflight [^:]*: ok (\S+)\s*$", line)
        if m:
            ok.append(m.group(1))
            continue
        m = re.match(r"^preflight [^:]*: FAIL ([^:\s]+): (.*)$", line)
        if m:
            failed.append((m.group(1), m.group(2)))
    return ok, failed


def parse_preflight_notes(out: str) -> list[str]:
    """The preflight's notes (reported, not failed), e.g. no user-space OOM guard."""
    return [m.group(1) for m in re.finditer(r"^preflight ([^:]*: note \S+: .*)$", out, re.M)]


def preflight_checks(script: str) -> list[str]:
    """The check names a preflight script reports (`ok <name>`), in order (the fabric program's own
    checks where the script runs it)."""
    seen: list[str] = []
    names = re.findall(r"\bok ([a-z0-9][a-z0-9-]*)", script.split(fabric.RAILS_EOF)[0])
    if fabric.RAILS_EOF in script:
        names += list(rails.CHECKS)
    names += re.findall(r"\bok ([a-z0-9][a-z0-9-]*)", script.split(fabric.RAILS_EOF)[-1])
    for name in names:
        if name not in seen:
            seen.append(name)
    return seen


def fabric_report(out: str) -> dict | None:
    """The rails the node's preflight found (its `deepseek-spark fabric:` line)."""
    lines = [line for line in out.splitlines() if line.startswith(rails.REPORT_PREFIX)]
    return json.loads(lines[-1][len(rails.REPORT_PREFIX):]) if lines else None
