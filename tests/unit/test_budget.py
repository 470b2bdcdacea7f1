"""Each node's memory budget (planning/budget.py) and its rules (planning/budget_rules.py): every container
the plan gives a memory limit is counted on its node, each rank's limit is what the budget leaves it, and
its limit and its memory gate's need come from the budget."""

from __future__ import annotations

import dataclasses
import itertools
import math
import shlex

import pytest

from declared.stack import parse_stack
from declared.stackfiles import project_stacks
from harness import cluster_of
from planning import budget, budget_rules, rulebook, rules, stackplan
from planning.budget import NodeBudget, Placed
from planning.nodeplan import NodePlan

STACKS = ["tp2", "tp3", "tp4", "tp4x2", "sim", "sim-tp2", "sim-x2", "sim-team"]
NODE_RULE = dict(rules.STACK_RULES)["node-memory-budget"]
THIN_RULE = dict(rules.STACK_RULES)["node-memory-headroom-warning"]


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
    class Monitor:  # a kind no budget knows yet
        node: str
        container_name: str
        memory_mib: int

    sc, stack = stack_of("tp4")
    cp = stackplan.build_stack(sc, stack)
    found = set(limited((cp, Monitor("spark2", "tp4-monitoring", 512))))
    assert ("spark2", "tp4-monitoring", 512) in found
    assert ("spark2", "tp4-monitoring", 512) not in {(b.node, c.container, c.limit_mib) for b in cp.budgets
                                                     for c in b.containers}  # fmt: skip


def test_a_gateway_or_a_monitoring_server_leaves_every_ranks_limit_and_so_the_groups_revision_as_it_was():
    # they used to come out of the rank's limit (122764, 121228, 120076 MiB on tp3's head): three revisions, and
    # adding a team gateway or Prometheus restarted the serving group
    plain, stack = stack_of("tp3")
    team, _ = stack_of("tp3", gateway={})
    watched, _ = stack_of("tp3", gateway={}, monitoring={"server": {}})
    plans = [stackplan.build_stack(sc, stack) for sc in (plain, team, watched)]
    assert [p.budgets[0].others != () for p in plans] == [True, True, True]
    assert len({p.groups[0].group.revision for p in plans}) == 1
    assert len({tuple(s.memory_mib for s in p.groups[0].group.specs) for p in plans}) == 1
    assert [c.role for c in plans[2].budgets[0].others] == ["gateway", "gateway-db", "node-exporter", "prometheus",
                                                            "alertmanager", "guard"]  # fmt: skip


def test_side_containers_beyond_the_side_reserve_are_refused_naming_the_fields_and_the_restart():
    sc, stack = stack_of("tp3", gateway={"memoryMiB": 3600})
    errors = [f for f in rules.check_stack(sc, stack)[0] if f.rule == "node-memory-budget"]
    assert errors[0].field == "gateway.memoryMiB" and errors[0].value == 3600  # (and so the node's limits add up)
    assert "spark1 take 4,176 MiB (tp3-gateway 3,600 + tp3-gateway-db 512 + tp3-node-exporter 64)" in errors[0].problem
    assert "memory.sideReserveGiB to at least 4.1" in errors[0].fix and "the group restarts" in errors[0].fix
    bigger, _ = stack_of("tp3", gateway={"memoryMiB": 3600}, memory={"sideReserveGiB": 4.5})
    assert [f for f in rules.check_stack(bigger, stack)[0] if f.rule == "node-memory-budget"] == []


def test_tp3_with_the_gateway_on_the_head_keeps_the_reserves_and_gives_the_rank_what_is_left():
    """The issue's case: rank limit, gateway and database used to add up to the whole 121.7 GiB."""
    sc, stack = stack_of("tp3", gateway={})
    assert rules.check_stack(sc, stack)[0] == []
    cp = stackplan.build_stack(sc, stack)
    head, worker, _ = cp.budgets
    assert [(c.container, c.role) for c in head.containers] == [
        ("tp3-rank0", "rank"), ("tp3-gateway", "gateway"), ("tp3-gateway-db", "gateway-db"),
        ("tp3-node-exporter", "node-exporter"), ("tp3-guard", "guard")]
    assert head.unified_mib == 124620 and head.reserve_mib == 1536 and head.budget_mib == 123084
    assert head.rank.limit_mib == 123084 - 4096 - 256 == worker.rank.limit_mib  # memory.sideReserveGiB, the guard
    assert head.free_mib == 4096 - 1024 - 512 - 64
    assert [c.container for c in worker.others] == ["tp3-node-exporter", "tp3-guard"]
    assert head.headroom_mib == head.rank.limit_mib - head.rank.need_mib > budget.THIN_HEADROOM_MIB
    # what the components receive: the rank's limit, and its gate's need, are the budget's
    assert cp.groups[0].group.specs[0].memory_mib == head.rank.limit_mib
    assert gate_needs(cp) == {b.rank.container: b.rank.need_mib for b in cp.budgets}
    assert ("tp3-rank0 118,732 (needs 110,815) + tp3-gateway 1,024 + tp3-gateway-db 512 + tp3-node-exporter 64 + "
            "tp3-guard 256 = 120,588"
            in budget.summary(cp.budgets))


