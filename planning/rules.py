"""Validation rules, checked at preview before any resource is registered.

Each rule is a function of the validated config that returns findings (planning/rulebook.py: Finding, and how
a rule registers). The rules live in modules by area: a group's nodes and cabling (node_rules, link_rules), what
it serves and how its engine starts (serving_rules), its memory (memory_rules); the stack's groups, router and
gateway (router_rules), each node's memory budget (budget_rules) and the monitoring (monitoring_rules). This
module imports them all and runs them in one order: `RULES` and `STACK_RULES` are the lists the program runs
and the tests walk (every rule has a passing and a failing case).
"""

from __future__ import annotations

import dataclasses

from . import rulebook
# each rule module registers its rules with the rulebook when imported
from . import budget_rules, frontdoor_rules, link_rules, memory_rules, monitoring_rules, node_rules  # noqa: F401
from . import router_rules  # noqa: F401
from . import serving_rules
from declared.cluster import ClusterConfig
from declared.stack import StackConfig

# The order check and check_stack report findings in (preview prints them so): a group's rules, then the stack's.
ORDER = (
    "engine-fields", "node-count-equals-tp", "unique-nodes", "fabric-ip-is-ipv4", "fabric-planes", "ep-divides-tp",
    "ports-distinct", "no-ram-offload", "known-profile", "memory-plan-fits", "context-length-supported",
    "topology-fits-node-count", "nfs-share-read-only", "extra-args-not-managed", "engine-version",
    "extra-env-not-managed", "paths-apart-from-checkpoint", "image-build-context-exists", "tp3-padding-warning",
    "dev-image-warning", "kv-pin-clamp-warning", "ring-needs-nccl-overlay-warning", "vllm-weights-range-warning",
    "pinned-revision-warning", "fabric-link-ips",
)  # fmt: skip
STACK_ORDER = (
    "node-in-one-group", "one-served-model", "router-node", "router-port-free", "router-image", "gateway-node",
    "gateway-port-free", "gateway-member-models", "node-memory-budget", "node-memory-headroom-warning",
    "monitoring-node", "monitoring-ports-free", "frontdoor-node", "frontdoor-port-free", "frontdoor-own-certificate",
)  # fmt: skip


def _in_order(order: tuple[str, ...], registered: dict) -> list:
    """(name, rule) in `order`; a registered rule missing from it, or a name no module registers, fails here."""
    if set(order) != set(registered) or len(order) != len(set(order)):
        raise RuntimeError(f"the rule order and the registered rules differ: {sorted(set(order) ^ set(registered))}")
    return [(name, registered[name]) for name in order]


RULES: list[tuple[str, rulebook.Rule]] = _in_order(ORDER, rulebook.REGISTERED)
STACK_RULES: list[tuple[str, rulebook.StackRule]] = _in_order(STACK_ORDER, rulebook.STACK_REGISTERED)


def check(cfg: ClusterConfig, stack: str = "") -> tuple[list[rulebook.Finding], list[rulebook.Finding]]:
    """Run every rule for `stack`; returns (errors, warnings). Missing or foreign engine fields are
    reported alone: the other rules assume each engine's fields are there."""
    findings = serving_rules.engine_fields(cfg, stack)
    if not findings:
        findings = [f for _, fn in RULES for f in fn(cfg, stack)]
    return [f for f in findings if f.level == "error"], [f for f in findings if f.level == "warning"]


def check_stack(sc: StackConfig, stack: str = "") -> tuple[list[rulebook.Finding], list[rulebook.Finding]]:
    """Every group's rules (findings named by group) and the stack's own; returns (errors, warnings)."""
    findings: list[rulebook.Finding] = []
    for i, entry in enumerate(sc.groups):
        errors, warnings = check(entry.cfg, entry.plan_name(stack))
        findings += [dataclasses.replace(f, field=rulebook.group_prefix(sc, i) + f.field) for f in errors + warnings]
    findings += [f for _, fn in STACK_RULES for f in fn(sc, stack)]
    return [f for f in findings if f.level == "error"], [f for f in findings if f.level == "warning"]
