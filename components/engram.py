"""EngramShards: each node's rank of the engram tables packed once onto its NVMe (~10 min)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from .node import SparkNode


@dataclass(frozen=True)
class EngramShardsArgs:
    nodes: list[SparkNode]  # each node's shard is its part of the plan: nodes[i].node.shard
    images: list[docker.RemoteImage]
    volumes: list[docker.Volume]


class EngramShards(pulumi.ComponentResource):
    """`shards[i]`: the pack command for rank i on node i."""

    def __init__(self, name: str, args: EngramShardsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:EngramShards", name, None, opts)
        self.shards: list[remote.Command] = []
        for rank, node in enumerate(args.nodes):
            shard = node.node.shard
            self.shards.append(
                remote.Command(
                    f"{name}-{node.node.name}",
                    connection=node.connection,
                    create=shard.create,
                    delete=shard.delete,
                    triggers=list(shard.triggers),
                    add_previous_output_in_env=False,
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        # Packing costs ~10 min per node: destroy keeps the shard unless engram.retain is false.
                        retain_on_delete=shard.retain,
                        # create and delete touch the same shard files: remove the old ones first.
                        delete_before_replace=True,
                        # The packer runs the engine image on the checkpoint volume, on a checked node.
                        depends_on=[node.preflight, args.images[rank], args.volumes[rank]],
                    ),
                )
            )
        self.register_outputs({"shards": [s.stdout for s in self.shards]})
