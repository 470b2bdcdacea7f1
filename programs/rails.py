"""The node's ConnectX-7 data plane as NCCL will use it: its rails (RoCE devices), their GIDs, the
socket interface; and, for preflight, the link checks (speed, MTU, no-fragment pings to peers).

A DGX Spark's cabled QSFP port shows up as two twin netdevs and two RoCE devices, one per PCI
domain (0000:01:00.1 and 0002:01:00.1: enp1s0f1np1/rocep1s0f1 and enP2p1s0f1np1/roceP2p1s0f1),
each good for ~100 Gb/s: NCCL must use both. Starting from the interface that holds the node's
fabric IP, the rails are the RoCE devices of that PCI bus/device/function in every domain, i.e.
both twins of the port. `fabric.ibHca` pins them instead.

Runs on the node (preflight: `--format check`) and in every rank container (its entrypoint:
`--format env`, sh assignments it evals), from stdin, with the standard library only. It reads
sysfs (`/sys/class/infiniband`, `/sys/class/net`) and each interface's IPv4 address (ioctl);
preflight also runs `ethtool` and `ping`. Nothing is changed on the node.

    python3 - --fabric-ip 10.0.0.1 --bootstrap-ip 10.0.0.1 --format env [--sysfs DIR]
            (pinned NCCL_IB_HCA / NCCL_SOCKET_IFNAME / NCCL_IB_GID_INDEX, and DSPARK_LINK_IPS, are read
            from the environment)
    python3 - ... --format check --node spark1 --speed-mbps 200000 --mtu 9000 --peer spark2=10.0.0.2
    python3 - ... --format links    (each rail's state and negotiated speed, JSON: the guard serves them as metrics)
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import json
import os
import re
import shlex
import socket
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

SYSFS = "/sys/class/infiniband"
NET = "/sys/class/net"
SIOCGIFADDR, SIOCGIFNETMASK = 0x8915, 0x891B
REPORT_PREFIX = "deepseek-spark fabric:"
# preflight's check names, each reported `ok` or `FAIL` (dspark lists them from here)
CHECKS = ("fabric-ip", "fabric-rails", "fabric-gid", "fabric-bootstrap", "fabric-link", "fabric-link-speed",
          "fabric-mtu", "fabric-peer")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _ioctl_ip(sock: socket.socket, name: str, request: int) -> str | None:
    try:
        packed = fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None
    return socket.inet_ntoa(packed[20:24])


def interfaces() -> dict[str, str]:
    """Interface name -> its (primary) IPv4 address as address/prefix, for interfaces that have one."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            ip, mask = _ioctl_ip(s, name, SIOCGIFADDR), _ioctl_ip(s, name, SIOCGIFNETMASK)
            if ip:
                out[name] = str(ipaddress.IPv4Interface(f"{ip}/{mask or '255.255.255.255'}"))
    return out


def _state(text: str) -> str:
    """sysfs port state '4: ACTIVE' -> 'ACTIVE'."""
    return text.split(":", 1)[-1].strip() if text else "MISSING"


def devices(root: str = SYSFS) -> list[dict]:
    """Every RoCE/IB device in sysfs: name, PCI address, netdevs, port 1 state and its GID table."""
    out = []
    for hca in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        port = os.path.join(root, hca, "ports", "1")
        if not os.path.isdir(port):
            continue
        dev = os.path.join(root, hca, "device")
        gids = []
        gid_dir = os.path.join(port, "gids")
        for index in sorted(os.listdir(gid_dir), key=lambda s: int(s) if s.isdigit() else 1 << 30) \
                if os.path.isdir(gid_dir) else []:  # fmt: skip
            value = _read(os.path.join(gid_dir, index))
            if not value or set(value) <= {"0", ":"}:
                continue
            gids.append({"index": int(index), "gid": value,
                         "type": _read(os.path.join(port, "gid_attrs", "types", index)),
                         "ndev": _read(os.path.join(port, "gid_attrs", "ndevs", index))})  # fmt: skip
        net = os.path.join(dev, "net")
        out.append({
            "hca": hca,
            "pci": os.path.basename(os.path.realpath(dev)),
            "netdevs": sorted(os.listdir(net)) if os.path.isdir(net) else [],
            "state": _state(_read(os.path.join(port, "state"))),
            "phys_state": _state(_read(os.path.join(port, "phys_state"))),
            "gids": gids,
        })  # fmt: skip
    return out


