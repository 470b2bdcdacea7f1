"""deepseek-spark policy pack: `pulumi preview --policy-pack policy` (see docs/pr-previews-and-clients.md).

The checks are plain functions in guardrails.py; policies.py turns them into pulumi-policy objects.
"""

from pulumi_policy import EnforcementLevel, PolicyPack

import policies

PolicyPack(
    name=policies.PACK_NAME,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=policies.build(),
)
