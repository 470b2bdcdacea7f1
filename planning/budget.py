"""Each node's memory budget (pure): a Spark's unified memory less the OS reserve, and every container
the stack places on that node with its memory limit and, for the rank, what it needs to start.

On a Spark the GPU's memory is the host's, so everything on a node shares one figure:

    budget     = memory.unifiedGiB - memory.hostReserveGiB           (memoryplan.node_budget_mib)
    rank limit = min(what the rank wants: its static pool + what it needs outside it + the runtime floor,
                     the budget less the guard and memory.sideReserveGiB)         (memoryplan.rank_memory_mib)
    side containers (router, gateway, monitoring): their limits together within memory.sideReserveGiB
    rank need  = what the memory gate wants available when the rank starts       (memoryplan.rank_need_mib)

The budget is computed from the validated stack config, before the plan: the rank's limit is an input of
the plan (RankSpec.memory_mib, part of the group revision), and the rules check the budget before any
plan exists. stackplan.build_stack hands each rank its limit and the memory gate its need from here, so
the container's limit and the gate's figure come from one place; planning/budget_rules.py refuses a
rank whose limit is below its need and a node whose limits exceed its budget.

A new kind of container on the nodes (the guard, a monitoring stack, ...): add one `Placed` per node it
runs on in `side_containers` (the marked place below). The ranks' limits, the rules, `dspark plan` and
the preview log then count it. tests/unit/test_budget.py fails while a container the ClusterPlan gives
a memory limit is missing from the budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import gateway, guard, memoryplan, plan, routing
from declared.cluster import ClusterConfig
from declared.stack import LOCAL, StackConfig

RANK = "rank"
THIN_HEADROOM_MIB = 2048  # a rank whose limit leaves less above its need is one surprise away from its OOM kill


@dataclass(frozen=True)
class Placed:
    """One container the stack places on a node."""

    node: str  # the node's name
    container: str  # its docker name
    role: str  # RANK, "router", "gateway", "gateway-db", ...
    limit_mib: int  # its memory limit (memory = memorySwap)
    need_mib: Optional[int] = None  # a rank: what must be available when it starts (the memory gate's figure)
    field: str = ""  # the config field that sets the limit, as findings name it (group_field); "" for a rank

    def to_output(self) -> dict:
        return {"container": self.container, "role": self.role, "limitMiB": self.limit_mib, "needMiB": self.need_mib}


@dataclass(frozen=True)
class NodeBudget:
    """One node: what its containers may take together, and each of them."""

    node: str
    group: int  # index of the node's group in the stack (StackConfig.groups)
    unified_mib: int
    reserve_mib: int  # memory.hostReserveGiB: sshd, dockerd and the OS; no container's limit covers it
    containers: tuple[Placed, ...]  # the node's rank first

    @property
    def budget_mib(self) -> int:
        return self.unified_mib - self.reserve_mib

    @property
    def rank(self) -> Placed:
        return next(c for c in self.containers if c.role == RANK)

    @property
    def others(self) -> tuple[Placed, ...]:
        return tuple(c for c in self.containers if c.role != RANK)

    @property
    def limits_mib(self) -> int:
        return sum(c.limit_mib for c in self.containers)

    @property
    def free_mib(self) -> int:
        """What no container's limit covers (below zero: the limits exceed the budget)."""
        return self.budget_mib - self.limits_mib

    @property
    def headroom_mib(self) -> int:
        """How far a container may outgrow its planned need before its own limit stops it (the least over
        the containers with a need: the rank); the free budget when none has one."""
        margins = [c.limit_mib - c.need_mib for c in self.containers if c.need_mib is not None]
        return min(margins) if margins else self.free_mib

    def to_output(self) -> dict:
        return {
            "node": self.node, "unifiedMiB": self.unified_mib, "reserveMiB": self.reserve_mib,
            "budgetMiB": self.budget_mib, "limitsMiB": self.limits_mib, "freeMiB": self.free_mib,
            "headroomMiB": self.headroom_mib, "containers": [c.to_output() for c in self.containers],
        }  # fmt: skip

    def summary(self) -> str:
        parts = [f"{c.container} {c.limit_mib:,}" + (f" (needs {c.need_mib:,})" if c.need_mib is not None else "")
                 for c in self.containers]  # fmt: skip
        return (f"{self.node}: budget {self.budget_mib:,} MiB ({self.unified_mib:,} less the {self.reserve_mib:,} "
                f"reserve) holds {' + '.join(parts)} = {self.limits_mib:,}; headroom {self.headroom_mib:,} MiB")


def _nodes(sc: StackConfig) -> set[str]:
    return {n.name for e in sc.groups for n in e.cfg.nodes}


def _order(sc: StackConfig):
    """Nodes in the stack's order (group by group, rank by rank)."""
    order = [n.name for e in sc.groups for n in e.cfg.nodes]
    return order.index


