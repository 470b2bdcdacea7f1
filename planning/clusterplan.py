"""The shape of the stack's plan: a ClusterPlan holds a StackPlan for every group (its nodes, image, ranks,
readiness, memory), the router, the team gateway and the monitoring. Only the dataclasses: planning/stackplan.py
builds them, and the modules that read a finished plan (alerts, monitoring, the components) import them from here.
This module imports the plan types it holds, never a module that reads a ClusterPlan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import memoryplan, plan, routing
from .budget import NodeBudget
from .exposure import NodeExposure
from .frontdoor import FrontDoorPlan
from .gateway import GatewayPlan
from .guard import GuardPlan
from .nodeplan import NodePlan
from .prometheus import MonitoringPlan
from declared.cluster import ImageBuildConfig


@dataclass(frozen=True)
class SeedPlan:
    """The head serving its downloaded checkpoint to the workers' copies (rsync over ConnectX-7)."""

    start: str
    stop: str


@dataclass(frozen=True)
class ImagePlan:
    name: str
    timeout_minutes: int
    build: Optional[ImageBuildConfig]
    agree: str = ""  # where Pulumi runs: every node's image IDs agree (commands.image_agree)
    build_digest: str = ""  # with `build`: the digest of its inputs (plan.image_build_digest), the image's label
    build_script: str = ""  # ... the node's script (imagebuild.context_build): builds unless built from these inputs
    build_stdin: str = ""  # ... the context it reads on stdin (imagebuild.context_stdin)


@dataclass(frozen=True)
class ExportPlan:
    """nfs mode with workers: the head's read-only export of the checkpoint."""

    create: str
    delete: str


@dataclass(frozen=True)
class GroupPlan:
    engine: str
    revision: str
    specs: tuple[plan.RankSpec, ...]
    key_file_create: str
    key_file_delete: str
    key_file_path: str
    generation_record: str
    # per rank: the image's own parsers on that rank's argv before the group starts (commands.argcheck,
    # with programs/argcheck.py on stdin)
    argchecks: tuple[str, ...] = ()
    argcheck_program: str = ""
    # where Pulumi runs: RDMA bandwidth between linked nodes before the group starts (commands.fabric_gate)
    fabric_gate: Optional[str] = None
    # per rank, on its node once the old group is down: page cache dropped, MemAvailable against the plan
    # (commands.memgate, with programs/memgate.py on stdin); empty with memory.memoryGate off
    memory_gates: tuple[str, ...] = ()
    # the same, report only (no drop, no verdict): what a gate runs when only its program or connection
    # changed while the group serves (its ranks hold the memory then; the gate itself runs at the next start)
    memory_reports: tuple[str, ...] = ()
    memgate_program: str = ""


@dataclass(frozen=True)
class ReadinessPlan:
    command: str
    timeout_minutes: int  # for Pulumi: the probe's own timeout plus a margin


@dataclass(frozen=True)
class AlertTargets:
    """What the alert rules hold the group to (planning/alerts.py)."""

    kv_tokens: int  # the KV pool rank 0 should obtain (memoryplan.expected_kv_tokens)
    min_kv_share: float  # readiness.minKvShare: less than this share of kv_tokens is a shortfall
    memory_floor_gib: float  # memory.runtimeFloorGiB: what the plan keeps free on a node while the group serves
    ttft_seconds: float  # alerts.ttftSeconds: the p95 time to first token to stay under


@dataclass(frozen=True)
class StackPlan:
    stack: str
    engine: str
    endpoint: str
    model: str
    revision: str  # the group revision: computed here only
    nodes: tuple[NodePlan, ...]
    image: ImagePlan
    export: Optional[ExportPlan]
    group: GroupPlan
    readiness: ReadinessPlan
    memory: memoryplan.MemoryPlan
    name: Optional[str] = None  # the group's name in a stack with `groups`; None: the stack is one group
    seed: Optional[SeedPlan] = None  # source: download with share.mode: local and workers
    planes: str = ""  # which network carries what, and the checkpoint's modelled boot read (fabric.summary)
    compile_cache_prefix: str = ""  # the compile-cache volumes' names start so (plan.compile_cache_prefix)
    # per node of the group, in rank order: its memory budget, every container the stack places there (budget.py)
    budgets: tuple[NodeBudget, ...] = ()
    guard: Optional[GuardPlan] = None  # the guard on every node (serving.selfHeal), None when it is off
    alerts: Optional[AlertTargets] = None  # what the alert rules hold the group to

    @property
    def group_name(self) -> str:
        return self.name or self.stack


@dataclass(frozen=True)
class MemberPlan:
    """A group's place in the router's rotation (local commands, where Pulumi runs)."""

    worker: str  # the group's rank-0 URL
    add: str
    remove: str


@dataclass(frozen=True)
class RouterPlan:
    node: Optional[NodePlan]  # where the router container runs; None: the docker engine where Pulumi runs
    group: Optional[str]  # the group that node belongs to
    spec: routing.RouterSpec
    key_file_create: str
    key_file_delete: str
    url: str  # http://host:port
    readiness: ReadinessPlan  # one answer through the router
    metrics: str  # host:port of the router's Prometheus exporter
    argcheck: str  # the image's sglang-router parser on the router's argv (commands.image_check)

    @property
    def endpoint(self) -> str:
        """The stack's endpoint."""
        return self.url + "/v1"


@dataclass(frozen=True)
class ClusterPlan:
    """The whole stack: its groups (one for a stack without `groups`), and the router in front of them."""

    stack: str
    groups: tuple[StackPlan, ...]
    router: Optional[RouterPlan]
    members: tuple[Optional[MemberPlan], ...]  # per group; None without a router
    gateway: Optional[GatewayPlan] = None  # the team gateway in front of it all (gateway.members' keys)
    monitoring: Optional[MonitoringPlan] = None  # node exporters, and Prometheus + Alertmanager
    exposure: tuple[NodeExposure, ...] = ()  # every node's listeners, who may reach them, its fence (exposure.build)
    front_door: Optional[FrontDoorPlan] = None  # the stack's one HTTPS port (frontDoor.enabled)

    @property
    def upstream(self) -> str:
        """Where the stack serves behind the gateway (the internal key): the router's, or the one group's."""
        return self.router.endpoint if self.router else self.groups[0].endpoint

    @property
    def inner_endpoint(self) -> str:
        """What answers behind the front door: the gateway's when there is one, else the router's or the group's."""
        return self.gateway.endpoint if self.gateway else self.upstream

    @property
    def endpoint(self) -> str:
        """The stack's endpoint: the front door's when there is one."""
        return self.front_door.endpoint if self.front_door else self.inner_endpoint

    @property
    def model(self) -> str:
        return self.groups[0].model

    @property
    def budgets(self) -> tuple[NodeBudget, ...]:
        """Every node's memory budget, group by group."""
        return tuple(b for g in self.groups for b in g.budgets)
