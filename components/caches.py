"""CompileCaches: each node's compile-cache volume, mounted into its rank at /root/.cache.

The engines compile and autotune kernels at boot (FlashInfer, Triton, torch inductor, DeepGEMM, vLLM's
compile cache) and reuse what they find in their cache directories; inside the container those are lost
at every restart. One volume per node and image: its name carries a hash of the image ID the node holds,
so a new image gets an empty cache (what an old build compiled must not be loaded by a new one) and the
group's restart through the generation mounts it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

import pulumi
import pulumi_docker as docker

from .image import image_key
from .node import SparkNode

LABEL = "deepseek-spark.compile-cache"


def volume_name(prefix: str, image_id: str) -> str:
    return f"{prefix}-{hashlib.sha256(image_id.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class CompileCachesArgs:
    stack: str
    prefix: str  # plan.compile_cache_prefix(stack)
    nodes: list[SparkNode]
    images: list[pulumi.CustomResource]  # the serving image on each node


class CompileCaches(pulumi.ComponentResource):
    """`volumes[i]`: node i's compile cache for the image it holds."""

    def __init__(self, name: str, args: CompileCachesArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:CompileCaches", name, None, opts)
        self.volumes: list[docker.Volume] = []
        for node, image in zip(args.nodes, args.images):
            key = image_key(image)
            self.volumes.append(docker.Volume(
                f"{name}-{node.node.name}",
                name=key.apply(lambda v: volume_name(args.prefix, v)),
                labels=[docker.VolumeLabelArgs(label="deepseek-spark.stack", value=args.stack),
                        docker.VolumeLabelArgs(label=LABEL, value="true"),
                        docker.VolumeLabelArgs(label="deepseek-spark.image", value=key)],
                opts=pulumi.ResourceOptions(
                    parent=self,
                    provider=node.docker,
                    # Minutes of JIT and autotuning per boot: destroy keeps it (like the engram shards); a
                    # new image's volume replaces it in the state and the old one stays on the node until
                    # pruned (`docker volume prune --filter label=deepseek-spark.compile-cache`).
                    retain_on_delete=True,
                ),
            ))  # fmt: skip
        self.register_outputs({"volumes": [v.name for v in self.volumes]})
