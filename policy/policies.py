"""pulumi-policy objects for the guardrails in guardrails.py (one policy per check, all mandatory).

`build()` is what __main__.py serves; tests call the same objects' `validate` with
`ResourceValidationArgs` made from the program's registered resources.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

import guardrails

PACK_NAME = "deepseek-spark-guardrails"


def _config(args: Any) -> Mapping[str, Any]:
    return args.get_config() or {}


def _resource_policy(spec: guardrails.PolicySpec, facts: guardrails.StackFacts) -> ResourceValidationPolicy:
    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        for message in spec.check(args, _config(args), facts):
            report_violation(message)

    return ResourceValidationPolicy(
        name=spec.name,
        description=spec.description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema(spec.config_schema) if spec.config_schema else None,
    )


def _stack_policy(spec: guardrails.PolicySpec, facts: guardrails.StackFacts) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        for message in spec.check(args.resources, _config(args), facts):
            report_violation(message)

    return StackValidationPolicy(
        name=spec.name,
        description=spec.description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=PolicyConfigSchema(spec.config_schema) if spec.config_schema else None,
    )


def build(facts: Optional[guardrails.StackFacts] = None) -> list:
    """Every guardrail as a pulumi-policy policy. `facts` default: the stack config the Pulumi CLI
    passes to the policy pack process (PULUMI_CONFIG, secrets decrypted)."""
    facts = facts if facts is not None else guardrails.StackFacts.from_environment(os.environ)
    return [(_stack_policy if s.stack else _resource_policy)(s, facts) for s in guardrails.POLICIES]
