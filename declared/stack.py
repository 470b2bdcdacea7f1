"""The stack's own config: the fields of `deepseek-spark:cluster` beside one group's (`groups`, `router`,
`gateway` with its members, `monitoring`), `StackConfig` that holds them with every group's `ClusterConfig`,
and `parse_stack`, which merges each group's fields over the shared ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from .cluster import (
    ClusterConfig, ConfigError, Host, ImageRef, Name, Printable, Source, _Strict, error_lines, parse_cluster,
)  # fmt: skip

ROUTER_POLICIES = ("round_robin", "cache_aware", "power_of_two", "random")
LOCAL = "local"  # router.node: the docker engine where Pulumi runs
ANYWHERE = "0.0.0.0/0"


class RouterConfig(_Strict):
    """The SGLang router (`sglang-router`, PyPI) in front of several groups: one endpoint, the API key
    enforced there, groups taken out of rotation while they restart (scripts/router.sh of the reference)."""

    node: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")] = Field(
        description="name of the node (of any group) that runs the router container, or `local`: the docker "
        "engine where Pulumi runs"
    )
    address: Host | None = Field(
        default=None, description="where clients reach the router (default: its node's host; 127.0.0.1 when local)"
    )
    port: int = Field(default=8889, ge=1024, le=65535, description="the stack's endpoint port on that node")
    metrics_port: int = Field(default=29000, ge=1024, le=65535, description="the router's Prometheus port")
    policy: Literal[ROUTER_POLICIES] = Field(  # type: ignore[valid-type]
        default="round_robin", description="round_robin: cache_aware piles shared prefixes onto one group"
    )
    image: ImageRef | None = Field(
        default=None, description="image with sglang_router (default: the SGLang image of the router node's group)"
    )
    request_timeout_seconds: int = Field(default=1800, ge=1, le=86400, description="the longest a request may take "
                                         "through the router, in seconds (--request-timeout-secs)")  # fmt: skip
    drain_timeout_seconds: int = Field(
        default=600, ge=0, le=86400, description="longest wait for a group's requests to finish before it restarts"
    )
    # The container's memory limit (no swap), counted in its node's budget. sglang-router is a Rust proxy that
    # buffers a request body of up to 512 MiB (--max-payload-size): 1 GiB holds one of those and its own use.
    memory_mib: int = Field(default=1024, ge=256, le=16384, alias="memoryMiB", description="the router's container")


GATEWAY_IMAGE = "deepseek-spark-gateway:litellm-1.110.2"  # built from programs/gateway/Dockerfile
MEMBER_NAME = r"^[a-z0-9]([a-z0-9._-]{0,30}[a-z0-9])?$"
# What the gateway's hook calls the admin's and Prometheus's keys in usage rows and metrics: no member's name.
RESERVED_MEMBERS = ("admin", "metrics")


class MemberConfig(_Strict):
    """A team member: their own key (a Pulumi secret), scoped to the served model, revocable alone."""

    name: Annotated[str, Field(pattern=MEMBER_NAME)] = Field(
        description="1-32 lowercase letters, digits or ._- (it names the member's resources, metrics and usage)"
    )
    models: list[Name] = Field(default_factory=list, description="served models this key may call (default: all)")
    rpm_limit: int | None = Field(default=None, ge=1, le=1_000_000, description="requests per minute (LiteLLM enforces it)")
    tpm_limit: int | None = Field(default=None, ge=1, le=10**9, description="tokens per minute (LiteLLM enforces it)")
    # A budget in tokens, not dollars: the model runs on the team's own Sparks, so LiteLLM's USD budgets (its
    # price table, its Prisma-backed spend) have nothing to count; the gateway's hook counts the usage table.
    token_budget: int | None = Field(
        default=None, ge=1, le=10**12,
        description="prompt + completion tokens per budgetPeriod; beyond it the gateway answers 429 until the period ends",
    )
    budget_period: Literal["day", "week", "month"] = Field(
        default="month", description="the budget's period, in UTC (a week starts on Monday)"
    )
    rotation: int = Field(default=0, ge=0, le=10**6, description="raise it to issue the member a new generated key")

    @model_validator(mode="after")
    def _period_needs_budget(self) -> "MemberConfig":
        if self.name in RESERVED_MEMBERS:
            raise ValueError(f"name: {self.name!r} is what the gateway calls its own {self.name} key in usage and "
                             "metrics; fix: give the member another name")  # fmt: skip
        if "budget_period" in self.model_fields_set and self.token_budget is None:
            raise ValueError(f"budgetPeriod: {self.budget_period!r} without tokenBudget limits nothing; "
                             "fix: set tokenBudget (tokens per period) or remove budgetPeriod")  # fmt: skip
        return self


class GatewayConfig(_Strict):
    """The team gateway (LiteLLM's proxy, PostgreSQL beside it) in front of the stack's endpoint: a key per
    member, revocable without restarting a group, and usage per member."""

    node: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")] | None = Field(
        default=None, description="the node that runs the gateway (default: the router's node, else the head)"
    )
    address: Host | None = Field(default=None, description="where clients reach the gateway (default: its node's host)")
    port: int = Field(default=4000, ge=1024, le=65535, description="the stack's endpoint port: the only one a client needs")
    database_port: int = Field(default=5433, ge=1024, le=65535, description="PostgreSQL's port on 127.0.0.1 of that node")
    image: ImageRef = Field(default=GATEWAY_IMAGE, description="built on the node from programs/gateway/Dockerfile")
    keep_data: bool = Field(default=True, description="destroy keeps the database volume (keys and usage records)")
    # The containers' memory limits (no swap): on a Spark the rank's unified memory is what they would take.
    memory_mib: int = Field(default=1024, ge=512, le=16384, alias="memoryMiB", description="LiteLLM's container")
    database_memory_mib: int = Field(default=512, ge=128, le=16384, alias="databaseMemoryMiB",
                                     description="PostgreSQL's container")  # fmt: skip
    request_timeout_seconds: int = Field(default=1800, ge=1, le=86400, description="the longest LiteLLM waits for "
                                         "the endpoint's answer to a request, in seconds")  # fmt: skip
    members: list[MemberConfig] = Field(default_factory=list,
                                        description="the team's members, each with a key of their own")  # fmt: skip

    @model_validator(mode="after")
    def _unique_members(self) -> "GatewayConfig":
        names = [m.name for m in self.members]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"members: {', '.join(dup)} listed twice; every member needs their own name")
        return self


MONITORING_IMAGE = "deepseek-spark-monitoring:bookworm"  # built from programs/monitoring/Dockerfile (Debian's packages)


class NodeExporterConfig(_Strict):
    """Debian's prometheus-node-exporter on every node: its memory (MemAvailable, the page cache) and more."""

    enabled: bool = Field(default=True, description="run it on every node (the memory alerts read it)")
    port: int = Field(default=9100, ge=1024, le=65535, description="its port on every node's host network")
    memory_mib: int = Field(default=64, ge=32, le=1024, alias="memoryMiB", description="its container's limit")


class MonitoringServerConfig(_Strict):
    """Prometheus and Alertmanager on one node, for a team that has none: they scrape every target of the
    `prometheus` output, evaluate the `alert_rules` and send alerts to `alertWebhook` (a Pulumi secret)."""

    node: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")] | None = Field(
        default=None, description="the node that runs them (default: the router's node, else the head)"
    )
    prometheus_port: int = Field(default=9090, ge=1024, le=65535, description="Prometheus's port on its node")
    alertmanager_port: int = Field(default=9093, ge=1024, le=65535, description="Alertmanager's port on its node")
    scrape_interval_seconds: int = Field(default=15, ge=1, le=3600, description="how often Prometheus scrapes every "
                                         "target, in seconds")  # fmt: skip
    evaluation_interval_seconds: int = Field(default=15, ge=1, le=3600, description="how often Prometheus evaluates "
                                             "the alert rules, in seconds")  # fmt: skip
    group_wait_seconds: int = Field(default=30, ge=0, le=3600, description="Alertmanager's wait before a new alert")
    group_interval_seconds: int = Field(default=60, ge=1, le=86400,
                                        description="Alertmanager's wait before what changed in a group (a resolution too)")
    retention: Annotated[str, Field(pattern=r"^[0-9]+[hdwy]$")] = Field(default="15d", description="the TSDB's")
    keep_data: bool = Field(default=True, description="destroy keeps the TSDB volume")
    memory_mib: int = Field(default=1024, ge=256, le=16384, alias="memoryMiB", description="Prometheus's container")
    alertmanager_memory_mib: int = Field(default=128, ge=64, le=4096, alias="alertmanagerMemoryMiB",
                                         description="Alertmanager's container")  # fmt: skip


