"""The guard's plan (pure): what runs on every node of a group so that the group serves again by itself
after a rank crash, a reboot or a power cut (programs/guard).

Per node: a directory on the host (`<stateDir>/guard/<group>`) holding the guard's archive (`guard.pyz`:
the guard and the gate programs it runs, one deterministic zip), the group's token (0600) and, on the
head, the leader's journal and the maintenance marker; a container `<group>-guard` in the serving image
(python3), host network and PID namespace (it reaches the other guards and the head's API on the
management network, and runs the start gates on the node itself), the node's docker socket, a restart
policy (back after a reboot), a memory limit. Its arguments carry the IDs of the rank containers Pulumi
created: the only containers it ever starts, and why Pulumi replaces it whenever the group changes.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shlex
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import commands, exposure, launch, plan
from declared.cluster import ClusterConfig

q = shlex.quote
ROOT = Path(__file__).resolve().parents[1]
# What the archive holds: the guard and what it imports (the router membership, the probe) or runs on the
# host (the gate programs).
BUNDLE_FILES = (
    "programs/__init__.py", "programs/bootlog.py", "programs/membership.py", "programs/memgate.py",
    "programs/probe.py", "programs/rails.py", "programs/tunnel.py",
    *sorted(f"programs/guard/{p.name}" for p in (ROOT / "programs/guard").glob("*.py") if p.name != "__main__.py"),
)  # fmt: skip
ARCHIVE_MAIN = "from programs.guard.main import main\nraise SystemExit(main())\n"
STATE_MOUNT = "/state"  # the guard's directory on the host, inside its container
ARCHIVE = "guard.pyz"
TOKEN = "token"
DOCKER_SOCKET = "/var/run/docker.sock"
ROLE_LABEL = "guard"
TOKEN_GENERATE = "python3 -c 'import secrets; print(secrets.token_hex(32))'"  # where Pulumi runs, kept as a secret


def archive() -> bytes:
    """The guard as one zip `python3` runs (zipapp layout), byte for byte the same for the same sources."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in [("__main__.py", ARCHIVE_MAIN), *((f, (ROOT / f).read_text()) for f in BUNDLE_FILES)]:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, text)
    return buf.getvalue()


ARCHIVE_BYTES = archive()
ARCHIVE_B64 = base64.b64encode(ARCHIVE_BYTES).decode() + "\n"  # what the bundle command reads on stdin
DIGEST = hashlib.sha256(ARCHIVE_BYTES).hexdigest()[:16]


def container_name(group: str) -> str:
    """The guard's container on every node of group `group` (its plan name)."""
    return f"{group}-guard"


def directory(cfg: ClusterConfig, rank: int, group: str) -> str:
    """The guard's directory on node `rank`'s host."""
    return f"{plan.state_dir(cfg, cfg.nodes[rank].ssh_user)}/guard/{group}"


def bundle_write(path: str, s: str = "") -> str:
    """Write the archive (base64 on stdin) to `path`, replacing it in one rename (literal paths only: the policy
    pack reads every path a script moves or deletes)."""
    tmp = f"{path}.tmp"
    return (
        "set -eu\n"
        f"{s}mkdir -p {q(path.rsplit('/', 1)[0])}\n"
        f"base64 -d | {s}tee {q(tmp)} >/dev/null\n"
        f"{s}chmod 644 {q(tmp)}\n"
        f"{s}mv {q(tmp)} {q(path)}\n"
    )


def bundle_delete(dir_: str, s: str = "") -> str:
    """On destroy: the archive, the journal and the maintenance marker, then the directory if empty."""
    files = " ".join(q(f"{dir_}/{name}") for name in (ARCHIVE, "journal.json", "paused.json", "retry"))
    return f"{s}rm -f {files}\n{s}rmdir {q(dir_)} 2>/dev/null || true\n"


@dataclass(frozen=True)
class GuardMount:
    target: str
    source: str
    read_only: bool


@dataclass(frozen=True)
class GuardNode:
    rank: int
    node: str
    host: str  # the management address: where the leader and Prometheus reach this guard
    container_name: str  # <group>-guard
    memory_mib: int  # its container's limit (serving.selfHeal.memoryMiB), counted in its node's budget
    image: str
    dir: str
    bundle_write: str
    bundle_delete: str
    token_create: str
    token_delete: str
    gates: tuple[tuple[str, str, tuple[str, ...]], ...]  # (gate, program in the archive, its arguments)
    mounts: tuple[GuardMount, ...]
    url: str

    @property
    def role(self) -> str:
        return "leader" if self.rank == 0 else "follower"


