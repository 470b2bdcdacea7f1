"""The stack's plan as one object: everything the program will create, per node, computed once from
the validated config. The Pulumi components receive their part of it (never the raw config), and
`python -m dspark plan` prints the same object, so what a reviewer reads is what `up` builds.

    sp = stackplan.build(cfg, "tp4", host_keys)     # pure: no Pulumi, no node
    sp.revision, sp.nodes[1].preflight, sp.group.specs[0].args, sp.memory
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import commands, plan
from .config import ClusterConfig, ImageBuildConfig


@dataclass(frozen=True)
class DownloadPlan:
    """model.source: download on a node that holds a copy: fetched once per revision."""

    create: str
    triggers: tuple[str, ...]


@dataclass(frozen=True)
class ShardPlan:
    """The node's engram shard (SGLang): packed once per checkpoint revision, TP layout and rank."""

    files: tuple[str, ...]
    create: str
    delete: str
    triggers: tuple[str, ...]
    retain: bool


@dataclass(frozen=True)
class NodePlan:
    name: str
    rank: int
    host: str
    fabric_ip: str
    ssh_port: int
    ssh_user: str
    docker_host: str  # ssh://user@host[:port] for the docker provider
    ssh_opts: tuple[str, ...]  # the system ssh client's options (docker provider, readiness probe)
    host_key: Optional[str]  # pinned for remote commands; None: not verified
    preflight: str  # read-only checks (commands.preflight)
    volume_name: str
    volume_options: dict[str, str]  # the checkpoint volume's driver_opts on this node
    download: Optional[DownloadPlan]
    shard: Optional[ShardPlan]

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


@dataclass(frozen=True)
class ImagePlan:
    name: str
    timeout_minutes: int
    build: Optional[ImageBuildConfig]


@dataclass(frozen=True)
class ExportPlan:
    """nfs mode with workers: the head's read-only export of the checkpoint."""

    create: str
    delete: str


@dataclass(frozen=True)
class GroupPlan:
    engine: str
    revision: str
    specs: tuple[plan.RankSpec, ...]
    key_file_create: str
    key_file_delete: str
    key_file_path: str
    generation_record: str


@dataclass(frozen=True)
class ReadinessPlan:
    command: str
    timeout_minutes: int  # for Pulumi: the probe's own timeout plus a margin


@dataclass(frozen=True)
class StackPlan:
    stack: str
    engine: str
    endpoint: str
    model: str
    revision: str  # the group revision: computed here only
    nodes: tuple[NodePlan, ...]
    image: ImagePlan
    export: Optional[ExportPlan]
    group: GroupPlan
    readiness: ReadinessPlan
    memory: plan.MemoryPlan


def _download(cfg: ClusterConfig, stack: str, rank: int) -> Optional[DownloadPlan]:
    holds_copy = rank == 0 or cfg.share.mode == "local"
    if cfg.model.source != "download" or not holds_copy:
        return None
    m = cfg.model
    return DownloadPlan(commands.download(cfg, stack), (m.hf_repo or "", m.revision, m.checkpoint_dir))


def _shard(cfg: ClusterConfig, stack: str, rank: int) -> Optional[ShardPlan]:
    if cfg.engine != "sglang" or cfg.engram is None:
        return None
    return ShardPlan(
        files=tuple(plan.shard_files(rank, cfg.serving.tp_size)),
        create=commands.engram_pack(cfg, stack, rank),
        delete=commands.engram_delete(cfg, rank),
        # What forces a repack: the checkpoint revision, the TP layout and the rank (and where it lives).
        triggers=(cfg.model.revision, f"tp={cfg.serving.tp_size}", f"rank={rank}", cfg.engram.dir),
        retain=cfg.engram.retain,
    )


def build(cfg: ClusterConfig, stack: str, host_keys: tuple[Optional[str], ...] = ()) -> StackPlan:
    """The whole plan of `stack` from its validated config (and the host keys config.load found)."""
    specs = tuple(plan.group_specs(cfg, stack))
    revision = plan.group_revision(list(specs), plan.image_build_digest(cfg))
    ssh_opts = tuple(commands.ssh_opts(cfg))
    nodes = tuple(
        NodePlan(
            name=n.name,
            rank=rank,
            host=n.host,
            fabric_ip=n.fabric_ip,
            ssh_port=n.ssh_port,
            ssh_user=n.ssh_user,
            docker_host=f"ssh://{n.ssh_user}@{n.host}" + ("" if n.ssh_port == 22 else f":{n.ssh_port}"),
            ssh_opts=ssh_opts,
            host_key=host_keys[rank] if rank < len(host_keys) else n.host_key,
            preflight=commands.preflight(cfg, stack, rank),
            volume_name=plan.checkpoint_volume_name(stack),
            volume_options=plan.volume_options(cfg, rank),
            download=_download(cfg, stack, rank),
            shard=_shard(cfg, stack, rank),
        )
        for rank, n in enumerate(cfg.nodes)
    )
    export = None
    if cfg.share.mode == "nfs" and len(cfg.nodes) > 1:
        export = ExportPlan(commands.export_create(cfg, stack), commands.export_delete(cfg, stack))
    return StackPlan(
        stack=stack,
        engine=cfg.engine,
        endpoint=plan.endpoint(cfg),
        model=cfg.model.served_name,
        revision=revision,
        nodes=nodes,
        image=ImagePlan(cfg.image, cfg.image_timeout_minutes, cfg.image_build),
        export=export,
        group=GroupPlan(
            engine=cfg.engine,
            revision=revision,
            specs=specs,
            key_file_create=commands.api_key_create(cfg, stack),
            key_file_delete=commands.api_key_delete(cfg, stack),
            key_file_path=plan.api_key_path(cfg, stack),
            generation_record=commands.generation_record(stack, revision),
        ),
        readiness=ReadinessPlan(commands.readiness(cfg, stack), cfg.readiness.timeout_seconds // 60 + 5),
        memory=plan.memory_plan(cfg),
    )