class MonitoringConfig(_Strict):
    """The stack's monitoring (docs/monitoring.md): a node exporter on every node, and, when set, Prometheus
    and Alertmanager on one node."""

    image: ImageRef = Field(default=MONITORING_IMAGE, description="built on the nodes from programs/monitoring/Dockerfile")
    node_exporter: NodeExporterConfig = Field(default_factory=NodeExporterConfig,
                                              description="prometheus-node-exporter on every node (on)")  # fmt: skip
    server: MonitoringServerConfig | None = Field(default=None, description="Prometheus and Alertmanager (off)")


class OpenPortConfig(_Strict):
    """A port of the owner's own that the fence lets through on every node of the stack."""

    port: int = Field(ge=1, le=65535, description="the TCP port")
    sources: list[Source] = Field(default_factory=lambda: [ANYWHERE], min_length=1,
                                  description="who may reach it (IPv4 addresses or networks; default anywhere)")
    why: Printable = Field(min_length=1, max_length=200, description="what listens there (shown in the preview)")


class FirewallConfig(_Strict):
    """Who may reach the stack's nodes (docs/exposure.md): a host firewall on every node (nftables, one table of the
    stack's own, applied atomically, in force at boot before any container starts) that lets through ssh from the
    operators, the endpoint from the clients, and every inner port only from the parts of the stack that use it."""

    enabled: bool = Field(default=True, description="fence every node (off: every listener answers whoever reaches "
                                                    "it; the preview warns)")  # fmt: skip
    clients: list[Source] = Field(default_factory=lambda: [ANYWHERE], min_length=1,
                                  description="who may reach the stack's endpoint (default anywhere)")
    operators: list[Source] = Field(default_factory=lambda: [ANYWHERE], min_length=1,
                                    description="who may reach ssh on every node (default anywhere; Pulumi's own "
                                                "machine must be among them)")  # fmt: skip
    scrapers: list[Source] = Field(default_factory=list, description="who may scrape the node exporters, guards and "
                                   "engines besides the stack's own Prometheus (a team's Prometheus)")  # fmt: skip
    open: list[OpenPortConfig] = Field(default_factory=list, description="ports of the owner's own to let through")
    confirm_seconds: int = Field(default=60, ge=10, le=600, description="a new rule set that cuts the ssh of the "
                                 "`up` applying it is rolled back after this long")  # fmt: skip


