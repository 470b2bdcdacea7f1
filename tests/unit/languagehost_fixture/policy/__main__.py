"""Fixture policy pack of tests/unit/test_language_host.py: one mandatory policy, reading the stack
name and config the language host's policy proxy put in its environment."""
import os

import pulumi
from pulumi_policy import EnforcementLevel, PolicyPack, ResourceValidationPolicy


def no_forbidden(args, report_violation):
    if args.resource_type == "lhfixture:index:Forbidden":
        greeting = pulumi.Config("lhfixture").get("greeting")
        report_violation(f"{args.name} is forbidden (stack {os.environ.get('PULUMI_STACK')}, greeting {greeting})")


PolicyPack(
    name="fixture-pack",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[ResourceValidationPolicy(name="no-forbidden", description="no forbidden components",
                                       validate=no_forbidden)],
)
