"""FabricGate: RDMA bandwidth between every pair of linked nodes, over all rails, before a group starts.

A local command (runs where Pulumi runs, like the readiness probe) that measures each pair with
ib_write_bw on every rail at once (programs/fabricgate.py) and fails `up` when a pair carries less
than fabric.minBandwidthGbps: a link can negotiate 200 Gb/s and carry 13. It runs when the group is
(re)started (its trigger is the group revision), never on a no-op `up`: after the old ranks are
down and before any new rank starts. Its figures are the `fabric` stack output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi
from pulumi_command import local

from planning import fabric

KEEP_PREVIOUS = 'printf "%s\n" "$PULUMI_COMMAND_STDOUT"'  # an update that re-prints what the last run printed


@dataclass(frozen=True)
class FabricGateArgs:
    command: str  # commands.fabric_gate
    revision: str  # the group revision: measured again whenever the group restarts
    preflights: list[pulumi.Resource]
    generation: pulumi.Resource  # the group generation: measured once the old group is down


class FabricGate(pulumi.ComponentResource):
    """`check`: the measurement; `figures`: its report."""

    def __init__(self, name: str, args: FabricGateArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:FabricGate", name, None, opts)
        self.check = local.Command(
            f"{name}-check",
            create=args.command,
            # A new gate command alone (no group start) must not load the rails a serving group uses: the update
            # keeps the last measurement (its previous stdout) and the gate measures at the next start.
            update=KEEP_PREVIOUS,
            triggers=[args.revision],
            opts=pulumi.ResourceOptions(
                parent=self,
                # Measure only rails that passed preflight (both twins up, GIDs, MTU, peers), and only once the
                # old group is down (the new generation exists): a serving group's NCCL traffic would share the rails.
                depends_on=[*args.preflights, args.generation],
                # A pair takes seconds; a hung ib_write_bw is cut by the program itself (90 s per rail).
                custom_timeouts=pulumi.CustomTimeouts(create="15m"),
            ),
        )
        self.figures = self.check.stdout.apply(fabric.gate_report)
        self.register_outputs({"figures": self.figures})
