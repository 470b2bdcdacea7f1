"""SIMULATOR STAND-IN: the link model of a dspark-sim node's simulated ConnectX-7 fabric, and what it renders
(stdlib only, pure: no side effects but ``write_tree`` into a plain directory).

* the model (``node_model``, ``with_rail``, ``validate``) that ``sim.cluster`` writes to every node as
  ``/etc/dspark-sim/fabric.json`` and ``sim.faults`` rewrites;
* what the node shows for it: the fake sysfs tree (``sysfs_tree``), ``ethtool`` and ``ibdev2netdev`` output
  (``ethtool_output``, ``ibdev2netdev_output``), which the unit tests call on a temporary sysfs root.

On the host it is ``sim.fabric``; on a node it is ``dspark_sim.fabric`` (same bytes, in the node image's
``/usr/lib/python3/dist-packages``), imported by ``sim.fabric_node``, which applies the model there as
``/usr/local/sbin/sim-fabric``.

Model (``/etc/dspark-sim/fabric.json``)::

    {"node": "spark1",
     "management": {"netdev": "enP7s7", "ip": "172.30.99.11", "prefix": 24, "speed_mbps": 10000},
     "rails": [{"hca": "rocep1s0f1", "netdev": "enp1s0f1np1", "pci": "0000:01:00.1", "ip": "10.99.1.11",
                "prefix": 24, "state": "ACTIVE", "speed_mbps": 200000, "gbps": 93.5, "mtu": 9000,
                "gid_index": 3}, ...]}

``gbps`` is what one rail carries (read by the ``ib_write_bw`` stand-in); ``gid_index`` is where the
IPv4-mapped RoCE v2 GID sits (3 on a Spark without extra addresses; 5, 7, ... put IPv6 GID pairs first).
"""
from __future__ import annotations

import copy
import ipaddress
import json
import os

MODEL_PATH = "/etc/dspark-sim/fabric.json"
STATE_DIR = "/run/dspark-sim"
READY = STATE_DIR + "/fabric.ok"   # written by `sim-fabric boot` when done
LOG = "/var/log/sim-fabric.log"

MGMT_NETDEV = "enP7s7"
MGMT_SPEED_MBPS = 10000
# the cabled QSFP port of a Spark's ConnectX-7: two twins (one per PCI domain), rail A and rail B
RAILS = (
    {"hca": "rocep1s0f1", "netdev": "enp1s0f1np1", "pci": "0000:01:00.1"},
    {"hca": "roceP2p1s0f1", "netdev": "enP2p1s0f1np1", "pci": "0002:01:00.1"},
)
RAIL_DEFAULTS = {"state": "ACTIVE", "speed_mbps": 200000, "gbps": 93.5, "mtu": 9000, "gid_index": 3}
STATES = ("ACTIVE", "DOWN")
MTU_RANGE = (68, 9978)         # ConnectX-7's max MTU is 9978
GID_TABLE_LEN = 255            # mlx5 RoCE GID table length
FW_VER = "28.45.1020"
HCA_TYPE = "MT4129"            # ConnectX-7 (PCI device 0x1021 = 4129)
PCI_VENDOR, PCI_DEVICE = "0x15b3", "0x1021"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


class FabricError(ValueError):
    pass


# ------------------------------------------------------------------------------ the model ----
def node_model(node: str, mgmt_ip: str, rail_ips: list[str], prefix: int = 24) -> dict:
    """The healthy model of one node: management NIC + the two rails with their addresses."""
    if len(rail_ips) != len(RAILS):
        raise FabricError(f"{node}: {len(RAILS)} rail addresses needed, got {rail_ips}")
    rails = [dict(r, ip=ip, prefix=prefix, **RAIL_DEFAULTS) for r, ip in zip(RAILS, rail_ips)]
    m = {"node": node,
         "management": {"netdev": MGMT_NETDEV, "ip": mgmt_ip, "prefix": prefix, "speed_mbps": MGMT_SPEED_MBPS},
         "rails": rails}
    validate(m)
    return m


