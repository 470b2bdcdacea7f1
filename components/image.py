"""ServingImage: the engine image present on every node: pulled by each node's engine, or, when
`imageBuild` is set, built on each node's engine from a local context (the recipe's overlay on the base
image, like the reference's `start.sh build`; the context goes on the build command's stdin, nothing is
pushed to a registry), then read like a pulled one. Then one image per group: every node's image ID (of
the pulled image, or of the base a build starts FROM) must agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import local, remote

from .node import SparkNode
from planning.clusterplan import ImagePlan


def image_key(image: docker.RemoteImage) -> pulumi.Output:
    """The image ID the node's docker reported for its serving image (pulled or built there; a refresh re-reads it)."""
    return pulumi.Output.from_input(image.image_id).apply(lambda v: v or "")


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
        self.images: list[docker.RemoteImage] = []
        self.builds: list[remote.Command] = []
        for node in args.nodes:
            # Pulling or building tens of GB on the node outlasts the 20 min default.
            timeouts = pulumi.CustomTimeouts(create=f"{image_plan.timeout_minutes}m", update=f"{image_plan.timeout_minutes}m")
            after = []
            if build is not None:
                self.builds.append(remote.Command(
                    f"{name}-{node.node.name}-build", connection=node.connection, create=image_plan.build_script,
                    update=image_plan.build_script, stdin=image_plan.build_stdin, add_previous_output_in_env=False,
                    # docker answers on the node once its preflight passed.
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[node.preflight], custom_timeouts=timeouts),
                ))  # fmt: skip
                after.append(self.builds[-1])
            self.images.append(docker.RemoteImage(
                f"{name}-{node.node.name}",
                name=image_plan.name,
                # a build from other inputs is a new image under the same name: read its ID again
                triggers={"build": image_plan.build_digest} if build is not None else None,
                # A multi-GB image shared with other stacks, or built on the node: destroy must not delete it.
                keep_locally=True,
                # the build leaves the image on the node before it is read.
                opts=pulumi.ResourceOptions(parent=self, provider=node.docker, custom_timeouts=timeouts, depends_on=after),
            ))  # fmt: skip
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
