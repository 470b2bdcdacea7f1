"""A DGX Spark's fabric as files, for tests: /sys/class/infiniband laid out as on a Spark, and a
`python3` for PATH that runs the real programs/rails.py (fed on stdin, as preflight feeds it) against
that tree and a given set of interface addresses instead of this machine's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

RAILS = Path(__file__).resolve().parents[1] / "programs" / "rails.py"

# A Spark with port 1 cabled: its twins rocep1s0f1 (0000:01:00.1) and roceP2p1s0f1 (0002:01:00.1);
# port 0 (rocep1s0f0 / roceP2p1s0f0) not cabled.
IFACES = {"enP7s7": "10.0.0.1/24", "enp1s0f1np1": "10.0.22.1/24", "enP2p1s0f1np1": "10.0.122.1/24"}
DEVICES = [
    ("rocep1s0f1", "0000:01:00.1", "enp1s0f1np1", "ACTIVE"),
    ("roceP2p1s0f1", "0002:01:00.1", "enP2p1s0f1np1", "ACTIVE"),
    ("rocep1s0f0", "0000:01:00.0", "enp1s0f0np0", "DOWN"),
    ("roceP2p1s0f0", "0002:01:00.0", "enP2p1s0f0np0", "DOWN"),
]
STATE = {"ACTIVE": ("4: ACTIVE", "5: LinkUp"), "DOWN": ("1: DOWN", "3: Disabled")}


def _ipv4_gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def make_sysfs(tmp_path, devices=DEVICES, ifaces=IFACES, gid_at=None):
    """/sys/class/infiniband as on a Spark: device -> the PCI function, device/net/<netdev>, port 1's
    state and GID table (0/1 link-local v1/v2, then the IPv4 v1/v2 GIDs: index 3 is RoCE v2)."""
    root, pci = tmp_path / "infiniband", tmp_path / "devices"
    for hca, address, netdev, state in devices:
        (pci / address / "net" / netdev).mkdir(parents=True)
        port = root / hca / "ports" / "1"
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / sub).mkdir(parents=True)
        os.symlink(pci / address, root / hca / "device")
        (port / "state").write_text(STATE[state][0] + "\n")
        (port / "phys_state").write_text(STATE[state][1] + "\n")
        table = [("fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"),
                 ("fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2")]  # fmt: skip
        ip = ifaces.get(netdev, "").split("/")[0]
        if ip and state == "ACTIVE":
            table += [(_ipv4_gid(ip), "IB/RoCE v1"), (_ipv4_gid(ip), "RoCE v2")]
        start = (gid_at or {}).get(hca, 0)
        for i, (gid, kind) in enumerate(table):
            index = i if i < 2 else i + start
            (port / "gids" / str(index)).write_text(gid + "\n")
            (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
            (port / "gid_attrs" / "ndevs" / str(index)).write_text(netdev + "\n")
    return str(root)




FAKE_PYTHON = """#!{python}
import json, os, sys
prog = sys.stdin.read() if sys.argv[1:2] == ["-"] else None
if prog != open({rails!r}).read():  # anything but the fabric program: the real interpreter
    if prog is None:
        os.execv({python!r}, [{python!r}, *sys.argv[1:]])
    sys.argv = sys.argv[1:]
    exec(compile(prog, "<stdin>", "exec"), {{"__name__": "__main__"}})
    sys.exit(0)
ns = {{"__name__": "rails_under_test"}}
exec(compile(prog, "rails.py", "exec"), ns)
ns["SYSFS"], ns["NET"] = os.environ["FAKE_SYSFS"], os.environ["FAKE_NET"]
ns["interfaces"] = lambda: json.loads(os.environ["FAKE_IFACES"])
sys.exit(ns["main"](sys.argv[2:]))
"""


def spark_ifaces(n: int) -> dict[str, str]:
    """spark<n> of the example stacks: host 10.0.0.n on enP7s7, fabricIp 10.0.22.n, its twin 10.0.122.n."""
    return {"enP7s7": f"10.0.0.{n}/24", "enp1s0f1np1": f"10.0.22.{n}/24", "enP2p1s0f1np1": f"10.0.122.{n}/24"}


def install(tmp_path, bin_dir, ifaces=IFACES, devices=DEVICES, mtu=9000, gid_at=None) -> dict:
    """A fake Spark fabric under tmp_path and `python3` in bin_dir; returns the env its scripts need."""
    root = str(tmp_path / "infiniband")
    if not os.path.isdir(root):
        root = make_sysfs(tmp_path, devices, ifaces, gid_at)
    net = tmp_path / "net"
    for netdev in ifaces:
        (net / netdev).mkdir(parents=True, exist_ok=True)
        (net / netdev / "mtu").write_text(f"{mtu}\n")
    py = bin_dir / "python3"
    py.write_text(FAKE_PYTHON.format(python=sys.executable, rails=str(RAILS)))
    py.chmod(0o755)
    return {"FAKE_SYSFS": root, "FAKE_NET": str(net), "FAKE_IFACES": json.dumps(ifaces)}