def validate(m: dict) -> None:
    errors = []
    mg = m.get("management") or {}
    for k in ("netdev", "ip"):
        if not mg.get(k):
            errors.append(f"management.{k} missing")
    rails = m.get("rails") or []
    if not rails:
        errors.append("no rails")
    for r in rails:
        name = r.get("hca", "?")
        for k in ("hca", "netdev", "pci", "ip"):
            if not r.get(k):
                errors.append(f"{name}: {k} missing")
        if r.get("state") not in STATES:
            errors.append(f"{name}: state {r.get('state')!r} not in {STATES}")
        sp = r.get("speed_mbps")
        if not isinstance(sp, int) or isinstance(sp, bool) or sp <= 0:
            errors.append(f"{name}: speed_mbps {sp!r} must be a positive integer (Mb/s)")
        g = r.get("gbps")
        if not isinstance(g, (int, float)) or isinstance(g, bool) or g < 0:
            errors.append(f"{name}: gbps {g!r} must be a number >= 0")
        elif isinstance(sp, int) and g > sp / 1000:
            errors.append(f"{name}: gbps {g} exceeds the link speed {sp / 1000:g} Gb/s")
        mtu = r.get("mtu")
        if not isinstance(mtu, int) or isinstance(mtu, bool) or not MTU_RANGE[0] <= mtu <= MTU_RANGE[1]:
            errors.append(f"{name}: mtu {mtu!r} must be an integer in {MTU_RANGE[0]}..{MTU_RANGE[1]}")
        gi = r.get("gid_index")
        if not isinstance(gi, int) or isinstance(gi, bool) or gi < 3 or gi % 2 == 0 or gi >= 16:
            errors.append(f"{name}: gid_index {gi!r} must be odd, 3..15 (IPv4 RoCE v1/v2 GIDs at "
                          "gid_index-1/gid_index, after the link-local pair and any IPv6 pairs)")
        try:
            ipaddress.IPv4Address(r.get("ip", ""))
        except ValueError:
            errors.append(f"{name}: ip {r.get('ip')!r} is not an IPv4 address")
    names = [r.get("hca") for r in rails] + [r.get("netdev") for r in rails]
    if len(names) != len(set(names)):
        errors.append(f"duplicate rail names {names}")
    if errors:
        raise FabricError(f"fabric model of {m.get('node', '?')}: " + "; ".join(errors))


def find_rail(m: dict, rail: str) -> dict:
    for r in m.get("rails") or []:
        if rail in (r["hca"], r["netdev"]):
            return r
    names = ", ".join(f"{r['hca']}/{r['netdev']}" for r in m.get("rails") or [])
    raise FabricError(f"{m.get('node', '?')}: no rail {rail!r} (rails: {names})")


def with_rail(m: dict, rail: str, *, state: str | None = None, speed_mbps: int | None = None,
              gbps: float | None = None, mtu: int | None = None, gid_index: int | None = None) -> dict:
    """A copy of model ``m`` with one rail (hca or netdev name) changed; validated."""
    new = copy.deepcopy(m)
    r = find_rail(new, rail)
    if state is not None:
        r["state"] = str(state).upper()
    for k, v in (("speed_mbps", speed_mbps), ("gbps", gbps), ("mtu", mtu), ("gid_index", gid_index)):
        if v is not None:
            r[k] = v
    validate(new)
    return new


def dumps(m: dict) -> str:
    return json.dumps(m, indent=2) + "\n"


# ----------------------------------------------------------------------------- GIDs (pure) ----
def _gid(b: bytes) -> str:
    h = b.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def ipv4_gid(ip: str) -> str:
    """The IPv4-mapped GID (``::ffff:a.b.c.d``) as sysfs prints it."""
    return _gid(bytes(10) + b"\xff\xff" + ipaddress.IPv4Address(ip).packed)


def eui64(mac: str) -> bytes:
    b = bytes(int(x, 16) for x in mac.split(":"))
    return bytes([b[0] ^ 0x02]) + b[1:3] + b"\xff\xfe" + b[3:6]


def link_local_gid(mac: str) -> str:
    return _gid(b"\xfe\x80" + bytes(6) + eui64(mac))


