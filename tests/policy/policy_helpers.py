"""Shared pieces for the policy-pack tests (imported by name; conftest modules are not importable):
the real stacks' registered resources, turned into what pulumi-policy hands a validator
(ResourceValidationArgs / PolicyResource), and bad copies of them."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
POLICY_DIR = ROOT / "policy"
if str(POLICY_DIR) not in sys.path:
    sys.path.insert(0, str(POLICY_DIR))

from pulumi_policy import PolicyCustomTimeouts, PolicyResource, PolicyResourceOptions, ResourceValidationArgs  # noqa: E402
from pulumi_policy.proxy import unknown_checking_proxy  # noqa: E402

import guardrails  # noqa: E402
from harness import TEST_API_KEY, TEST_SSH_KEY, Recording, Registered, cluster_of, reveal  # noqa: E402

STACKS = ("tp3", "tp4", "tp2", "sim", "tp4x2", "sim-x2", "sim-team")


def stack_config(stack: str) -> dict[str, str]:
    """The stack config as the Pulumi CLI hands it to a policy pack (PULUMI_CONFIG, secrets decrypted)."""
    return {
        "deepseek-spark:cluster": json.dumps(cluster_of(stack)),
        "deepseek-spark:apiKey": TEST_API_KEY,
        "deepseek-spark:sshPrivateKey": TEST_SSH_KEY,
    }


def facts_for(stack: str) -> guardrails.StackFacts:
    return guardrails.StackFacts.from_config(stack_config(stack))


def opts_of(r: Registered) -> PolicyResourceOptions:
    return PolicyResourceOptions(
        protect=r.protect,
        ignore_changes=list(r.ignore_changes),
        delete_before_replace=r.delete_before_replace,
        aliases=[],
        custom_timeouts=PolicyCustomTimeouts(0, 0, 0),
        additional_secret_outputs=[],
        parent=r.parent or None,
    )


def as_args(r: Registered, config: Optional[dict] = None, props: Optional[dict] = None) -> ResourceValidationArgs:
    """What pulumi-policy's Analyze passes a resource validation: secrets unwrapped, unknown-checking props."""
    plain = reveal(r.inputs) if props is None else props
    props = unknown_checking_proxy(copy.deepcopy(plain))
    return ResourceValidationArgs(r.type, props, r.urn, r.name, opts_of(r), None, config)


def as_stack_resource(r: Registered, props: Optional[dict] = None) -> PolicyResource:
    plain = reveal(r.inputs) if props is None else props
    return PolicyResource(r.type, unknown_checking_proxy(copy.deepcopy(plain)), r.urn, r.name, opts_of(r), None, None, [], {})


def changed(r: Registered, **changes: Any) -> Registered:
    """A copy of `r` with some inputs replaced (a deliberately bad resource); `_dbr=False` flips the option."""
    bad = copy.deepcopy(r)
    if "_dbr" in changes:
        bad.delete_before_replace = changes.pop("_dbr")
    bad.inputs.update(changes)
    return bad


def custom(rec: Recording) -> list[Registered]:
    return [r for r in rec.resources if r.custom]
