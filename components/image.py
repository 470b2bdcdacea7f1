"""ServingImage: the engine image present on every node: pulled by each node's engine, or, when
`imageBuild` is set, built on each node from a local context (the recipe's overlay on the base
image, like the reference's `start.sh build`; nothing is pushed to a registry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_docker as docker

from .node import SparkNode
from planning.stackplan import ImagePlan


@dataclass(frozen=True)
class ServingImageArgs:
    image: ImagePlan
    nodes: list[SparkNode]


class ServingImage(pulumi.ComponentResource):
    """One image resource per node; `images[i]` belongs to `nodes[i]`."""

    def __init__(self, name: str, args: ServingImageArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:ServingImage", name, None, opts)
        image_plan, build = args.image, args.image.build
        self.images: list[pulumi.CustomResource] = []
        for node in args.nodes:
            node_opts = pulumi.ResourceOptions(
                parent=self,
                provider=node.docker,
                # Pulling or building tens of GB on the node outlasts the 20 min default.
                custom_timeouts=pulumi.CustomTimeouts(
                    create=f"{image_plan.timeout_minutes}m", update=f"{image_plan.timeout_minutes}m"
                ),
            )
            if build is None:
                image = docker.RemoteImage(
                    f"{name}-{node.node.name}",
                    name=image_plan.name,
                    # A multi-GB image shared with other stacks: destroy must not delete it.
                    keep_locally=True,
                    opts=node_opts,
                )
            else:
                image = docker.Image(
                    f"{name}-{node.node.name}",
                    image_name=image_plan.name,
                    build=docker.DockerBuildArgs(
                        context=build.context,
                        dockerfile=f"{build.context}/{build.dockerfile}",
                        args=dict(sorted(build.args.items())),
                        platform=build.platform,
                    ),
                    skip_push=True,
                    opts=node_opts,
                )
            self.images.append(image)
        self.register_outputs({})