FRONTDOOR_IMAGE = "deepseek-spark-frontdoor:nginx-1.22"  # built from programs/frontdoor/Dockerfile (Debian's nginx)
CERT_NAME = r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$|^[0-9.]+$"


class CertificateConfig(_Strict):
    """Where the front door's certificate comes from (docs/front-door.md): a CA of the stack's own, made where
    Pulumi runs (default), or the owner's own certificate and key (a company CA)."""

    source: Literal["stack-ca", "own"] = Field(
        default="stack-ca", description="stack-ca: the stack's own CA issues it (clients get the CA); own: "
        "`certificate` here and its key in the secret `deepseek-spark:frontDoorKey`"
    )
    certificate: str | None = Field(default=None, description="source own: the certificate chain (PEM, the server's "
                                    "first), for every name clients use")  # fmt: skip
    ca: str | None = Field(default=None, description="source own: the CA clients verify it with (PEM; default: the "
                           "system's CAs)")  # fmt: skip
    validity_days: int = Field(default=90, ge=2, le=825, description="stack-ca: how long a server certificate lasts")
    renew_before_days: int = Field(default=30, ge=1, le=824, description="renewed (by the first `up`) this many days "
                                   "before it expires; the preview warns from then on")  # fmt: skip

    @model_validator(mode="after")
    def _consistent(self) -> "CertificateConfig":
        if self.renew_before_days >= self.validity_days:
            raise ValueError(f"renewBeforeDays: {self.renew_before_days} leaves nothing of validityDays "
                             f"{self.validity_days}; fix: a renewBeforeDays below validityDays")  # fmt: skip
        if self.source == "own" and not self.certificate:
            raise ValueError("certificate: source own needs the certificate chain (PEM) here and its key in "
                             "`pulumi config set --secret deepseek-spark:frontDoorKey < key.pem`")  # fmt: skip
        if self.source == "stack-ca" and (self.certificate or self.ca):
            raise ValueError("certificate: a certificate or ca given with source stack-ca would be ignored; fix: "
                             "set source: own, or remove them")  # fmt: skip
        for name in ("certificate", "ca"):
            pem = getattr(self, name)
            if pem and "-----BEGIN CERTIFICATE-----" not in pem:
                raise ValueError(f"{name}: not a PEM certificate (-----BEGIN CERTIFICATE-----); fix: paste the PEM file")
        return self