def gid_entries(rail: dict, mac: str) -> dict[int, tuple[str, str]]:
    """Populated GID table entries: index -> (gid, type). 0/1 link-local RoCE v1/v2; IPv6 pairs (when
    gid_index > 3); then the IPv4-mapped v1/v2 pair at gid_index-1/gid_index. A DOWN rail keeps only the
    link-local (MAC-derived) pair: the IPv4 GIDs follow the netdev's address, gone without carrier."""
    ll = link_local_gid(mac)
    out = {0: (ll, "IB/RoCE v1"), 1: (ll, "RoCE v2")}
    if rail["state"] != "ACTIVE":
        return out
    gi = rail["gid_index"]
    for pair, idx in enumerate(range(2, gi - 1, 2)):
        ula = b"\xfd\x00" + bytes(4) + bytes([0, pair + 1]) + eui64(mac)
        out[idx] = (_gid(ula), "IB/RoCE v1")
        out[idx + 1] = (_gid(ula), "RoCE v2")
    v4 = ipv4_gid(rail["ip"])
    out[gi - 1] = (v4, "IB/RoCE v1")
    out[gi] = (v4, "RoCE v2")
    return out


def rate_text(speed_mbps: int) -> str:
    gb = speed_mbps / 1000
    width, kind = (4, "HDR") if speed_mbps >= 200000 else (4, "EDR") if speed_mbps >= 100000 else (4, "QDR")
    return f"{gb:g} Gb/sec ({width}X {kind})"


# ---------------------------------------------------------------------- sysfs tree (pure) ----
class Dir(dict):
    """A directory of the fake tree: merged with a real directory of the same path unless ``replace``."""

    def __init__(self, *a, replace: bool = False, **kw):
        super().__init__(*a, **kw)
        self.replace = replace


class Link(str):
    """A symlink (the string is its target)."""


def _put(tree: Dir, path: str, node) -> None:
    parts = path.split("/")
    d = tree
    for p in parts[:-1]:
        d = d.setdefault(p, Dir())
    d[parts[-1]] = node


def pci_dir(pci: str) -> str:
    """``devices/...`` path of a rail's PCI function (root port ``<domain>:00:00.0`` above it)."""
    dom = pci.split(":")[0]
    return f"devices/pci{dom}:00/{dom}:00:00.0/{pci}"


def _rel(src_dir: str, target: str) -> Link:
    return Link(os.path.relpath(target, src_dir))


