"""The Pulumi ComponentResources, one per concept (`deepseek-spark:index:<Class>`), each receiving its
part of the plan: SparkNode, CheckpointShare, ServingImage, EngramShards, SglangGroup/VllmRayGroup
(with `group`'s shared pieces), Readiness, Router, DeepSeekCluster, and `deployment`, which wires them
in rolling order and returns the stack outputs.

May import: `pulumi` and its providers, `planning` (the plan they are built from). Never `declared`:
components never read or parse config; they get a plan.
"""
