"""CheckpointShare: the checkpoint reachable on every node as one docker volume.

nfs mode: the head exports the checkpoint read-only to exactly the worker fabric IPs, workers mount
it as a docker `local` volume with NFS options; the head binds it locally. local mode: every node
binds its own copy. With model.source: download, each node that holds a copy (the head in nfs mode,
every node in local mode) first fetches it, once per revision. Deleting these volumes never touches
the checkpoint files, and downloads are never deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from . import commands, plan
from .config import ClusterConfig
from .node import SparkNode


def holds_copy(cfg: ClusterConfig, rank: int) -> bool:
    return rank == 0 or cfg.share.mode == "local"


@dataclass(frozen=True)
class CheckpointShareArgs:
    cfg: ClusterConfig
    stack: str
    nodes: list[SparkNode]
    images: list[docker.RemoteImage]  # the download runs the engine image's huggingface-cli
    hf_token: Optional[Any] = None  # secret Output[str], for source: download


class CheckpointShare(pulumi.ComponentResource):
    """`export` (head, nfs mode only) and `volumes[i]` on node i."""

    def __init__(self, name: str, args: CheckpointShareArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:CheckpointShare", name, None, opts)
        cfg, stack, nodes = args.cfg, args.stack, args.nodes
        self.downloads: dict[int, remote.Command] = {}
        if cfg.model.source == "download":
            for rank, node in enumerate(nodes):
                if not holds_copy(cfg, rank):
                    continue
                self.downloads[rank] = remote.Command(
                    f"{name}-download-{node.node.name}",
                    connection=node.connection,
                    create=commands.download(cfg, stack),
                    stdin=args.hf_token,
                    triggers=[cfg.model.hf_repo, cfg.model.revision, cfg.model.checkpoint_dir],
                    add_previous_output_in_env=False,
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        # ~400 GiB per node: a downloaded checkpoint is never deleted by Pulumi.
                        retain_on_delete=True,
                        # Downloads run the engine image on a node that passed preflight.
                        depends_on=[node.preflight, args.images[rank]],
                    ),
                )
        self.export: Optional[remote.Command] = None
        if cfg.share.mode == "nfs" and len(nodes) > 1:
            self.export = remote.Command(
                f"{name}-export",
                connection=nodes[0].connection,
                create=commands.export_create(cfg, stack),
                delete=commands.export_delete(cfg, stack),
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # create and delete write the same exports file: remove the old one first.
                    delete_before_replace=True,
                    # The export only makes sense once the head passed its checkpoint checks (and downloaded it).
                    depends_on=[nodes[0].preflight, *self.downloads.values()],
                ),
            )
        self.volumes: list[docker.Volume] = []
        for rank, node in enumerate(nodes):
            nfs_client = self.export is not None and rank > 0
            before = [self.export] if nfs_client else ([self.downloads[rank]] if rank in self.downloads else [])
            self.volumes.append(
                docker.Volume(
                    f"{name}-{node.node.name}",
                    name=plan.checkpoint_volume_name(stack),
                    driver="local",
                    driver_opts=plan.volume_options(cfg, rank),
                    labels=[docker.VolumeLabelArgs(label="deepseek-spark.stack", value=stack)],
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        provider=node.docker,
                        # Fixed volume name per node: the old volume must go before the new one.
                        delete_before_replace=True,
                        # A worker's NFS volume mounts the head's export; a local copy must be downloaded first.
                        depends_on=before,
                    ),
                )
            )
        self.register_outputs({"volumes": [v.name for v in self.volumes]})