def ipv4_gid(gid: str) -> str | None:
    """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
    parts = gid.lower().split(":")
    if len(parts) != 8 or any(int(p, 16) for p in parts[:5]) or parts[5] != "ffff":
        return None
    raw = bytes.fromhex(parts[6].rjust(4, "0") + parts[7].rjust(4, "0"))
    return socket.inet_ntoa(raw)


def v2_gid(dev: dict, ip: str | None) -> dict | None:
    """The device's RoCE v2 GID of `ip` (or of any IPv4 address when `ip` is None)."""
    for g in dev["gids"]:
        mapped = ipv4_gid(g["gid"])
        if "v2" in g["type"].lower() and mapped and (ip is None or mapped == ip):
            return g
    return None


def _twin_key(pci: str) -> str:
    """0002:01:00.1 -> 01:00.1: twins differ only in the PCI domain."""
    return pci.split(":", 1)[1] if pci.count(":") >= 2 else pci


def _matches(name: str, patterns: str) -> bool:
    """NCCL's list matching for NCCL_IB_HCA: comma list, optional :port, prefix unless '=' (exact),
    '^' excludes."""
    exclude, exact = patterns.startswith("^"), False
    patterns = patterns.lstrip("^")
    if patterns.startswith("="):
        exact, patterns = True, patterns[1:]
    hit = any((name == p.split(":")[0]) if exact else name.startswith(p.split(":")[0])
              for p in patterns.split(",") if p)  # fmt: skip
    return hit != exclude