def test_the_router_comes_out_of_its_nodes_rank_and_a_local_router_out_of_none():
    capped = {"memFractionStatic": 0.95}  # the rank would take the whole node: what is left for it is the cap
    sc, stack = stack_of("sim-x2", serving=capped)
    cp = stackplan.build_stack(sc, stack)
    spark1 = cp.budgets[0]
    assert [(c.container, c.limit_mib, c.field) for c in spark1.others] == [
        ("sim-x2-router", 1024, "router.memoryMiB"), ("sim-x2-node-exporter", 64, "monitoring.nodeExporter.memoryMiB"),
        ("sim-x2-prometheus", 1024, "monitoring.server.memoryMiB"),
        ("sim-x2-alertmanager", 128, "monitoring.server.alertmanagerMemoryMiB"),
        ("sim-x2-a-guard", 256, "groups[0](a).serving.selfHeal.memoryMiB")]  # (Prometheus: on the router's node)
    assert spark1.rank.limit_mib == spark1.budget_mib - 4096 - 256  # the side containers come out of the reserve
    assert all(b.rank.limit_mib == spark1.rank.limit_mib and [c.role for c in b.others] == ["node-exporter", "guard"]
               for b in cp.budgets[1:])  # fmt: skip
    assert cp.router.spec.memory_mib == 1024
    local, _ = stack_of("sim-x2", router={"node": "local"}, serving=capped)  # Prometheus then on the head
    assert [[c.role for c in b.others] for b in budget.node_budgets(local, "sim-x2")] == [
        ["node-exporter", "prometheus", "alertmanager", "guard"]] + [["node-exporter", "guard"]] * 3
    bigger, _ = stack_of("sim-x2", router={"memoryMiB": 2048}, serving=capped)
    assert budget.node_budgets(bigger, "sim-x2")[0].rank.limit_mib == spark1.rank.limit_mib  # within the reserve


def test_a_group_planned_alone_gives_its_ranks_the_whole_budget_but_its_own_guards_and_the_side_reserve():
    sc, stack = stack_of("sim-x2", serving={"memFractionStatic": 0.95})  # capped: the rank gets what is left
    alone = stackplan.build(sc.groups[0].cfg, "sim-x2-a")
    assert [b.rank.limit_mib for b in alone.budgets] == [b.budget_mib - 256 - 4096 for b in alone.budgets]
    assert all([(c.container, c.role) for c in b.others] == [("sim-x2-a-guard", "guard")] for b in alone.budgets)
    assert [s.memory_mib for s in alone.group.specs] == [b.rank.limit_mib for b in alone.budgets]


def test_hostreserve_60_on_tp4_is_refused_naming_each_node_the_figures_and_the_knob():
    """The issue's case: preview used to pass with every limit at 63,180 MiB below a need of 100,354."""
    sc, stack = stack_of("tp4", memory={"hostReserveGiB": 60})
    errors = [e for e in rules.check_stack(sc, stack)[0] if e.rule == "node-memory-budget"]
    assert [e.field for e in errors] == ["memory.hostReserveGiB"] * 4
    worker = errors[1]
    assert "rank tp4-rank1 on spark2 needs 100,354 MiB" in worker.problem and "its limit is 58,828 MiB" in worker.problem  # 63,180 less the side reserve's 4,096 and the guard's 256
    assert "lower memory.hostReserveGiB to at most 19.4" in worker.fix
    assert "lower memory.hostReserveGiB to at most 18.1;" in errors[0].fix  # the head holds rank 0's extra
    # the fix is exact: the reserve it names is the largest that passes
    assert NODE_RULE(stack_of("tp4", memory={"hostReserveGiB": 18.1})[0], stack) == []
    assert ["spark1" in e.problem for e in NODE_RULE(stack_of("tp4", memory={"hostReserveGiB": 19.4})[0], stack)] == [True]
    assert len(NODE_RULE(stack_of("tp4", memory={"hostReserveGiB": 19.5})[0], stack)) == 4


