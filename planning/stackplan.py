"""The stack's plan as one object: everything the program will create, per node, computed once from
the validated config. The Pulumi components receive their part of it (never the raw config), and
`python -m dspark plan` prints the same object, so what a reviewer reads is what `up` builds. The plan's
dataclasses are in planning/clusterplan.py (a node's: planning/nodeplan.py); this module builds them.

    sp = stackplan.build(cfg, "tp4", host_keys)     # pure: no Pulumi, no node
    sp.revision, sp.nodes[1].preflight, sp.group.specs[0].args, sp.memory
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Optional

from . import alerts, budget, clusterplan, commands, exposure, fabric, imagebuild, memoryplan, monitoring, nodeplan
from . import frontdoor, plan, prometheus, routing
from . import gateway as gateway_plan
from . import guard as guard_plan
from .budget import NodeBudget
from .gateway import GatewayPlan
from declared.cluster import ClusterConfig
from declared.stack import LOCAL, StackConfig

BUILT_FROM = "deepseek-spark.build"  # a serving image built on a node: the digest of its build's inputs

# Runs inside the serving image (its python3 and engine packages), fed on stdin.
ARGCHECK_PROGRAM = (Path(__file__).parent.parent / "programs" / "argcheck.py").read_text()
# Runs with the node's python3, fed on stdin: the memory gate before a group starts.
MEMGATE_PROGRAM = (Path(__file__).parent.parent / "programs" / "memgate.py").read_text()


def _download(cfg: ClusterConfig, stack: str, rank: int) -> Optional[nodeplan.DownloadPlan]:
    holds_copy = rank == 0 or cfg.share.mode == "local"
    if cfg.model.source != "download" or not holds_copy:
        return None
    m = cfg.model
    triggers = (m.hf_repo or "", m.revision, m.checkpoint_dir)
    if rank > 0:  # downloaded once, on the head; copied from it over the worker's ConnectX-7 link
        return nodeplan.DownloadPlan(commands.checkpoint_copy(cfg, rank), triggers, from_head=True)
    return nodeplan.DownloadPlan(commands.download(cfg, stack), triggers)


def _shard(cfg: ClusterConfig, stack: str, rank: int) -> Optional[nodeplan.ShardPlan]:
    if cfg.engine != "sglang" or cfg.engram is None:
        return None
    return nodeplan.ShardPlan(
        files=tuple(plan.shard_files(rank, cfg.serving.tp_size)),
        create=commands.engram_pack(cfg, stack, rank),
        delete=commands.engram_delete(cfg, rank),
        # What forces a repack: the checkpoint revision, the TP layout and the rank (and where it lives).
        triggers=(cfg.model.revision, f"tp={cfg.serving.tp_size}", f"rank={rank}", cfg.engram.dir),
        retain=cfg.engram.retain,
    )


def image_plan(cfg: ClusterConfig, name: str) -> clusterplan.ImagePlan:
    """The serving image on every node: pulled, or built on each node from `imageBuild`'s context (sent on stdin)."""
    b = cfg.image_build
    image = clusterplan.ImagePlan(cfg.image, cfg.image_timeout_minutes, b, commands.image_agree(cfg, name))
    if b is None:
        return image
    digest, context = plan.image_build_digest(cfg), plan.PROJECT_ROOT / b.context
    return replace(image, build_digest=digest,
                   build_script=imagebuild.context_build(cfg.image, BUILT_FROM, digest, b.dockerfile, b.args, b.platform),
                   build_stdin=imagebuild.context_stdin(context, plan.context_files(context)))


def restart_hint(name: str, group: Optional[str]) -> str:
    """The operator command that starts group `group` (None: the stack's one group) over; `name` is what its
    resources carry (`<stack>` or `<stack>-<group>`)."""
    stack = name[: -len(group) - 1] if group else name
    return f"python -m dspark restart --stack {stack}" + (f" --group {group}" if group else "") + " --yes"


