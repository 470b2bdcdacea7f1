"""Each node's memory budget (planning/budget.py): every container the plan gives a memory limit is counted
on its node, each rank's limit is what the budget leaves it, and its limit and its memory gate's need come
from the budget."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from declared.config import parse_stack
from harness import cluster_of
from planning import budget, rules, stackplan
from planning.budget import NodeBudget
from planning.stackplan import NodePlan

STACKS = ["tp2", "tp3", "tp4", "tp4x2", "sim", "sim-tp2", "sim-x2", "sim-team"]


def stack_of(name: str, **sections) -> tuple:
    """(StackConfig, stack name) of `name`'s file with `sections` merged into its cluster block."""
    raw = cluster_of(name)
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_stack(raw), name


def limited(obj, node: str | None = None):
    """(node, container, limit) of every object in the plan with a memory limit (`memory_mib`), its node the
    nearest NodePlan or `node` field around it: ranks, the router, the gateway's two, and any kind added later."""
    if isinstance(obj, NodeBudget):
        return
    if isinstance(obj, NodePlan):
        node = obj.name
    if dataclasses.is_dataclass(obj):
        own = getattr(obj, "node", None)
        node = own.name if isinstance(own, NodePlan) else own if isinstance(own, str) else node
        if getattr(obj, "memory_mib", None) is not None:
            yield node, getattr(obj, "container_name", None) or obj.name, obj.memory_mib
        for f in dataclasses.fields(obj):
            yield from limited(getattr(obj, f.name), node)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from limited(item, node)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from limited(item, node)


def gate_needs(cp) -> dict[str, int]:
    """container -> the --need-mib its memory gate's command line carries (what the gate compares on the node)."""
    out = {}
    for g in cp.groups:
        for spec, gate in zip(g.group.specs, g.group.memory_gates):
            argv = shlex.split(gate)
            out[spec.container_name] = int(argv[argv.index("--need-mib") + 1])
    return out


@pytest.mark.parametrize("name", STACKS + ["tp3+gateway", "tp4x2+gateway"])
def test_every_container_the_plan_limits_is_in_its_nodes_budget_and_nothing_else(name):
    base, _, extra = name.partition("+")
    sc, stack = stack_of(base, **({"gateway": {}} if extra else {}))
    cp = stackplan.build_stack(sc, stack)
    in_plan = sorted((n, c, m) for n, c, m in limited(cp) if n is not None)
    in_budget = sorted((b.node, c.container, c.limit_mib) for b in cp.budgets for c in b.containers)
    assert in_plan == in_budget
    assert [b.node for b in cp.budgets] == [n.name for e in sc.groups for n in e.cfg.nodes]
    assert all(b.limits_mib <= b.budget_mib and b.rank.limit_mib >= b.rank.need_mib for b in cp.budgets)


def test_the_walk_finds_a_container_kind_the_budget_does_not_count():
    """The check above can fail: a limited container in the plan that the budget does not list."""

    @dataclasses.dataclass(frozen=True)
    class Guard:
        node: str
        container_name: str
        memory_mib: int

    sc, stack = stack_of("tp4")
    cp = stackplan.build_stack(sc, stack)
    found = set(limited((cp, Guard("spark2", "tp4-guard", 256))))
    assert ("spark2", "tp4-guard", 256) in found
    assert ("spark2", "tp4-guard", 256) not in {(b.node, c.container, c.limit_mib) for b in cp.budgets for c in b.containers}


def test_tp3_with_the_gateway_on_the_head_leaves_the_reserve_and_gives_the_rank_what_is_left():
    """The issue's case: rank limit, gateway and database used to add up to the whole 121.7 GiB."""
    sc, stack = stack_of("tp3", gateway={})
    assert rules.check_stack(sc, stack)[0] == []
    cp = stackplan.build_stack(sc, stack)
    head, worker, _ = cp.budgets
    assert [(c.container, c.role) for c in head.containers] == [
        ("tp3-rank0", "rank"), ("tp3-gateway", "gateway"), ("tp3-gateway-db", "gateway-db")]
    assert head.unified_mib == 124620 and head.reserve_mib == 1536 and head.budget_mib == 123084
    assert head.rank.limit_mib == 123084 - 1024 - 512 and head.limits_mib == head.budget_mib
    assert worker.rank.limit_mib == 123084 and worker.others == ()
    assert head.headroom_mib == head.rank.limit_mib - head.rank.need_mib > budget.THIN_HEADROOM_MIB
    # what the components receive: the rank's limit, and its gate's need, are the budget's
    assert cp.groups[0].group.specs[0].memory_mib == head.rank.limit_mib
    assert gate_needs(cp) == {b.rank.container: b.rank.need_mib for b in cp.budgets}
    assert "tp3-rank0 121,548 (needs 110,815) + tp3-gateway 1,024 + tp3-gateway-db 512 = 123,084" in budget.summary(cp.budgets)


def test_the_router_comes_out_of_its_nodes_rank_and_a_local_router_out_of_none():
    sc, stack = stack_of("sim-x2")
    cp = stackplan.build_stack(sc, stack)
    spark1 = cp.budgets[0]
    assert [(c.container, c.limit_mib, c.field) for c in spark1.others] == [("sim-x2-router", 1024, "router.memoryMiB")]
    assert spark1.rank.limit_mib == spark1.budget_mib - 1024
    assert all(b.rank.limit_mib == b.budget_mib and not b.others for b in cp.budgets[1:])
    assert cp.router.spec.memory_mib == 1024
    local, _ = stack_of("sim-x2", router={"node": "local"})
    assert all(not b.others for b in budget.node_budgets(local, "sim-x2"))
    bigger, _ = stack_of("sim-x2", router={"memoryMiB": 4096})
    assert budget.node_budgets(bigger, "sim-x2")[0].rank.limit_mib == spark1.budget_mib - 4096


def test_a_group_planned_alone_gives_its_ranks_the_whole_budget():
    sc, stack = stack_of("sim-x2")
    alone = stackplan.build(sc.groups[0].cfg, "sim-x2-a")
    assert [b.rank.limit_mib for b in alone.budgets] == [b.budget_mib for b in alone.budgets]
    assert [s.memory_mib for s in alone.group.specs] == [b.rank.limit_mib for b in alone.budgets]


def test_budget_output_is_what_dspark_plan_prints():
    sc, stack = stack_of("sim-team")
    head = budget.node_budgets(sc, stack)[0]
    out = head.to_output()
    assert out["budgetMiB"] == out["unifiedMiB"] - out["reserveMiB"] == 123084
    assert out["limitsMiB"] == sum(c["limitMiB"] for c in out["containers"]) and out["freeMiB"] == 123084 - out["limitsMiB"]
    assert [c["role"] for c in out["containers"]] == ["rank", "gateway", "gateway-db"]
    assert out["containers"][0]["needMiB"] == head.rank.need_mib and out["containers"][1]["needMiB"] is None
