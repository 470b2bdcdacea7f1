"""The alert rules of the repository's stacks as files (planning/alerts.py), for promtool and the tests."""
from __future__ import annotations

from pathlib import Path

from declared.stack import parse_stack
from declared.stackfiles import project_stacks
from harness import cluster_of, with_known_hosts
from planning import alerts, clusterplan, stackplan

STACKS = project_stacks()


def plan_of(stack: str) -> clusterplan.ClusterPlan:
    raw = with_known_hosts(cluster_of(stack))
    return stackplan.build_stack(parse_stack(raw), stack)


def write_rules(stack: str, folder: Path) -> Path:
    path = folder / f"{stack}.rules.yml"
    path.write_text(alerts.render(alerts.rule_groups(plan_of(stack)), stack))
    return path
