"""Router: one endpoint in front of several serving groups (the SGLang router, see routing.py).

The router container runs on one node of a group, with its own docker provider and ssh connection
to that node (it is created before the groups, whose memberships depend on it), or on the docker
engine where Pulumi runs (`router.node: local`). Each group joins
the rotation through `router_member`: a local command that adds the group's rank 0 once the group
answered, and on its way out takes it out of rotation and waits for its requests to finish. It sits
downstream of the group's readiness (its triggers hold the check's ID), so when a group restarts
the engine deletes the membership first (out of rotation, drained), then the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import local, remote

from planning import commands, launch
from .node import connection
from planning.clusterplan import MemberPlan, RouterPlan
from planning.stackplan import ARGCHECK_PROGRAM

LOCAL_DOCKER = "unix:///var/run/docker.sock"  # router.node: local


@dataclass(frozen=True)
class RouterArgs:
    plan: RouterPlan
    api_key: Any  # secret Output[str]
    private_key: Any = None  # secret Output[str]; ssh-agent when None


class Router(pulumi.ComponentResource):
    """`container`: the router on its node; `api_key_file`: its copy of the key, mounted read-only."""

    def __init__(self, name: str, args: RouterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:Router", name, None, opts)
        rp, spec = args.plan, args.plan.spec
        child = pulumi.ResourceOptions(parent=self)
        self.docker = (
            docker.Provider(f"{name}-docker", host=rp.node.docker_host, ssh_opts=list(rp.node.ssh_opts), opts=child)
            if rp.node is not None
            # Its own name: moving the router replaces its container through the old provider (a provider
            # updated in place would look for the old container on the new engine and leave it running).
            else docker.Provider(f"{name}-docker-local", host=LOCAL_DOCKER, opts=child)
        )
        self.image = docker.RemoteImage(
            f"{name}-image",
            name=spec.image,
            # The image is the SGLang image the node's group runs too: never remove it on destroy.
            keep_locally=True,
            opts=pulumi.ResourceOptions(parent=self, provider=self.docker),
        )
        key_file = dict(
            create=rp.key_file_create,
            delete=rp.key_file_delete,
            stdin=args.api_key,
            triggers=[args.api_key, spec.key_file],
            add_previous_output_in_env=False,
            # create and delete touch the same file: delete the old one before writing the new.
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
        )
        self.api_key_file: remote.Command | local.Command = (
            remote.Command(
                f"{name}-api-key", connection=connection(rp.node, args.private_key), logging=remote.Logging.NONE,
                **key_file,
            )
            if rp.node is not None
            else local.Command(f"{name}-api-key", logging=local.Logging.NONE, **key_file)
        )
        check = dict(
            create=rp.argcheck,
            stdin=ARGCHECK_PROGRAM,
            # A rebuilt or re-pulled image under the same tag has another parser: check it again.
            triggers=[self.image.id],
            add_previous_output_in_env=False,
            # It runs the image the router will run.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.image]),
        )
        # The image's own sglang-router parser on the router's argv, before the router (re)starts.
        self.argcheck: remote.Command | local.Command = (
            remote.Command(f"{name}-argcheck", connection=connection(rp.node, args.private_key), **check)
            if rp.node is not None
            else local.Command(f"{name}-argcheck", **check)
        )
        self.container = docker.Container(
            f"{name}-container",
            name=spec.container_name,
            image=spec.image,
            entrypoints=spec.entrypoint,
            command=spec.args,
            # The key file's ID: a new key replaces the router (it reads the key only when it starts).
            labels=[
                docker.ContainerLabelArgs(label=k, value=v)
                for k, v in sorted({**spec.labels, "deepseek-spark.key-file": self.api_key_file.id}.items())
            ],
            network_mode=spec.network_mode,
            # Its limit from the plan, swap included (no swap): counted in its node's memory budget.
            memory=spec.memory_mib,
            memory_swap=spec.memory_mib,
            mounts=[
                docker.ContainerMountArgs(
                    target=launch.API_KEY_MOUNT, source=spec.key_file, type="bind", read_only=True
                )
            ],
            restart=spec.restart,
            must_run=True,
            wait=False,
            destroy_grace_seconds=30,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=self.docker,
                # Fixed container name and port: the old router must be gone before the new one starts.
                delete_before_replace=True,
                # The image must be on the node, its parser must accept the argv, and the key file must be
                # written before the router starts.
                depends_on=[self.image, self.argcheck, self.api_key_file],
                # A router a refresh found stopped is replaced, not started again in place (as ranks are).
                replace_on_changes=["mustRun"],
            ),
        )
        self.register_outputs({"endpoint": rp.endpoint, "container": self.container.name})


def router_member(
    name: str, member: MemberPlan, api_key: Any, readiness: pulumi.Resource, router: Router, parent: pulumi.Resource
) -> local.Command:
    """The group's place in the router's rotation: added once the group answered; removed (and its
    requests drained) before anything of the group goes down."""
    return local.Command(
        name,
        create=member.add,
        delete=member.remove,
        environment={commands.READINESS_KEY_ENV: api_key},  # the probe's variable: one name for both
        # A new group (its readiness re-ran) or a new router: join again.
        triggers=[readiness.id, router.container.id],
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=parent,
            # add and remove name the same worker: leave the rotation before joining it again.
            delete_before_replace=True,
            # Join only a router that runs, with a group that answered.
            depends_on=[readiness, router.container],
        ),
    )
