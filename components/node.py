"""SparkNode: how Pulumi reaches one DGX Spark (docker provider over ssh, command connection) and
the read-only preflight that must pass before anything runs there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from planning.nodeplan import NodePlan


def connection(node: NodePlan, private_key: Optional[Any]) -> remote.ConnectionArgs:
    """How remote commands reach `node` (ssh-agent when `private_key` is None)."""
    return remote.ConnectionArgs(
        host=node.host,
        port=node.ssh_port,
        user=node.ssh_user,
        private_key=private_key,
        # pulumi-command accepts any host key unless one is pinned: pin the one ssh trusts.
        host_key=node.host_key,
        # Enough retries to ride out sshd's MaxStartups drops while many commands dial one node at once.
        dial_error_limit=node.dial_error_limit,
        per_dial_timeout=node.per_dial_timeout,
    )


@dataclass(frozen=True)
class SparkNodeArgs:
    node: NodePlan
    recheck_on: str  # the group revision: every group (re)start is preceded by a fresh preflight
    private_key: Optional[Any] = None  # secret Output[str]; ssh-agent when None


class SparkNode(pulumi.ComponentResource):
    """One Spark: `docker` provider, `connection` for remote commands, and `preflight`."""

    docker: docker.Provider
    preflight: remote.Command

    def __init__(self, name: str, args: SparkNodeArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:SparkNode", name, None, opts)
        node = args.node
        self.node = node
        self.docker = docker.Provider(
            f"{name}-docker",
            host=node.docker_host,
            ssh_opts=list(node.ssh_opts),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.connection = connection(node, args.private_key)
        self.preflight = remote.Command(
            f"{name}-preflight",
            connection=self.connection,
            create=node.preflight,
            # Re-check the node whenever the serving group is (re)started, not only on the first `up`.
            triggers=[args.recheck_on],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"host": node.host, "preflight": self.preflight.stdout})
