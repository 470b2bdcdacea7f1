"""The monitoring the program runs on the nodes (pure): Debian's prometheus-node-exporter on every node (its
memory, for the memory alerts), and, with `monitoring.server`, Prometheus and Alertmanager on one node for a
team that has none. All three come from one image built from Debian's packages (programs/monitoring/Dockerfile).

Prometheus scrapes exactly the stack's `prometheus` output (planning/monitoring.scrape_configs) and evaluates
the stack's `alert_rules` (planning/alerts.py); Alertmanager sends every alert, and its resolution, to
`alertWebhook` (a Pulumi secret: Slack, ntfy, a pager all take a webhook). On the server's node, under
`<stateDir>/<stack>-monitoring/`:
- `etc/`: prometheus.yml and rules.yml (no secret), mounted read-only in Prometheus;
- `alertmanager.yml` (0600: it holds the webhook URL) and `gateway-metrics-key` (0600), mounted read-only;
- the TSDB on the docker volume `<stack>-prometheus` (kept on destroy unless keepData: false).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from declared.stack import MONITORING_IMAGE, MonitoringConfig, StackConfig
from . import imagebuild
from .commands import secret_file_create, secret_file_delete
from .gateway import files_digest, files_write
from .exposure import LOOPBACK  # Prometheus and Alertmanager: on their node only (operators: through ssh)
from .nodeplan import NodePlan

q = shlex.quote
ETC = "/etc/dspark-monitoring"  # prometheus.yml, rules.yml (read-only)
SECRETS = "/run/dspark-monitoring"  # alertmanager.yml, gateway-metrics-key (read-only)
TSDB = "/prometheus"
HOST_ROOT = "/host"  # the node's / in the node exporter (read-only)
GATEWAY_KEY = f"{SECRETS}/gateway-metrics-key"
DOCKERFILE = Path(__file__).resolve().parents[1] / "programs" / "monitoring" / "Dockerfile"
BUILT_FROM = "deepseek-spark.dockerfile"  # the image's label: the digest of the Dockerfile it was built from


def dockerfile_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def image_build(image: str, digest: str) -> str:
    """On a node: build the monitoring image from its Dockerfile (on stdin: it copies no file, so it needs no
    context) unless the node holds one built from the same Dockerfile (its label says which)."""
    return imagebuild.unless_built(image, BUILT_FROM, digest,
                                   f"docker build --label {q(f'{BUILT_FROM}={digest}')} -t {q(image)} -")


@dataclass(frozen=True)
class Container:
    name: str
    entrypoint: tuple[str, ...]
    command: tuple[str, ...]
    mounts: tuple[tuple[str, str, str, bool], ...]  # (target, source, type, read-only)
    memory_mib: int


@dataclass(frozen=True)
class ExporterPlan:
    """The node exporter on one node of the stack."""

    node: NodePlan
    group: str  # the plan name of the node's group (whose docker provider reaches it)
    container: Container
    port: int

    @property
    def target(self) -> str:
        return f"{self.node.host}:{self.port}"


@dataclass(frozen=True)
class ServerPlan:
    node: NodePlan
    directory: str
    files: dict[str, str]  # prometheus.yml, rules.yml
    files_write: str
    files_delete: str
    alertmanager_path: str
    alertmanager_create: str
    alertmanager_delete: str
    key_path: Optional[str]  # the gateway's metrics key (None: no gateway to scrape)
    key_create: Optional[str]
    key_delete: Optional[str]
    volume: str
    keep_data: bool
    prometheus: Container
    alertmanager: Container
    prometheus_url: str
    alertmanager_url: str
    group_wait: int  # Alertmanager's wait before it sends a new alert (seconds)
    group_interval: int  # and before it sends what changed in a group, a resolution too

    @property
    def files_digest(self) -> str:
        """What Prometheus was started with: a change restarts it (its label holds it)."""
        return files_digest(self.files)


@dataclass(frozen=True)
class MonitoringPlan:
    stack: str
    image: str
    exporters: tuple[ExporterPlan, ...]
    server: Optional[ServerPlan]
    dockerfile: str = ""  # programs/monitoring/Dockerfile, what `build` reads on stdin
    build: Optional[str] = None  # the image's build on each node (image_build); None: another image, pulled

    @property
    def digest(self) -> str:
        """The Dockerfile's digest, on the image and every monitoring container: a new Dockerfile rebuilds the
        image and restarts them."""
        return dockerfile_digest(self.dockerfile) if self.build else ""

    def to_output(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node_exporters": [e.target for e in self.exporters]}
        if self.server is not None:
            out.update(node=self.server.node.name, prometheus=self.server.prometheus_url,
                       alertmanager=self.server.alertmanager_url, volume=self.server.volume)  # fmt: skip
        return out


def exporter_container(stack: str, mc: MonitoringConfig, host: str) -> Container:
    """The node exporter on the node whose management address is `host` (where Prometheus scrapes it)."""
    ne = mc.node_exporter
    return Container(
        name=f"{stack}-node-exporter",
        entrypoint=("/usr/bin/prometheus-node-exporter",),
        # the node's own /proc and /sys (the host's: what a container's own shows too, with the host's PID space)
        command=(f"--path.rootfs={HOST_ROOT}", f"--path.procfs={HOST_ROOT}/proc", f"--path.sysfs={HOST_ROOT}/sys",
                 f"--web.listen-address={host}:{ne.port}",
                 # a container sees the node's mounts under /host: these are not the node's own filesystems
                 "--collector.filesystem.mount-points-exclude=^/(dev|proc|run|sys|var/lib/docker/.+)($|/)"),
        mounts=((HOST_ROOT, "/", "bind", True),),
        memory_mib=ne.memory_mib,
    )  # fmt: skip


def prometheus_config(scrape: list[dict[str, Any]], mc: MonitoringConfig, stack: str) -> dict[str, Any]:
    """prometheus.yml: the stack's scrape configs (the gateway's key file where this server mounts it)."""
    s = mc.server
    jobs = []
    for job in scrape:
        job = json.loads(json.dumps(job))
        if "authorization" in job:
            job["authorization"]["credentials_file"] = GATEWAY_KEY
        jobs.append(job)
    return {
        "global": {"scrape_interval": f"{s.scrape_interval_seconds}s",
                   "evaluation_interval": f"{s.evaluation_interval_seconds}s", "external_labels": {"stack": stack}},
        "rule_files": [f"{ETC}/rules.yml"],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{s.alertmanager_port}"]}]}]},
        "scrape_configs": jobs,
    }  # fmt: skip


def alertmanager_config(webhook: Optional[str], group_wait: int, group_interval: int = 60) -> str:
    """alertmanager.yml (computed in an apply: the webhook URL is a secret). Without a webhook the alerts are
    kept in Alertmanager (its API and UI) and sent nowhere."""
    receiver: dict[str, Any] = {"name": "webhook"}
    if webhook:
        receiver["webhook_configs"] = [{"url": webhook, "send_resolved": True}]
    doc = {"route": {"receiver": "webhook", "group_by": ["alertname", "stack", "group", "node"],
                     "group_wait": f"{group_wait}s", "group_interval": f"{group_interval}s", "repeat_interval": "4h"},
           "receivers": [receiver]}  # fmt: skip
    return yaml.safe_dump(doc, sort_keys=False)


def server_node(sc: StackConfig, nodes: tuple[tuple[str, NodePlan], ...]) -> NodePlan:
    """The server's node among the stack's `nodes` ((group's plan name, node), group by group: stackplan's)."""
    s = sc.monitoring.server
    router = sc.router.node if sc.router else None
    where = s.node or (router if router and router != "local" else nodes[0][1].name)
    return next(n for _, n in nodes if n.name == where)


def exporters_only(sc: StackConfig, stack: str, nodes: tuple[tuple[str, NodePlan], ...]) -> MonitoringPlan:
    """The stack's node exporters (every node of every group, unless monitoring.nodeExporter is off); `nodes`:
    (the group's plan name, node) of every node of the stack, group by group."""
    mc = sc.monitoring
    exporters = tuple(ExporterPlan(n, group, exporter_container(stack, mc, n.host), mc.node_exporter.port)
                      for group, n in nodes) if mc.node_exporter.enabled else ()  # fmt: skip
    if mc.image != MONITORING_IMAGE:  # the user's own image: pulled like any other
        return MonitoringPlan(stack, mc.image, exporters, None)
    text = DOCKERFILE.read_text()
    return MonitoringPlan(stack, mc.image, exporters, None, text, image_build(mc.image, dockerfile_digest(text)))


def server(sc: StackConfig, stack: str, node: NodePlan, scrape: list[dict[str, Any]], rules_text: str,
           state_dir: str, sudo: str) -> ServerPlan:  # fmt: skip
    """Prometheus and Alertmanager on `node`: files under `state_dir` (the node's), the TSDB on a volume; the
    gateway's metrics key beside them when a scrape job reads the gateway with it."""
    mc = sc.monitoring
    s = mc.server
    name = f"{stack}-monitoring"
    directory = f"{state_dir}/{name}"
    files = {"prometheus.yml": "# written by deepseek-spark (planning/prometheus.py)\n"
                               + yaml.safe_dump(prometheus_config(scrape, mc, stack), sort_keys=False),
             "rules.yml": rules_text}  # fmt: skip
    am_path = f"{directory}/alertmanager.yml"
    key_path = f"{directory}/gateway-metrics-key" if any("authorization" in job for job in scrape) else None
    secrets = ((f"{SECRETS}/alertmanager.yml", am_path, "bind", True),
               *([(GATEWAY_KEY, key_path, "bind", True)] if key_path else []))  # fmt: skip
    prometheus = Container(
        name=f"{stack}-prometheus", entrypoint=("/usr/bin/prometheus",),
        command=(f"--config.file={ETC}/prometheus.yml", f"--storage.tsdb.path={TSDB}",
                 # loopback: nothing but an operator (through ssh) reads it (planning/exposure.py)
                 f"--storage.tsdb.retention.time={s.retention}", f"--web.listen-address={LOOPBACK}:{s.prometheus_port}"),
        mounts=((ETC, f"{directory}/etc", "bind", True), (TSDB, f"{stack}-prometheus", "volume", False), *secrets),
        memory_mib=s.memory_mib,
    )  # fmt: skip
    alertmanager = Container(
        name=f"{stack}-alertmanager", entrypoint=("/usr/bin/prometheus-alertmanager",),
        command=(f"--config.file={SECRETS}/alertmanager.yml", "--storage.path=/tmp/alertmanager",
                 f"--web.listen-address={LOOPBACK}:{s.alertmanager_port}", "--cluster.listen-address="),
        mounts=secrets[:1], memory_mib=s.alertmanager_memory_mib,
    )  # fmt: skip
    return ServerPlan(
        node=node, directory=directory, files=files, files_write=files_write(f"{directory}/etc", files, sudo),
        files_delete=f"{sudo}rm -rf {q(directory + '/etc')}\n",
        alertmanager_path=am_path, alertmanager_create=secret_file_create(am_path, sudo),
        alertmanager_delete=secret_file_delete(am_path, sudo),
        key_path=key_path, key_create=key_path and secret_file_create(key_path, sudo),
        key_delete=key_path and secret_file_delete(key_path, sudo),
        volume=f"{stack}-prometheus", keep_data=s.keep_data, prometheus=prometheus, alertmanager=alertmanager,
        prometheus_url=f"http://{LOOPBACK}:{s.prometheus_port}", alertmanager_url=f"http://{LOOPBACK}:{s.alertmanager_port}",
        group_wait=s.group_wait_seconds, group_interval=s.group_interval_seconds,
    )  # fmt: skip