def sysfs_tree(m: dict, macs: dict[str, str]) -> Dir:
    """The fake sysfs entries (relative to /sys) for model ``m``; ``macs``: netdev -> MAC address."""
    t = Dir()
    _put(t, "class/infiniband", Dir(replace=True))
    _put(t, "class/infiniband_verbs", Dir({"abi_version": "6\n"}, replace=True))
    for i, r in enumerate(m["rails"]):
        hca, nd, pci = r["hca"], r["netdev"], r["pci"]
        fn = pci_dir(pci)
        mac = macs.get(nd) or "02:00:00:00:00:%02x" % (i + 1)
        guid = ":".join(eui64(mac).hex()[j:j + 4] for j in range(0, 16, 4))
        up = r["state"] == "ACTIVE"
        func = Dir({
            "vendor": PCI_VENDOR + "\n", "device": PCI_DEVICE + "\n", "subsystem_vendor": PCI_VENDOR + "\n",
            "class": "0x020000\n", "numa_node": "-1\n",
            "uevent": f"DRIVER=mlx5_core\nPCI_CLASS=20000\nPCI_ID=15B3:1021\nPCI_SLOT_NAME={pci}\n",
            "net": Dir({nd: _rel(f"{fn}/net", f"devices/virtual/net/{nd}")}),
        })
        ports = Dir({
            "state": "4: ACTIVE\n" if up else "1: DOWN\n",
            "phys_state": "5: LinkUp\n" if up else "3: Disabled\n",
            "rate": rate_text(r["speed_mbps"]) + "\n", "link_layer": "Ethernet\n",
            "lid": "0x0\n", "sm_lid": "0x0\n", "lid_mask_count": "0\n", "sm_sl": "0\n",
            "cap_mask": "0x00010000\n",
        })
        gids, types, ndevs = Dir(), Dir(), Dir()
        entries = gid_entries(r, mac)
        for idx in range(GID_TABLE_LEN):
            gids[str(idx)] = (entries[idx][0] if idx in entries else ZERO_GID) + "\n"
        for idx, (_, typ) in entries.items():
            types[str(idx)] = typ + "\n"
            ndevs[str(idx)] = nd + "\n"
        ports["gids"] = gids
        ports["gid_attrs"] = Dir({"types": types, "ndevs": ndevs})
        func["infiniband"] = Dir({hca: Dir({
            "device": _rel(f"{fn}/infiniband/{hca}", fn),
            "node_type": "1: CA\n", "node_guid": guid + "\n", "sys_image_guid": guid + "\n",
            "fw_ver": FW_VER + "\n", "hca_type": HCA_TYPE + "\n", "board_id": "NVD0000000054\n",
            "node_desc": f"{m.get('node', 'spark')} {hca}\n",
            "ports": Dir({"1": ports}),
        })})
        uv = f"uverbs{i}"
        func["infiniband_verbs"] = Dir({uv: Dir({
            "ibdev": hca + "\n", "abi_version": "1\n", "dev": f"231:{192 + i}\n",
            "device": _rel(f"{fn}/infiniband_verbs/{uv}", fn)})})
        _put(t, fn, func)
        _put(t, f"class/infiniband/{hca}", _rel("class/infiniband", f"{fn}/infiniband/{hca}"))
        _put(t, f"class/infiniband_verbs/{uv}", _rel("class/infiniband_verbs", f"{fn}/infiniband_verbs/{uv}"))
        _put(t, f"bus/pci/devices/{pci}", _rel("bus/pci/devices", fn))
    return t


def flatten(tree: Dir, prefix: str = "") -> dict[str, object]:
    """path -> str (file) | Link | Dir (directory, for its replace flag) of every node in the tree."""
    out = {}
    for name, node in tree.items():
        p = f"{prefix}/{name}" if prefix else name
        out[p] = node
        if isinstance(node, Dir):
            out.update(flatten(node, p))
    return out


def write_tree(root: str, tree: Dir, netdevs: dict[str, dict] | None = None) -> None:
    """Materialize a tree under a plain directory (unit tests: a temporary sysfs root). ``netdevs``:
    netdev -> {attribute: value} (operstate, carrier, mtu, address) written as
    ``devices/virtual/net/<netdev>/<attribute>`` with its ``class/net/<netdev>`` link, as the kernel has them."""
    for nd, attrs in (netdevs or {}).items():
        d = os.path.join(root, "devices/virtual/net", nd)
        os.makedirs(d, exist_ok=True)
        for k, v in attrs.items():
            with open(os.path.join(d, k), "w") as f:
                f.write(f"{v}\n")
        os.makedirs(os.path.join(root, "class/net"), exist_ok=True)
        link = os.path.join(root, "class/net", nd)
        if not os.path.lexists(link):
            os.symlink(f"../../devices/virtual/net/{nd}", link)
    for path, node in sorted(flatten(tree).items()):
        full = os.path.join(root, path)
        if isinstance(node, Dir):
            os.makedirs(full, exist_ok=True)
        elif isinstance(node, Link):
            os.makedirs(os.path.dirname(full), exist_ok=True)
            if os.path.lexists(full):
                os.unlink(full)
            os.symlink(node, full)
        else:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(node)


# --------------------------------------------------------------------- ethtool (pure parts) ----
RAIL_MODES = ("10000baseKR/Full", "25000baseCR/Full", "50000baseCR2/Full", "100000baseCR4/Full",
              "100000baseCR2/Full", "200000baseCR4/Full")
MGMT_MODES = ("100baseT/Full", "1000baseT/Full", "2500baseT/Full", "5000baseT/Full", "10000baseT/Full")


def _modes(label: str, modes) -> list[str]:
    pad = " " * len(label)
    return ["\t" + label + modes[0]] + [f"\t{pad}{m}" for m in modes[1:]]


