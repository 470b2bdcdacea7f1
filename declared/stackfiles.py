"""The project's stacks: the `Pulumi.<stack>.yaml` files beside `Pulumi.yaml`, the checked-in ones. Every collector
of stacks (tests, docs, policy checks, listings) reads them here. Nothing else lives in that folder: the demo's own
stacks are in its project folder (`.dspark-demo/project`, dspark demo), the tests' in theirs."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def project_stacks(root: Path = ROOT) -> list[str]:
    """The names of the stacks with a stack file in `root`, sorted."""
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml"))
