"""``python -m sim``: thin CLI over :mod:`sim.cluster` (lifecycle), :mod:`sim.faults`, :mod:`sim.sshconfig` and
:mod:`sim.images`."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim", description="simulated DGX Spark cluster (dspark-sim)")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", help="build/cache the node image and the engine TEST DOUBLE image (sglang-sim + vllm-sim)")
    c = sub.add_parser("create", help="create the cluster (idempotent)")
    c.add_argument("--name", default="sim")
    c.add_argument("--nodes", type=int, default=3)
    c.add_argument("--subnet", default=None,
                   help="default: the cluster's own (sim.cluster.SUBNETS; 172.30.99.0/24 for any other name)")
    c.add_argument("--retain", action="store_true", help="keep a half-created cluster for debugging")
    for name, hlp in (("status", "per-node health"), ("delete", "remove nodes and network (--purge: their engines too)"),
                      ("ssh-config", "print the ssh config block")):
        s = sub.add_parser(name, help=hlp)
        s.add_argument("--name", default="sim")
        if name == "ssh-config":
            s.add_argument("--json", action="store_true", help="machine-readable")
            s.add_argument("--install", action="store_true",
                           help="add an Include of the cluster's ssh_config to ~/.ssh/config")
            s.add_argument("--uninstall", action="store_true", help="remove that Include line")
        if name == "status":
            s.add_argument("--json", action="store_true")
        if name == "delete":
            s.add_argument("--purge", action="store_true",
                           help="also remove the nodes' docker engines (the loaded engine image, kept otherwise)")
    for name in ("stop-node", "start-node"):
        s = sub.add_parser(name)
        s.add_argument("node", help="spark<i>")
        s.add_argument("--name", default="sim")
    s = sub.add_parser("fabric", help="every node's link model (/etc/dspark-sim/fabric.json)")
    s.add_argument("--name", default="sim")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("set-rail", help="fault injection on one rail of one node (rewrites its model, applies it)")
    s.add_argument("node", help="spark<i>")
    s.add_argument("rail", help="hca or netdev: rocep1s0f1, roceP2p1s0f1, enp1s0f1np1, enP2p1s0f1np1")
    s.add_argument("--name", default="sim")
    s.add_argument("--state", choices=["ACTIVE", "DOWN", "active", "down"])
    s.add_argument("--speed-mbps", type=int, help="link speed ethtool/sysfs report (200000 healthy)")
    s.add_argument("--gbps", type=float, help="what one rail carries (ib_write_bw; 93.5 healthy)")
    s.add_argument("--mtu", type=int, help="the netdev's MTU (9000 healthy)")
    s.add_argument("--gid-index", type=int, help="where the IPv4 RoCE v2 GID sits (3 healthy; odd)")
    s = sub.add_parser("reset-fabric", help="every node's fabric back to healthy")
    s.add_argument("--name", default="sim")
    s = sub.add_parser("hold-memory", help="a process on a node holding memory in its /proc/meminfo model")
    s.add_argument("node", help="spark<i>")
    s.add_argument("gib", type=float)
    s.add_argument("--holder", default="sim-memory-hold", help="the process's name (15 characters at most)")
    s.add_argument("--name", default="sim")
    s = sub.add_parser("release-memory", help="end what hold-memory started on a node")
    s.add_argument("node", help="spark<i>")
    s.add_argument("--name", default="sim")
    s = sub.add_parser("gpu-fault", help="a node's GPU prestart hook refuses containers (they stay Created)")
    s.add_argument("node", help="spark<i>")
    s.add_argument("--message", default=None, help="what the hook prints (default: a CUDA requirement error)")
    s.add_argument("--clear", action="store_true", help="the hook is healthy again")
    s.add_argument("--name", default="sim")
    s = sub.add_parser("power-cut", help="nodes lose power at once (SIGKILL: nothing shuts down); default all")
    s.add_argument("nodes", nargs="*", help="spark<i> (default: every node)")
    s.add_argument("--name", default="sim")
    s = sub.add_parser("power-on", help="boot nodes again after a power cut (default all)")
    s.add_argument("nodes", nargs="*", help="spark<i> (default: every node)")
    s.add_argument("--name", default="sim")
    s = sub.add_parser("crash-at-boot", help="every rank started on a node dies during its boot (until --clear)")
    s.add_argument("node", help="spark<i>")
    s.add_argument("--message", default=None, help="what the rank dies with (default: a CUDA illegal memory access)")
    s.add_argument("--clear", action="store_true", help="ranks boot normally again")
    s.add_argument("--name", default="sim")
    s = sub.add_parser("meminfo", help="a node's /proc/meminfo (the model's rendering)")
    s.add_argument("node", help="spark<i>")
    s.add_argument("--name", default="sim")
    a = p.parse_args(argv)

    from . import cluster, faults, images, sshconfig
    from .inventory import SimError

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        if a.cmd == "build":
            print(json.dumps(images.build_all(log), indent=2))
        elif a.cmd == "create":
            info = cluster.create(a.name, a.nodes, subnet=a.subnet, log=log, retain=a.retain)
            print(info.describe())
        elif a.cmd == "status":
            st = cluster.status(a.name)
            if a.json:
                print(json.dumps(st, indent=2))
            else:
                print(cluster.format_status(st))
            return 0 if st["healthy"] else 1
        elif a.cmd == "delete":
            cluster.delete(a.name, log=log, purge=a.purge)
        elif a.cmd == "stop-node":
            cluster.stop_node(a.name, a.node, log=log)
        elif a.cmd == "start-node":
            cluster.start_node(a.name, a.node, log=log)
        elif a.cmd == "fabric":
            models = faults.fabric(a.name)
            print(json.dumps(models, indent=2) if a.json else faults.format_fabric(models))
        elif a.cmd == "set-rail":
            faults.set_rail(a.name, a.node, a.rail, state=a.state, speed_mbps=a.speed_mbps, gbps=a.gbps, mtu=a.mtu,
                            gid_index=a.gid_index, log=log)
        elif a.cmd == "reset-fabric":
            faults.reset_fabric(a.name, log=log)
        elif a.cmd == "hold-memory":
            faults.hold_memory(a.name, a.node, int(a.gib * 1024), holder=a.holder, log=log)
        elif a.cmd == "release-memory":
            faults.release_memory(a.name, a.node, log=log)
        elif a.cmd == "gpu-fault":
            faults.gpu_fault(a.name, a.node, None if a.clear else (a.message or faults.GPU_FAULT_DEFAULT), log=log)
        elif a.cmd == "power-cut":
            faults.power_cut(a.name, a.nodes, log=log)
        elif a.cmd == "power-on":
            faults.power_on(a.name, a.nodes, log=log)
        elif a.cmd == "crash-at-boot":
            faults.crash_at_boot(a.name, a.node, None if a.clear else (a.message or faults.CRASH_DEFAULT), log=log)
        elif a.cmd == "meminfo":
            print(json.dumps(faults.meminfo(a.name, a.node), indent=2))
        elif a.cmd == "ssh-config":
            if a.install:
                log(f"Include added to {sshconfig.install_ssh_include(a.name)}")
            elif a.uninstall:
                log(f"Include removed from {sshconfig.uninstall_ssh_include(a.name)}")
            elif a.json:
                print(json.dumps(cluster.ssh_info(a.name).to_json(), indent=2))
            else:
                print(cluster.ssh_info(a.name).ssh_config_text, end="")
    except SimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