def ethtool_settings(netdev: str, *, speed_mbps: int, link: bool, port: str, modes, supported_port: str,
                     fec: bool, lanes: int | None, wol: str, transceiver: str) -> str:
    """ethtool's ``Settings for`` block in its netlink output format (ethtool netlink/settings.c)."""
    lines = [f"Settings for {netdev}:", f"\tSupported ports: [ {supported_port} ]"]
    lines += _modes("Supported link modes:   ", modes)
    lines += ["\tSupported pause frame use: Symmetric", "\tSupports auto-negotiation: Yes"]
    lines.append("\tSupported FEC modes: " + ("None\t RS\t BASER\t LLRS" if fec else "Not reported"))
    lines += _modes("Advertised link modes:  ", modes)
    lines += ["\tAdvertised pause frame use: Symmetric", "\tAdvertised auto-negotiation: Yes"]
    lines.append("\tAdvertised FEC modes: " + ("RS" if fec else "Not reported"))
    if link:
        lines.append(f"\tSpeed: {speed_mbps}Mb/s")
        if lanes:
            lines.append(f"\tLanes: {lanes}")
        lines.append("\tDuplex: Full")
    else:
        lines += ["\tSpeed: Unknown!", "\tDuplex: Unknown! (255)"]
    lines += ["\tAuto-negotiation: on", f"\tPort: {port}", "\tPHYAD: 0", f"\tTransceiver: {transceiver}",
              f"\tSupports Wake-on: {wol}", "\tWake-on: d",
              "        Current message level: 0x00000004 (4)", " " * 30 + " link",
              f"\tLink detected: {'yes' if link else 'no'}"]
    return "\n".join(lines) + "\n"


def _operstate(sysfs: str, netdev: str) -> str | None:
    try:
        with open(os.path.join(sysfs, "class/net", netdev, "operstate")) as f:
            return f.read().strip()
    except OSError:
        return None


# what Debian's ethtool 6.1 prints for an unknown name: the kernel's refusal for each of its five requests
# (link modes, link info, WoL, debug, link state), then "No data available", exit 75
NO_DEVICE = "netlink error: no device matches name (offset 24)\nnetlink error: No such device\n" * 5
NO_DEVICE_RC, NO_DATA = 75, "No data available\n"


def ethtool_output(argv: list[str], m: dict, sysfs: str = "/sys") -> tuple[int, str, str] | None:
    """(exit code, stdout, stderr) for what the model answers; None: hand over to the real ethtool
    (any other interface, or an option the stand-in does not model)."""
    if len(argv) == 2 and argv[0] in ("-i", "--driver"):
        dev, settings = argv[1], False
    elif len(argv) == 1 and not argv[0].startswith("-"):
        dev, settings = argv[0], True
    else:
        return None
    rail = next((r for r in m.get("rails") or [] if r["netdev"] == dev), None)
    mg = m.get("management") or {}
    if rail is None and dev != mg.get("netdev"):
        return None
    state = _operstate(sysfs, dev)
    if state is None:  # the model names it but the node has no such netdev (the sim is broken)
        return NO_DEVICE_RC, NO_DATA, NO_DEVICE
    if rail is not None and not settings:
        return 0, (f"driver: mlx5_core\nversion: 6.8.0-1013-nvidia\nfirmware-version: {FW_VER} (NVD0000000054)\n"
                   f"expansion-rom-version: \nbus-info: {rail['pci']}\nsupports-statistics: yes\n"
                   "supports-test: yes\nsupports-eeprom-access: no\nsupports-register-dump: no\n"
                   "supports-priv-flags: yes\n"), ""
    if not settings:
        return None
    if rail is not None:
        link = rail["state"] == "ACTIVE" and state == "up"
        sp = rail["speed_mbps"]
        lanes = 4 if sp >= 200000 else 2 if sp >= 100000 else 1
        return 0, ethtool_settings(dev, speed_mbps=sp, link=link, port="Direct Attach Copper", modes=RAIL_MODES,
                                   supported_port="FIBRE", fec=True, lanes=lanes, wol="d",
                                   transceiver="internal"), ""
    return 0, ethtool_settings(dev, speed_mbps=int(mg.get("speed_mbps") or MGMT_SPEED_MBPS), link=state == "up",
                               port="Twisted Pair", modes=MGMT_MODES, supported_port="TP", fec=False, lanes=None,
                               wol="pumbg", transceiver="external"), ""


