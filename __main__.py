"""deepseek-spark: DeepSeek-V4.1-Flash on DGX Sparks as one OpenAI-compatible endpoint.

Load and validate the stack config, build the plan, register it, export the outputs. Nothing else.
"""

import pulumi

from components import deployment
from declared.cluster import ConfigError
from declared.settings import load
from planning import budget, exposure, frontdoor, rules, stackplan

try:
    settings = load()
except ConfigError as exc:
    raise pulumi.RunError(str(exc)) from None

errors, warnings = rules.check_stack(settings.config, settings.stack)
for finding in [*warnings, *settings.warnings]:
    pulumi.log.warn(str(finding))
if errors:
    raise pulumi.RunError(
        f"{len(errors)} problem(s) in the stack config, nothing was changed:\n  " + "\n  ".join(map(str, errors))
    )
plan = stackplan.build_stack(settings.config, settings.stack, settings.host_keys)  # everything to create, once
for group in plan.groups:
    where = "" if group.name is None else f"[group {group.name}] "
    pulumi.log.info(where + group.memory.summary())
    pulumi.log.info(where + budget.summary(group.budgets))  # every container on each node, against its budget
    pulumi.log.info(where + group.planes)
pulumi.log.info(exposure.summary(plan.exposure))  # who may reach what on every node: the fence below applies it
if plan.front_door is not None:
    pulumi.log.info(frontdoor.summary(plan.front_door))  # the endpoint, its certificate and when it is renewed

outputs = deployment.deploy(plan, settings.api_key, settings.ssh_private_key, settings.hf_token, settings.member_keys,
                            settings.alert_webhook, settings.front_door_key)
for name, value in outputs.items():
    pulumi.export(name, value)
