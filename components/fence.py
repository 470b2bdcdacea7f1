"""Fence: every node's host firewall, the stack's trust boundary (planning/exposure.py; docs/exposure.md).

One local command per node (it runs where Pulumi runs, over the system ssh: programs/fence.py) puts the node's
rule set, one nftables table of the stack's own, onto the node, refusing a rule set that would cut this
machine's ssh and leaving the node to roll back one that no new ssh connection confirms; the node loads it at
boot before docker starts. A changed rule set is applied again the same way; destroy takes it off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_command import local

from planning.exposure import NodeExposure

from .node import SparkNode


@dataclass(frozen=True)
class FenceArgs:
    exposure: tuple[NodeExposure, ...]  # every node's, its fence commands included (stackplan)
    nodes: dict[str, SparkNode]  # by node name


class Fence(pulumi.ComponentResource):
    """`rules[node]`: the command that holds that node's fence."""

    def __init__(self, name: str, args: FenceArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:Fence", name, None, opts)
        self.rules: dict[str, local.Command] = {}
        for ne in args.exposure:
            if not ne.enabled:
                continue
            self.rules[ne.node] = local.Command(
                f"{name}-{ne.node}",
                create=ne.apply,
                update=ne.apply,  # a changed rule set goes through the same refusal, rollback and confirmation
                delete=ne.remove,
                stdin=ne.ruleset,
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # the node answers ssh once its preflight passed
                    depends_on=[args.nodes[ne.node].preflight],
                    # the apply waits for its confirmation (firewall.confirmSeconds at most) before it returns
                    custom_timeouts=pulumi.CustomTimeouts(create="15m", update="15m", delete="10m"),
                ),
            )
        self.register_outputs({"nodes": {ne.node: ne.digest for ne in args.exposure if ne.enabled}})