def ethtool_fallback(argv: list[str], sysfs: str = "/sys") -> tuple[int, str, str]:
    """Without the real ethtool (unit tests on a host): the no-such-device error, else a veth's block."""
    devs = [a for a in argv if not a.startswith("-")]
    if not devs:
        return 1, "", "ethtool: bad command line argument(s)\nFor more information run ethtool -h\n"
    dev = devs[-1]
    state = _operstate(sysfs, dev)
    if state is None:
        return NO_DEVICE_RC, NO_DATA, NO_DEVICE
    return 0, (f"Settings for {dev}:\n\tSupported ports: [  ]\n\tSupported link modes:   Not reported\n"
               f"\tSpeed: 10000Mb/s\n\tDuplex: Full\n\tAuto-negotiation: off\n\tPort: Twisted Pair\n"
               f"\tPHYAD: 0\n\tTransceiver: internal\n\tLink detected: {'yes' if state in ('up', 'unknown') else 'no'}\n"), ""


# ------------------------------------------------------------------------- ibdev2netdev (pure) ----
def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def ibdev2netdev_output(argv: list[str], sysfs: str = "/sys") -> tuple[int, str, str]:
    """Mellanox mlnx-tools ``ibdev2netdev`` (ofed_scripts/ibdev2netdev), new-style branch: for each device
    in ``ls /sys/class/infiniband`` and port, the RoCE netdev is ``gid_attrs/ndevs/0`` and its state the
    netdev's ``carrier`` (Up/Down). The real script first requires a netdev whose ``device/vendor`` is
    0x15b3; the simulated netdevs are veths, so that check is skipped."""
    usage = "ibdev2netdev <options>\n-h, --help                print help message\n-v, --verbose             print more info\n"
    if argv[:1] in (["-h"], ["--help"]):
        return 0, usage, ""
    if len(argv) > 1 or (argv and argv[0] != "-v"):
        return 255, usage, ""
    verbose = argv == ["-v"]
    ibroot = os.path.join(sysfs, "class/infiniband")
    if not os.path.isdir(ibroot):
        return 255, "", ""  # driver is stopped
    out = []
    for d in sorted(os.listdir(ibroot)):
        pdir = os.path.join(ibroot, d, "ports")
        for port in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []:
            ll = (_read(os.path.join(pdir, port, "link_layer")) or "").strip()
            if ll == "InfiniBand":
                continue  # (the GUID match of the real script; no IB ports here)
            eth = (_read(os.path.join(pdir, port, "gid_attrs/ndevs/0")) or "").strip()
            if not eth:
                continue
            carrier = (_read(os.path.join(sysfs, "class/net", eth, "carrier")) or "").strip()
            link = "Up" if carrier == "1" else "Down"
            if not verbose:
                out.append(f"{d} port {port} ==> {eth} ({link})")
                continue
            st = (_read(os.path.join(pdir, port, "state")) or "").split()
            ibstate = f"{st[1] if len(st) > 1 else 'NA':<6}"
            devid_s = (_read(os.path.join(ibroot, d, "device/device")) or "").strip()
            devid = f"MT{int(devid_s, 0)}" if devid_s else "NA"
            fw = (_read(os.path.join(ibroot, d, "fw_ver")) or "NA").strip()
            pdev = ""
            busdir = os.path.join(sysfs, "bus/pci/devices")
            for p in sorted(os.listdir(busdir)) if os.path.isdir(busdir) else []:
                ibd = os.path.join(busdir, p, "infiniband")
                if os.path.isdir(ibd) and os.listdir(ibd) == [d]:
                    pdev = p
            out.append(f"{pdev} {d} ({devid} - NA)  fw {fw} port {port} ({ibstate}) ==> {eth} ({link})")
    return 0, "".join(line + "\n" for line in out), ""
