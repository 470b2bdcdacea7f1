"""The cluster's two planes, from the config alone: which address carries what.

- control plane: each node's `host` (ssh, Pulumi, the API clients call);
- data plane: its ConnectX-7 addresses, `fabricIp` plus `linkIps` (a node with more than one direct
  link, e.g. a triangle). NCCL, dist-init, Ray, the NFS checkpoint and the bandwidth gate use it.

Two nodes share a link when they have data-plane addresses in one subnet (fabric.prefixLength);
that link is what NFS and the bandwidth gate use between them. The bootstrap address (dist-init,
Ray, SGLANG_HOST_IP/VLLM_HOST_IP, the socket interfaces) is the fabricIp, or, with
`fabric.bootstrap: management` (a triangle, where no data-plane address reaches every peer), the
host: a reviewed choice, never a fallback.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from declared.cluster import ClusterConfig, NodeConfig
from programs.fabricgate import REPORT_PREFIX

# What reading the checkpoint at boot costs, by path (GB/s one rank sustains; planning figures,
# inferred: 10 GbE ~1.1 GB/s shared by every worker, ConnectX-7 NFS over RDMA-less TCP ~5 GB/s per
# client with nconnect=8, a Spark's NVMe ~6 GB/s).
READ_GBPS = {"nvme": 6.0, "nfs-fabric": 5.0, "nfs-management": 1.1}


# Runs on the node (preflight) and in every rank container (its entrypoint), from a quoted heredoc.
RAILS_PROGRAM = (Path(__file__).resolve().parents[1] / "programs" / "rails.py").read_text()
RAILS_EOF = "DSPARK_RAILS"


def heredoc(args: list[str], then: str = "") -> str:
    """`python3 - ARGS` with programs/rails.py in a quoted heredoc; `then`: the rest of its command line."""
    assert f"\n{RAILS_EOF}\n" not in RAILS_PROGRAM
    return f"python3 - {' '.join(shlex.quote(a) for a in args)} <<'{RAILS_EOF}'{then}\n{RAILS_PROGRAM}{RAILS_EOF}"


def rails_args(cfg: ClusterConfig, rank: int) -> list[str]:
    """programs/rails.py's arguments for node `rank` (the pinned values, when the fabric section pins them)."""
    f = cfg.fabric
    args = ["--fabric-ip", cfg.nodes[rank].fabric_ip, "--bootstrap-ip", bootstrap_ip(cfg, rank)]
    args += [f"--link-ip={ip}" for ip in cfg.nodes[rank].link_ips]
    args += ["--hca", f.ib_hca] if f.ib_hca else []
    args += ["--ifname", f.socket_ifname] if f.socket_ifname else []
    args += ["--gid-index", str(f.gid_index)] if f.gid_index is not None else []
    return args


@dataclass(frozen=True)
class Link:
    a: int  # node index
    b: int
    a_ip: str
    b_ip: str
    subnet: str


def addresses(node: NodeConfig) -> list[str]:
    return [node.fabric_ip, *node.link_ips]


def _net(ip: str, prefix: int) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    except ValueError:
        return None


def link(cfg: ClusterConfig, a: int, b: int) -> Link | None:
    """The data-plane link nodes a and b share: their first addresses in one subnet."""
    p = cfg.fabric.prefix_length
    for ip_a in addresses(cfg.nodes[a]):
        for ip_b in addresses(cfg.nodes[b]):
            na = _net(ip_a, p)
            if na is not None and na == _net(ip_b, p):
                return Link(a, b, ip_a, ip_b, str(na))
    return None


def links(cfg: ClusterConfig) -> list[Link]:
    """Every pair of nodes that shares a link: the pairs NCCL traffic runs between (a ring's
    neighbours; every pair on a switch or in a triangle)."""
    return [lk for a, b in combinations(range(len(cfg.nodes)), 2) if (lk := link(cfg, a, b)) is not None]


def peers(cfg: ClusterConfig, rank: int) -> list[tuple[str, str]]:
    """(peer name, peer address on the link with `rank`) for every peer `rank` shares a link with."""
    out = []
    for lk in links(cfg):
        if rank in (lk.a, lk.b):
            other, ip = (lk.b, lk.b_ip) if lk.a == rank else (lk.a, lk.a_ip)
            out.append((cfg.nodes[other].name, ip))
    return out