def build(
    cfg: ClusterConfig, stack: str, host_keys: tuple[Optional[str], ...] = (), group: Optional[str] = None,
    budgets: tuple[NodeBudget, ...] = (),
) -> clusterplan.StackPlan:
    """The whole plan of one group from its validated config (and the host keys settings.load found).
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
        nodeplan.NodePlan(
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
        export = clusterplan.ExportPlan(commands.export_create(cfg, stack), commands.export_delete(cfg, stack))
    return clusterplan.StackPlan(
        stack=stack,
        engine=cfg.engine,
        endpoint=plan.endpoint(cfg),
        model=cfg.model.served_name,
        revision=revision,
        nodes=nodes,
        image=image_plan(cfg, group or stack),
        export=export,
        group=clusterplan.GroupPlan(
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
        readiness=clusterplan.ReadinessPlan(commands.readiness(cfg, stack, restart_hint=restart_hint(stack, group)),
                                cfg.readiness.timeout_seconds // 60 + 5),
        memory=memory,
        name=group,
        planes=fabric.summary(cfg, memory.ranks[0].weights_gib),
        compile_cache_prefix=plan.compile_cache_prefix(stack),
        budgets=budgets,
        seed=clusterplan.SeedPlan(commands.seed_start(cfg, stack), commands.seed_stop(cfg, stack))
        if any(n.download is not None and n.download.from_head for n in nodes) else None,
        guard=guard_plan.build(cfg, stack, stack[: -len(group) - 1] if group else stack,
                               needs=tuple(r.need_mib for r in ranks)),
        alerts=clusterplan.AlertTargets(memoryplan.expected_kv_tokens(cfg), cfg.readiness.min_kv_share, cfg.memory.runtime_floor_gib,
                            cfg.alerts.ttft_seconds),
    )


def build_stack(sc: StackConfig, stack: str, host_keys: tuple[tuple[Optional[str], ...], ...] = ()) -> clusterplan.ClusterPlan:
    """The plan of every group of the stack and of its router (rules.check_stack passed)."""
    budgets = budget.node_budgets(sc, stack)  # before the groups: each rank's limit is what its node's budget leaves
    groups = tuple(
        build(e.cfg, e.plan_name(stack), host_keys[i] if i < len(host_keys) else (), e.name,
              tuple(b for b in budgets if b.group == i))
        for i, e in enumerate(sc.groups)
    )
    if sc.router is not None or sc.gateway is not None or sc.front_door.enabled:  # behind the stack's front: inner
        groups = tuple(replace(g, readiness=clusterplan.ReadinessPlan(
            commands.readiness(e.cfg, g.stack, restart_hint=restart_hint(g.stack, e.name), tunnel=True),
            g.readiness.timeout_minutes)) for g, e in zip(groups, sc.groups))  # fmt: skip
    if sc.router is None:
        cp = clusterplan.ClusterPlan(stack, groups, None, tuple(None for _ in groups))
        return _monitoring(sc, stack, _front_door(sc, stack, replace(cp, gateway=_gateway(sc, stack, cp))))
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
    readiness = clusterplan.ReadinessPlan(
        commands.readiness(cfg, stack, url=url + "/v1"), cfg.readiness.timeout_seconds // 60 + 5
    )
    spec = routing.router_spec(r, stack, r.image or cfg.image, key_path, workers, node.host if node else host)
    router = clusterplan.RouterPlan(
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
        clusterplan.MemberPlan(
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
    cp = clusterplan.ClusterPlan(stack, groups, router, members)
    return _monitoring(sc, stack, _front_door(sc, stack, replace(cp, gateway=_gateway(sc, stack, cp))))


def _monitoring(sc: StackConfig, stack: str, cp: clusterplan.ClusterPlan) -> clusterplan.ClusterPlan:
    """The stack's node exporters, then (monitoring.server) Prometheus over the stack's scrape configs, which
    include them, with the stack's alert rules, and Alertmanager; and every node's exposure (exposure.build)."""
    nodes = tuple((g.stack, n) for g in cp.groups for n in g.nodes)
    cp = replace(cp, monitoring=prometheus.exporters_only(sc, stack, nodes), exposure=_fences(sc, stack))
    if sc.monitoring.server is None:
        return cp
    node = prometheus.server_node(sc, nodes)
    gi = next(i for i, g in enumerate(cp.groups) if node in g.nodes)
    cfg = sc.groups[gi].cfg
    rules = alerts.render(alerts.rule_groups(cp), stack)
    server = prometheus.server(sc, stack, node, monitoring.scrape_configs(cp), rules,
                               plan.state_dir(cfg, node.ssh_user), commands.key_sudo(cfg, node.ssh_user))
    return replace(cp, monitoring=replace(cp.monitoring, server=server))


def _fences(sc: StackConfig, stack: str) -> tuple[exposure.NodeExposure, ...]:
    """Every node's exposure (exposure.build) with the commands that put its fence on and take it off."""
    fw, out = sc.firewall, []
    ranks = [(e.cfg, rank) for e in sc.groups for rank in range(len(e.cfg.nodes))]
    for ne, (cfg, rank) in zip(exposure.build(sc, stack), ranks):
        args = (cfg, rank, stack, ne.table, list(fw.operators), fw.confirm_seconds)
        out.append(replace(ne, apply=commands.fence(*args), remove=commands.fence(*args, action="remove")))
    return tuple(out)


def _gateway(sc: StackConfig, stack: str, cp: clusterplan.ClusterPlan) -> Optional[GatewayPlan]:
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
        cp.upstream, commands.readiness(cfg, stack, url=url, health_path=gateway_plan.HEALTH_PATH,
                                        tunnel=sc.front_door.enabled),  # behind the door: an inner port
        cfg.readiness.timeout_seconds // 60 + 5,
    )


def _front_door(sc: StackConfig, stack: str, cp: clusterplan.ClusterPlan,
                today: Optional[dt.date] = None) -> clusterplan.ClusterPlan:  # fmt: skip
    """The front door on the endpoint's node (exposure.door_node; rules.check_stack made sure it has one), in front of
    the gateway, the router or the head; its probe goes through it and verifies its certificate."""
    fd = sc.front_door
    if not fd.enabled:
        return cp
    where = exposure.door_node(sc)
    gi, ni = next((i, j) for i, e in enumerate(sc.groups) for j, n in enumerate(e.cfg.nodes) if n.name == where)
    cfg, node = sc.groups[gi].cfg, cp.groups[gi].nodes[ni]
    inner = cp.inner_endpoint
    health = gateway_plan.HEALTH_PATH if cp.gateway else "/health"
    timeout = (sc.gateway.request_timeout_seconds if sc.gateway else
               sc.router.request_timeout_seconds if sc.router else cfg.readiness.timeout_seconds)  # fmt: skip
    probe_url = f"https://{node.host}" + ("" if fd.port == 443 else f":{fd.port}") + "/v1"
    door = frontdoor.build(fd, stack, node, plan.state_dir(cfg, node.ssh_user), commands.key_sudo(cfg, node.ssh_user),
                           inner, health, timeout, commands.readiness(cfg, stack, url=probe_url, ca_env=frontdoor.CA_ENV),
                           cfg.readiness.timeout_seconds // 60 + 5, today or dt.date.today())  # fmt: skip
    return replace(cp, front_door=door)
