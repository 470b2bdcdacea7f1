"""deepseek-spark: DeepSeek-V4.1-Flash on 2-4 DGX Sparks as one OpenAI-compatible endpoint.

Load and validate the stack config, build the cluster, export the outputs. Nothing else.
"""

import pulumi

from components import config, rules, stackplan
from components.cluster import DeepSeekCluster, DeepSeekClusterArgs

try:
    settings = config.load()
except config.ConfigError as exc:
    raise pulumi.RunError(str(exc)) from None

errors, warnings = rules.check(settings.cluster, settings.stack)
for finding in warnings:
    pulumi.log.warn(str(finding))
if errors:
    raise pulumi.RunError(
        f"{len(errors)} problem(s) in the stack config, nothing was changed:\n  " + "\n  ".join(map(str, errors))
    )
plan = stackplan.build(settings.cluster, settings.stack, settings.host_keys)  # everything to create, once
pulumi.log.info(plan.memory.summary())

cluster = DeepSeekCluster(
    settings.stack, DeepSeekClusterArgs(plan, settings.api_key, settings.ssh_private_key, settings.hf_token)
)

pulumi.export("endpoint", cluster.endpoint)
pulumi.export("model", cluster.model)
pulumi.export("api_key", cluster.api_key)
pulumi.export("nodes", cluster.node_outputs)
pulumi.export("memory_plan", cluster.memory_plan)
pulumi.export("group_revision", cluster.group_revision)
pulumi.export("client_config", cluster.client_config)
