"""Guard: the group's self-healing, on the cluster (planning/guard.py, programs/guard).

On every node of the group: the guard's archive and the group's token written over ssh, and the guard's
container, which the node's docker restarts after a crash, a reboot or a power cut. It is created once
the group answered (after readiness), with the rank containers' IDs in its arguments: those are the only
containers it may start. So every change of the group replaces it first: the engine deletes it before
any rank (its arguments depend on theirs) and creates the next one after the new group answered. While
an `up`, `dspark restart` or `destroy` changes the group there is no guard on the nodes, and a guard
never starts a rank of an older group or recreates a container Pulumi removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from planning import guard as guard_plan
from planning.guard import GuardPlan
from .keys import generated_key
from .node import SparkNode


@dataclass(frozen=True)
class GuardArgs:
    plan: GuardPlan
    nodes: list[SparkNode]
    ranks: list[docker.Container]  # rank i on node i: the containers the guard may stop and start
    images: list[pulumi.Resource]  # the serving image on each node (the guard runs in it)
    ready: pulumi.Resource  # the group's readiness check (behind a router: its membership)
    key_file: pulumi.Resource  # the API key file on the head, which the leader mounts
    after: list[pulumi.Resource] = field(default_factory=list)
    fabric: Any = None  # Output[dict]: the group's last bandwidth gate report, which the leader serves as metrics


class Guard(pulumi.ComponentResource):
    """`containers[i]`: the guard on node i (the head's leads); `token`: the group's (secret)."""

    def __init__(self, name: str, args: GuardArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:Guard", name, None, opts)
        gp = args.plan
        self.token = generated_key(f"{name}-token", guard_plan.TOKEN_GENERATE, [], self)
        ids = pulumi.Output.all(*[r.id for r in args.ranks])
        self.containers: list[docker.Container] = []
        for gn, node in zip(gp.nodes, args.nodes):
            archive = remote.Command(
                f"{name}-{gn.node}-archive",
                connection=node.connection,
                create=gn.bundle_write,
                update=gn.bundle_write,
                delete=gn.bundle_delete,
                stdin=guard_plan.ARCHIVE_B64,
                # A new directory (stateDir) is a new archive there, and the old one removed.
                triggers=[gn.dir],
                logging=remote.Logging.STDERR,
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # Its delete empties the directory the new one may be written to: delete first.
                    delete_before_replace=True,
                    # Written only on a node that passed preflight.
                    depends_on=[node.preflight],
                ),
            )
            token = remote.Command(
                f"{name}-{gn.node}-token",
                connection=node.connection,
                create=gn.token_create,
                delete=gn.token_delete,
                stdin=self.token,
                # A new token, or a new directory for it (the old file is deleted, never left behind).
                triggers=[self.token, gn.dir],
                logging=remote.Logging.NONE,
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # create and delete touch the same file: delete the old one before writing the new.
                    delete_before_replace=True,
                    # The directory exists once the archive is written.
                    depends_on=[archive],
                ),
            )
            # The ranks' IDs, in its arguments (its own rank's; the leader's peers') and a label (all of them): the
            # engine deletes it before any rank of the group, and a new group gets a new guard.
            labels = {**gp.labels, "deepseek-spark.node": gn.node, "deepseek-spark.ranks": ids.apply(",".join)}
            command = [*gp.base_args(gn.rank), "--container", args.ranks[gn.rank].id]
            if gn.rank == 0:
                command += ["--leader", ids.apply(lambda v: gp.leader_json(dict(enumerate(v))))]
                if args.fabric is not None:
                    command += ["--fabric", pulumi.Output.from_input(args.fabric).apply(guard_plan.fabric_json)]
            self.containers.append(docker.Container(
                f"{name}-{gn.node}",
                name=gn.container_name,
                image=gn.image,
                entrypoints=["python3"],
                command=command,
                labels=[docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())],
                network_mode="host",
                pid_mode="host",
                # It runs the start gates on the node itself (nsenter into the host's namespaces: drop the page
                # cache, read MemAvailable, check the rails), as the program's remote commands do over ssh.
                privileged=True,
                mounts=[docker.ContainerMountArgs(target=m.target, source=m.source, type="bind", read_only=m.read_only)
                        for m in gn.mounts],
                # Back by itself after a crash of its own, a reboot or a power cut: that is its job.
                restart="unless-stopped",
                memory=gn.memory_mib,
                memory_swap=gn.memory_mib,
                must_run=True,
                wait=False,
                destroy_grace_seconds=10,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    provider=node.docker,
                    # Fixed container name and port: the old guard must be gone before the new one starts.
                    delete_before_replace=True,
                    # It starts watching a group that answers (readiness, or back in the router's rotation), from
                    # its own archive and token, in the node's serving image, with the head's key file there.
                    depends_on=[archive, token, args.images[gn.rank], args.ready, args.key_file, *args.after],
                ),
            ))  # fmt: skip
        self.register_outputs({"containers": [c.name for c in self.containers]})
