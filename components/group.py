"""Pieces every serving group shares (SglangGroup, VllmRayGroup): the API key file on the head and
one rank container from a plan.RankSpec, with the lifecycle every group needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_docker as docker
from pulumi_command import local, remote

from planning import launch, plan
from .fabric import FabricGate, FabricGateArgs
from .node import SparkNode
from planning.clusterplan import GroupPlan

GENERATION_LABEL = "deepseek-spark.generation"
STOP_SIGNAL = "SIGTERM"  # docker's default, set so that the rank depends on its generation (rank_container)


@dataclass(frozen=True)
class GroupArgs:
    """Inputs of a serving group component (SglangGroup, VllmRayGroup)."""

    group: GroupPlan  # the group's part of the plan: engine, revision, rank specs, key file
    stack: str
    api_key: Any  # secret Output[str]
    nodes: list[SparkNode]
    volumes: list[docker.Volume]  # the checkpoint volume on each node
    images: list[pulumi.Resource] = field(default_factory=list)  # the serving image on each node
    prerequisites: list[pulumi.Resource] = field(default_factory=list)  # on every node: what must exist first
    # What must be done before this group may be taken down for a change: the previous group back in
    # the router's rotation (a rolling change: one group at a time).
    after: list[pulumi.Resource] = field(default_factory=list)
    # The image identity check (ServingImage.agree): the group starts only on one image, and restarts when it moves.
    image_identity: local.Command | None = None
    caches: list[docker.Volume] = field(default_factory=list)  # the compile-cache volume on each node


def container_args(
    spec: plan.RankSpec,
    revision: str,
    stack: str,
    engine: str,
    volume_names: dict[str, Any] | None = None,
    extra_labels: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """docker.Container inputs for one rank (everything but opts), from its RankSpec.

    `volume_names` (mount target -> the name output of the volume mounted there: the checkpoint, the
    compile cache) and `extra_labels` (the generation's ID, the IDs of the containers this one must
    start after) make those *property* dependencies: when one of
    them is replaced delete-before-replace, the engine deletes this container first. Plain depends_on
    would leave it running (e.g. an old head holding the rendezvous port while new workers start).
    """
    labels: dict[str, Any] = {
        plan.REVISION_LABEL: revision,
        "deepseek-spark.stack": stack,
        "deepseek-spark.rank": str(spec.rank),
        "deepseek-spark.role": spec.role,
        "deepseek-spark.engine": engine,
        **(extra_labels or {}),
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
            docker.ContainerMountArgs(
                target=m.target,
                source=(volume_names or {}).get(m.target, m.source) if m.type == "volume" else m.source,
                type=m.type,
                read_only=m.read_only,
            )
            for m in spec.mounts
        ],
        restart=spec.restart,
        # The memory plan's figure for this rank, swap included (no swap): its cgroup kills a runaway rank.
        memory=spec.memory_mib,
        memory_swap=spec.memory_mib,
        must_run=True,
        # The model takes minutes to load: no docker-level wait; Readiness gates `up` instead.
        wait=False,
        destroy_grace_seconds=30,
    )


def volume_names(args: GroupArgs, rank: int) -> dict[str, Any]:
    """The names of the volumes rank `rank` mounts, by mount target (outputs: property dependencies)."""
    names = {launch.MODEL_MOUNT: args.volumes[rank].name}
    if args.caches:
        names[launch.CACHE_MOUNT] = args.caches[rank].name
    return names


def rank_container(
    name: str,
    spec: plan.RankSpec,
    revision: str,
    args: GroupArgs,
    engine: str,
    after: list[docker.Container],
    generation: remote.Command | local.Command,
    parent: pulumi.Resource,
    gates: list[pulumi.Resource] | None = None,
) -> docker.Container:
    """One rank's container on its node, started after the containers in `after`.

    Its `deepseek-spark.generation` label is the group generation's ID, and so is (in form) its stop signal:
    property dependencies, so when the generation is replaced the engine deletes every rank (in one chain,
    dependents first: the head, which depends on its workers, goes first) before the new generation exists,
    and no new rank can start before that. The engine asks the docker plugin whether a rank must go by
    diffing it with those properties unknown: the plugin answers "replace" for an unknown string (a
    replace-on-change field) but "no change" for a wholly unknown set such as `labels`, hence the signal.
    """
    labels: dict[str, Any] = {GENERATION_LABEL: generation.id}
    if after:
        labels["deepseek-spark.after"] = pulumi.Output.all(*[c.id for c in after]).apply(lambda ids: ",".join(ids))
    return docker.Container(
        name,
        **container_args(spec, revision, args.stack, engine, volume_names(args, spec.rank), labels),
        stop_signal=generation.id.apply(lambda _: STOP_SIGNAL),
        opts=pulumi.ResourceOptions(
            parent=parent,
            provider=args.nodes[spec.rank].docker,
            # Fixed container name and host ports: the old rank must be gone before the new one starts.
            delete_before_replace=True,
            # A group starts only when every node is ready (preflight, image, checkpoint, shards): a rank
            # started early can time out waiting for a node that is still pulling or packing.
            # The start gates (each node's memory, the bandwidth between the nodes) run after the old group is
            # down, before any new rank: every rank waits for all of them.
            depends_on=[*args.prerequisites, generation, *after, *(gates or [])],
            # After a refresh found the rank stopped (the provider reports mustRun false), `up` replaces it
            # instead of starting the old container again in place. A tensor-parallel group fails as a
            # whole (NCCL is fail-stop), so a refresh finds every rank stopped or gone and they are all
            # replaced, workers first, the head last (its labels hold the workers' IDs).
            replace_on_changes=["mustRun"],
            custom_timeouts=pulumi.CustomTimeouts(create="10m", delete="10m"),
        ),
    )


def fabric_gate(name: str, args: GroupArgs, generation: pulumi.Resource, parent) -> FabricGate | None:
    """The group's FabricGate (None with one node or fabric.bandwidthGate off)."""
    if args.group.fabric_gate is None:
        return None
    preflights = [n.preflight for n in args.nodes]
    return FabricGate(name, FabricGateArgs(args.group.fabric_gate, args.group.revision, preflights, generation),
                      pulumi.ResourceOptions(parent=parent))  # fmt: skip


