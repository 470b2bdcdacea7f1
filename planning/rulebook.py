"""The validation rules' framework: a Finding, and the registries the rule modules add their rules to.

A rule is a function of the validated config (a group's ClusterConfig, or the whole StackConfig for a stack
rule) and the stack's name that returns findings. An error finding names the field, the bad value and the fix;
warnings are printed and do not stop the run. The rules live in modules by area (node_rules, serving_rules,
memory_rules, link_rules; router_rules, budget_rules, monitoring_rules for the stack) and register here with
`rule` or `stack_rule` when imported; planning/rules.py imports them all and runs them in order (check,
check_stack).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from declared.cluster import ClusterConfig
from declared.stack import StackConfig


@dataclass(frozen=True)
class Finding:
    rule: str
    field: str
    value: object
    problem: str
    fix: str
    level: str = "error"  # or "warning"

    def __str__(self) -> str:
        return f"cluster.{self.field} = {self.value!r}: {self.problem}; fix: {self.fix}"


Rule = Callable[[ClusterConfig, str], list[Finding]]  # (config, stack name) -> findings
StackRule = Callable[[StackConfig, str], list[Finding]]  # (stack config, stack name) -> findings
# Every rule by name, as its module registered it (planning/rules.py puts them in the order findings are reported).
REGISTERED: dict[str, Rule] = {}
STACK_REGISTERED: dict[str, StackRule] = {}


def _register(registry: dict, name: str, fn):
    if name in registry:
        raise ValueError(f"two rules are named {name!r}")
    registry[name] = fn
    return fn


def rule(name: str) -> Callable[[Rule], Rule]:
    """Registers a group's rule: run for every group of the stack, its findings named by group."""
    return lambda fn: _register(REGISTERED, name, fn)


def stack_rule(name: str) -> Callable[[StackRule], StackRule]:
    """Registers a stack rule: run once, on the whole stack (its groups, router, gateway, monitoring)."""
    return lambda fn: _register(STACK_REGISTERED, name, fn)


def group_prefix(sc: StackConfig, i: int) -> str:
    """How a finding names a field of group `i`: "groups[1](b)." ("" in a stack that is one group)."""
    name = sc.groups[i].name
    return "" if name is None else f"groups[{i}]({name})."
