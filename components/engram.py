"""EngramShards: each node's rank of the engram tables packed once onto its NVMe (~10 min)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from . import commands
from .config import ClusterConfig
from .node import SparkNode


def triggers(cfg: ClusterConfig, rank: int) -> list[str]:
    """What forces a repack: the checkpoint revision, the TP layout and the rank (and where it lives)."""
    return [cfg.model.revision, f"tp={cfg.serving.tp_size}", f"rank={rank}", cfg.engram.dir]


@dataclass(frozen=True)
class EngramShardsArgs:
    cfg: ClusterConfig
    stack: str
    nodes: list[SparkNode]
    images: list[docker.RemoteImage]
    volumes: list[docker.Volume]


class EngramShards(pulumi.ComponentResource):
    """`shards[i]`: the pack command for rank i on node i."""

    def __init__(self, name: str, args: EngramShardsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:EngramShards", name, None, opts)
        cfg = args.cfg
        self.shards: list[remote.Command] = []
        for rank, node in enumerate(args.nodes):
            self.shards.append(
                remote.Command(
                    f"{name}-{node.node.name}",
                    connection=node.connection,
                    create=commands.engram_pack(cfg, args.stack, rank),
                    delete=commands.engram_delete(cfg, rank),
                    triggers=triggers(cfg, rank),
                    add_previous_output_in_env=False,
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        # Packing costs ~10 minutes per node: keep shards on destroy unless engram.retain is false.
                        retain_on_delete=cfg.engram.retain,
                        # Old and new shard share paths: the delete of the old must not run after the new pack.
                        delete_before_replace=True,
                        # Packing reads the checkpoint volume with the serving image, after preflight passed.
                        depends_on=[node.preflight, args.images[rank], args.volumes[rank]],
                    ),
                )
            )
        self.register_outputs({"shards": [s.stdout for s in self.shards]})
