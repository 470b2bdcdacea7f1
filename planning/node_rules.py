"""The rules on a group's nodes and how they are cabled: one rank per node, each node's own name and addresses,
a data plane that joins every pair that exchanges NCCL traffic, a topology the node count can be cabled in, the
read-only checkpoint share and the paths kept apart from it. Registered with the others when planning/rules.py
imports this module (the further ConnectX-7 addresses: planning/link_rules.py).
"""

from __future__ import annotations

import ipaddress
from collections import Counter

from . import fabric, plan
from .rulebook import Finding, rule
from declared.cluster import ClusterConfig
from declared.shapes import read_only_problem


@rule("node-count-equals-tp")
def _node_count(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    n, tp = len(cfg.nodes), cfg.serving.tp_size
    if n != tp:
        return [
            Finding("node-count-equals-tp", "serving.tpSize", tp,
                    f"{n} nodes are listed but each Spark runs exactly one rank",
                    f"set serving.tpSize to {n}, or list {tp} nodes")
        ]  # fmt: skip
    return []


@rule("unique-nodes")
def _unique(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    out = []
    for attr, label in (("name", "name"), ("host", "host"), ("fabric_ip", "fabricIp")):
        counts = Counter(getattr(n, attr) for n in cfg.nodes)
        for i, node in enumerate(cfg.nodes):
            value = getattr(node, attr)
            if counts[value] > 1:
                out.append(Finding("unique-nodes", f"nodes[{i}].{label}", value,
                                   f"{label} is used by {counts[value]} nodes", f"give every node its own {label}"))  # fmt: skip
    return out


@rule("fabric-ip-is-ipv4")
def _fabric_ip(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    out = []
    for i, node in enumerate(cfg.nodes):
        values = [("fabricIp", node.fabric_ip), ("nfsServerIp", node.nfs_server_ip),
                  *((f"linkIps[{k}]", ip) for k, ip in enumerate(node.link_ips))]  # fmt: skip
        if cfg.fabric.bootstrap == "management":
            values.append(("host", node.host))
        for label, value in values:
            if value is None:
                continue
            try:
                ip = ipaddress.IPv4Address(value)
                bad = ip.is_loopback or ip.is_unspecified or ip.is_multicast
            except ValueError:
                bad = True
            if bad:
                what = ("with fabric.bootstrap: management, dist-init, Ray and NCCL's bootstrap bind the host"
                        if label == "host" else "NCCL, dist-init and NFS use it")  # fmt: skip
                out.append(Finding("fabric-ip-is-ipv4", f"nodes[{i}].{label}", value,
                                   f"not a routable IPv4 address ({what})",
                                   "use the node's IPv4 address, e.g. 10.0.0.2"))  # fmt: skip
    return out


def _subnet(ip: str, prefix: int) -> str | None:
    try:
        return str(ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False))
    except ValueError:
        return None


@rule("fabric-planes")
def _planes(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    """The data plane is complete and apart from the control plane: every pair that exchanges NCCL
    traffic shares a ConnectX-7 link, one bootstrap address per node reaches every peer, and NFS
    uses a link the head and the worker share."""
    out, nodes, p = [], cfg.nodes, cfg.fabric.prefix_length
    n = len(nodes)
    if n < 2:
        return out
    need = [(i, (i + 1) % n) for i in range(n)] if cfg.topology == "ring" else \
        [(a, b) for a in range(n) for b in range(a + 1, n)]  # fmt: skip
    for a, b in sorted({tuple(sorted(x)) for x in need}):
        if fabric.link(cfg, a, b) is None:
            out.append(Finding("fabric-planes", f"nodes[{b}].fabricIp", nodes[b].fabric_ip,
                               f"{nodes[a].name} and {nodes[b].name} have no data-plane addresses in one /{p} subnet, so "
                               "NCCL traffic between them has no ConnectX-7 link",
                               f"give each its address on their link ({'linkIps' if cfg.topology == 'direct' else 'fabricIp'}), "
                               "or cable both to the RoCE switch"))  # fmt: skip
    subnets = {_subnet(x.fabric_ip, p) for x in nodes}
    if cfg.fabric.bootstrap == "fabric" and len(subnets) > 1:
        out.append(Finding("fabric-planes", "fabric.bootstrap", "fabric",
                           f"the fabricIps are on {len(subnets)} /{p} subnets ({', '.join(sorted(map(str, subnets)))}): "
                           "dist-init, Ray and NCCL's bootstrap need one address per node that every peer reaches",
                           "set fabric.bootstrap: management for a triangle or ring (bootstrap over the hosts, as the "
                           "reference does; NCCL still moves data over ConnectX-7), or put every fabricIp on one switch "
                           "subnet"))  # fmt: skip
    for i, node in enumerate(nodes):
        if node.host == node.fabric_ip:
            out.append(Finding("fabric-planes", f"nodes[{i}].fabricIp", node.fabric_ip,
                               "equals the node's host: control and data plane on one address. If that is the 10 GbE "
                               "management link, NCCL, dist-init and the checkpoint would cross it (preflight fails "
                               "when the address is not on ConnectX-7)",
                               "set fabricIp to the node's address on its cabled ConnectX-7 port", "warning"))  # fmt: skip
        if i and node.nfs_server_ip and cfg.share.mode == "nfs":
            lk = fabric.link(cfg, 0, i)
            if lk is None or lk.a_ip != node.nfs_server_ip:
                out.append(Finding("fabric-planes", f"nodes[{i}].nfsServerIp", node.nfs_server_ip,
                                   f"is not the head's address on its link with {node.name} (the export lists "
                                   f"{node.name}'s address on that link, so the mount would be refused)",
                                   f"remove it (default: {lk.a_ip if lk else 'the shared link'}) or use the head's "
                                   "fabricIp/linkIps address that shares a subnet with this worker"))  # fmt: skip
    return out


@rule("topology-fits-node-count")
def _topology(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    n = len(cfg.nodes)
    if cfg.topology == "direct" and n > 3:
        return [Finding("topology-fits-node-count", "topology", "direct",
                        f"{n} Sparks cannot all be cabled to each other (a triangle is the largest direct mesh)",
                        "use topology: switch (RoCE switch) or topology: ring (NCCL ring mode, 4 nodes)")]  # fmt: skip
    if cfg.topology == "ring" and n != 4:
        return [Finding("topology-fits-node-count", "topology", "ring",
                        f"NCCL ring mode is for exactly 4 Sparks, {n} are listed",
                        "use topology: direct for 2-3 nodes, or switch")]  # fmt: skip
    return []


@rule("nfs-share-read-only")
def _nfs_ro(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    out = []
    for field, opts, fix in (
        ("share.exportOptions", cfg.share.export_options, "[ro, sync, no_subtree_check, no_root_squash, insecure]"),
        ("share.mountOptions", cfg.share.mount_options, "keep ro: [nfsvers=4.2, ro, nconnect=8, hard, timeo=600]"),
    ):
        problem = read_only_problem(opts)
        if problem:
            out.append(Finding("nfs-share-read-only", field, opts, problem, fix))
    return out


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


@rule("paths-apart-from-checkpoint")
def _paths(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    """stateDir (the API key file) and engram.dir never inside or above checkpointDir: inside, they are
    exported over NFS and mounted into every rank; above, the checkpoint sits inside them."""
    ckpt = cfg.model.checkpoint_dir
    out = []
    for field, path in (("stateDir", plan.state_dir(cfg)), ("engram.dir", cfg.engram.dir if cfg.engram else None)):
        if path is None:
            continue
        if _within(path, ckpt) or _within(ckpt, path):
            where = "inside" if _within(path, ckpt) else "above"
            out.append(Finding("paths-apart-from-checkpoint", field, path,
                               f"is {where} model.checkpointDir {ckpt!r}, which is shared with every rank (and over NFS)",
                               "use a directory outside the checkpoint tree, e.g. /var/lib/deepseek-spark or /data/engram"))  # fmt: skip
    return out


@rule("ring-needs-nccl-overlay-warning")
def _ring(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    if cfg.topology != "ring":
        return []
    return [Finding("ring-needs-nccl-overlay-warning", "topology", "ring",
                    "switchless ring mode sets NCCL_ALGO=Ring and the ring env, but the reference also needs an "
                    "NCCL build with SWITCHLESS_RING_ONLY inside the image",
                    "use an image that ships that NCCL, or a RoCE switch (topology: switch)", level="warning")]  # fmt: skip
