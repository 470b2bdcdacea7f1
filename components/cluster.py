"""DeepSeekCluster: wires nodes, checkpoint share, images, engram shards, the serving group and the
readiness gate, and owns the stack outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi

from . import clients, commands, plan
from .config import Settings
from .engram import EngramShards, EngramShardsArgs
from .image import ServingImage, ServingImageArgs
from .node import SparkNode, SparkNodeArgs
from .readiness import Readiness, ReadinessArgs
from .group import GroupArgs
from .sglang import SglangGroup
from .share import CheckpointShare, CheckpointShareArgs
from .vllm import VllmRayGroup


def client_config(endpoint: str, model: str, api_key: str) -> dict:
    """What an OpenAI SDK, curl or a gateway needs (holds the key: exported as a secret)."""
    return {
        "base_url": endpoint,
        "api_key": api_key,
        "model": model,
        "openai_env": {"OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": api_key, "OPENAI_MODEL": model},
        "litellm": clients.litellm_config(clients.Client(endpoint, api_key, model))["model_list"][0],
    }


@dataclass(frozen=True)
class DeepSeekClusterArgs:
    settings: Settings


class DeepSeekCluster(pulumi.ComponentResource):
    def __init__(self, name: str, args: DeepSeekClusterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:DeepSeekCluster", name, None, opts)
        s = args.settings
        cfg, stack = s.cluster, s.stack
        child = pulumi.ResourceOptions(parent=self)
        revision = plan.group_revision(plan.group_specs(cfg, stack), plan.image_build_digest(cfg))

        self.nodes = [
            SparkNode(
                f"{name}-{node.name}",
                SparkNodeArgs(node=node, ssh_opts=commands.ssh_opts(cfg), preflight=commands.preflight(cfg, stack, rank),
                              recheck_on=revision, host_key=s.host_keys[rank], private_key=s.ssh_private_key),
                child,
            )  # fmt: skip
            for rank, node in enumerate(cfg.nodes)
        ]
        self.image = ServingImage(
            f"{name}-image", ServingImageArgs(cfg.image, self.nodes, cfg.image_timeout_minutes, cfg.image_build), child
        )
        self.share = CheckpointShare(
            f"{name}-checkpoint", CheckpointShareArgs(cfg, stack, self.nodes, self.image.images, s.hf_token), child
        )
        prerequisites = [*(n.preflight for n in self.nodes), *self.image.images, *self.share.volumes]
        self.group: SglangGroup | VllmRayGroup
        if cfg.engine == "sglang":
            self.engram = EngramShards(
                f"{name}-engram",
                EngramShardsArgs(cfg, stack, self.nodes, self.image.images, self.share.volumes),
                child,
            )
            prerequisites += self.engram.shards
            self.group = SglangGroup(
                f"{name}-sglang", GroupArgs(cfg, stack, s.api_key, self.nodes, self.share.volumes, prerequisites), child
            )
        else:
            self.group = VllmRayGroup(
                f"{name}-vllm", GroupArgs(cfg, stack, s.api_key, self.nodes, self.share.volumes, prerequisites), child
            )
        self.readiness = Readiness(
            f"{name}-readiness", ReadinessArgs(cfg, stack, s.api_key, self.group.ranks), child
        )

        self.endpoint = plan.endpoint(cfg)
        self.model = cfg.model.served_name
        self.api_key = s.api_key
        self.memory_plan = plan.memory_plan(cfg).to_output()
        self.group_revision = self.group.revision
        self.node_outputs = [
            {
                "name": n.name,
                "host": n.host,
                "fabricIp": n.fabric_ip,
                "sshUser": n.ssh_user,
                "rank": rank,
                "role": "head" if rank == 0 else "worker",
                "container": plan.container_name(stack, rank),
            }
            for rank, n in enumerate(cfg.nodes)
        ]
        # Resolves once readiness passed, so `client_config` is only ever handed out for a working endpoint.
        self.client_config = pulumi.Output.secret(
            pulumi.Output.all(self.readiness.ready, s.api_key).apply(
                lambda v: client_config(self.endpoint, self.model, v[1])
            )
        )
        self.register_outputs(
            {
                "endpoint": self.endpoint,
                "model": self.model,
                "group_revision": self.group_revision,
                "client_config": self.client_config,
            }
        )