def discover(fabric_ip: str, bootstrap_ip: str, hca: str | None = None, ifname: str | None = None,
             gid_index: int | None = None, root: str = SYSFS, ifaces: dict[str, str] | None = None,
             link_ips: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """What NCCL gets on this node, and every problem found (check, message). `link_ips`: the node's
    other data-plane addresses (a triangle's second link): their ports' twins are rails too."""
    ifaces = interfaces() if ifaces is None else ifaces
    by_ip = {v.split("/")[0]: k for k, v in ifaces.items()}
    devs = devices(root)
    problems: list[tuple[str, str]] = []
    homes: dict[str, dict] = {}  # data-plane address -> the RoCE device whose netdev holds it
    for label, ip in [("fabricIp", fabric_ip), *(("linkIps", x) for x in link_ips)]:
        netdev = by_ip.get(ip)
        home = next((d for d in devs if netdev and netdev in d["netdevs"]), None)
        if netdev is None:
            problems.append(("ip", f"{label} {ip} is on no interface of this node; set the node's {label} to "
                                          "its ConnectX-7 address (ibdev2netdev lists the ports and their netdevs)"))
        elif home is None:
            problems.append(("ip", f"{label} {ip} is on {netdev}, which is not a ConnectX-7 interface (no RoCE "
                                          "device has it): NCCL, dist-init and the checkpoint would cross that link; set "
                                          f"the node's {label} to its address on the cabled ConnectX-7 port"))
        else:
            homes[ip] = home
    netdev = by_ip.get(fabric_ip)
    ports: dict[str, list[str]] = {}  # data-plane address -> the rails of its port (both twins)
    if hca:
        rails = [d for d in devs if _matches(d["hca"], hca)]
        if not rails:
            problems.append(("rails", f"fabric.ibHca {hca} names no RoCE device of this node (it has "
                                      f"{', '.join(d['hca'] for d in devs) or 'none'}); fix fabric.ibHca or unset it"))
        ports = {ip: [d["hca"] for d in rails] for ip in homes}
    else:
        rails = []
        for ip, home in homes.items():
            twins = sorted((d for d in devs if _twin_key(d["pci"]) == _twin_key(home["pci"])), key=lambda d: d["pci"])
            ports[ip] = [d["hca"] for d in twins]
            rails += [d for d in twins if d not in rails]
    seeds = {id(h) for h in homes.values()}
    for d in rails:
        if d["state"] != "ACTIVE":
            home = next((h for h in homes.values() if _twin_key(h["pci"]) == _twin_key(d["pci"])), None)
            twin = "" if hca or id(d) in seeds or home is None else f", twin of {home['hca']} on the cabled port,"
            problems.append(("rails", f"{d['hca']} ({', '.join(d['netdevs']) or 'no netdev'}){twin} is {d['state']} "
                                      f"(physical {d['phys_state']}): NCCL would run without it "
                                      f"({'half the port' if twin else 'a pinned rail'}); bring "
                                      f"{', '.join(d['netdevs']) or 'its netdev'} up with an IPv4 address on its link "
                                      "(netplan: both twins) and check the cable and switch port"))
    active = [d for d in rails if d["state"] == "ACTIVE"]
    gids = {}
    for d in active:
        own = ifaces.get(d["netdevs"][0], "").split("/")[0] if d["netdevs"] else ""
        g = v2_gid(d, own or None)
        if g is None:
            problems.append(("gid", f"{d['hca']} has no RoCE v2 GID for "
                                    f"{'its address ' + own if own else 'an IPv4 address'}: NCCL cannot reach peers over "
                                    "it; give its netdev an IPv4 address (the GID table follows the addresses)"))
        elif gid_index is not None and not any(x["index"] == gid_index and "v2" in x["type"].lower()
                                               and ipv4_gid(x["gid"]) for x in d["gids"]):  # fmt: skip
            problems.append(("gid", f"fabric.gidIndex {gid_index} is not a RoCE v2 IPv4 GID on {d['hca']} (that is "
                                    f"index {g['index']}); unset fabric.gidIndex to look it up at every start"))
        else:
            gids[d["hca"]] = g
    indices = {g["index"] for g in gids.values()}
    socket_if = ifname or by_ip.get(bootstrap_ip)
    if ifname is None and socket_if is None and bootstrap_ip != fabric_ip:  # (the fabricIp is reported above)
        problems.append(("bootstrap", f"the bootstrap address {bootstrap_ip} is on no interface of this node; check "
                                      "fabric.bootstrap and the node's fabricIp/host"))
    elif ifname and not any(n.startswith(p.lstrip("^=")) for n in ifaces for p in ifname.split(",")):
        problems.append(("bootstrap", f"fabric.socketIfname {ifname} matches no interface with an IPv4 address "
                                      f"({', '.join(sorted(ifaces))}); fix it or unset it"))
    return {
        "fabric_ip": fabric_ip,
        "fabric_netdev": netdev,
        "rails": [{"hca": d["hca"], "netdev": (d["netdevs"] or [""])[0], "pci": d["pci"], "state": d["state"],
                   "ip": ifaces.get((d["netdevs"] or [""])[0], "").split("/")[0],
                   "gid_index": gids[d["hca"]]["index"] if d["hca"] in gids else None} for d in rails],  # fmt: skip
        "hca": ",".join(d["hca"] for d in active),
        "ports": ports,
        "socket_ifname": socket_if,
        # one index for every rail, or none: NCCL then picks each device's RoCE v2 IPv4 GID itself
        "gid_index": gid_index if gid_index is not None else (indices.pop() if len(indices) == 1 else None),
        "problems": problems,
    }


def env_lines(found: dict, pinned: dict) -> list[str]:
    """sh assignments for what is not pinned in the rank's env already."""
    values = {"NCCL_IB_HCA": found["hca"]}
    if found["socket_ifname"]:
        values.update(NCCL_SOCKET_IFNAME=found["socket_ifname"], GLOO_SOCKET_IFNAME=found["socket_ifname"],
                      TP_SOCKET_IFNAME=found["socket_ifname"])  # fmt: skip
    if found["gid_index"] is not None:
        values["NCCL_IB_GID_INDEX"] = str(found["gid_index"])
    return [f"export {k}={shlex.quote(v)}" for k, v in values.items() if not pinned.get(k)]


def _ethtool_speed(netdev: str) -> tuple[bool, str]:
    """(link detected, speed text) from `ethtool NETDEV`."""
    try:
        out = subprocess.run(["ethtool", netdev], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False, "unknown (ethtool failed)"
    speed = re.search(r"Speed:\s*(\S+)", out)
    return "Link detected: yes" in out, speed.group(1) if speed else "unknown"


def _ping(ip: str, size: int) -> bool:
    try:
        return subprocess.run(["ping", "-M", "do", "-s", str(size), "-c", "2", "-i", "0.2", "-W", "2", "-q", ip],
                              capture_output=True, timeout=15).returncode == 0  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False


def host_checks(found: dict, speed_mbps: int, mtu: int, peers: list[tuple[str, str]], net: str | None = None) -> list:
    """Preflight's link checks on the rails NCCL will use: negotiated speed, MTU, and a no-fragment
    ping at that MTU to every peer address this node shares a link with."""
    problems, net = [], net or NET
    for r in found["rails"]:
        if r["state"] != "ACTIVE" or not r["netdev"]:
            continue
        link, speed = _ethtool_speed(r["netdev"])
        rate = int(speed[:-4]) if speed.endswith("Mb/s") and speed[:-4].isdigit() else 0
        if not link:
            problems.append(("link", f"{r['netdev']} ({r['hca']}) has no carrier; check its cable and the switch port"))
        elif rate < speed_mbps:
            problems.append(("link-speed", f"{r['netdev']} ({r['hca']}) negotiated {speed}, fabric.linkSpeedMbps is "
                                           f"{speed_mbps} (a port left at 100G halves the fabric); on a switch, set "
                                           "the port to 200G with autonegotiation off; direct, check the cable is a "
                                           "200G QSFP112 DAC/AOC"))
        have = _read(os.path.join(net, r["netdev"], "mtu"))
        if have != str(mtu):
            problems.append(("mtu", f"{r['netdev']} ({r['hca']}) has MTU {have or 'unknown'}, fabric.mtu is {mtu}; "
                                    f"set mtu: {mtu} on both twins in netplan (and on the switch ports), or set "
                                    f"fabric.mtu to what every node and switch port uses"))
    with ThreadPoolExecutor(max_workers=max(1, len(peers))) as pool:  # every peer at once: 7 on an 8-node switch
        answered = list(pool.map(lambda peer: _ping(peer[1], mtu - 28) or _ping(peer[1], 1472) and "1500", peers))
    for (name, ip), ok in zip(peers, answered):
        if ok is not True:
            fits = ok == "1500"
            problems.append(("peer", f"{name} {ip} does not answer a no-fragment ping of {mtu} bytes"
                                     + (" (1500 bytes pass): an MTU mismatch on the path; give every node's twins and "
                                        f"the switch ports MTU {mtu}" if fits else
                                        ": no route over the data plane; check the link, its addresses and "
                                        "`ip route get " + ip + "` on this node")))  # fmt: skip
    return problems


def link_states(found: dict) -> list[dict]:
    """Each rail NCCL uses as a metric reads it (the guard serves these): its device state and negotiated speed
    (ethtool, as preflight reads it; 0 when unknown)."""
    out = []
    for r in found["rails"]:
        link, speed = _ethtool_speed(r["netdev"]) if r["netdev"] else (False, "")
        rate = int(speed[:-4]) if speed.endswith("Mb/s") and speed[:-4].isdigit() else 0
        out.append({"hca": r["hca"], "netdev": r["netdev"], "up": r["state"] == "ACTIVE" and link, "speed_mbps": rate})
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rails", description=__doc__.split("\n\n")[0])
    p.add_argument("--fabric-ip", required=True)
    p.add_argument("--bootstrap-ip", required=True)
    p.add_argument("--link-ip", action="append", default=[], help="another data-plane address (linkIps)")
    p.add_argument("--hca", default=None)
    p.add_argument("--ifname", default=None)
    p.add_argument("--gid-index", type=int, default=None)
    p.add_argument("--sysfs", default=SYSFS)
    p.add_argument("--format", choices=["env", "check", "json", "links"], default="env",
                   help="links: each rail's state and speed as JSON (the guard's metrics)")
    p.add_argument("--node", default="")
    p.add_argument("--speed-mbps", type=int, default=0)
    p.add_argument("--mtu", type=int, default=0)
    p.add_argument("--peer", action="append", default=[], help="NAME=IP, a peer address on a shared link")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.format == "env":  # in a rank container: what the fabric section pinned is in the rank's env
        env = os.environ
        a.hca = a.hca or env.get("NCCL_IB_HCA") or None
        a.ifname = a.ifname or env.get("NCCL_SOCKET_IFNAME") or None
        pinned_gid = env.get("NCCL_IB_GID_INDEX", "")
        a.gid_index = a.gid_index if a.gid_index is not None else (int(pinned_gid) if pinned_gid.isdigit() else None)
        a.link_ip = a.link_ip or [x for x in env.get("DSPARK_LINK_IPS", "").split(",") if x]
    found = discover(a.fabric_ip, a.bootstrap_ip, a.hca, a.ifname, a.gid_index, a.sysfs, link_ips=tuple(a.link_ip))
    if a.format == "json":
        print(json.dumps(found))
        return 1 if found["problems"] else 0
    if a.format == "links":
        print(json.dumps(link_states(found)))
        return 0
    if a.format == "env":
        for check, message in found["problems"]:
            print(f"deepseek-spark fabric: FAIL {check}: {message}", file=sys.stderr)
        if found["problems"]:
            return 1
        print("\n".join(env_lines(found, dict(os.environ))))
        return 0
    peers = [tuple(x.split("=", 1)) for x in a.peer]
    problems = found["problems"] + host_checks(found, a.speed_mbps, a.mtu, peers)
    failed = {c for c, _ in problems}
    for check, message in problems:
        print(f"preflight {a.node}: FAIL fabric-{check}: {message}", file=sys.stderr)
    for check in CHECKS:
        if check.removeprefix("fabric-") not in failed:
            print(f"preflight {a.node}: ok {check}")
    report = {k: found[k] for k in ("fabric_netdev", "rails", "ports", "hca", "socket_ifname", "gid_index")}
    print(f"{REPORT_PREFIX} {json.dumps(report, sort_keys=True)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
