"""Pure planning: from a validated ClusterConfig to everything each node runs. No Pulumi here.

Everything a rank container runs with is computed once, as a RankSpec: its command line, environment and
entrypoint (planning/launch.py), its mounts and memory limit (planning/memoryplan.py); the components only map
specs to resources. The group revision is a hash of all specs, so any change to what any rank runs
with changes the label on every rank, and Pulumi replaces the whole tensor-parallel group.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import fabric, launch, memoryplan
from declared.cluster import ClusterConfig, NodeConfig

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # relative imageBuild.context paths start here
ENGRAM_LAYERS = (1, 14)
REVISION_LABEL = "deepseek-spark.group-revision"


def shard_files(rank: int, tp: int) -> list[str]:
    return [f"engram-l{layer}-r{rank}of{tp}.bin" for layer in ENGRAM_LAYERS]


# ---------------------------------------------------------------- ranks


def head(cfg: ClusterConfig) -> NodeConfig:
    return cfg.nodes[0]


def state_dir(cfg: ClusterConfig, user: str | None = None) -> str:
    """Where the API key file lives on the head (or on the node of `user`): root's /var/lib, or the
    ssh user's home (no sudo)."""
    if cfg.state_dir:
        return cfg.state_dir
    user = user or head(cfg).ssh_user
    return "/var/lib/deepseek-spark" if user == "root" else f"/home/{user}/.local/state/deepseek-spark"


def container_name(stack: str, rank: int) -> str:
    return f"{stack}-rank{rank}"


def compile_cache_prefix(stack: str) -> str:
    """The compile-cache volumes' name before the image key (components/caches.py adds it)."""
    return f"{stack}-compile-cache"


def checkpoint_volume_name(stack: str) -> str:
    return f"{stack}-checkpoint"


def api_key_path(cfg: ClusterConfig, stack: str) -> str:
    return f"{state_dir(cfg)}/{stack}/api-key"


def volume_options(cfg: ClusterConfig, rank: int) -> dict[str, str]:
    """driver_opts of the checkpoint volume on node `rank`: a bind of the local copy (the head, or
    every node in local mode), or an NFSv4 mount of the head's read-only export."""
    ckpt = cfg.model.checkpoint_dir
    if rank == 0 or cfg.share.mode == "local":
        return {"type": "none", "o": "bind", "device": ckpt}
    server = fabric.nfs_link(cfg, rank)[0]  # the head's address on the link it shares with this worker
    return {"type": "nfs", "o": ",".join([f"addr={server}", *cfg.share.mount_options]), "device": f":{ckpt}"}


@dataclass(frozen=True)
class Mount:
    target: str
    source: str
    type: str  # "volume" or "bind"
    read_only: bool


@dataclass(frozen=True)
class RankSpec:
    """Everything one rank container runs with; hashed into the group revision."""

    rank: int
    node: str
    container_name: str
    image: str
    entrypoint: list[str]
    args: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    checkpoint: dict[str, str]  # how the checkpoint volume is mounted on this node (a change restarts the group)
    generation: int  # serving.generation: bump it to restart the whole group on purpose
    ulimits: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {"memlock": (-1, -1), "stack": (67108864, 67108864), "nofile": (1048576, 1048576)}
    )
    devices: list[str] = field(default_factory=lambda: ["/dev/infiniband"])
    # the container's memory limit (memory = memory_swap: no swap): what the node's budget gives the rank
    # (planning/budget.py, memoryplan.rank_memory_mib)
    memory_mib: int | None = None
    # docker's own spelling (CAP_ prefix): what the docker plugin reads back on a refresh, so that a refresh of a
    # running rank is no change (with "IPC_LOCK" the next `up` replaced every rank)
    capabilities: list[str] = field(default_factory=lambda: ["CAP_IPC_LOCK"])
    network_mode: str = "host"
    ipc_mode: str = "host"
    gpus: str = "all"
    restart: str = "no"

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


