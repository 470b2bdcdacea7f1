"""deepseek-spark policy pack: `pulumi preview --policy-pack policy` (see docs/pull-request-previews.md).

The checks are plain functions in guardrails.py; policies.py turns them into pulumi-policy objects.
"""

import sys
from pathlib import Path

# The pack shares the program's validators (declared/shapes.py): one source of truth.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

import policies  # noqa: E402

PolicyPack(
    name=policies.PACK_NAME,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=policies.build(),
)
