"""The rules on the monitoring the program runs (planning/prometheus.py), checked at preview with the others:
the server's node exists, and the node exporter's and the server's ports are free where they run. Registered
with the others when planning/rules.py imports this module."""

from __future__ import annotations

from declared.stack import LOCAL, StackConfig

from .rulebook import Finding, stack_rule
from .serving_rules import node_ports


def _names(sc: StackConfig) -> list[str]:
    return [n.name for e in sc.groups for n in e.cfg.nodes]


@stack_rule("monitoring-node")
def _server_node(sc: StackConfig, stack: str = "") -> list[Finding]:
    s = sc.monitoring.server
    if s is None or s.node is None or s.node in _names(sc):
        return []
    why = ("Prometheus runs on a node (its TSDB must outlive the machine Pulumi runs on)" if s.node == LOCAL
           else "is not a node of any group")  # fmt: skip
    return [Finding("monitoring-node", "monitoring.server.node", s.node, why, f"use one of {', '.join(_names(sc))}")]


@stack_rule("monitoring-ports-free")
def _ports(sc: StackConfig, stack: str = "") -> list[Finding]:
    mc = sc.monitoring
    out = []
    server = mc.server
    where = None
    if server is not None:
        router = sc.router.node if sc.router else None
        where = server.node or (router if router and router != LOCAL else sc.groups[0].cfg.nodes[0].name)
    for e in sc.groups:
        for node in e.cfg.nodes:
            taken = node_ports(e.cfg, node)
            if sc.router is not None and sc.router.node == node.name:
                taken.update({sc.router.port: "router.port", sc.router.metrics_port: "router.metricsPort"})
            if sc.gateway is not None and (sc.gateway.node or where) == node.name:
                taken.update({sc.gateway.port: "gateway.port", sc.gateway.database_port: "gateway.databasePort"})
            mine = [("nodeExporter.port", mc.node_exporter.port)] if mc.node_exporter.enabled else []
            if server is not None and node.name == where:
                mine += [("server.prometheusPort", server.prometheus_port),
                         ("server.alertmanagerPort", server.alertmanager_port)]  # fmt: skip
            fix = "pick free ports: the defaults are nodeExporter.port 9100, server.prometheusPort 9090, alertmanagerPort 9093"
            for i, (label, port) in enumerate(mine):
                clash = taken.get(port) or next((f"monitoring.{o}" for o, p in mine[:i] if p == port), None)
                if clash:
                    out.append(Finding("monitoring-ports-free", f"monitoring.{label}", port, f"is {clash} on {node.name}",
                                       fix))  # fmt: skip
    # one finding per field and value, however many nodes share it
    return list({(f.field, f.value, f.problem.split(" on ")[0]): f for f in out}.values())
