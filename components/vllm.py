"""VllmRayGroup: vLLM with tensor parallelism across Sparks joined by Ray (seed 004).

Node 0 runs the Ray head and, once Ray reports every node alive, `vllm serve`; the other nodes run
Ray workers. The head starts first and is deleted last: each worker depends on the head, whose
Ray head it joins. Same rules as SGLang otherwise: fixed names, `restart=no`, one group revision
label on every container so any change replaces the whole group.
"""

from __future__ import annotations

from typing import Optional

import pulumi
import pulumi_docker as docker

from . import plan
from .group import GroupArgs, api_key_file, container_args


class VllmRayGroup(pulumi.ComponentResource):
    """`api_key_file` on the head, `ranks[0]` Ray head + server, `ranks[i]` Ray workers, one `revision`."""

    revision: str

    def __init__(self, name: str, args: GroupArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:VllmRayGroup", name, None, opts)
        cfg, stack, nodes = args.cfg, args.stack, args.nodes
        specs = plan.vllm_specs(cfg, stack)
        self.revision = plan.group_revision(specs)
        self.api_key_file = api_key_file(f"{name}-api-key", cfg, stack, args.api_key, nodes[0], self)
        self.ranks: list[docker.Container] = []
        for spec in specs:  # head first: every worker joins its Ray head
            deps = list(args.ready_on_node[spec.rank]) if args.ready_on_node else []
            deps += [self.api_key_file] if spec.rank == 0 else [self.ranks[0]]
            self.ranks.append(
                docker.Container(
                    f"{name}-rank{spec.rank}",
                    **container_args(spec, self.revision, stack, "vllm"),
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        provider=nodes[spec.rank].docker,
                        # Fixed container names and host ports: the old container must be gone first.
                        delete_before_replace=True,
                        # Workers join the head's Ray (head created first, deleted last); each container
                        # also waits for its node's preflight, image and checkpoint volume.
                        depends_on=deps,
                        # A new API key must reach the server, and the group only restarts as a whole.
                        replace_with=[self.api_key_file],
                        custom_timeouts=pulumi.CustomTimeouts(create="10m", delete="10m"),
                    ),
                )
            )
        self.register_outputs({"revision": self.revision, "ranks": [c.name for c in self.ranks]})
