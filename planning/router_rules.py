"""The stack's own rules on its groups, its router and its team gateway: a node in one group, one served model,
the router's and the gateway's node, ports and image. Stack rules (rulebook.stack_rule): they see the whole
stack. Registered with the others when planning/rules.py imports this module.
"""

from __future__ import annotations

from .gateway import default_node
from .rulebook import Finding, group_prefix, stack_rule
from .serving_rules import node_ports
from declared.stack import LOCAL, StackConfig


@stack_rule("node-in-one-group")
def _one_group(sc: StackConfig, stack: str = "") -> list[Finding]:
    out = []
    for attr, label in (("name", "name"), ("host", "host"), ("fabric_ip", "fabricIp")):
        owners: dict[str, int] = {}
        for i, entry in enumerate(sc.groups):
            for j, node in enumerate(entry.cfg.nodes):
                value = getattr(node, attr)
                if value in owners and owners[value] != i:
                    out.append(Finding("node-in-one-group", f"{group_prefix(sc, i)}nodes[{j}].{label}", value,
                                       f"is also a node of group {sc.groups[owners[value]].name!r}: a Spark runs one "
                                       "rank of one group", "give each group its own nodes"))  # fmt: skip
                owners.setdefault(value, i)
    return out


@stack_rule("one-served-model")
def _one_model(sc: StackConfig, stack: str = "") -> list[Finding]:
    first = sc.groups[0].cfg.model.served_name
    return [Finding("one-served-model", f"{group_prefix(sc, i)}model.servedName", e.cfg.model.served_name,
                    f"differs from group {sc.groups[0].name!r}'s {first!r}: the router sends any request to any group",
                    "serve the same model name in every group")
            for i, e in enumerate(sc.groups) if e.cfg.model.served_name != first]  # fmt: skip


def router_group(sc: StackConfig) -> tuple[int, int] | None:
    """(group index, node index) of the router's node, None when no group has it."""
    if sc.router is None:
        return None
    for i, entry in enumerate(sc.groups):
        for j, node in enumerate(entry.cfg.nodes):
            if node.name == sc.router.node:
                return i, j
    return None


@stack_rule("router-node")
def _router_node(sc: StackConfig, stack: str = "") -> list[Finding]:
    if sc.router is not None and sc.router.node == LOCAL and router_group(sc) is not None:
        return [Finding("router-node", "router.node", LOCAL, "names where Pulumi runs, and a node is named local too",
                        "rename that node")]  # fmt: skip
    if sc.router is None or sc.router.node == LOCAL or router_group(sc) is not None:
        return []
    names = [n.name for e in sc.groups for n in e.cfg.nodes]
    return [Finding("router-node", "router.node", sc.router.node, "is not a node of any group",
                    f"use one of {', '.join(names)}")]  # fmt: skip


@stack_rule("router-port-free")
def _router_ports(sc: StackConfig, stack: str = "") -> list[Finding]:
    where = router_group(sc)
    if sc.router is None or (where is None and sc.router.node != LOCAL):
        return []
    r, taken, on = sc.router, {}, ""  # where Pulumi runs: no port of ours is known there
    if where is not None:
        cfg = sc.groups[where[0]].cfg
        node = cfg.nodes[where[1]]
        taken = node_ports(cfg, node)
        on = f" on {node.name}"
    fix = f"use the reference's router ports: port 8889, metricsPort 29000{' (free' + on + ')' if on else ''}"
    return _ports_free("router-port-free", "router", (("port", r.port), ("metricsPort", r.metrics_port)), taken, on, fix)