def rank_specs(cfg: ClusterConfig, stack: str, limits: list[int] | None = None) -> list[RankSpec]:
    """`limits`: each rank's memory limit from the stack's budget (planning/budget.py); default: the group
    alone on its nodes."""
    specs = []
    for rank, node in enumerate(cfg.nodes):
        mounts = [
            Mount(launch.MODEL_MOUNT, checkpoint_volume_name(stack), "volume", True),
            Mount(launch.ENGRAM_MOUNT, cfg.engram.dir, "bind", False),
            Mount(launch.CACHE_MOUNT, compile_cache_prefix(stack), "volume", False),
        ]
        if rank == 0:
            mounts.append(Mount(launch.API_KEY_MOUNT, api_key_path(cfg, stack), "bind", True))
        specs.append(
            RankSpec(
                rank=rank,
                node=node.name,
                container_name=container_name(stack, rank),
                image=cfg.image,
                entrypoint=["/bin/sh", "-c", launch.launch_wrapper(), "sglang-launch"],
                args=launch.sglang_args(cfg, rank),
                env=launch.rank_env(cfg, rank),
                mounts=mounts,
                checkpoint=volume_options(cfg, rank),
                generation=cfg.serving.generation,
                memory_mib=limits[rank] if limits else memoryplan.rank_memory_mib(cfg, rank),
            )
        )
    return specs


def vllm_specs(cfg: ClusterConfig, stack: str, limits: list[int] | None = None) -> list[RankSpec]:
    """backend ray: node 0 runs a Ray head + `vllm serve` once every Ray worker joined, other nodes a Ray
    worker. backend mp: every node runs `vllm serve`, node 0 with the API, the others --headless."""
    mp = cfg.serving.distributed_executor_backend == "mp"
    specs = []
    for rank, node in enumerate(cfg.nodes):
        mounts = [Mount(launch.MODEL_MOUNT, checkpoint_volume_name(stack), "volume", True),
                  Mount(launch.CACHE_MOUNT, compile_cache_prefix(stack), "volume", False)]
        if rank == 0:
            mounts.append(Mount(launch.API_KEY_MOUNT, api_key_path(cfg, stack), "bind", True))
        if mp:
            run, key, role = 'exec vllm "$@"', ("env:VLLM_API_KEY" if rank == 0 else None), "vllm-node"
            args = launch.vllm_serve_args(cfg, rank) + launch.vllm_mp_args(cfg, rank)
        elif rank == 0:
            run, key, role = launch.vllm_head_run(cfg), "env:VLLM_API_KEY", "vllm-head"
            args = launch.vllm_serve_args(cfg)
        else:
            run, key, role = launch.RAY_WORKER_RUN, None, "ray-worker"
            args = ["ray", "start", "--block", "--address", f"{fabric.bootstrap_ip(cfg, 0)}:{cfg.serving.ray_port}",
                    "--node-ip-address", fabric.bootstrap_ip(cfg, rank), "--num-gpus", "1",
                    "--disable-usage-stats", *launch.ray_ports_args(cfg)]  # fmt: skip
        specs.append(
            RankSpec(rank=rank, node=node.name, container_name=container_name(stack, rank), image=cfg.image,
                     entrypoint=["/bin/sh", "-c", launch.launch_wrapper(run, key=key), role], args=args,
                     env=launch.vllm_env(cfg, rank), mounts=mounts, checkpoint=volume_options(cfg, rank),
                     generation=cfg.serving.generation,
                     memory_mib=limits[rank] if limits else memoryplan.rank_memory_mib(cfg, rank))
        )  # fmt: skip
    return specs


def rank_checks(cfg: ClusterConfig, spec: RankSpec) -> list[tuple[str, list[str]]]:
    """What the image's own parsers check for one rank before the group starts: (engine, argv) pairs,
    the exact argv the rank's entrypoint hands to each program (programs/argcheck.py), less the
    head's `--api-key <key>` that its wrapper appends from the key file (no key on a command line)."""
    if cfg.engine == "sglang":
        return [("sglang", spec.args)]
    if spec.args[:1] == ["ray"]:  # a Ray worker
        return [("ray", spec.args[1:])]
    checks = [("vllm", spec.args)]
    if cfg.serving.distributed_executor_backend == "ray":
        checks.insert(0, ("ray", launch.ray_head_args(cfg, str(cfg.serving.ray_port), fabric.bootstrap_ip(cfg, spec.rank))))
    return checks