def side_containers(sc: StackConfig, stack: str) -> list[Placed]:
    """Every container the stack places on a node besides the ranks, with its limit. A container placed
    on an unknown node (the rules name it) or where Pulumi runs (router.node: local) is in no budget."""
    out: list[Placed] = []
    nodes = _nodes(sc)
    r = sc.router
    if r is not None and r.node != LOCAL and r.node in nodes:
        out.append(Placed(r.node, routing.container_name(stack), "router", r.memory_mib, field="router.memoryMiB"))
    gw = sc.gateway
    if gw is not None:
        where = gateway.default_node(gw, r.node if r else None, sc.groups[0].cfg.nodes[0].name)
        if where in nodes:
            out.append(Placed(where, gateway.container_name(stack), "gateway", gw.memory_mib, field="gateway.memoryMiB"))
            out.append(Placed(where, gateway.database_name(stack), "gateway-db", gw.database_memory_mib,
                              field="gateway.databaseMemoryMiB"))  # fmt: skip
    mc = sc.monitoring
    if mc.node_exporter.enabled:  # every node of every group (planning/prometheus.py)
        out += [Placed(n, f"{stack}-node-exporter", "node-exporter", mc.node_exporter.memory_mib,
                       field="monitoring.nodeExporter.memoryMiB") for n in sorted(nodes, key=_order(sc))]  # fmt: skip
    if mc.server is not None:
        where = mc.server.node or (r.node if r and r.node != LOCAL else sc.groups[0].cfg.nodes[0].name)
        if where in nodes:
            out.append(Placed(where, f"{stack}-prometheus", "prometheus", mc.server.memory_mib,
                              field="monitoring.server.memoryMiB"))  # fmt: skip
            out.append(Placed(where, f"{stack}-alertmanager", "alertmanager", mc.server.alertmanager_memory_mib,
                              field="monitoring.server.alertmanagerMemoryMiB"))  # fmt: skip
    # ---- A NEW KIND OF CONTAINER THE STACK PLACES GOES HERE: one Placed per node it runs on, with the limit its
    # plan gives the container (the same figure, not a copy of it) and the config field that sets it. (A kind every
    # group has on each of its nodes, like the guard, goes in own_containers.)
    return out


def group_field(sc: StackConfig, group: int, path: str) -> str:
    """A per-group field as the findings name it: `groups[i](name).<path>` in a stack with groups."""
    name = sc.groups[group].name
    return path if name is None else f"groups[{group}]({name}).{path}"


def own_containers(cfg: ClusterConfig, name: str, node: str, prefix: str = "") -> tuple[Placed, ...]:
    """What the group itself places on each of its nodes beside its rank: the guard (serving.selfHeal, its limit
    memoryplan.guard_memory_mib: the figure rank_memory_mib leaves out). `prefix`: the group's field prefix."""
    if not memoryplan.guard_memory_mib(cfg):
        return ()
    return (Placed(node, guard.container_name(name), "guard", memoryplan.guard_memory_mib(cfg),
                   field=f"{prefix}serving.selfHeal.memoryMiB"),)  # fmt: skip


def group_budgets(cfg: ClusterConfig, name: str, side: list[Placed] | tuple[Placed, ...] = (),
                  group: int = 0, prefix: str = "") -> tuple[NodeBudget, ...]:  # fmt: skip
    """The budgets of one group's nodes (in rank order): its rank on each, beside the group's own containers
    (own_containers) and the `side` containers the stack placed there; the rank's limit is what the budget
    leaves it. `name`: what the group's resources are named after (`<stack>` or `<stack>-<group>`); `prefix`:
    how findings name the group's fields (group_field)."""
    out = []
    for rank, node in enumerate(cfg.nodes):
        others = tuple(p for p in side if p.node == node.name)
        limit = memoryplan.rank_memory_mib(cfg, rank)  # the side containers come out of the reserve, not of it
        rank_entry = Placed(node.name, plan.container_name(name, rank), RANK, limit, memoryplan.rank_need_mib(cfg, rank))
        unified = int(cfg.memory.unified_gib * 1024)
        reserve = unified - memoryplan.node_budget_mib(cfg)  # memory.hostReserveGiB, rounded up
        own = own_containers(cfg, name, node.name, prefix)
        out.append(NodeBudget(node.name, group, unified, reserve, (rank_entry, *others, *own)))
    return tuple(out)


def node_budgets(sc: StackConfig, stack: str) -> tuple[NodeBudget, ...]:
    """Every node of the stack, group by group, in rank order."""
    side = side_containers(sc, stack)
    return tuple(b for i, e in enumerate(sc.groups)
                 for b in group_budgets(e.cfg, e.plan_name(stack), side, i, group_field(sc, i, "")))  # fmt: skip


def summary(budgets: tuple[NodeBudget, ...]) -> str:
    """For the preview log: a line per node."""
    head = "memory budget per node (unified memory less memory.hostReserveGiB; every container's limit, MiB):"
    return "\n".join([head, *(f"  {b.summary()}" for b in budgets)])
