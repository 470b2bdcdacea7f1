"""SIMULATOR STAND-IN: what runs on a dspark-sim node to make it match its link model (stdlib only).

It is ``/usr/local/sbin/sim-fabric`` on a node (a launcher of ``dspark_sim.fabric_node``, this file, shipped
with ``dspark_sim.fabric``, the model it applies: ``sim.fabric``, in the node image's
``/usr/lib/python3/dist-packages``):

- ``sim-fabric boot`` (the entrypoint, before sshd): rename the interfaces by the IP they hold
  (management -> ``enP7s7``, rail A -> ``enp1s0f1np1``, rail B -> ``enP2p1s0f1np1``), then ``apply``;
- ``sim-fabric apply`` (boot, and the sim API after a change): make the node match the model -- each
  rail netdev's link up/down and MTU (real ``ip link``), ``/dev/infiniband/uverbs<i>``, and a fake sysfs
  for the two RoCE devices (``/sys/class/infiniband``, ``/sys/class/infiniband_verbs``, their PCI
  functions under ``/sys/devices`` and ``/sys/bus/pci/devices``);
- ``sim-fabric ethtool ARGS`` / ``sim-fabric ibdev2netdev [-v]``: what the ``ethtool`` and
  ``ibdev2netdev`` stand-ins run.

The fake sysfs: sysfs refuses mkdir, so a private tmpfs (``/run/dspark-sim/sysfs``) holds, for each of
``class``, ``devices`` and ``bus``, a copy of the real directory made of bind mounts of every real entry
(recursively merged where a fake entry lives inside a real directory, e.g. ``devices/pci0000:00``) plus
the fake entries as plain files and symlinks; each is then rbind-mounted over ``/sys/<top>``. Later
``apply`` calls rewrite the fake files in place, so every view (the node, and rank containers that
sim-runc binds the node's ``/sys/class``, ``/sys/devices`` and ``/sys/bus`` into) sees the change.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import os
import subprocess
import sys

from .fabric import (LOG, MODEL_PATH, READY, STATE_DIR, Dir, FabricError, Link, dumps, ethtool_fallback, ethtool_output,
                     flatten, ibdev2netdev_output, sysfs_tree, validate, write_tree)

STAGE = STATE_DIR + "/sysfs"
FAKE_LIST = STATE_DIR + "/sysfs-fake.json"
REAL_ETHTOOL = "/usr/sbin/ethtool"
SYSFS_TOPS = ("class", "devices", "bus")


def log(msg: str) -> None:
    line = f"[sim-fabric] {msg}"
    print(line, file=sys.stderr, flush=True)
    try:
        with open(LOG, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def load(path: str = MODEL_PATH) -> dict:
    with open(path) as f:
        m = json.load(f)
    validate(m)
    return m


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise FabricError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def _addresses() -> dict[str, str]:
    """IPv4 address -> interface name."""
    out = {}
    for link in json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]"):
        for a in link.get("addr_info") or []:
            if a.get("family") == "inet":
                out[a["local"]] = link["ifname"]
    return out


def rename_interfaces(m: dict) -> list[str]:
    """Give each interface its Spark name by the IP it holds (docker names them eth0.. in any order)."""
    want = [(m["management"]["ip"], m["management"]["netdev"])] + [(r["ip"], r["netdev"]) for r in m["rails"]]
    have = _addresses()
    done = []
    for ip, name in want:
        cur = have.get(ip)
        if cur is None:
            log(f"WARNING: no interface holds {ip} (for {name})")
            continue
        if cur == name:
            continue
        routes = json.loads(_ip("-j", "-4", "route", "show", "default", "dev", cur).stdout or "[]")
        _ip("link", "set", "dev", cur, "down")
        _ip("link", "set", "dev", cur, "name", name)
        _ip("link", "set", "dev", name, "up")
        for rt in routes:
            if rt.get("gateway"):
                _ip("route", "replace", "default", "via", rt["gateway"], "dev", name)
        done.append(f"{cur}->{name} ({ip})")
    if done:
        log("renamed " + ", ".join(done))
    return done


def apply_links(m: dict) -> None:
    for r in m["rails"]:
        nd = r["netdev"]
        if not os.path.exists(f"/sys/class/net/{nd}"):
            log(f"WARNING: rail netdev {nd} does not exist")
            continue
        _ip("link", "set", "dev", nd, "mtu", str(r["mtu"]))
        _ip("link", "set", "dev", nd, "up" if r["state"] == "ACTIVE" else "down")


def make_devices(m: dict) -> None:
    os.makedirs("/dev/infiniband", exist_ok=True)
    for name in [f"uverbs{i}" for i in range(len(m["rails"]))] + ["rdma_cm"]:
        p = f"/dev/infiniband/{name}"
        if not os.path.exists(p):
            os.mknod(p, 0o20666, os.makedev(1, 3))  # /dev/null's numbers: opens, reads nothing
            os.chmod(p, 0o666)


_libc = None
MS_RDONLY, MS_BIND, MS_REC, MS_PRIVATE = 1, 4096, 16384, 1 << 18


def _mount(src: str | None, dst: str, fstype: str | None = None, flags: int = 0, data: str | None = None) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    if _libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {src} -> {dst}: {os.strerror(e)}")


def _mounted(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def _place_fake(path: str, node) -> None:
    if isinstance(node, Dir):
        os.makedirs(path, exist_ok=True)
    elif isinstance(node, Link):
        if os.path.islink(path) and os.readlink(path) == node:
            return
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(node, path)
    else:
        try:
            with open(path) as f:
                if f.read() == node:
                    return
        except OSError:
            pass
        tmp = path + ".sim-new"
        with open(tmp, "w") as f:
            f.write(node)
        os.replace(tmp, path)


def _merge(real: str, stage: str, fake: Dir, counter: list) -> None:
    """Fill ``stage`` (a dir on our tmpfs) with bind mounts of every real entry not in ``fake`` and the fake
    entries; a fake directory over a real one is merged one level further down."""
    os.makedirs(stage, exist_ok=True)
    real_names = [] if fake.replace or not os.path.isdir(real) else os.listdir(real)
    for name in real_names:
        if name in fake:
            continue
        src, dst = os.path.join(real, name), os.path.join(stage, name)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            os.mkdir(dst)
            _mount(src, dst, flags=MS_BIND | MS_REC)
            counter[0] += 1
        else:
            open(dst, "w").close()
            _mount(src, dst, flags=MS_BIND)
            counter[0] += 1
    for name, node in fake.items():
        dst = os.path.join(stage, name)
        if isinstance(node, Dir):
            src = os.path.join(real, name)
            _merge(src if name in real_names else "/nonexistent", dst, node, counter)
        else:
            _place_fake(dst, node)


def sync_sysfs(tree: Dir) -> str:
    """Build (first call after boot) or update in place (later calls) the fake sysfs."""
    os.makedirs(STATE_DIR, exist_ok=True)
    flat = flatten(tree)
    leaves = sorted(p for p, n in flat.items() if not isinstance(n, Dir))
    if not _mounted(STAGE):
        os.makedirs(STAGE, exist_ok=True)
        _mount("dspark-sysfs", STAGE, "tmpfs", 0, "mode=755")
        _mount(None, STAGE, None, MS_PRIVATE)
        counter = [0]
        for top in SYSFS_TOPS:
            _merge(f"/sys/{top}", f"{STAGE}/{top}", tree.get(top, Dir()), counter)
        for top in SYSFS_TOPS:
            _mount(f"{STAGE}/{top}", f"/sys/{top}", flags=MS_BIND | MS_REC)
        what = f"built ({counter[0]} bind mounts of real entries, {len(leaves)} fake files/links)"
    else:
        for p, node in sorted(flat.items()):
            _place_fake(f"{STAGE}/{p}", node)
        try:
            with open(FAKE_LIST) as f:
                old = set(json.load(f))
        except (OSError, ValueError):
            old = set()
        for p in sorted(old - set(leaves)):
            full = f"{STAGE}/{p}"
            if os.path.lexists(full) and not os.path.ismount(full):
                os.unlink(full)
        what = f"updated ({len(old - set(leaves))} removed)"
    with open(FAKE_LIST, "w") as f:
        json.dump(leaves, f)
    return what


def _macs(m: dict) -> dict[str, str]:
    out = {}
    for r in m["rails"]:
        try:
            with open(f"/sys/class/net/{r['netdev']}/address") as f:
                a = f.read()
        except OSError:
            continue
        if a:
            out[r["netdev"]] = a.strip()
    return out


def apply(path: str = MODEL_PATH) -> dict:
    m = load(path)
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(f"{STATE_DIR}/lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        apply_links(m)
        make_devices(m)
        what = sync_sysfs(sysfs_tree(m, _macs(m)))
    log(f"applied {path}: sysfs {what}; " + ", ".join(
        f"{r['hca']}/{r['netdev']} {r['state']} {r['speed_mbps']}Mb/s {r['gbps']}Gb/s mtu {r['mtu']} "
        f"gid {r['gid_index']}" for r in m["rails"]))
    return m


def boot(path: str = MODEL_PATH) -> None:
    if os.path.exists(READY):
        os.unlink(READY)
    m = load(path)
    rename_interfaces(m)
    apply(path)
    with open(READY, "w") as f:
        f.write("ok\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd, rest = (argv[0], argv[1:]) if argv else ("", [])
    # test hooks for the two read-only stand-ins (unit tests run them against a temporary tree)
    model_path = os.environ.get("DSPARK_SIM_FABRIC_JSON", MODEL_PATH)
    sysfs = os.environ.get("DSPARK_SIM_SYSFS", "/sys")
    try:
        if cmd == "boot":
            boot()
        elif cmd == "apply":
            apply()
        elif cmd == "show":
            sys.stdout.write(dumps(load()))
        elif cmd == "ethtool":
            try:
                res = ethtool_output(rest, load(model_path), sysfs)
            except (OSError, ValueError):
                res = None
            if res is None:
                if os.access(REAL_ETHTOOL, os.X_OK) and "DSPARK_SIM_SYSFS" not in os.environ:
                    os.execv(REAL_ETHTOOL, [REAL_ETHTOOL, *rest])
                res = ethtool_fallback(rest, sysfs)
            rc, out, err = res
            sys.stdout.write(out)
            sys.stderr.write(err)
            return rc
        elif cmd == "ibdev2netdev":
            rc, out, err = ibdev2netdev_output(rest, sysfs)
            sys.stdout.write(out)
            sys.stderr.write(err)
            return rc
        elif cmd == "write-tree" and len(rest) == 1:  # debugging: the fake tree into a plain directory
            m = load()
            write_tree(rest[0], sysfs_tree(m, _macs(m)))
        else:
            print("usage: sim-fabric boot|apply|show|ethtool ARGS|ibdev2netdev [-v]|write-tree DIR", file=sys.stderr)
            return 2
    except (OSError, FabricError) as e:
        log(f"ERROR: {cmd}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