class FrontDoorConfig(_Strict):
    """The stack's one HTTPS endpoint (nginx, Debian's package) on the endpoint's node, in front of the gateway, the
    router or the head: TLS, the OpenAI routes and /health only, streaming unbuffered (docs/front-door.md)."""

    enabled: bool = Field(default=False, description="serve the endpoint over HTTPS through the front door")
    port: int = Field(default=443, ge=1, le=65535, description="its port on the endpoint's node: the only one clients "
                      "need; plain HTTP is not served")  # fmt: skip
    names: list[Annotated[str, Field(pattern=CERT_NAME, max_length=253)]] = Field(
        default_factory=list, description="more DNS names (or addresses) clients use for it; the node's name and "
        "address are always on the certificate"
    )
    image: ImageRef = Field(default=FRONTDOOR_IMAGE, description="built on the node from programs/frontdoor/Dockerfile")
    memory_mib: int = Field(default=256, ge=64, le=4096, alias="memoryMiB", description="its container's limit")
    certificate: CertificateConfig = Field(default_factory=CertificateConfig, description="where its certificate "
                                           "comes from")  # fmt: skip


@dataclass(frozen=True)
class GroupEntry:
    """One serving group: a name (none for a stack without `groups`) and its full config."""

    name: str | None
    cfg: ClusterConfig

    def plan_name(self, stack: str) -> str:
        """What the program names this group's resources, containers and files after."""
        return stack if self.name is None else f"{stack}-{self.name}"


@dataclass(frozen=True)
class StackConfig:
    """The whole stack: one or more groups, and the router in front of them (None: no router)."""

    groups: tuple[GroupEntry, ...]
    router: RouterConfig | None = None
    gateway: GatewayConfig | None = None
    monitoring: MonitoringConfig = MonitoringConfig()
    firewall: FirewallConfig = FirewallConfig()
    front_door: FrontDoorConfig = FrontDoorConfig()

    @property
    def single(self) -> ClusterConfig | None:
        """The config of a stack written without `groups` (today's stacks); None otherwise."""
        return self.groups[0].cfg if len(self.groups) == 1 and self.groups[0].name is None else None



STACK_SECTIONS = ("router", "gateway", "monitoring", "firewall", "frontDoor")  # the stack's own, beside the groups' fields
GROUP_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?$")
GROUP_FIELDS = ("engine", "nodes", "model", "image", "engineVersion", "imageBuild", "imageTimeoutMinutes", "serving", "engram",
                "fabric", "share", "readiness", "memory", "alerts", "topology", "stateDir")  # fmt: skip


