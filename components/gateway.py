"""Gateway: the team's one endpoint (LiteLLM's proxy, its PostgreSQL beside it, see planning/gateway.py).

Keys are generated where Pulumi runs (or taken from the `memberKeys` secret) and kept in the state as
secrets; each member's key is registered in the gateway's database by a remote command whose delete
revokes the member's keys (a rotation: the old key first, then the new one), so adding, rotating or revoking one member is that member's resources changing and nothing
else: no rank, router or gateway container is replaced. The containers are replaced only when the
gateway's files, image or secrets change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from planning import gateway as gateway_plan
from planning.gateway import ContainerPlan, GatewayPlan
from planning.clusterplan import ReadinessPlan
from .keys import generated_key
from .node import connection
from .readiness import Readiness, ReadinessArgs


@dataclass(frozen=True)
class GatewayArgs:
    plan: GatewayPlan
    api_key: Any  # secret Output[str]: the stack's internal key, sent upstream only
    upstream: list  # what answers behind the gateway (the router's or the group's readiness check)
    member_keys: dict  # member -> secret Output[str] set in the `memberKeys` config; others are generated
    private_key: Any = None  # secret Output[str]; ssh-agent when None


class Gateway(pulumi.ComponentResource):
    """`container` and `database` on the gateway's node; `members[name]` registers that member's key;
    `readiness` answers once a request went through the gateway with the admin key."""

    def __init__(self, name: str, args: GatewayArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:Gateway", name, None, opts)
        gp = args.plan
        child = pulumi.ResourceOptions(parent=self)
        conn = connection(gp.node, args.private_key)
        self.docker = docker.Provider(f"{name}-docker", host=gp.node.docker_host, ssh_opts=list(gp.node.ssh_opts),
                                      opts=child)  # fmt: skip
        on_node = pulumi.ResourceOptions(parent=self, provider=self.docker)
        self.image = docker.RemoteImage(
            f"{name}-image", name=gp.image,
            # Built on the node from programs/gateway/Dockerfile (nothing to pull it from): never remove it.
            keep_locally=True, opts=on_node,
        )  # fmt: skip
        self.admin_key = generated_key(f"{name}-admin-key", gateway_plan.KEY_GENERATE, [], self)
        self.metrics_key = generated_key(f"{name}-metrics-key", gateway_plan.KEY_GENERATE, [], self)
        db_password = generated_key(f"{name}-db-password", gateway_plan.PASSWORD_GENERATE, [], self)

        self.files = remote.Command(
            f"{name}-files", connection=conn, create=gp.files_write, update=gp.files_write, delete=gp.files_delete,
            add_previous_output_in_env=False, opts=child,
        )  # fmt: skip
        secrets_text = pulumi.Output.secret(
            pulumi.Output.all(self.admin_key, self.metrics_key, args.api_key, db_password).apply(
                lambda v: gateway_plan.secrets_env(*v, gp.database_port)
            )
        )
        self.secrets = remote.Command(
            f"{name}-secrets", connection=conn, create=gp.secrets_create, delete=gp.secrets_delete,
            stdin=secrets_text, triggers=[secrets_text], logging=remote.Logging.NONE, add_previous_output_in_env=False,
            # create and delete touch the same file: delete the old one before writing the new.
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
        )  # fmt: skip
        self.volume = docker.Volume(
            f"{name}-db-data", name=gp.volume,
            labels=[docker.VolumeLabelArgs(label="deepseek-spark.gateway", value=name)],
            # Keys and usage records outlive the stack unless gateway.keepData is false.
            opts=pulumi.ResourceOptions(parent=self, provider=self.docker, retain_on_delete=gp.keep_data),
        )  # fmt: skip
        # What they were started with (the files' digest, the secrets file's ID): a change replaces them.
        started_with = {"deepseek-spark.stack": gp.stack, "deepseek-spark.files": gp.files_digest,
                        "deepseek-spark.secrets": self.secrets.id}  # fmt: skip
        self.database = self._container(f"{name}-db", gp.database, {**started_with, "deepseek-spark.role": "gateway-db"},
                                        [self.volume])  # fmt: skip
        self.container = self._container(f"{name}-container", gp.gateway,
                                         {**started_with, "deepseek-spark.role": "gateway"}, [self.database])  # fmt: skip

        self.members: dict[str, remote.Command] = {}
        self.member_keys: dict[str, pulumi.Output] = {}
        for m in gp.members:
            key = args.member_keys.get(m.name) or generated_key(
                f"{name}-key-{m.name}", gateway_plan.KEY_GENERATE, [m.rotation], self
            )
            self.member_keys[m.name] = key
            self.members[m.name] = remote.Command(
                f"{name}-member-{m.name}", connection=conn, create=m.add, update=m.add, delete=m.revoke,
                stdin=key,
                # A new key is a new record; a scope change updates the record in place.
                triggers=[key],
                logging=remote.Logging.STDOUT,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # delete revokes every key of the member: the old key goes before the new one is added.
                    delete_before_replace=True,
                    # The admin script runs in the gateway container (its python, psycopg and database).
                    depends_on=[self.container],
                ),
            )
        self.readiness = Readiness(
            f"{name}-readiness",
            ReadinessArgs(ReadinessPlan(gp.readiness, gp.readiness_timeout_minutes), self.admin_key,
                          [self.container, *args.upstream]),
            child,
        )  # fmt: skip
        self.register_outputs({"endpoint": gp.endpoint, "container": gp.gateway.name})

    def _container(self, name: str, cp: ContainerPlan, labels: dict, after: list) -> docker.Container:
        return docker.Container(
            name,
            name=cp.name,
            image=self.image.name,  # the tag the node holds (as the router's)
            command=list(cp.command),
            labels=[docker.ContainerLabelArgs(label=k, value=v) for k, v in sorted(labels.items())],
            network_mode="host",
            memory=cp.memory_mib,
            memory_swap=cp.memory_mib,
            mounts=[docker.ContainerMountArgs(target=t, source=s, type=k, read_only=ro) for t, s, k, ro in cp.mounts],
            restart="unless-stopped",
            must_run=True,
            wait=False,
            destroy_grace_seconds=30,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=self.docker,
                # Fixed container name and port: the old one must be gone before the new one starts.
                delete_before_replace=True,
                # The image, the files and secrets it mounts, and what it talks to must be there first.
                depends_on=[self.image, self.files, self.secrets, *after],
            ),
        )
