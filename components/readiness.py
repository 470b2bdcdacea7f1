"""Readiness: `up` succeeds only when the endpoint really answers.

A local command (runs where Pulumi runs) that waits for rank 0's /health and one authenticated
chat completion (programs/probe.py), failing at once if a rank exits meanwhile. It re-runs
whenever a rank container is (re)created. The API key reaches it through its environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pulumi
from pulumi_command import local

from planning import commands, frontdoor, memoryplan
from planning.clusterplan import ReadinessPlan


@dataclass(frozen=True)
class ReadinessArgs:
    readiness: ReadinessPlan
    api_key: Any  # secret Output[str]
    ranks: list[pulumi.Resource]
    ca_pem: Any = None  # Output[str]: the front door's CA, which an https probe verifies it with


class Readiness(pulumi.ComponentResource):
    """`check`: the probe; `ready` resolves once the endpoint has answered."""

    def __init__(self, name: str, args: ReadinessArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:Readiness", name, None, opts)
        self.check = local.Command(
            f"{name}-check",
            create=args.readiness.command,
            environment={commands.READINESS_KEY_ENV: args.api_key,
                         **({frontdoor.CA_ENV: args.ca_pem} if args.ca_pem is not None else {})},
            # Probe again whenever any rank was (re)created: a new group, or one recovered after a refresh.
            triggers=[r.id for r in args.ranks],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self,
                # The probe talks to the running group: every rank must have been created first.
                depends_on=args.ranks,
                # The probe itself waits up to readiness.timeoutSeconds; give Pulumi a little more.
                custom_timeouts=pulumi.CustomTimeouts(create=f"{args.readiness.timeout_minutes}m"),
            ),
        )
        self.ready = self.check.stdout.apply(lambda _: True)
        # What rank 0 reported it obtained (KV pool, DSPARK, context), from the probe's last line.
        self.boot = self.check.stdout.apply(memoryplan.boot_from_probe)
        self.register_outputs({"ready": self.ready, "boot": self.boot})
