"""The whole stack from its plan: the router (when there is one), then every group in order, each
one's restart waiting for the group before it to be back in the router's rotation, and the stack
outputs. A stack without `groups` is one DeepSeekCluster named after the stack, exactly as before.
"""

from __future__ import annotations

from typing import Any

import pulumi

from planning import alerts, exposure, monitoring
from planning.clientconfig import client_config

from .cluster import DeepSeekCluster, DeepSeekClusterArgs
from .fence import Fence, FenceArgs
from .frontdoor import FrontDoor, FrontDoorArgs
from .gateway import Gateway, GatewayArgs
from .monitoring import Monitoring, MonitoringArgs
from .readiness import Readiness, ReadinessArgs
from .router import Router, RouterArgs
from planning.clusterplan import ClusterPlan, StackPlan


def group_output(sp: StackPlan) -> dict[str, Any]:
    """One entry of the `groups` output: the group's own endpoint, nodes and revision."""
    return {
        "name": sp.group_name,
        "endpoint": sp.endpoint,
        "engine": sp.engine,
        "tpSize": len(sp.nodes),
        "nodes": [n.name for n in sp.nodes],
        "revision": sp.revision,
    }


def deploy(
    cp: ClusterPlan, api_key: Any, ssh_private_key: Any = None, hf_token: Any = None, member_keys: Any = None,
    alert_webhook: Any = None, front_door_key: Any = None,
) -> dict[str, Any]:
    """Register every resource of the stack; returns the stack outputs by name."""
    router = Router(f"{cp.stack}-router", RouterArgs(cp.router, api_key, ssh_private_key)) if cp.router else None
    clusters: list[DeepSeekCluster] = []
    after: list[pulumi.Resource] = []
    for sp, member in zip(cp.groups, cp.members):
        cluster = DeepSeekCluster(
            sp.stack, DeepSeekClusterArgs(sp, api_key, ssh_private_key, hf_token, router, member, after)
        )
        clusters.append(cluster)
        # Rolling: the next group goes down only once this one is back in the router's rotation.
        after = [cluster.member] if cluster.member is not None else []

    outputs: dict[str, Any] = {"endpoint": cp.endpoint, "model": cp.model, "api_key": api_key}
    if len(clusters) == 1:
        only = clusters[0]
        outputs.update(nodes=only.node_outputs, memory_plan=only.memory_plan, group_revision=only.group_revision)
    else:
        outputs["nodes"] = [{**n, "group": sp.group_name} for sp, c in zip(cp.groups, clusters) for n in c.node_outputs]
        outputs["memory_plan"] = {sp.group_name: c.memory_plan for sp, c in zip(cp.groups, clusters)}
    outputs["groups"] = [group_output(sp) for sp in cp.groups]
    # per group: what rank 0 reported it obtained at its last boot, next to what the plan expected
    outputs["boot"] = {sp.group_name: c.readiness.boot for sp, c in zip(cp.groups, clusters)}
    # per group: the fabric gate's measured bandwidth per node pair and rail at the last (re)start
    outputs["fabric"] = {sp.group_name: (c.fabric.figures if c.fabric else None) for sp, c in zip(cp.groups, clusters)}
    outputs["prometheus"] = {"scrape_configs": monitoring.scrape_configs(cp)}
    nodes = {n.node.name: n for c in clusters for n in c.nodes}
    Fence(f"{cp.stack}-fence", FenceArgs(cp.exposure, nodes))
    outputs["exposure"] = exposure.to_output(cp.exposure)
    outputs["alert_rules"] = alerts.rule_groups(cp)

    if router is None:
        outputs["client_config"] = clusters[0].client_config
        upstream = [clusters[0].readiness.check]
    else:
        members = [c.member for c in clusters if c.member is not None]
        ready = Readiness(f"{cp.stack}-router-readiness", ReadinessArgs(cp.router.readiness, api_key, members))
        _router_outputs(cp, outputs, ready, api_key)
        upstream = [ready.check]
    gateway = door = None
    if cp.gateway is not None:
        gateway = Gateway(f"{cp.stack}-gateway", GatewayArgs(cp.gateway, api_key, upstream, dict(member_keys or {}),
                                                             ssh_private_key))  # fmt: skip
    if cp.front_door is not None:
        fp = cp.front_door
        door = FrontDoor(f"{cp.stack}-frontdoor", FrontDoorArgs(
            fp, nodes[fp.node.name], gateway.admin_key if gateway else api_key,
            [gateway.readiness.check] if gateway else upstream, front_door_key))  # fmt: skip
        outputs["front_door"] = _front_door_output(fp, door)
        if gateway is None:
            outputs["client_config"] = pulumi.Output.secret(pulumi.Output.all(door.readiness.ready, api_key, door.ca_pem)
                                                            .apply(lambda v: client_config(cp.endpoint, cp.model, v[1],
                                                                                           v[2])))  # fmt: skip
    if gateway is not None:
        _gateway_outputs(cp, outputs, gateway, door)
    mp = cp.monitoring
    if mp is not None and (mp.exporters or mp.server is not None):
        ready = [gateway.readiness.check] if gateway else upstream
        Monitoring(f"{cp.stack}-monitoring", MonitoringArgs(mp, nodes, alert_webhook,
                                                            gateway.metrics_key if gateway else None, ready))  # fmt: skip
        outputs["monitoring"] = mp.to_output()
    return outputs