def bootstrap_ip(cfg: ClusterConfig, rank: int) -> str:
    node = cfg.nodes[rank]
    return node.host if cfg.fabric.bootstrap == "management" else node.fabric_ip


def nfs_link(cfg: ClusterConfig, rank: int) -> tuple[str, str, str]:
    """(head's server address, this worker's client address, what carries it) for worker `rank`: the
    link the two share (or nfsServerIp); an address that is the head's host is the management plane."""
    head, node = cfg.nodes[0], cfg.nodes[rank]
    lk = link(cfg, 0, rank)
    if node.nfs_server_ip and (lk is None or lk.a_ip != node.nfs_server_ip):
        return node.nfs_server_ip, node.host, "management" if node.nfs_server_ip == head.host else "unknown"
    if lk is None:
        return head.fabric_ip, node.fabric_ip, "unknown (no shared link)"
    return lk.a_ip, lk.b_ip, "management" if lk.a_ip == head.host else f"ConnectX-7 {lk.subnet}"


def checkpoint_path(cfg: ClusterConfig, rank: int) -> dict:
    """How the checkpoint reaches rank `rank` at boot, and what reading it costs (the model above)."""
    if rank > 0 and cfg.share.mode == "local" and cfg.model.source == "download":
        lk = link(cfg, 0, rank)
        how, key = f"local disk, copied once per revision from {cfg.nodes[0].name}'s download (rsync)", "nvme"
        via = f"ConnectX-7 {lk.subnet}" if lk else "unknown (no shared link)"
    elif rank == 0 or cfg.share.mode == "local":
        how, via, key = "local disk", "", "nvme"
    else:
        server, client, via = nfs_link(cfg, rank)
        how = f"NFS from {cfg.nodes[0].name} {server} to {client}"
        key = "nfs-fabric" if via.startswith("ConnectX-7") else "nfs-management"
    return {"how": how, "via": via, "read_gbps": READ_GBPS[key], "path": key}


def boot_read_minutes(cfg: ClusterConfig, gib_per_rank: float) -> list[dict]:
    """Modelled time for each rank to read its part of the checkpoint at boot. Workers on NFS over the
    management link share its ~1.1 GB/s: their reads queue behind each other."""
    rows = []
    shared = sum(1 for r in range(1, len(cfg.nodes)) if checkpoint_path(cfg, r)["path"] == "nfs-management")
    for rank in range(len(cfg.nodes)):
        p = checkpoint_path(cfg, rank)
        rate = p["read_gbps"] / (shared if p["path"] == "nfs-management" and shared else 1)
        rows.append({**p, "rank": rank, "node": cfg.nodes[rank].name,
                     "minutes": round(gib_per_rank * 1.073741824 / rate / 60, 1)})  # fmt: skip
    return rows


def summary(cfg: ClusterConfig, gib_per_rank: float) -> str:
    """The planes and the boot read model, printed next to the memory plan."""
    boot = "management (host)" if cfg.fabric.bootstrap == "management" else "ConnectX-7 (fabricIp)"
    lines = [f"fabric: bootstrap over {boot}; links: " + (", ".join(
        f"{cfg.nodes[lk.a].name}<->{cfg.nodes[lk.b].name} {lk.subnet}" for lk in links(cfg)) or "none")]
    for r in boot_read_minutes(cfg, gib_per_rank):
        lines.append(f"  checkpoint to rank {r['rank']} ({r['node']}): {r['how']}"
                     + (f" over {r['via']}" if r['via'] else "")
                     + f", ~{r['minutes']} min for {gib_per_rank:.0f} GiB at {r['read_gbps']:g} GB/s")  # fmt: skip
    return "\n".join(lines)


def gate_report(stdout: str | None) -> dict | None:
    """The fabric gate's figures from its last report line (None when it printed none)."""
    lines = [line for line in (stdout or "").splitlines() if line.startswith(REPORT_PREFIX)]
    return json.loads(lines[-1][len(REPORT_PREFIX):]) if lines else None