def group_specs(cfg: ClusterConfig, stack: str, limits: list[int] | None = None) -> list[RankSpec]:
    """`limits`: as rank_specs. Both engines serve /metrics (vLLM always; SGLang with --enable-metrics)."""
    return vllm_specs(cfg, stack, limits) if cfg.engine == "vllm" else rank_specs(cfg, stack, limits)


# ---------------------------------------------------------------- the image built on the nodes, the group revision


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """One .dockerignore pattern as Docker matches it (Go filepath.Match, plus `**` for any depth)."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/" also matches no directory at all
                i += 1
                out += "(?:.*/)?"
            else:
                out += ".*"
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c) or (c if c in "[]-^" else re.escape(c))
        i += 1
    return re.compile(out + r"\Z")


def dockerignore(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """The context's .dockerignore as (exclude?, regex) rules, in file order (the last match wins)."""
    path = context / ".dockerignore"
    rules = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        line = posixpath.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((exclude, _ignore_regex(line)))
    return rules


def context_files(context: Path) -> list[str]:
    """The files `docker build` sends for `context`: everything but what .dockerignore excludes (a
    pattern that matches a directory excludes what is under it; `!` patterns re-include)."""
    rules = dockerignore(context)
    kept = []
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        parts = rel.split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        excluded = False
        for exclude, regex in rules:
            if any(regex.match(c) for c in candidates):
                excluded = exclude
        if not excluded:
            kept.append(rel)
    return kept


def build_context_digest(context: Path, dockerfile: str, args: dict[str, str] | None = None,
                         platform: str | None = None) -> str:  # fmt: skip
    """Hash of what a build of `context` depends on, as pulumi-docker's Image hashes it: every file
    the build would send (names, modes, contents; .dockerignore honoured, so an ignored file changes
    nothing), the Dockerfile, the build args and the platform. A change rebuilds the image on every
    node and, through the group revision, restarts the whole group."""
    h = hashlib.sha256()
    for rel in context_files(context):
        path = context / rel
        h.update(f"{rel}\0{path.stat().st_mode & 0o777:o}\0".encode())
        h.update(path.read_bytes())
    h.update(dockerfile.encode())
    h.update(json.dumps({"args": dict(sorted((args or {}).items())), "platform": platform}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def image_build_digest(cfg: ClusterConfig) -> str:
    """"" when the image is pulled; the build's digest (context, args, platform) when it is built on the nodes."""
    b = cfg.image_build
    if b is None:
        return ""
    return build_context_digest(PROJECT_ROOT / b.context, b.dockerfile, b.args, b.platform)


_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?\s*$", re.I | re.M)
_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?\s*$", re.M)


def base_images(dockerfile_text: str, args: dict[str, str] | None = None) -> list[str]:
    """The images a Dockerfile builds FROM (registry refs, not earlier stages), `${ARG}`s resolved from
    the build args and the ARG defaults before the first FROM."""
    values = {m.group(1): m.group(2) or "" for m in _ARG.finditer(dockerfile_text.split("FROM", 1)[0])}
    values.update(args or {})
    refs, stages = [], set()
    for m in _FROM.finditer(dockerfile_text):
        ref = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda v: values.get(v.group(1), ""), m.group(1))
        if ref.lower() not in stages and ref != "scratch" and ref not in refs:
            refs.append(ref)
        if m.group(2):
            stages.add(m.group(2).lower())
    return refs


def image_identity_refs(cfg: ClusterConfig) -> list[str]:
    """What must be the same image on every node of a group: the pulled image itself, or, for an image built
    on each node (whose IDs always differ: a build records its time), the base images it is built FROM."""
    b = cfg.image_build
    if b is None:
        return [cfg.image]
    return base_images((PROJECT_ROOT / b.context / b.dockerfile).read_text(), b.args) or [cfg.image]


def group_revision(specs: list[RankSpec], image_build: str = "") -> str:
    """Short hash of everything any rank runs with (and the overlay build's digest, when the image is
    built on the nodes). Deterministic: sorted keys, no timestamps."""
    blob = json.dumps([asdict(s) for s in specs], sort_keys=True, separators=(",", ":")) + image_build
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def endpoint(cfg: ClusterConfig) -> str:
    return f"http://{head(cfg).host}:{cfg.serving.port}/v1"
