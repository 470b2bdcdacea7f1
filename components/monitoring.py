"""Monitoring: what the program runs to observe the stack (planning/prometheus.py).

On every node: Debian's prometheus-node-exporter (its memory, for the memory alerts and panels). With
`monitoring.server`, on one node: Prometheus over the stack's scrape configs and alert rules, its TSDB on a
retained volume, and Alertmanager sending every alert to `alertWebhook` (a Pulumi secret, in a 0600 file on
the node, never in an argument, a label or an output). All from one image of Debian's packages, built on the
nodes from programs/monitoring/Dockerfile (the simulated nodes have it loaded).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from planning import prometheus as prometheus_plan
from planning.prometheus import Container, MonitoringPlan
from .node import SparkNode

LABEL = "deepseek-spark.role"


@dataclass(frozen=True)
class MonitoringArgs:
    plan: MonitoringPlan
    nodes: dict[str, SparkNode]  # node name -> how Pulumi reaches it (every node of the stack)
    webhook: Any = None  # secret Output[str] (alertWebhook), or None: alerts stay in Alertmanager
    gateway_metrics_key: Any = None  # secret Output[str]: Prometheus reads the gateway's /metrics with it
    after: list = field(default_factory=list)  # what the server waits for: the stack answering (its targets exist)


class Monitoring(pulumi.ComponentResource):
    """`exporters[node]`, and with a server `prometheus`, `alertmanager` (None otherwise)."""

    def __init__(self, name: str, args: MonitoringArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:Monitoring", name, None, opts)
        mp = args.plan
        self.base, self.stack = name, mp.stack
        # what every container was started from (empty for a pulled image): a rebuilt image restarts them
        self.built = {prometheus_plan.BUILT_FROM: mp.digest} if mp.digest else {}
        self.images: dict[str, docker.RemoteImage] = {}
        self.exporters: dict[str, docker.Container] = {}
        for e in mp.exporters:
            node = args.nodes[e.node.name]
            image = self._image(e.node.name, mp, node)
            self.exporters[e.node.name] = self._container(
                f"{name}-{e.node.name}-node-exporter", e.container, node, image, "node-exporter",
                # the node's mounts reach the exporter as they change (a volume mounted later, the sim's meminfo)
                propagation="rslave")  # fmt: skip
        self.prometheus = self.alertmanager = None
        if mp.server is not None:
            self._server(name, mp, args)
        self.register_outputs({"exporters": list(self.exporters)})

    def _image(self, node_name: str, mp: MonitoringPlan, node: SparkNode) -> docker.RemoteImage:
        """The image on the node: the default one built there from programs/monitoring/Dockerfile (once per
        Dockerfile), another one pulled."""
        if node_name in self.images:
            return self.images[node_name]
        after = []
        if mp.build is not None:
            after.append(remote.Command(
                f"{self.base}-{node_name}-image-build", connection=node.connection, create=mp.build, update=mp.build,
                stdin=mp.dockerfile, add_previous_output_in_env=False,
                # docker answers on the node once its preflight passed.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[node.preflight]),
            ))  # fmt: skip
        self.images[node_name] = docker.RemoteImage(
            f"{self.base}-{node_name}-image", name=mp.image,
            # a new Dockerfile is a new image under the same name: read its ID again
            triggers={"dockerfile": mp.digest} if mp.build else None,
            # Built on the node (nothing to pull it from), or the user's: never remove it.
            keep_locally=True,
            # the build leaves the image on the node before it is read.
            opts=pulumi.ResourceOptions(parent=self, provider=node.docker, depends_on=after),
        )  # fmt: skip
        return self.images[node_name]

    def _container(self, name: str, c: Container, node: SparkNode, image: docker.RemoteImage, role: str,
                   after: Optional[list] = None, propagation: Optional[str] = None,
                   started_with: Optional[dict] = None) -> docker.Container:  # fmt: skip
        mounts = [docker.ContainerMountArgs(
            target=t, source=s, type=k, read_only=ro,
            bind_options=docker.ContainerMountBindOptionsArgs(propagation=propagation) if k == "bind" and propagation else None,
        ) for t, s, k, ro in c.mounts]  # fmt: skip
        return docker.Container(
            name,
            name=c.name,
            image=image.name,
            entrypoints=list(c.entrypoint),
            command=list(c.command),
            labels=[docker.ContainerLabelArgs(label=k, value=v) for k, v in
                    sorted({"deepseek-spark.stack": self.stack, LABEL: role, **self.built,
                            **(started_with or {})}.items())],  # fmt: skip
            network_mode="host",
            pid_mode="host" if role == "node-exporter" else None,
            mounts=mounts,
            # Back by itself after a crash or a reboot, like the gateway: it watches the rest.
            restart="unless-stopped",
            memory=c.memory_mib,
            memory_swap=c.memory_mib,
            must_run=True,
            wait=False,
            destroy_grace_seconds=10,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=node.docker,
                # Fixed container name and port: the old one must be gone before the new one starts.
                delete_before_replace=True,
                # Its image, and (the server) its files and what it scrapes, must be there first.
                depends_on=[image, *(after or [])],
                # A moved mount source (a new stateDir) must recreate it: the real docker plugin planned it as an
                # in-place update that changes nothing on the node, so every later refresh found the old mounts.
                replace_on_changes=["mounts"],
            ),
        )

    def _server(self, name: str, mp: MonitoringPlan, args: MonitoringArgs) -> None:
        sp = mp.server
        node = args.nodes[sp.node.name]
        image = self._image(sp.node.name, mp, node)
        files = remote.Command(
            f"{name}-files", connection=node.connection, create=sp.files_write, update=sp.files_write,
            delete=sp.files_delete, add_previous_output_in_env=False,
            # The directory is written on a node that passed preflight.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[node.preflight]),
        )  # fmt: skip
        am_text = pulumi.Output.secret(pulumi.Output.from_input(args.webhook).apply(
            lambda url: prometheus_plan.alertmanager_config(url, sp.group_wait, sp.group_interval)))  # fmt: skip
        files_for = [("alertmanager-config", sp.alertmanager_create, sp.alertmanager_delete, am_text)]
        if sp.key_path is not None:  # a scrape job reads the gateway's /metrics with its metrics key
            files_for.append(("gateway-key", sp.key_create, sp.key_delete, pulumi.Output.secret(args.gateway_metrics_key)))
        secrets = []
        for role, create, delete, stdin in files_for:
            secrets.append(remote.Command(
                f"{name}-{role}", connection=node.connection, create=create, delete=delete, stdin=stdin,
                # A new text (a new webhook, a new key) replaces the file: delete the old one first.
                triggers=[stdin], logging=remote.Logging.NONE, add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(
                    parent=self,
                    # create and delete touch the same file.
                    delete_before_replace=True,
                    # Its directory exists once the files are written.
                    depends_on=[files],
                ),
            ))  # fmt: skip
        volume = docker.Volume(
            f"{name}-tsdb", name=sp.volume,
            labels=[docker.VolumeLabelArgs(label="deepseek-spark.monitoring", value=name)],
            # The series outlive the stack unless monitoring.server.keepData is false.
            opts=pulumi.ResourceOptions(parent=self, provider=node.docker, retain_on_delete=sp.keep_data),
        )  # fmt: skip
        # What they were started with (the files' digest, the secret files' IDs): a change restarts them.
        self.alertmanager = self._container(f"{name}-alertmanager", sp.alertmanager, node, image, "alertmanager",
                                            [secrets[0]], started_with={"deepseek-spark.config": secrets[0].id})
        self.prometheus = self._container(
            f"{name}-prometheus", sp.prometheus, node, image, "prometheus",
            [files, *secrets, volume, self.alertmanager, *(args.after or [])],
            started_with={"deepseek-spark.files": sp.files_digest,
                          **({"deepseek-spark.secrets": secrets[1].id} if len(secrets) > 1 else {})},
        )  # fmt: skip