def test_a_need_no_reserve_can_hold_names_the_engine_knobs():
    sc, stack = stack_of("tp4", serving={"maxTotalTokens": 30_000_000})
    found = NODE_RULE(sc, stack)
    assert found and found[0].field == "serving.maxTotalTokens" and "hostReserveGiB" not in found[0].fix
    assert "serving.maxTotalTokens, serving.maxRunningRequests or memory.runtimeFloorGiB" in found[0].fix
    vllm, _ = stack_of("tp2", memory={"unifiedGiB": 100})
    found = NODE_RULE(vllm, "tp2")
    assert found and found[0].field == "serving.gpuMemoryUtilization" and "serving.maxModelLen" in found[0].fix


def test_a_group_of_a_stack_is_named_in_the_field():
    sc, _ = stack_of("tp4x2", memory={"hostReserveGiB": 60})
    fields = {e.field for e in NODE_RULE(sc, "tp4x2")}
    assert fields == {"groups[0](a).memory.hostReserveGiB", "groups[1](b).memory.hostReserveGiB"}


def test_limits_beyond_the_budget_are_refused_naming_node_figures_and_fields():
    """Not reachable through rank_memory_mib (it caps the rank), so checked on a budget built by hand: a
    kind of container added to the plan but left out of the ranks' cap would be caught."""
    sc, _ = stack_of("tp3", gateway={})
    rank = Placed("spark1", "tp3-rank0", budget.RANK, 123084, 110815)
    gw = Placed("spark1", "tp3-gateway", "gateway", 1024, field="gateway.memoryMiB")
    over = NodeBudget("spark1", 0, 124620, 1536, (rank, gw))
    assert over.free_mib == -1024
    (found,) = [f for f in budget_rules.problems(over, sc) if "add up" in f.problem]
    assert found.field == "gateway.memoryMiB" and found.level == "error"
    assert "on spark1 add up to 124,108 MiB (tp3-rank0 123,084 + tp3-gateway 1,024), 1,024 MiB more" in found.problem
    assert "gateway.memoryMiB" in found.fix
    fits = NodeBudget("spark1", 0, 124620, 1536, (dataclasses.replace(rank, limit_mib=122060), gw))
    assert budget_rules.problems(fits, sc) == []


def test_thin_headroom_is_a_warning_naming_node_and_figures():
    # tp3's head needs 110,815 MiB of its 124,620: a host reserve of 7.3 GiB (7,476), the side reserve (4,096) and
    # the guard (256) leave the rank 112,792, 1,977 above
    sc, stack = stack_of("tp3", gateway={}, memory={"hostReserveGiB": 7.3})
    assert NODE_RULE(sc, stack) == []
    head = [f for f in THIN_RULE(sc, stack) if " on spark1 " in f.problem]
    (found,) = head
    assert found.level == "warning" and found.field == "memory.hostReserveGiB"
    assert "on spark1 (112,792 MiB) leaves 1,977 MiB above what it needs (110,815 MiB)" in found.problem
    assert "memory.hostReserveGiB or memory.sideReserveGiB" in found.fix
    assert THIN_RULE(*stack_of("tp3", gateway={})) == []


def test_budget_rules_wait_for_a_memory_plan():
    """A group without a computable memory plan is reported by known-profile (the budget says nothing)."""
    sc, stack = stack_of("tp4", model={"profile": "llama"})
    assert NODE_RULE(sc, stack) == [] and THIN_RULE(sc, stack) == []
    assert any(e.rule == "known-profile" for e in rules.check_stack(sc, stack)[0])


def test_a_per_group_field_carries_its_groups_name():
    sc, _ = stack_of("tp4x2")
    assert budget.group_field(sc, 1, "memory.hostReserveGiB") == "groups[1](b).memory.hostReserveGiB"
    assert budget.group_field(sc, 1, "x") == rulebook.group_prefix(sc, 1) + "x"  # as check_stack names a group's findings
    one, _ = stack_of("tp4")
    assert budget.group_field(one, 0, "memory.hostReserveGiB") == "memory.hostReserveGiB"


