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

from .group import GroupArgs, api_key_file, argv_checks, group_generation, rank_container, start_gates


class SglangGroup(pulumi.ComponentResource):
    """`api_key_file` on the head, `ranks[i]` on node i, one `revision` for the whole group."""

    revision: str

    def __init__(self, name: str, args: GroupArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:SglangGroup", name, None, opts)
        specs = args.group.specs
        self.revision = args.group.revision
        self.api_key_file = api_key_file(f"{name}-api-key", args.group, args.api_key, args.nodes[0], self)
        self.argchecks = argv_checks(name, args, self)
        self.generation = group_generation(
            f"{name}-generation", args.group, self.api_key_file, [*args.prerequisites, *self.argchecks], self,
            args.after, args.image_identity,
        )
        self.fabric, self.memory = start_gates(name, args, self.generation, self)
        gates = [*([self.fabric.check] if self.fabric else []), *self.memory]
        self.ranks: list[docker.Container] = []
        for spec in reversed(specs):  # workers first, so the head can depend on all of them
            # Rank 0 starts after every worker, and is deleted first when any worker is replaced.
            after = list(self.ranks) if spec.rank == 0 else []
            container = rank_container(
                f"{name}-rank{spec.rank}", spec, self.revision, args, "sglang", after, self.generation, self, gates
            )
            self.ranks.insert(0, container)
        self.register_outputs({"revision": self.revision, "ranks": [c.name for c in self.ranks]})
