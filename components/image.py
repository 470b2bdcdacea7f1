"""ServingImage: the engine image present on every node: pulled by each node's engine, or, when
`imageBuild` is set, built on each node from a local context (the recipe's overlay on the base
image, like the reference's `start.sh build`; nothing is pushed to a registry). Then one image per
group: every node's image ID (of the pulled image, or of the base a build starts FROM) must agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import local

from .node import SparkNode
from planning.clusterplan import ImagePlan


def image_key(image: pulumi.CustomResource) -> pulumi.Output:
    """The image ID the node's docker reported for its serving image (a pull: imageId, which a refresh
    re-reads; a build: repoDigest, the local image ID when nothing is pushed)."""
    value = image.image_id if isinstance(image, docker.RemoteImage) else image.repo_digest
    return pulumi.Output.from_input(value).apply(lambda v: v or "")


@dataclass(frozen=True)
class ServingImageArgs:
    image: ImagePlan
    nodes: list[SparkNode]
    recheck_on: str = ""  # the group revision: the IDs are read again at every group (re)start


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
        self.agree = local.Command(
            f"{name}-agree",
            create=image_plan.agree,
            # read again when a node's image changes (a pull, a rebuild, a moved tag a refresh found) and before
            # every group start; a failed check is not kept, so the next `up` reads the nodes again
            triggers=[args.recheck_on, *(image_key(i) for i in self.images)],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, depends_on=self.images),  # the images just pulled or built
        )
        # `ref=id ...` the nodes agree on: the group generation follows it
        self.identity = self.agree.stdout
        self.register_outputs({"identity": self.identity})
