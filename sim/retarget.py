"""A sim stack file moved onto another simulated cluster: the checked-in `Pulumi.sim*.yaml` point at the cluster
`sim` (its addresses and its ssh state under ~/.local/state/deepseek-spark-sim/sim/); the demo and the e2e tier run
the same stacks on clusters of their own (sim.cluster.SUBNETS), so every address of `sim` and its ssh state folder
become the other cluster's. Pure: text in, text out (comments and layout kept, so the copy reads like the original).
"""
from __future__ import annotations

import ipaddress
import re

from .cluster import DEFAULT_SUBNET, MAX_NODES, plan
from .inventory import DEFAULT_CLUSTER, SimError

_IP = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])")


def _addresses(cluster: str) -> list[str]:
    """Every address a cluster plans, in one order: the networks, the gateway, then each node's management and rail
    addresses."""
    p = plan(cluster, MAX_NODES)
    nets = [str(ipaddress.ip_network(s).network_address) for s in (p.subnet, *p.rail_subnets)]
    return [*nets, p.gateway, *(a for n in p.nodes for a in (n.ip, *n.rail_ips))]


def address_map(cluster: str) -> dict[str, str]:
    """`sim`'s address -> `cluster`'s."""
    return dict(zip(_addresses(DEFAULT_CLUSTER), _addresses(cluster)))


def retarget(text: str, cluster: str) -> str:
    """`text` (a sim stack file, a URL, an expected address) with the cluster `sim`'s addresses and ssh state folder
    replaced by `cluster`'s. An address inside `sim`'s networks that no node or network of it holds is an error: it
    would silently keep pointing at `sim`."""
    if cluster == DEFAULT_CLUSTER:
        return text
    moved = address_map(cluster)
    inside = [ipaddress.ip_network(s) for s in (DEFAULT_SUBNET, *plan(DEFAULT_CLUSTER, 1).rail_subnets)]

    def one(m: re.Match) -> str:
        ip = m.group(1)
        if ip in moved:
            return moved[ip]
        try:
            if any(ipaddress.ip_address(ip) in net for net in inside):
                raise SimError(f"{ip} is in the cluster {DEFAULT_CLUSTER!r}'s networks but none of its planned "
                               f"addresses: cannot move it to {cluster!r}")
        except ValueError:  # not an address (e.g. a version number)
            pass
        return ip

    text = _IP.sub(one, text)
    return text.replace(f"deepseek-spark-sim/{DEFAULT_CLUSTER}/", f"deepseek-spark-sim/{cluster}/")
