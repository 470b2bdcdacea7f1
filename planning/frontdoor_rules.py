"""The front door's rules (stack rules, rulebook.stack_rule): where it can run, its port free on its node, and the
owner's certificate naming the endpoint and not about to expire. Registered when planning/rules.py imports this.
"""

from __future__ import annotations

import datetime as dt

from .exposure import door_node
from .rulebook import Finding, stack_rule
from .serving_rules import node_ports
from declared.stack import LOCAL, StackConfig


@stack_rule("frontdoor-node")
def _node(sc: StackConfig, stack: str = "") -> list[Finding]:
    fd = sc.front_door
    if fd.enabled and sc.gateway is None and sc.router is not None and sc.router.node == LOCAL:
        return [Finding("frontdoor-node", "frontDoor.enabled", True, "the endpoint is the router where Pulumi runs "
                        "(router.node: local): no node of the stack answers for it, so the door has nothing to front",
                        "put the router on a node (router.node: <node>), or add a gateway, or set frontDoor.enabled: "
                        "false")]  # fmt: skip
    return []


@stack_rule("frontdoor-port-free")
def _port(sc: StackConfig, stack: str = "") -> list[Finding]:
    fd = sc.front_door
    if not fd.enabled or _node(sc):
        return []
    where = door_node(sc)
    cfg, node = next((e.cfg, n) for e in sc.groups for n in e.cfg.nodes if n.name == where)
    taken = node_ports(cfg, node)
    if sc.router is not None and sc.router.node == where:
        taken.update({sc.router.port: "router.port", sc.router.metrics_port: "router.metricsPort"})
    if sc.gateway is not None:
        taken.update({sc.gateway.port: "gateway.port", sc.gateway.database_port: "gateway.databasePort"})
    if sc.monitoring.node_exporter.enabled:
        taken[sc.monitoring.node_exporter.port] = "monitoring.nodeExporter.port"
    if fd.port in taken:
        return [Finding("frontdoor-port-free", "frontDoor.port", fd.port, f"is {taken[fd.port]} on {where}",
                        "pick a free port: the default is 443")]
    return []


@stack_rule("frontdoor-own-certificate")
def _own(sc: StackConfig, stack: str = "", today: dt.date | None = None) -> list[Finding]:
    """source own: the chain must name what clients are given (frontDoor.names[0], else the door's node address),
    and the preview warns from renewBeforeDays before it expires (an expired one is an error)."""
    fd, c = sc.front_door, sc.front_door.certificate
    if not fd.enabled or c.source != "own" or not c.certificate or _node(sc):
        return []
    from . import tls

    try:
        info = tls.describe(c.certificate)
    except ValueError as exc:
        return [Finding("frontdoor-own-certificate", "frontDoor.certificate.certificate", "(PEM)",
                        f"cannot be read: {exc}", "paste the PEM of the server's certificate first, then its chain")]
    where = door_node(sc)
    host = next(n.host for e in sc.groups for n in e.cfg.nodes if n.name == where)
    want = fd.names[0] if fd.names else host
    out = []
    if want not in info["names"]:
        out.append(Finding("frontdoor-own-certificate", "frontDoor.certificate.certificate", info["subject"],
                           f"does not name {want} (it names {', '.join(info['names']) or 'nothing'}), which clients "
                           "are given", f"issue it for {want}, or list the name it has first in frontDoor.names"))
    left = (dt.date.fromisoformat(info["not_after"][:10]) - (today or dt.date.today())).days
    if left < 0:
        out.append(Finding("frontdoor-own-certificate", "frontDoor.certificate.certificate", info["not_after"],
                           "has expired: clients refuse it", "renew it and set the new PEM here, then `pulumi up`"))
    elif left <= c.renew_before_days:
        out.append(Finding("frontdoor-own-certificate", "frontDoor.certificate.certificate", info["not_after"],
                           f"expires in {left} days", "renew it and set the new PEM here, then `pulumi up` (the door "
                           "reloads it; no rank restarts)", level="warning"))  # fmt: skip
    return out