@dataclass(frozen=True)
class GuardPlan:
    group: str  # the group's plan name (`<stack>` or `<stack>-<group>`): its containers' prefix
    stack: str
    port: int
    nodes: tuple[GuardNode, ...]
    heal: dict  # programs.guard.heal.HealPlan's fields
    settings: dict  # programs.guard.decide.Settings' fields
    interval: int

    @property
    def labels(self) -> dict[str, str]:
        return {"deepseek-spark.stack": self.group, "deepseek-spark.role": ROLE_LABEL,
                "deepseek-spark.guard-archive": DIGEST}  # fmt: skip

    def base_args(self, rank: int) -> list[str]:
        """The guard's arguments on node `rank` that need no container ID (known at preview: what a policy reads)."""
        n = self.nodes[rank]
        return [f"{STATE_MOUNT}/{ARCHIVE}", "--stack", self.stack, "--group", self.group, "--node", n.node,
                "--rank", str(rank), "--role", n.role, "--bind", n.host, "--port", str(self.port), "--state-dir", STATE_MOUNT,
                "--token-file", f"{STATE_MOUNT}/{TOKEN}", "--gates", json.dumps([[g, p, list(a)] for g, p, a in n.gates])]

    def leader_json(self, ids: dict[int, str]) -> str:
        """The leader's `--leader` document, given the rank containers' IDs: its peers, how to heal, when to stop."""
        peers = [{"rank": p.rank, "node": p.node, "url": p.url, "container": ids[p.rank]} for p in self.nodes[1:]]
        return json.dumps({"peers": peers, "heal": self.heal, "settings": self.settings,
                           "key_file": launch.API_KEY_MOUNT, "interval": self.interval}, sort_keys=True)  # fmt: skip

    def args(self, rank: int, ids: dict[int, str]) -> list[str]:
        """The guard's arguments on node `rank`, given the rank containers' IDs (Pulumi's outputs)."""
        argv = [*self.base_args(rank), "--container", ids[rank]]
        return argv + (["--leader", self.leader_json(ids)] if rank == 0 else [])


def fabric_json(report: Optional[dict]) -> str:
    """The leader's `--fabric`: the floor and each pair's total of the group's last bandwidth gate (its report, the
    `fabric` output), which it serves as metrics; `{}` when the gate printed none."""
    if not report:
        return "{}"
    pairs = [{"a": p["a"], "b": p["b"], "totalGbps": p["totalGbps"]} for p in report.get("pairs", [])]
    return json.dumps({"floorGbps": report.get("floorGbps", 0), "pairs": pairs}, sort_keys=True)


def orders(cfg: ClusterConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(start order, stop order) of the ranks, as Pulumi creates and deletes them: SGLang's head depends on
    every worker (workers first, the head last; the head deleted first), vLLM's workers join the head's Ray
    or master (the head first, the workers last; they are deleted first)."""
    workers = tuple(range(1, len(cfg.nodes)))
    if cfg.engine == "sglang":
        return (*workers, 0), (0, *workers)
    return (0, *workers), (*workers, 0)


def build(cfg: ClusterConfig, group: str, stack: str, router: Optional[str] = None,
          worker: Optional[str] = None, needs: Optional[tuple[int, ...]] = None) -> Optional[GuardPlan]:  # fmt: skip
    """The group's guard plan; None with serving.selfHeal off. `router`/`worker`: behind a router, its URL and
    the group's rank-0 URL as the router knows it; `needs`: each rank's need from its node's memory budget (the
    figure the program's memory gate checks, planning/budget.py)."""
    sh = cfg.serving.self_heal
    if not sh.enabled:
        return None
    nodes = []
    for rank, n in enumerate(cfg.nodes):
        d, s = directory(cfg, rank, group), commands.key_sudo(cfg, n.ssh_user)
        gates = [("rails", "rails.py", tuple(commands.rails_check_args(cfg, rank)))]
        if cfg.memory.memory_gate:
            need = needs[rank] if needs else None
            gates.append(("memory", "memgate.py", tuple(commands.memgate_args(cfg, rank, need_mib=need))))
        mounts = [GuardMount(STATE_MOUNT, d, False), GuardMount(DOCKER_SOCKET, DOCKER_SOCKET, False)]
        if rank == 0:  # the leader asks the group (and the router) with the stack's key, as readiness does
            mounts.append(GuardMount(launch.API_KEY_MOUNT, plan.api_key_path(cfg, group), True))
        nodes.append(GuardNode(
            rank=rank, node=n.name, host=exposure.node_bind(cfg, rank), container_name=container_name(group), memory_mib=sh.memory_mib, image=cfg.image, dir=d,
            bundle_write=bundle_write(f"{d}/{ARCHIVE}", s), bundle_delete=bundle_delete(d, s),
            token_create=commands.secret_file_create(f"{d}/{TOKEN}", s),
            token_delete=commands.secret_file_delete(f"{d}/{TOKEN}", s),
            gates=tuple(gates), mounts=tuple(mounts), url=f"http://{n.host}:{sh.port}",
        ))  # fmt: skip
    start, stop = orders(cfg)
    r = cfg.readiness
    heal = {"engine": cfg.engine, "start_order": list(start), "stop_order": list(stop),
            "url": f"http://{exposure.engine_bind(cfg, 0)}:{cfg.serving.port}/v1", "model": cfg.model.served_name, "prompt": r.prompt,
            "expect": r.expect, "boot_timeout": r.timeout_seconds, "interval": r.interval_seconds,
            "grace": sh.stop_grace_seconds, "router": router, "worker": worker}  # fmt: skip
    settings = {"max_attempts": sh.max_attempts, "backoff_s": sh.backoff_seconds, "hang_s": sh.hang_seconds,
                "stable_s": sh.stable_seconds}  # fmt: skip
    return GuardPlan(group, stack, sh.port, tuple(nodes), heal, settings, sh.interval_seconds)
