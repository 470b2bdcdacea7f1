"""The stack's plan as one object: everything the program will create, per node, computed once from
the validated config. The Pulumi components receive their part of it (never the raw config), and
`python -m dspark plan` prints the same object, so what a reviewer reads is what `up` builds.

    sp = stackplan.build(cfg, "tp4", host_keys)     # pure: no Pulumi, no node
    sp.revision, sp.nodes[1].preflight, sp.group.specs[0].args, sp.memory
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from . import budget, commands, fabric, memoryplan, plan, routing
from . import gateway as gateway_plan
from . import alerts, monitoring
from . import guard as guard_plan
from . import prometheus
from .budget import NodeBudget
from .gateway import GatewayPlan
from .guard import GuardPlan
from declared.config import LOCAL, ClusterConfig, ImageBuildConfig, StackConfig

# Runs inside the serving image (its python3 and engine packages), fed on stdin.
ARGCHECK_PROGRAM = (Path(__file__).parent.parent / "programs" / "argcheck.py").read_text()
# Runs with the node's python3, fed on stdin: the memory gate before a group starts.
MEMGATE_PROGRAM = (Path(__file__).parent.parent / "programs" / "memgate.py").read_text()


@dataclass(frozen=True)
class DownloadPlan:
    """model.source: download on a node that holds a copy: fetched once per revision (the head from the
    hub; with share.mode: local, each worker copies the head's over ConnectX-7: `from_head`)."""

    create: str
    triggers: tuple[str, ...]
    from_head: bool = False


@dataclass(frozen=True)
class SeedPlan:
    """The head serving its downloaded checkpoint to the workers' copies (rsync over ConnectX-7)."""

    start: str
    stop: str


@dataclass(frozen=True)
class ShardPlan:
    """The node's engram shard (SGLang): packed once per checkpoint revision, TP layout and rank."""

    files: tuple[str, ...]
    create: str
    delete: str
    triggers: tuple[str, ...]
    retain: bool


@dataclass(frozen=True)
class NodePlan:
    name: str
    rank: int
    host: str
    fabric_ip: str
    ssh_port: int
    ssh_user: str
    docker_host: str  # ssh://user@host[:port] for the docker provider
    ssh_opts: tuple[str, ...]  # the system ssh client's options (docker provider, readiness probe)
    host_key: Optional[str]  # pinned for remote commands; None: not verified
    dial_error_limit: int  # remote commands: failed dials before giving up (ssh.dialErrorLimit)
    per_dial_timeout: int  # remote commands: seconds per TCP connect (ssh.perDialTimeout)
    preflight: str  # read-only checks (commands.preflight)
    volume_name: str
    volume_options: dict[str, str]  # the checkpoint volume's driver_opts on this node
    download: Optional[DownloadPlan]
    shard: Optional[ShardPlan]

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


@dataclass(frozen=True)
class ImagePlan:
    name: str
    timeout_minutes: int
    build: Optional[ImageBuildConfig]
    agree: str = ""  # where Pulumi runs: every node's image IDs agree (commands.image_agree)


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
    monitoring: Optional["prometheus.MonitoringPlan"] = None  # node exporters, and Prometheus + Alertmanager

    @property
    def upstream(self) -> str:
        """Where the stack serves behind the gateway (the internal key): the router's, or the one group's."""
        return self.router.endpoint if self.router else self.groups[0].endpoint

    @property
    def endpoint(self) -> str:
        """The stack's endpoint: the gateway's when there is one."""
        return self.gateway.endpoint if self.gateway else self.upstream

    @property
    def model(self) -> str:
        return self.groups[0].model

    @property
    def budgets(self) -> tuple[NodeBudget, ...]:
        """Every node's memory budget, group by group."""
        return tuple(b for g in self.groups for b in g.budgets)


def _download(cfg: ClusterConfig, stack: str, rank: int) -> Optional[DownloadPlan]:
    holds_copy = rank == 0 or cfg.share.mode == "local"
    if cfg.model.source != "download" or not holds_copy:
        return None
    m = cfg.model
    triggers = (m.hf_repo or "", m.revision, m.checkpoint_dir)
    if rank > 0:  # downloaded once, on the head; copied from it over the worker's ConnectX-7 link
        return DownloadPlan(commands.checkpoint_copy(cfg, rank), triggers, from_head=True)
    return DownloadPlan(commands.download(cfg, stack), triggers)


def _shard(cfg: ClusterConfig, stack: str, rank: int) -> Optional[ShardPlan]:
    if cfg.engine != "sglang" or cfg.engram is None:
        return None
    return ShardPlan(
        files=tuple(plan.shard_files(rank, cfg.serving.tp_size)),
        create=commands.engram_pack(cfg, stack, rank),
        delete=commands.engram_delete(cfg, rank),
        # What forces a repack: the checkpoint revision, the TP layout and the rank (and where it lives).
        triggers=(cfg.model.revision, f"tp={cfg.serving.tp_size}", f"rank={rank}", cfg.engram.dir),
        retain=cfg.engram.retain,
    )


def restart_hint(name: str, group: Optional[str]) -> str:
    """The operator command that starts group `group` (None: the stack's one group) over; `name` is what its
    resources carry (`<stack>` or `<stack>-<group>`)."""
    stack = name[: -len(group) - 1] if group else name
    return f"python -m dspark restart --stack {stack}" + (f" --group {group}" if group else "") + " --yes"


def build(
    cfg: ClusterConfig, stack: str, host_keys: tuple[Optional[str], ...] = (), group: Optional[str] = None,
    budgets: tuple[NodeBudget, ...] = (),
) -> StackPlan:
    """The whole plan of one group from its validated config (and the host keys config.load found).
    `stack` is the name its resources carry (the stack's, or `<stack>-<group>`); `budgets`: its nodes' memory budgets in the
    stack (budget.node_budgets: the router and the gateway on its nodes), default: the group alone there.
    Each rank's limit and its memory gate's need are the budget's."""
    budgets = budgets or budget.group_budgets(cfg, stack)
    ranks = [b.rank for b in budgets]
    specs = tuple(plan.group_specs(cfg, stack, limits=[r.limit_mib for r in ranks]))
    memory = memoryplan.memory_plan(cfg)
    revision = plan.group_revision(list(specs), plan.image_build_digest(cfg))
    ssh_opts = tuple(commands.ssh_opts(cfg))
    nodes = tuple(
        NodePlan(
            name=n.name,
            rank=rank,
            host=n.host,
            fabric_ip=n.fabric_ip,
            ssh_port=n.ssh_port,
            ssh_user=n.ssh_user,
            docker_host=f"ssh://{n.ssh_user}@{n.host}" + ("" if n.ssh_port == 22 else f":{n.ssh_port}"),
            ssh_opts=ssh_opts,
            host_key=host_keys[rank] if rank < len(host_keys) else n.host_key,
            dial_error_limit=cfg.ssh.dial_error_limit,
            per_dial_timeout=cfg.ssh.per_dial_timeout,
            preflight=commands.preflight(cfg, stack, rank),
            volume_name=plan.checkpoint_volume_name(stack),
            volume_options=plan.volume_options(cfg, rank),
            download=_download(cfg, stack, rank),
            shard=_shard(cfg, stack, rank),
        )
        for rank, n in enumerate(cfg.nodes)
    )
    export = None
    if cfg.share.mode == "nfs" and len(cfg.nodes) > 1:
        export = ExportPlan(commands.export_create(cfg, stack), commands.export_delete(cfg, stack))
    return StackPlan(
        stack=stack,
        engine=cfg.engine,
        endpoint=plan.endpoint(cfg),
        model=cfg.model.served_name,
        revision=revision,
        nodes=nodes,
        image=ImagePlan(cfg.image, cfg.image_timeout_minutes, cfg.image_build, commands.image_agree(cfg, group or stack)),
        export=export,
        group=GroupPlan(
            engine=cfg.engine,
            revision=revision,
            specs=specs,
            key_file_create=commands.api_key_create(cfg, stack),
            key_file_delete=commands.api_key_delete(cfg, stack),
            key_file_path=plan.api_key_path(cfg, stack),
            generation_record=commands.generation_record(stack, revision),
            argchecks=tuple(
                commands.argcheck(spec, plan.rank_checks(cfg, spec), plan.checkpoint_volume_name(stack))
                for spec in specs
            ),
            argcheck_program=ARGCHECK_PROGRAM,
            fabric_gate=commands.fabric_gate(cfg),
            memory_gates=tuple(commands.memgate(cfg, r, need_mib=ranks[r].need_mib) for r in range(len(cfg.nodes)))
            if cfg.memory.memory_gate else (),
            memory_reports=tuple(commands.memgate(cfg, r, report_only=True, need_mib=ranks[r].need_mib)
                                 for r in range(len(cfg.nodes))) if cfg.memory.memory_gate else (),
            memgate_program=MEMGATE_PROGRAM,
        ),
        readiness=ReadinessPlan(commands.readiness(cfg, stack, restart_hint=restart_hint(stack, group)),
                                cfg.readiness.timeout_seconds // 60 + 5),
        memory=memory,
        name=group,
        planes=fabric.summary(cfg, memory.ranks[0].weights_gib),
        compile_cache_prefix=plan.compile_cache_prefix(stack),
        budgets=budgets,
        seed=SeedPlan(commands.seed_start(cfg, stack), commands.seed_stop(cfg, stack))
        if any(n.download is not None and n.download.from_head for n in nodes) else None,
        guard=guard_plan.build(cfg, stack, stack[: -len(group) - 1] if group else stack,
                               needs=tuple(r.need_mib for r in ranks)),
        alerts=AlertTargets(memoryplan.expected_kv_tokens(cfg), cfg.readiness.min_kv_share, cfg.memory.runtime_floor_gib,
                            cfg.alerts.ttft_seconds),
    )


def build_stack(sc: StackConfig, stack: str, host_keys: tuple[tuple[Optional[str], ...], ...] = ()) -> ClusterPlan:
    """The plan of every group of the stack and of its router (rules.check_stack passed)."""
    budgets = budget.node_budgets(sc, stack)  # before the groups: each rank's limit is what its node's budget leaves
    groups = tuple(
        build(e.cfg, e.plan_name(stack), host_keys[i] if i < len(host_keys) else (), e.name,
              tuple(b for b in budgets if b.group == i))
        for i, e in enumerate(sc.groups)
    )
    if sc.router is None:
        cp = ClusterPlan(stack, groups, None, tuple(None for _ in groups))
        return _monitoring(sc, stack, replace(cp, gateway=_gateway(sc, stack, cp)))
    r = sc.router
    workers = [routing.worker_url(e.cfg.nodes[0].host, e.cfg.serving.port) for e in sc.groups]
    if r.node == LOCAL:  # where Pulumi runs: its docker engine, a key file in its user's state dir
        gi, node, host, sudo = 0, None, r.address or "127.0.0.1", ""
        key_path = str(Path.home() / ".local/state/deepseek-spark" / f"{stack}-router" / "api-key")
    else:
        gi, ni = next((i, j) for i, e in enumerate(sc.groups) for j, n in enumerate(e.cfg.nodes) if n.name == r.node)
        node = groups[gi].nodes[ni]
        host, sudo = r.address or node.host, commands.key_sudo(sc.groups[gi].cfg, node.ssh_user)
        key_path = commands.router_key_path(sc.groups[gi].cfg, node.ssh_user, stack)
    cfg = sc.groups[gi].cfg
    url = routing.worker_url(host, r.port)
    readiness = ReadinessPlan(
        commands.readiness(cfg, stack, url=url + "/v1"), cfg.readiness.timeout_seconds // 60 + 5
    )
    spec = routing.router_spec(r, stack, r.image or cfg.image, key_path, workers)
    router = RouterPlan(
        node=node,
        group=groups[gi].group_name if node else None,
        spec=spec,
        key_file_create=commands.secret_file_create(key_path, sudo),
        key_file_delete=commands.secret_file_delete(key_path, sudo),
        url=url,
        readiness=readiness,
        metrics=f"{host}:{r.metrics_port}",
        argcheck=commands.image_check(spec.image, node.name if node else LOCAL, "router", [("router", list(spec.args))]),
    )
    members = tuple(
        MemberPlan(
            worker=w,
            add=routing.member_add(url, w, e.cfg.readiness.timeout_seconds),
            remove=routing.member_remove(url, w, e.cfg.engine, r.drain_timeout_seconds),
        )
        for e, w in zip(sc.groups, workers)
    )
    # Behind the router, a group's guard takes it out of rotation while it heals, and puts it back; a router where
    # Pulumi runs is at 127.0.0.1 only for Pulumi (unless router.address says where the nodes reach it): the guard
    # then leaves the rotation to the router's own health checks.
    reach = url if (r.node != LOCAL or r.address) else None
    groups = tuple(replace(g, guard=guard_plan.build(e.cfg, g.stack, stack, reach, w if reach else None,
                                                     tuple(b.rank.need_mib for b in g.budgets)))
                   for g, e, w in zip(groups, sc.groups, workers))  # fmt: skip
    cp = ClusterPlan(stack, groups, router, members)
    return _monitoring(sc, stack, replace(cp, gateway=_gateway(sc, stack, cp)))


def _monitoring(sc: StackConfig, stack: str, cp: ClusterPlan) -> ClusterPlan:
    """The stack's node exporters, then (monitoring.server) Prometheus over the stack's scrape configs, which
    include them, with the stack's alert rules, and Alertmanager."""
    cp = replace(cp, monitoring=prometheus.exporters_only(sc, stack, cp))
    if sc.monitoring.server is None:
        return cp
    node = prometheus.server_node(sc, cp)
    gi = next(i for i, g in enumerate(cp.groups) if node in g.nodes)
    cfg = sc.groups[gi].cfg
    rules = alerts.render(alerts.rule_groups(cp), stack)
    server = prometheus.server(sc, stack, node, monitoring.scrape_configs(cp), rules,
                               plan.state_dir(cfg, node.ssh_user), commands.key_sudo(cfg, node.ssh_user))
    return replace(cp, monitoring=replace(cp.monitoring, server=server))


def _gateway(sc: StackConfig, stack: str, cp: ClusterPlan) -> Optional[GatewayPlan]:
    """The gateway on its node (rules.check_stack made sure the node exists), in front of cp.upstream."""
    gw = sc.gateway
    if gw is None:
        return None
    where = gateway_plan.default_node(gw, sc.router.node if sc.router else None, sc.groups[0].cfg.nodes[0].name)
    gi, ni = next((i, j) for i, e in enumerate(sc.groups) for j, n in enumerate(e.cfg.nodes) if n.name == where)
    cfg, node = sc.groups[gi].cfg, cp.groups[gi].nodes[ni]
    url = f"http://{gw.address or node.host}:{gw.port}/v1"
    return gateway_plan.build(
        gw, stack, node, plan.state_dir(cfg, node.ssh_user), commands.key_sudo(cfg, node.ssh_user), cp.model,
        cp.upstream, commands.readiness(cfg, stack, url=url, health_path=gateway_plan.HEALTH_PATH),
        cfg.readiness.timeout_seconds // 60 + 5,
    )
