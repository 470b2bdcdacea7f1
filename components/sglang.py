"""SglangGroup: the rank containers of one SGLang tensor-parallel group.

Workers start first and the head (rank 0) last: the head depends on every worker, so Pulumi creates
workers before the head and deletes the head first. Every rank carries the same group revision
label, so any change to what any rank runs with replaces all ranks together: a tensor-parallel
group never restarts one rank alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from . import commands, plan
from .config import ClusterConfig
from .node import SparkNode


def container_args(spec: plan.RankSpec, revision: str, stack: str) -> dict[str, Any]:
    """docker.Container inputs for one rank (everything but name/opts), from its RankSpec."""
    labels = {
        plan.REVISION_LABEL: revision,
        "deepseek-spark.stack": stack,
        "deepseek-spark.rank": str(spec.rank),
        "deepseek-spark.role": spec.role,
        "deepseek-spark.engine": "sglang",
    }
    return dict(
        name=spec.container_name,
        image=spec.image,
        entrypoints=spec.entrypoint,
        command=spec.args,
        envs=[f"{k}={v}" for k, v in spec.env.items()],
        labels=[docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())],
        network_mode=spec.network_mode,
        ipc_mode=spec.ipc_mode,
        gpus=spec.gpus,
        devices=[docker.ContainerDeviceArgs(host_path=d, container_path=d, permissions="rwm") for d in spec.devices],
        capabilities=docker.ContainerCapabilitiesArgs(adds=spec.capabilities),
        ulimits=[
            docker.ContainerUlimitArgs(name=n, soft=soft, hard=hard) for n, (soft, hard) in sorted(spec.ulimits.items())
        ],
        mounts=[
            docker.ContainerMountArgs(target=m.target, source=m.source, type=m.type, read_only=m.read_only)
            for m in spec.mounts
        ],
        restart=spec.restart,
        must_run=True,
        # The model takes 12-13 minutes to load: no docker-level wait; Readiness gates `up` instead.
        wait=False,
        destroy_grace_seconds=30,
    )


@dataclass(frozen=True)
class SglangGroupArgs:
    cfg: ClusterConfig
    stack: str
    api_key: Any  # secret Output[str]
    nodes: list[SparkNode]
    ready_on_node: list[list[pulumi.Resource]] = field(default_factory=list)  # per rank: what must exist first


class SglangGroup(pulumi.ComponentResource):
    """`api_key_file` on the head, `ranks[i]` on node i, one `revision` for the whole group."""

    revision: str

    def __init__(self, name: str, args: SglangGroupArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:SglangGroup", name, None, opts)
        cfg, stack, nodes = args.cfg, args.stack, args.nodes
        specs = plan.rank_specs(cfg, stack)
        self.revision = plan.group_revision(specs)
        head = nodes[0]
        self.api_key_file = remote.Command(
            f"{name}-api-key",
            connection=head.connection,
            create=commands.api_key_create(cfg, stack),
            delete=commands.api_key_delete(cfg, stack),
            stdin=args.api_key,
            # A rotated key replaces the file (and, through replace_with, every rank).
            triggers=[args.api_key],
            logging=remote.Logging.NONE,
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=self,
                # create and delete touch the same file: delete the old one before writing the new.
                delete_before_replace=True,
                # The state dir is created only on a node that passed preflight.
                depends_on=[head.preflight],
            ),
        )
        self.ranks: list[docker.Container] = []
        workers: list[docker.Container] = []
        for spec in reversed(specs):  # workers first, so the head can depend on all of them
            deps = list(args.ready_on_node[spec.rank]) if args.ready_on_node else []
            if spec.rank == 0:
                deps += [self.api_key_file, *workers]
            container = docker.Container(
                f"{name}-rank{spec.rank}",
                **container_args(spec, self.revision, stack),
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