def memory_gates(name: str, args: GroupArgs, generation: pulumi.Resource, parent) -> list[remote.Command]:
    """`<name>-rank<i>-memory` on each node (programs/memgate.py): sync, drop the page cache, then
    MemAvailable against what the memory plan needs there; a shortfall fails `up` naming the node, the
    figures and what holds the memory. Runs at every group start (its trigger is the generation)."""
    gates = []
    for spec, command, report in zip(args.group.specs, args.group.memory_gates, args.group.memory_reports):
        node = args.nodes[spec.rank]
        gates.append(remote.Command(
            f"{name}-rank{spec.rank}-memory",
            connection=node.connection,
            create=command,
            # A new gate program or connection alone arrives while the group serves: report, never drop or judge.
            update=report,
            stdin=args.group.memgate_program,
            triggers=[generation.id],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=parent,
                # Measured once the old group is down (the new generation exists): its ranks' memory is free then.
                depends_on=[node.preflight, generation],
                # sync can take minutes after a large download; the drop and the reading take seconds.
                custom_timeouts=pulumi.CustomTimeouts(create="10m"),
            ),
        ))  # fmt: skip
    return gates


def start_gates(name: str, args: GroupArgs, generation: pulumi.Resource, parent) -> tuple[FabricGate | None, list[remote.Command]]:
    """What every new rank waits for: the group's FabricGate (or None) and each node's memory gate."""
    return fabric_gate(f"{name}-fabric", args, generation, parent), memory_gates(name, args, generation, parent)


def argv_checks(name: str, args: GroupArgs, parent) -> list[remote.Command]:
    """`<name>-rank<i>-argcheck` on each node: the image's own engine parsers on the exact argv of that
    rank (programs/argcheck.py). Upstream of the group generation, so a command line the image
    refuses fails `up` in seconds, before the running group is taken down or any rank starts."""
    checks = []
    for spec, command in zip(args.group.specs, args.group.argchecks):
        node = args.nodes[spec.rank]
        checks.append(remote.Command(
            f"{name}-rank{spec.rank}-argcheck",
            connection=node.connection,
            create=command,
            stdin=args.group.argcheck_program,
            # A rebuilt or re-pulled image under the same tag has other parsers: check it again.
            triggers=[args.images[spec.rank].id] if args.images else [],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(
                parent=parent,
                # It runs the node's image with the node's checkpoint volume mounted.
                depends_on=[node.preflight, *args.images[spec.rank:spec.rank + 1], args.volumes[spec.rank]],
            ),
        ))  # fmt: skip
    return checks


def group_generation(
    name: str, group: GroupPlan, key_file: remote.Command, prerequisites: list[pulumi.Resource], parent,
    after: list[pulumi.Resource] | None = None, image_identity: local.Command | None = None,
) -> local.Command:
    """The group's generation: one resource upstream of every rank, replaced whenever the group must
    restart (a new revision, or a new API key file). Being delete-before-replace, its replacement
    makes the engine delete all of its dependents first, in one chain and in reverse dependency
    order (SGLang: the head, then the workers), before anything of the new group is created.
    Per-rank replacement alone runs as parallel chains, where a new worker can start while the old
    head still runs. Nothing runs on a node: it only records which revision it stands for. It follows
    the image IDs the nodes agree on, so an image that moved (a re-pulled tag) restarts the whole group."""
    identity = [image_identity.stdout] if image_identity is not None else []
    return local.Command(
        name,
        create=group.generation_record,
        triggers=[group.revision, key_file.id, *identity],
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            # Its replacement must take the old ranks down before the new generation exists.
            delete_before_replace=True,
            # Take the old group down only once every node is ready for the new one (shortest downtime)
            # and, behind a router, once the group before it is back in rotation (one group at a time).
            depends_on=[*prerequisites, *(after or [])],
        ),
    )


def api_key_file(name: str, group: GroupPlan, api_key: Any, head: SparkNode, parent) -> remote.Command:
    """The API key written from stdin to a 0600 file on the head, mounted read-only into the server."""
    return remote.Command(
        name,
        connection=head.connection,
        create=group.key_file_create,
        delete=group.key_file_delete,
        stdin=api_key,
        # A rotated key replaces the file (and, through the group generation, every rank); a new path
        # replaces it too, so the old file is deleted instead of left behind.
        triggers=[api_key, group.key_file_path],
        logging=remote.Logging.NONE,
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            # create and delete touch the same file: delete the old one before writing the new.
            delete_before_replace=True,
            # The state dir is created only on a node that passed preflight.
            depends_on=[head.preflight],
        ),
    )