def _merge(base: dict, override: dict) -> dict:
    """A group's config: the shared top-level fields with the group's own on top (mappings merged
    one level deep, so `serving: {tpSize: 2}` keeps the shared serving settings)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def parse_stack(raw: Any) -> StackConfig:
    """Validate `deepseek-spark:cluster` with optional `groups` and `router`; every problem in one
    message, each naming its field. Without `groups` the value is one group, exactly as before."""
    if not isinstance(raw, dict) or not {"groups", *STACK_SECTIONS} & set(raw):
        return StackConfig((GroupEntry(None, parse_cluster(raw)),))
    base = {k: v for k, v in raw.items() if k not in ("groups", *STACK_SECTIONS)}
    problems: list[str] = []
    router = gateway = None
    monitoring = MonitoringConfig()
    firewall = FirewallConfig()
    front_door = FrontDoorConfig()
    if raw.get("frontDoor") is not None:
        try:
            front_door = FrontDoorConfig.model_validate(raw["frontDoor"])
        except ValidationError as exc:
            problems += error_lines(exc, "cluster.frontDoor")
    if raw.get("firewall") is not None:
        try:
            firewall = FirewallConfig.model_validate(raw["firewall"])
        except ValidationError as exc:
            problems += error_lines(exc, "cluster.firewall")
    if raw.get("monitoring") is not None:
        try:
            monitoring = MonitoringConfig.model_validate(raw["monitoring"])
        except ValidationError as exc:
            problems += error_lines(exc, "cluster.monitoring")
    if raw.get("router") is not None:
        try:
            router = RouterConfig.model_validate(raw["router"])
        except ValidationError as exc:
            problems += error_lines(exc, "cluster.router")
    if raw.get("gateway") is not None:
        try:
            gateway = GatewayConfig.model_validate(raw["gateway"])
        except ValidationError as exc:
            problems += error_lines(exc, "cluster.gateway")
    groups_raw = raw.get("groups")
    if groups_raw is None:
        groups_raw = [None]  # a router in front of the one group the top level describes
    if not isinstance(groups_raw, list) or not groups_raw:
        problems.append("cluster.groups: must be a list of groups, each `{name: a, nodes: [...]}` plus what differs")
        raise ConfigError("invalid stack config:\n  " + "\n  ".join(problems))
    if "groups" in raw and "nodes" in base:
        problems.append("cluster.nodes: with `groups` every node belongs to a group; move the nodes into "
                        "cluster.groups[i].nodes")  # fmt: skip
    entries: list[GroupEntry] = []
    for i, g in enumerate(groups_raw):
        where = f"cluster.groups[{i}]"
        if g is None:
            try:
                entries.append(GroupEntry(None, parse_cluster(base)))
            except ConfigError as exc:
                problems.append(str(exc).removeprefix("invalid stack config:\n  "))
            continue
        if not isinstance(g, dict):
            problems.append(f"{where}: must be a mapping with `name` and `nodes`")
            continue
        name = g.get("name")
        if not isinstance(name, str) or not GROUP_NAME.match(name):
            problems.append(f"{where}.name: {name!r} must be 1-16 lowercase letters, digits or '-', e.g. a or tp4-b "
                            "(it becomes part of container and resource names)")  # fmt: skip
            continue
        unknown = sorted(set(g) - {"name", *GROUP_FIELDS})
        for key in unknown:
            problems.append(f"{where}.{key}: not a per-group field; set it at the top level of cluster (per-group "
                            f"fields: {', '.join(GROUP_FIELDS)})")  # fmt: skip
        if unknown:
            continue
        try:
            cfg = ClusterConfig.model_validate(_merge(base, {k: v for k, v in g.items() if k != "name"}))
        except ValidationError as exc:
            problems += error_lines(exc, f"{where}({name})")
            continue
        entries.append(GroupEntry(name, cfg))
    names = [e.name for e in entries if e.name]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"cluster.groups: the name {dup!r} is used twice; every group needs its own name")
    if problems:
        raise ConfigError("invalid stack config:\n  " + "\n  ".join(problems))
    return StackConfig(tuple(entries), router, gateway, monitoring, firewall, front_door)

