"""The rules on each node's memory budget (planning/budget.py), checked at preview with the others.

They are stack rules (rulebook.stack_rule): a node's budget counts the containers the router and the
gateway place beside its rank. Registered when planning.rules imports this module, so `rules.STACK_RULES`
holds them wherever the rules run.
"""

from __future__ import annotations

from declared.cluster import ClusterConfig
from declared.stack import StackConfig

from . import budget, memoryplan
from .budget import NodeBudget, Placed
from .memory_rules import known_profile
from .rulebook import Finding, stack_rule
from .serving_rules import engine_fields


def _plannable(cfg: ClusterConfig, stack: str) -> bool:
    """The group's memory plan can be computed (otherwise engine-fields, known-profile or memory-plan-fits
    already say why)."""
    if engine_fields(cfg, stack) or known_profile(cfg, stack):
        return False
    return memoryplan.memory_plan(cfg).known


def budgets(sc: StackConfig, stack: str) -> tuple[NodeBudget, ...]:
    """The stack's budgets, or () while a group's memory plan cannot be computed."""
    if not all(_plannable(e.cfg, e.plan_name(stack)) for e in sc.groups):
        return ()
    return budget.node_budgets(sc, stack)


def _need_knobs(cfg: ClusterConfig) -> str:
    if cfg.engine == "vllm":
        return "serving.gpuMemoryUtilization or serving.maxModelLen"
    return "serving.maxTotalTokens, serving.maxRunningRequests or memory.runtimeFloorGiB"


def _budget_text(b: NodeBudget, cfg: ClusterConfig) -> str:
    return (f"{b.node}'s budget is {b.budget_mib:,} MiB (memory.unifiedGiB {cfg.memory.unified_gib:g} less "
            f"memory.hostReserveGiB {cfg.memory.host_reserve_gib:g})")


def _move_others(b: NodeBudget) -> str:
    fields = ", ".join(c.field for c in b.others)
    return f"give the node's other containers less ({fields}) or place them on another node"


def _short(b: NodeBudget, sc: StackConfig) -> Finding:
    """The rank's limit (what the budget leaves it) is below what it needs to start."""
    cfg, r = sc.groups[b.group].cfg, b.rank
    # the largest reserve (GiB, to 0.1) with which the rank's limit (the budget less the guard and the side reserve)
    # still holds its need
    kept = memoryplan.guard_memory_mib(cfg) + memoryplan.side_reserve_mib(cfg)
    reserve = int((b.unified_mib - r.need_mib - kept) / 1024 * 10) / 10
    fixes = [f"lower memory.hostReserveGiB to at most {reserve:g}"] if reserve >= 0.5 else []
    fixes.append(f"lower what the rank needs ({_need_knobs(cfg)})")
    if b.others:
        fixes.append(f"lower {budget.group_field(sc, b.group, 'memory.sideReserveGiB')} (it keeps "
                     f"{memoryplan.side_reserve_mib(cfg):,} MiB for the side containers)")
    if b.others and r.need_mib + memoryplan.guard_memory_mib(cfg) <= b.budget_mib and reserve < 0.5:
        # the rank and its guard alone would fit: the side reserve takes the room
        field, value = budget.group_field(sc, b.group, "memory.sideReserveGiB"), cfg.memory.side_reserve_gib
    elif reserve >= 0.5:  # the reserve is what takes the room
        field, value = budget.group_field(sc, b.group, "memory.hostReserveGiB"), cfg.memory.host_reserve_gib
    elif cfg.engine == "vllm":
        field, value = budget.group_field(sc, b.group, "serving.gpuMemoryUtilization"), cfg.serving.gpu_memory_utilization
    else:
        field, value = budget.group_field(sc, b.group, "serving.maxTotalTokens"), cfg.serving.max_total_tokens
    return Finding("node-memory-budget", field, value,
                   f"rank {r.container} on {b.node} needs {r.need_mib:,} MiB to start (the memory gate's figure) but "
                   f"its limit is {r.limit_mib:,} MiB: {_budget_text(b, cfg)}, less "
                   f"{memoryplan.guard_memory_mib(cfg) + memoryplan.side_reserve_mib(cfg):,} MiB for the guard and "
                   "memory.sideReserveGiB, so its own limit would kill it at boot", "; or ".join(fixes))  # fmt: skip


