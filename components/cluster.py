"""DeepSeekCluster: wires nodes, checkpoint share, images, engram shards, the serving group and the
readiness gate, and owns the stack outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pulumi

from .caches import CompileCaches, CompileCachesArgs
from .engram import EngramShards, EngramShardsArgs
from .guard import Guard, GuardArgs
from .image import ServingImage, ServingImageArgs
from .node import SparkNode, SparkNodeArgs
from .readiness import Readiness, ReadinessArgs
from .group import GroupArgs
from .sglang import SglangGroup
from .share import CheckpointShare, CheckpointShareArgs
from .router import Router, router_member
from planning.clientconfig import client_config
from planning.clusterplan import MemberPlan, StackPlan
from .vllm import VllmRayGroup


@dataclass(frozen=True)
class DeepSeekClusterArgs:
    plan: StackPlan  # everything to create, computed once (stackplan.build)
    api_key: Any  # secret Output[str]
    ssh_private_key: Any = None  # secret Output[str]; ssh-agent when None
    hf_token: Any = None  # secret Output[str], for model.source: download
    # Behind a router: the router and this group's membership plan; `after`: what this group's restart
    # waits for (the previous group back in rotation).
    router: Optional[Router] = None
    member: Optional[MemberPlan] = None
    after: list = field(default_factory=list)


class DeepSeekCluster(pulumi.ComponentResource):
    def __init__(self, name: str, args: DeepSeekClusterArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("deepseek-spark:index:DeepSeekCluster", name, None, opts)
        sp, stack = args.plan, args.plan.stack
        child = pulumi.ResourceOptions(parent=self)

        self.nodes = [
            SparkNode(f"{name}-{node.name}", SparkNodeArgs(node, sp.revision, args.ssh_private_key), child)
            for node in sp.nodes
        ]
        self.image = ServingImage(f"{name}-image", ServingImageArgs(sp.image, self.nodes, sp.revision), child)
        self.share = CheckpointShare(
            f"{name}-checkpoint", CheckpointShareArgs(stack, sp.export, self.nodes, self.image.images, args.hf_token, sp.seed),
            child,
        )
        self.caches = CompileCaches(
            f"{name}-compile-cache", CompileCachesArgs(stack, sp.compile_cache_prefix, self.nodes, self.image.images),
            child,
        )
        prerequisites = [*(n.preflight for n in self.nodes), *self.image.images, *self.share.volumes]
        if sp.engine == "sglang":
            self.engram = EngramShards(
                f"{name}-engram", EngramShardsArgs(self.nodes, self.image.images, self.share.volumes), child
            )
            prerequisites += self.engram.shards
        group_args = GroupArgs(
            sp.group, stack, args.api_key, self.nodes, self.share.volumes, self.image.images, prerequisites,
            list(args.after), self.image.agree, self.caches.volumes,
        )
        self.group: SglangGroup | VllmRayGroup = (
            SglangGroup(f"{name}-sglang", group_args, child)
            if sp.engine == "sglang"
            else VllmRayGroup(f"{name}-vllm", group_args, child)
        )
        self.fabric = self.group.fabric
        self.readiness = Readiness(
            f"{name}-readiness", ReadinessArgs(sp.readiness, args.api_key, self.group.ranks), child
        )
        self.member: Optional[pulumi.Resource] = None
        if args.router is not None and args.member is not None:
            self.member = router_member(
                f"{name}-router-member", args.member, args.api_key, self.readiness.check, args.router, self
            )

        # The group's self-healing (serving.selfHeal): created once the group answers (and, behind a router, is
        # back in rotation), replaced by every change of the group before any rank.
        self.guard: Optional[Guard] = None
        if sp.guard is not None:
            ready = self.member if self.member is not None else self.readiness.check
            self.guard = Guard(f"{name}-guard", GuardArgs(
                sp.guard, self.nodes, self.group.ranks, self.image.images, ready, self.group.api_key_file,
                fabric=self.fabric.figures if self.fabric else None), child)  # fmt: skip

        self.endpoint = sp.endpoint
        self.model = sp.model
        self.api_key = args.api_key
        self.memory_plan = sp.memory.to_output()
        self.group_revision = sp.revision
        self.node_outputs = [
            {
                "name": n.name,
                "host": n.host,
                "fabricIp": n.fabric_ip,
                "sshUser": n.ssh_user,
                "rank": n.rank,
                "role": n.role,
                "container": spec.container_name,
            }
            for n, spec in zip(sp.nodes, sp.group.specs)  # fmt: skip
        ]
        # Resolves once readiness passed, so `client_config` is only ever handed out for a working endpoint.
        self.client_config = pulumi.Output.secret(
            pulumi.Output.all(self.readiness.ready, args.api_key).apply(
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