def test_budget_output_is_what_dspark_plan_prints():
    sc, stack = stack_of("sim-team")
    head = budget.node_budgets(sc, stack)[0]
    out = head.to_output()
    assert out["budgetMiB"] == out["unifiedMiB"] - out["reserveMiB"] == 123084
    assert out["limitsMiB"] == sum(c["limitMiB"] for c in out["containers"]) and out["freeMiB"] == 123084 - out["limitsMiB"]
    assert [c["role"] for c in out["containers"]] == ["rank", "gateway", "gateway-db", "node-exporter", "prometheus",
                                                      "alertmanager", "guard"]  # fmt: skip
    assert out["containers"][0]["needMiB"] == head.rank.need_mib and out["containers"][1]["needMiB"] is None


# ------------------------------------------------------------------ the property: over the memory knobs of every stack

ALL_STACKS = project_stacks()
MEMORY = {"hostReserveGiB": [0.5, 1.5, 60], "runtimeFloorGiB": [0, 30], "unifiedGiB": [100, 121.7]}
SERVING = {
    # maxTotalTokens spans the need (weights + KV ...), memFractionStatic the limit's want (the static pool)
    "sglang": {"memFractionStatic": [0.7, 0.95], "maxTotalTokens": [750_000, 8_000_000, 30_000_000]},
    "vllm": {"gpuMemoryUtilization": [0.5, 0.85, 0.95], "maxModelLen": [16384, 131072, 1048576]},
}  # fmt: skip
SIDE = {"router": {"memoryMiB": [1024, 16384]}, "gateway": {"memoryMiB": [1024, 16384]}}


def knob_grid(raw: dict):
    """Every combination of the memory knobs (and of the side containers' limits the stack has)."""
    knobs = [("memory", k, v) for k, v in MEMORY.items()]
    knobs += [("serving", k, v) for k, v in SERVING[raw.get("engine", "sglang")].items()]
    knobs += [(section, k, v) for section, fields in SIDE.items() if section in raw for k, v in fields.items()]
    for values in itertools.product(*(v for _, _, v in knobs)):
        yield [(section, k, value) for (section, k, _), value in zip(knobs, values)]


def test_the_sweep_covers_every_stack_file():
    assert {"tp2", "tp3", "tp4", "tp4x2", "sim", "sim-tp2", "sim-x2", "sim-team"} <= set(ALL_STACKS)


@pytest.mark.parametrize("name", ALL_STACKS + ["tp3+gateway"])
def test_no_memory_knobs_give_a_rank_a_limit_below_its_need_or_a_node_more_than_its_budget_unrefused(name):
    """For every combination: preview refuses naming the node and the figures, or every rank's limit (what
    its container gets) is at least its memory gate's need (what its gate's command line carries) and the
    limits of everything on each node stay within the node's unified memory less its reserve."""
    base, _, extra = name.partition("+")
    refused = passed = 0
    for combo in knob_grid({**cluster_of(base), **({"gateway": {}} if extra else {})}):
        raw = cluster_of(base)
        if extra:
            raw["gateway"] = {}
        for section, key, value in combo:
            raw.setdefault(section, {})[key] = value
        sc = parse_stack(raw)
        errors, warnings = NODE_RULE(sc, base), THIN_RULE(sc, base)
        cp = stackplan.build_stack(sc, base)
        needs, on_node = gate_needs(cp), {}
        for node, _, mib in limited(cp):
            on_node[node] = on_node.get(node, 0) + mib
        for entry, group in zip(sc.groups, cp.groups):
            memory = entry.cfg.memory
            budget_mib = int(memory.unified_gib * 1024) - math.ceil(memory.host_reserve_gib * 1024)
            for spec in group.group.specs:
                limit, need = spec.memory_mib, needs[spec.container_name]
                named = [e for e in errors if f" on {spec.node} " in e.problem]
                side = sum(c.limit_mib for b in cp.budgets if b.node == spec.node for c in b.others
                           if c.role != "guard")  # fmt: skip
                bad = limit < need or on_node[spec.node] > budget_mib or side > math.ceil(memory.side_reserve_gib * 1024)
                assert bool(named) == bad, (combo, spec.node, limit, need, on_node[spec.node], budget_mib)
                if limit < need:
                    assert any(f"{need:,} MiB" in e.problem and f"its limit is {limit:,} MiB" in e.problem for e in named)
                thin = [w for w in warnings if f" on {spec.node} " in w.problem]
                assert bool(thin) == (0 <= limit - need < budget.THIN_HEADROOM_MIB), (combo, spec.node)
        refused += bool(errors)
        passed += not errors
    assert refused and passed  # the grid reaches both sides of the line