def _over(b: NodeBudget, sc: StackConfig) -> Finding:
    """The node's containers may take more together than its budget."""
    cfg = sc.groups[b.group].cfg
    listed = " + ".join(f"{c.container} {c.limit_mib:,}" for c in b.containers)
    if b.others:  # the other containers' limits are stack fields (router.*, gateway.*)
        field, value, fix = b.others[0].field, b.others[0].limit_mib, _move_others(b)
    else:
        field, value = budget.group_field(sc, b.group, "memory.hostReserveGiB"), cfg.memory.host_reserve_gib
        fix = "lower the containers' limits, or memory.hostReserveGiB"
    return Finding("node-memory-budget", field, value,
                   f"the limits of the containers on {b.node} add up to {b.limits_mib:,} MiB ({listed}), "
                   f"{-b.free_mib:,} MiB more than its budget: {_budget_text(b, cfg)}; they could take the memory "
                   "the reserve keeps for sshd, dockerd and the OS", fix)  # fmt: skip


def _side(b: NodeBudget) -> tuple[Placed, ...]:
    """The stack's side containers on the node (the group's own guard is kept apart from the reserve)."""
    return tuple(c for c in b.others if c.role != "guard")


def _beyond_reserve(b: NodeBudget, sc: StackConfig) -> Finding:
    """The side containers' limits exceed what memory.sideReserveGiB keeps for them."""
    cfg, side = sc.groups[b.group].cfg, _side(b)
    took = sum(c.limit_mib for c in side)
    listed = " + ".join(f"{c.container} {c.limit_mib:,}" for c in side)
    reserve = memoryplan.side_reserve_mib(cfg)
    need_gib = -(-took * 10 // 1024) / 10
    return Finding("node-memory-budget", side[0].field, side[0].limit_mib,
                   f"the side containers on {b.node} take {took:,} MiB ({listed}), more than the "
                   f"{reserve:,} MiB that memory.sideReserveGiB {cfg.memory.side_reserve_gib:g} keeps for them beside "
                   "the ranks",
                   f"give them less ({', '.join(c.field for c in side)}), place some on another node, or raise "
                   f"{budget.group_field(sc, b.group, 'memory.sideReserveGiB')} to at least {need_gib:g} (that "
                   "lowers the ranks' limits: the group restarts)")  # fmt: skip


def problems(b: NodeBudget, sc: StackConfig) -> list[Finding]:
    """One node's errors: its side containers beyond the reserve; its rank's limit below its need; its containers'
    limits beyond its budget."""
    out = []
    if sum(c.limit_mib for c in _side(b)) > memoryplan.side_reserve_mib(sc.groups[b.group].cfg):
        out.append(_beyond_reserve(b, sc))
    if b.rank.limit_mib < b.rank.need_mib:
        out.append(_short(b, sc))
    if b.free_mib < 0:
        out.append(_over(b, sc))
    return out


@stack_rule("node-memory-budget")
def _node_budget(sc: StackConfig, stack: str = "") -> list[Finding]:
    """Every container on a node within the node's budget, and every rank's limit at least its need."""
    return [f for b in budgets(sc, stack) for f in problems(b, sc)]


@stack_rule("node-memory-headroom-warning")
def _thin(sc: StackConfig, stack: str = "") -> list[Finding]:
    """A rank whose limit leaves little above its need: a little more than the plan's figures kills it."""
    out = []
    for b in budgets(sc, stack):
        r, cfg = b.rank, sc.groups[b.group].cfg
        margin = r.limit_mib - r.need_mib
        if 0 <= margin < budget.THIN_HEADROOM_MIB:
            out.append(Finding("node-memory-headroom-warning", budget.group_field(sc, b.group, "memory.hostReserveGiB"),
                               cfg.memory.host_reserve_gib,
                               f"rank {r.container}'s limit on {b.node} ({r.limit_mib:,} MiB) leaves {margin:,} MiB above "
                               f"what it needs ({r.need_mib:,} MiB): a rank that takes a little more than the plan's "
                               "figures is killed by its limit",
                               f"lower what the rank needs ({_need_knobs(cfg)}), memory.hostReserveGiB or "
                               "memory.sideReserveGiB",
                               level="warning"))  # fmt: skip
    return out
