"""FrontDoor: the stack's one HTTPS port (nginx on the endpoint's node, planning/frontdoor.py).

Its certificate comes from the stack's own CA (made once where Pulumi runs and kept in the state as a secret; a
new server certificate every period, planning/tls.py) or is the owner's (frontDoor.certificate.certificate and the
secret frontDoorKey). A new certificate or config is written on the node and read by the running door (SIGHUP): the
container is replaced only when its image or command changes, and no rank ever is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import local, remote

from planning import frontdoor
from planning.clusterplan import ReadinessPlan
from planning.frontdoor import FrontDoorPlan
from .keys import generated_key
from .node import SparkNode
from .readiness import Readiness, ReadinessArgs


@dataclass(frozen=True)
class FrontDoorArgs:
    plan: FrontDoorPlan
    node: SparkNode  # its docker provider, ssh connection and preflight
    api_key: Any  # secret Output[str]: the key the probe sends through the door (the client config's)
    upstream: list  # what answers behind it: the gateway's, the router's or the group's readiness check
    own_key: Any = None  # secret Output[str]: frontDoorKey (certificate source own)


class FrontDoor(pulumi.ComponentResource):
    """`container` on the endpoint's node; `ca_pem` what clients verify it with (None: the system's CAs);
    `readiness` answers once a request went through it, its certificate verified."""

    def __init__(self, name: str, args: FrontDoorArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:FrontDoor", name, None, opts)
        fp, node = args.plan, args.node
        child = pulumi.ResourceOptions(parent=self)
        built = []
        if fp.build is not None:
            built.append(remote.Command(
                f"{name}-image-build", connection=node.connection, create=fp.build, update=fp.build,
                stdin=fp.dockerfile, add_previous_output_in_env=False,
                # docker answers on the node once its preflight passed.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[node.preflight]),
            ))  # fmt: skip
        self.image = docker.RemoteImage(
            f"{name}-image", name=fp.image,
            # a new Dockerfile is a new image under the same name: read its ID again
            triggers={"dockerfile": fp.digest} if fp.build else None,
            # Built on the node (nothing to pull it from), or the owner's: never remove it.
            keep_locally=True,
            # the build leaves the image on the node before it is read.
            opts=pulumi.ResourceOptions(parent=self, provider=node.docker, depends_on=built),
        )  # fmt: skip

        pem, self.ca_pem = self._certificate(name, fp, args.own_key)
        self.tls = remote.Command(
            f"{name}-tls", connection=node.connection, create=fp.tls_write, update=fp.tls_write, delete=fp.tls_delete,
            stdin=pem, logging=remote.Logging.NONE, add_previous_output_in_env=False,
            # the node's state dir exists once its preflight passed.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[node.preflight]),
        )  # fmt: skip
        self.files = remote.Command(
            f"{name}-files", connection=node.connection, create=fp.files_write, update=fp.files_write,
            delete=fp.files_delete, add_previous_output_in_env=False,
            # the node's state dir exists once its preflight passed.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[node.preflight]),
        )  # fmt: skip
        c = fp.container
        self.container = docker.Container(
            f"{name}-container",
            name=c.name,
            image=self.image.name,  # the tag the node holds (as the gateway's)
            command=list(c.command),
            labels=[docker.ContainerLabelArgs(label="deepseek-spark.stack", value=fp.stack),
                    docker.ContainerLabelArgs(label="deepseek-spark.role", value="frontdoor")],  # fmt: skip
            network_mode="host",
            memory=c.memory_mib,
            memory_swap=c.memory_mib,
            mounts=[docker.ContainerMountArgs(target=t, source=s, type=k, read_only=ro) for t, s, k, ro in c.mounts],
            restart="unless-stopped",
            stop_signal="SIGQUIT",  # nginx's graceful stop: the requests it serves finish first
            must_run=True,
            wait=False,
            destroy_grace_seconds=30,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=node.docker,
                # Fixed container name and port: the old one must be gone before the new one starts.
                delete_before_replace=True,
                # nginx reads its config and certificate at start: both must be on the node first.
                depends_on=[self.image, self.files, self.tls, *built],
            ),
        )
        self.readiness = Readiness(
            f"{name}-readiness",
            ReadinessArgs(ReadinessPlan(fp.readiness, fp.readiness_timeout_minutes), args.api_key,
                          [self.container, self.tls, *args.upstream], self.ca_pem),
            child,
        )  # fmt: skip
        self.register_outputs({"endpoint": fp.endpoint, "container": c.name})

    def _certificate(self, name: str, fp: FrontDoorPlan, own_key: Any) -> tuple[pulumi.Output, Any]:
        """(the PEM the door serves: chain then key, secret; the CA clients verify it with, or None)."""
        if fp.source == "own":
            pem = pulumi.Output.secret(pulumi.Output.from_input(own_key).apply(
                lambda k: fp.own_certificate.rstrip("\n") + "\n" + k.strip() + "\n"))  # fmt: skip
            return pem, fp.own_ca
        # The stack's CA: made once, kept (KEEP on update); a replace (`pulumi up --replace`) makes every client's
        # copy stale, so only an operator's explicit choice does it.
        ca = generated_key(f"{name}-ca", frontdoor.ca_command(fp.stack), [], self)
        cert = local.Command(
            f"{name}-certificate",
            create=frontdoor.server_command(fp),
            stdin=ca,
            # A new period (renewBeforeDays before expiry) or new names: a new certificate.
            triggers=[fp.period, list(fp.names)],
            logging=local.Logging.NONE,
            add_previous_output_in_env=False,
            # The private key is in its stdout: the state must hold it encrypted.
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["stdout"]),
        )
        pem = pulumi.Output.secret(cert.stdout.apply(lambda s: _chain_and_key(s)))
        return pem, pulumi.Output.unsecret(ca.apply(lambda s: json.loads(s)["cert"]))


def _chain_and_key(stdout: str) -> str:
    doc = json.loads(stdout)
    return doc["chain"] + doc["key"]