def _front_door_output(fp, door: FrontDoor) -> dict[str, Any]:
    """Where the front door is, what its certificate names and when a new one is issued, and its CA (public)."""
    cert = {"source": fp.source, "names": list(fp.names)}
    if fp.source == "stack-ca":
        cert.update(fp.renewal())
    return {"node": fp.node.name, "endpoint": fp.endpoint, "container": fp.container.name, "certificate": cert,
            "ca_pem": door.ca_pem}


def _gateway_outputs(cp: ClusterPlan, outputs: dict[str, Any], gw: Gateway, door: FrontDoor | None = None) -> None:
    """With a gateway, clients get its endpoint: each member has their own config in `member_configs`, the admin's
    (LiteLLM's master key: operator tools) is `admin_config`, named as such, and there is no `client_config` that
    could hand it out; the internal key stays in `api_key` for the operator alone."""
    gp = cp.gateway
    outputs["gateway"] = {
        "node": gp.node.name,
        "endpoint": gp.endpoint,
        "container": gp.gateway.name,
        "database": gp.database.name,
        "volume": gp.volume,
        "upstream": gp.upstream,
        "members": [m.name for m in gp.members],
        "admin_key": gw.admin_key,
        "metrics_key": gw.metrics_key,
    }
    # through the front door when there is one: its endpoint, its CA, and only once a request went through it
    ready = door.readiness.ready if door else gw.readiness.ready
    ca = door.ca_pem if door else None
    outputs.pop("client_config", None)
    outputs["admin_config"] = pulumi.Output.secret(
        pulumi.Output.all(ready, gw.admin_key, ca).apply(lambda v: client_config(cp.endpoint, cp.model, v[1], v[2]))
    )
    names = list(gw.member_keys)
    outputs["member_configs"] = pulumi.Output.secret(
        pulumi.Output.all(ready, ca, *(gw.member_keys[n] for n in names)).apply(
            lambda v: {n: client_config(cp.endpoint, cp.model, k, v[1]) for n, k in zip(names, v[2:])}
        )
    )


def _router_outputs(cp: ClusterPlan, outputs: dict[str, Any], ready: Readiness, api_key: Any) -> None:
    outputs["router"] = {
        "node": cp.router.node.name if cp.router.node else "local",
        "group": cp.router.group,
        "endpoint": cp.router.endpoint,
        "container": cp.router.spec.container_name,
        "workers": [m.worker for m in cp.members if m is not None],
    }
    # Resolves once an answer came back through the router: only ever handed out for a working endpoint.
    outputs["client_config"] = pulumi.Output.secret(
        pulumi.Output.all(ready.ready, api_key).apply(lambda v: client_config(cp.upstream, cp.model, v[1]))
    )
