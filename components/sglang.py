"""SglangGroup: the rank containers of one SGLang tensor-parallel group.

Workers start first and the head (rank 0) last: the head depends on every worker, so Pulumi creates
workers before the head and deletes the head first. Every rank carries the same group revision
label, so any change to what any rank runs with replaces all ranks together: a tensor-parallel
group never restarts one rank alone.
"""

from __future__ import annotations

from typing import Optional

import pulumi
import pulumi_docker as docker

from . import plan
from .group import GroupArgs, api_key_file, container_args


class SglangGroup(pulumi.ComponentResource):
    """`api_key_file` on the head, `ranks[i]` on node i, one `revision` for the whole group."""

    revision: str

    def __init__(self, name: str, args: GroupArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:SglangGroup", name, None, opts)
        cfg, stack, nodes = args.cfg, args.stack, args.nodes
        specs = plan.rank_specs(cfg, stack)
        self.revision = plan.group_revision(specs)
        self.api_key_file = api_key_file(f"{name}-api-key", cfg, stack, args.api_key, nodes[0], self)
        self.ranks: list[docker.Container] = []
        workers: list[docker.Container] = []
        for spec in reversed(specs):  # workers first, so the head can depend on all of them
            deps = list(args.ready_on_node[spec.rank]) if args.ready_on_node else []
            if spec.rank == 0:
                deps += [self.api_key_file, *workers]
            container = docker.Container(
                f"{name}-rank{spec.rank}",
                **container_args(spec, self.revision, stack, "sglang"),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    provider=nodes[spec.rank].docker,
                    # Fixed container name and host ports: the old rank must be gone before the new starts.
                    delete_before_replace=True,
                    # Rank 0 waits for every worker (workers start first, head is deleted first), and each
                    # rank for its node's preflight, image, checkpoint volume and engram shard.
                    depends_on=deps,
                    # A new API key must reach rank 0, and ranks only ever restart as a whole group.
                    replace_with=[self.api_key_file],
                    custom_timeouts=pulumi.CustomTimeouts(create="10m", delete="10m"),
                ),
            )
            if spec.rank > 0:
                workers.append(container)
            self.ranks.insert(0, container)
        self.register_outputs({"revision": self.revision, "ranks": [c.name for c in self.ranks]})
