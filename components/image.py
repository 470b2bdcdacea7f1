"""ServingImage: the engine image present on every node (pulled there by each node's engine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_docker as docker

from .node import SparkNode


@dataclass(frozen=True)
class ServingImageArgs:
    image: str
    nodes: list[SparkNode]
    timeout_minutes: int


class ServingImage(pulumi.ComponentResource):
    """One `RemoteImage` per node; `images[i]` belongs to `nodes[i]`."""

    def __init__(self, name: str, args: ServingImageArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:ServingImage", name, None, opts)
        self.images: list[docker.RemoteImage] = []
        for node in args.nodes:
            self.images.append(
                docker.RemoteImage(
                    f"{name}-{node.node.name}",
                    name=args.image,
                    # A multi-GB image shared with other stacks: destroy must not delete it.
                    keep_locally=True,
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        provider=node.docker,
                        # Pulling tens of GB over the node's uplink outlasts the 20 min default.
                        custom_timeouts=pulumi.CustomTimeouts(
                            create=f"{args.timeout_minutes}m", update=f"{args.timeout_minutes}m"
                        ),
                    ),
                )
            )
        self.register_outputs({"image_ids": [i.image_id for i in self.images]})