@stack_rule("router-image")
def _router_image(sc: StackConfig, stack: str = "") -> list[Finding]:
    where = router_group(sc) or ((0, 0) if sc.router is not None and sc.router.node == LOCAL else None)
    if sc.router is None or where is None or sc.router.image is not None:
        return []
    cfg = sc.groups[where[0]].cfg
    if cfg.engine == "sglang" and cfg.image_build is None:
        return []
    problem = (f"the router takes its image from group {sc.groups[where[0]].name or stack!r}, which runs vLLM: no "
               "sglang_router there" if cfg.engine == "vllm"
               else f"the router takes its image from group {sc.groups[where[0]].name or stack!r}, whose image is "
                    "built on the nodes (imageBuild), which the router does not wait for")  # fmt: skip
    return [Finding("router-image", "router.image", None, problem,
                    "set router.image to an image with sglang-router 0.3.2 that the node has or can pull, e.g. the "
                    "SGLang image lmsysorg/sglang:dev-dsv41")]  # fmt: skip


def gateway_where(sc: StackConfig) -> tuple[int, int] | None:
    """(group index, node index) of the gateway's node; None without a gateway or for an unknown node."""
    if sc.gateway is None:
        return None
    name = default_node(sc.gateway, sc.router.node if sc.router else None, sc.groups[0].cfg.nodes[0].name)
    return next(((i, j) for i, e in enumerate(sc.groups) for j, n in enumerate(e.cfg.nodes) if n.name == name), None)


@stack_rule("gateway-node")
def _gateway_node(sc: StackConfig, stack: str = "") -> list[Finding]:
    gw = sc.gateway
    if gw is None:
        return []
    names = [n.name for e in sc.groups for n in e.cfg.nodes]
    if gw.node == LOCAL:
        return [Finding("gateway-node", "gateway.node", LOCAL, "the gateway runs on a node (its database's volume "
                        "must outlive the machine Pulumi runs on)", f"use one of {', '.join(names)}")]  # fmt: skip
    if gateway_where(sc) is None:
        return [Finding("gateway-node", "gateway.node", gw.node, "is not a node of any group",
                        f"use one of {', '.join(names)}")]  # fmt: skip
    if sc.router is None and len(sc.groups) > 1:
        return [Finding("gateway-node", "gateway", "...", "several groups need the router in front of them for the "
                        "gateway to have one upstream", "add a `router:` block")]  # fmt: skip
    return []


@stack_rule("gateway-port-free")
def _gateway_ports(sc: StackConfig, stack: str = "") -> list[Finding]:
    where = gateway_where(sc)
    if where is None:
        return []
    gw, cfg = sc.gateway, sc.groups[where[0]].cfg
    node = cfg.nodes[where[1]]
    taken = node_ports(cfg, node)
    if sc.router is not None and sc.router.node == node.name:
        taken.update({sc.router.port: "router.port", sc.router.metrics_port: "router.metricsPort"})
    fix = f"pick free ports on {node.name}: the defaults are port 4000, databasePort 5433"
    ports = (("port", gw.port), ("databasePort", gw.database_port))
    return _ports_free("gateway-port-free", "gateway", ports, taken, f" on {node.name}", fix)


def _ports_free(rule: str, section: str, ports: tuple[tuple[str, int], tuple[str, int]], taken: dict[int, str],
                on: str, fix: str) -> list[Finding]:  # fmt: skip
    """A finding for each of the two ports another service on the node holds, and one when they are equal."""
    out = [Finding(rule, f"{section}.{label}", port, f"is {taken[port]}{on}", fix) for label, port in ports if port in taken]
    (first, a), (second, b) = ports
    if a == b:
        out.append(Finding(rule, f"{section}.{second}", b, f"equals {section}.{first}", fix))
    return out


@stack_rule("gateway-member-models")
def _gateway_models(sc: StackConfig, stack: str = "") -> list[Finding]:
    if sc.gateway is None:
        return []
    served = sc.groups[0].cfg.model.served_name
    return [Finding("gateway-member-models", f"gateway.members[{i}].models", m.models,
                    f"names a model this stack does not serve (it serves {served!r}), so the key could call nothing",
                    f"use [{served}], or leave models out (every served model)")
            for i, m in enumerate(sc.gateway.members) if m.models and served not in m.models]  # fmt: skip
