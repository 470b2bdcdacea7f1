"""The rule on each node's further ConnectX-7 addresses (`nodes[].linkIps`), checked at preview with the
others: every address once in the cluster, and, where nodes are cabled to each other (topology direct
or ring), each on the subnet of exactly the one peer its cable reaches. fabric.link pairs nodes by
subnet, so an address that breaks this sends NCCL, NFS or the bandwidth gate down the wrong cable, or
down none. Registered with the others when planning/rules.py imports this module.
"""

from __future__ import annotations

import ipaddress

from declared.cluster import ClusterConfig

from . import fabric
from .rulebook import Finding, rule

RULE = "fabric-link-ips"


def _net(ip: str, prefix: int) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    except ValueError:
        return None  # fabric-ip-is-ipv4 names it


def _owner(cfg: ClusterConfig, ip: str, skip: int) -> tuple[int, str] | None:
    """(node index, field) of another node that holds `ip` as fabricIp or a linkIp."""
    for j, node in enumerate(cfg.nodes):
        if j == skip:
            continue
        if node.fabric_ip == ip:
            return j, "fabricIp"
        if ip in node.link_ips:
            return j, f"linkIps[{node.link_ips.index(ip)}]"
    return None


@rule(RULE)
def _link_ips(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    out, p = [], cfg.fabric.prefix_length
    cabled = cfg.topology in ("direct", "ring")
    for i, node in enumerate(cfg.nodes):
        for k, ip in enumerate(node.link_ips):
            field = f"nodes[{i}].linkIps[{k}]"
            if ip in node.link_ips[:k]:
                out.append(Finding(RULE, field, ip, f"is listed twice in {node.name}'s linkIps",
                                   "list each of the node's ConnectX-7 addresses once"))  # fmt: skip
                continue
            if ip == node.fabric_ip:
                out.append(Finding(RULE, field, ip, f"is {node.name}'s fabricIp too (linkIps are the node's further "
                                   "addresses, one per further cable)", "remove it from linkIps"))  # fmt: skip
                continue
            owner = _owner(cfg, ip, i)
            if owner is not None:
                j, where = owner
                out.append(Finding(RULE, field, ip, f"is also {cfg.nodes[j].name}'s nodes[{j}].{where}: two ports "
                                   "cannot hold one address", f"give {node.name}'s port its own address on the "
                                   "subnet it shares with its peer"))  # fmt: skip
                continue
            net = _net(ip, p)
            if net is None:
                continue
            # the node's other addresses (a duplicate of this one is reported once, above)
            own = [("fabricIp", node.fabric_ip), *((f"linkIps[{m}]", x) for m, x in enumerate(node.link_ips) if x != ip)]
            mine = [(label, other) for label, other in own if _net(other, p) == net]
            if mine:
                out.append(Finding(RULE, field, ip, f"is on {net} like {node.name}'s own {mine[0][0]} {mine[0][1]}: "
                                   "two ports of one node on one subnet, so the kernel and NCCL may send a peer's "
                                   "traffic out of the wrong one", f"give each cable its own /{p} subnet "
                                   "(fabric.prefixLength)"))  # fmt: skip
                continue
            peers = [n.name for j, n in enumerate(cfg.nodes)
                     if j != i and any(_net(a, p) == net for a in fabric.addresses(n))]  # fmt: skip
            if not peers:
                out.append(Finding(RULE, field, ip, f"no other node has an address on {net}, so the cable this address "
                                   "is for reaches no peer", "give the node it is cabled to its address on that link "
                                   f"({net}, as its fabricIp or in its linkIps), or remove this one"))  # fmt: skip
            elif cabled and len(peers) > 1:
                out.append(Finding(RULE, field, ip, f"{net} is shared with {', '.join(peers)}: with topology "
                                   f"{cfg.topology} a cable joins exactly two nodes, so this address cannot say which "
                                   "peer it reaches", f"give each cable its own /{p} subnet, as Pulumi.tp3.yaml does "
                                   "(10.0.22.0/24 for spark1-spark2, 10.0.23.0/24 for spark1-spark3)"))  # fmt: skip
    return out
