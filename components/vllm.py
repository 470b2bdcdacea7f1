"""VllmRayGroup: vLLM with tensor parallelism across Sparks joined by Ray (seed 004).

Node 0 runs the Ray head and, once Ray reports every node alive, `vllm serve`; the other nodes run
Ray workers. With `distributedExecutorBackend: mp` there is no Ray: every node runs `vllm serve`,
node 0 with the API and the others `--headless`, joined by vLLM's own launcher. The head starts
first and is deleted last: each worker depends on the head, whose Ray head (or master) it joins. Same rules as SGLang otherwise: fixed names, `restart=no`, one group revision
label on every container so any change replaces the whole group.
"""

from __future__ import annotations

from typing import Optional

import pulumi
import pulumi_docker as docker

from .group import GroupArgs, api_key_file, argv_checks, group_generation, rank_container, start_gates


class VllmRayGroup(pulumi.ComponentResource):
    """`api_key_file` on the head, `ranks[0]` Ray head + server, `ranks[i]` Ray workers, one `revision`."""

    revision: str

    def __init__(self, name: str, args: GroupArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:VllmRayGroup", name, None, opts)
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
        for spec in specs:  # head first: every worker joins its Ray head (head created first, deleted last)
            after = [self.ranks[0]] if spec.rank > 0 else []
            self.ranks.append(
                rank_container(f"{name}-rank{spec.rank}", spec, self.revision, args, "vllm", after, self.generation, self, gates)
            )
        self.register_outputs({"revision": self.revision, "ranks": [c.name for c in self.ranks]})
