"""Fault injection on a simulated cluster (``sim.cluster`` is its lifecycle), and the views of what a fault changed.

- the fabric: ``set_rail(name, node, rail, ...)`` rewrites one rail of a node's link model
  (``/etc/dspark-sim/fabric.json``, ``sim.fabric``) and applies it (``sim-fabric apply``; a stopped node gets it at
  its next boot); ``reset_fabric`` restores the healthy model everywhere; ``fabric``/``format_fabric`` show them.
- memory: ``hold_memory``/``release_memory`` start and end a real process counted in the node's /proc/meminfo model
  (``sim.meminfo``); ``meminfo`` reads the node's /proc/meminfo.
- the GPU hook: ``gpu_fault(name, node, message)`` makes the node's prestart hook stand-in refuse every container that
  asks for GPUs (``docker start`` fails, the container stays ``Created``), until cleared or the node's next boot.
- ``power_cut(name, nodes)``: every given node loses power at once: its container is SIGKILLed, so nothing on it
  shuts down (no docker stop of its containers, no sync); ``power_on`` boots them again (in parallel) and waits for
  sshd and the node's docker engine, as ``start_node`` does. The node's docker engine then restarts the containers
  whose restart policy says so and leaves the others exited, as after a real power cut.
- ``crash_at_boot(name, node, message)``: every rank container started on the node dies during its boot with
  `message` (exit 1, after "Load weight begin."), until cleared or the node's next boot (/run): the node's runtime
  shim (sim-runc) hands the message to the container's engine TEST DOUBLE, which dies with it. A real rank that
  dies at every boot: a bad driver, a corrupt shard, a kernel that faults at load.
"""

from __future__ import annotations

from . import backend, cluster, images, inventory
from . import fabric as fab
from .inventory import DEFAULT_CLUSTER, NodeInfo, SimError, cluster_lock, parallel

CRASH_FILE = "/run/sim-rank-crash"  # read by sim-runc (sim/assets/node/sim-runc)
CRASH_DEFAULT = ("RuntimeError: CUDA error: an illegal memory access was encountered (simulated fault: this node's "
                 "ranks die at every boot)")
# What nvidia-container-cli prints when a container's CUDA requirement (the image's NVIDIA_REQUIRE_CUDA) is
# above what the node's driver supports: nvidia-smi still works, so preflight passes, but the prestart hook
# refuses and the container never starts (the message of libnvidia-container's requirement check).
GPU_FAULT_DEFAULT = ("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.1, please update your "
                     "driver to a newer version, or use an earlier cuda container: unknown")


# ------------------------------------------------------------------------------ the fabric ----
def _write_model(n: NodeInfo, model: dict) -> str:
    """Write the node's model and, when it runs, apply it (sim-fabric apply); returns what happened."""
    fab.validate(model)
    backend.docker("cp", "-", f"{n.container}:/", input=images.files_tar(
        {fab.MODEL_PATH.lstrip("/"): (fab.dumps(model).encode(), 0o644)}))
    if not inventory.running(n):
        return "written (node stopped: applied at its next boot)"
    r = backend.exec_in(n.container, "/usr/local/sbin/sim-fabric", "apply", timeout=60)
    if r.returncode != 0:
        raise SimError(f"{n.name}: sim-fabric apply failed: {(r.stderr or r.stdout).strip()}")
    return "applied"


def _set_rail(name: str, node: str, rail: str, log=print, **changes) -> dict:
    n = inventory.node(name, node)
    try:
        model = fab.with_rail(inventory.fabric_model(n), rail, **changes)
    except fab.FabricError as e:
        raise SimError(str(e)) from e
    what = _write_model(n, model)
    r = fab.find_rail(model, rail)
    log(f"{n.name} {r['hca']}/{r['netdev']}: state {r['state']}, {r['speed_mbps']} Mb/s, {r['gbps']} Gb/s, "
        f"mtu {r['mtu']}, gid_index {r['gid_index']} ({what})")
    return model


def _reset_fabric(name: str, log=print) -> dict[str, dict]:
    nodes = inventory.nodes(name)
    if not nodes:
        raise SimError(f"cluster {name!r} does not exist")
    out = {}
    for n in nodes:
        model = cluster.node_fabric(n)
        what = _write_model(n, model)
        out[n.name] = model
        log(f"{n.name}: fabric reset to healthy ({what})")
    return out


def set_rail(name: str, node: str, rail: str, *, state: str | None = None, speed_mbps: int | None = None,
             gbps: float | None = None, mtu: int | None = None, gid_index: int | None = None, log=print) -> dict:
    """Fault injection on one rail of one node (``rail``: hca or netdev name, e.g. ``roceP2p1s0f1`` or
    ``enP2p1s0f1np1``): rewrite the node's link model and apply it. ``state`` ACTIVE/DOWN (the netdev goes
    down: pings fail, ethtool says ``Link detected: no``, the port ``1: DOWN``, no IPv4 GIDs); ``speed_mbps``
    what ethtool and sysfs report; ``gbps`` what the ib_write_bw stand-in measures; ``mtu`` the netdev's real
    MTU; ``gid_index`` where the IPv4 RoCE v2 GID sits. Returns the node's new model."""
    with cluster_lock(name):
        return _set_rail(name, node, rail, log=log, state=state, speed_mbps=speed_mbps, gbps=gbps, mtu=mtu,
                         gid_index=gid_index)


def reset_fabric(name: str = DEFAULT_CLUSTER, log=print) -> dict[str, dict]:
    """Every node back to the healthy model (both rails ACTIVE, 200 Gb/s, 93.5 Gb/s, MTU 9000, GID 3)."""
    with cluster_lock(name):
        return _reset_fabric(name, log)


def fabric(name: str = DEFAULT_CLUSTER) -> dict[str, dict]:
    """Every node's link model: node name -> /etc/dspark-sim/fabric.json."""
    nodes = inventory.nodes(name)
    if not nodes:
        raise SimError(f"cluster {name!r} does not exist")
    return {n.name: inventory.fabric_model(n) for n in nodes}


def format_fabric(models: dict[str, dict]) -> str:
    lines = [f"  {'node':8s} {'hca':13s} {'netdev':14s} {'pci':13s} {'ip':15s} {'state':7s} {'speed':>8s} "
             f"{'Gb/s':>6s} {'mtu':>5s} {'gid':>3s}"]
    for node, m in models.items():
        mg = m["management"]
        lines.append(f"  {node:8s} {'-':13s} {mg['netdev']:14s} {'-':13s} {mg['ip']:15s} {'-':7s} "
                     f"{mg['speed_mbps']:>6d}Mb {'-':>6s} {'-':>5s} {'-':>3s}")
        for r in m["rails"]:
            lines.append(f"  {node:8s} {r['hca']:13s} {r['netdev']:14s} {r['pci']:13s} {r['ip']:15s} {r['state']:7s} "
                         f"{r['speed_mbps']:>6d}Mb {r['gbps']:>6g} {r['mtu']:>5d} {r['gid_index']:>3d}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- memory ----
def hold_memory(name: str, node: str, mib: int, holder: str = "sim-memory-hold", log=print) -> int:
    """A real process named `holder` on the node, counted in its /proc/meminfo model as holding `mib`
    (sim/meminfo.py); returns its pid. Ends with release_memory or the node's next boot."""
    n = inventory.node(name, node)
    r = backend.exec_in(n.container, "/usr/local/sbin/sim-meminfo", "hold", holder, str(mib), timeout=30)
    if r.returncode != 0:
        raise SimError(f"{n.name}: sim-meminfo hold failed: {(r.stderr or r.stdout).strip()}")
    pid = int(r.stdout.split()[0])
    log(f"{n.name}: {holder} (pid {pid}) holds {mib} MiB")
    return pid


def release_memory(name: str, node: str, log=print) -> list[str]:
    n = inventory.node(name, node)
    r = backend.exec_in(n.container, "/usr/local/sbin/sim-meminfo", "release", timeout=30)
    if r.returncode != 0:
        raise SimError(f"{n.name}: sim-meminfo release failed: {(r.stderr or r.stdout).strip()}")
    gone = r.stdout.split()
    log(f"{n.name}: released {', '.join(gone) or 'nothing'}")
    return gone


def meminfo(name: str, node: str) -> dict[str, int]:
    """The node's /proc/meminfo as it reads it (kB figures in MiB)."""
    n = inventory.node(name, node)
    r = backend.exec_in(n.container, "cat", "/proc/meminfo", timeout=30)
    out = {}
    for line in r.stdout.splitlines():
        key, _, rest = line.partition(":")
        if rest.split() and rest.split()[0].isdigit():
            out[key.strip()] = int(rest.split()[0]) // 1024
    return out


# ------------------------------------------------------------------------------ the GPU hook ----
def gpu_fault(name: str, node: str, message: str | None = GPU_FAULT_DEFAULT, log=print) -> None:
    """Make (or, with `message` None, stop making) the node's GPU prestart hook stand-in refuse every container
    that asks for GPUs with `message`: `docker start` fails and the container stays `Created`. Until the
    node's next boot (/run)."""
    n = inventory.node(name, node)
    script = 'printf "%s\\n" "$1" > /run/sim-gpu-fault' if message else "rm -f /run/sim-gpu-fault"
    r = backend.exec_in(n.container, "sh", "-c", script, "sh", message or "", timeout=30)
    if r.returncode != 0:
        raise SimError(f"{n.name}: gpu-fault failed: {(r.stderr or r.stdout).strip()}")
    log(f"{n.name}: GPU hook {'refuses: ' + message if message else 'healthy'}")


# ------------------------------------------------------------------- whole nodes and ranks ----
def _targets(name: str, nodes: list[str] | None):
    return [inventory.node(name, n) for n in nodes] if nodes else inventory.nodes(name)


def power_cut(name: str, nodes: list[str] | None = None, log=print) -> list[str]:
    """SIGKILL the given nodes (default: all) at once; returns their names."""
    with cluster_lock(name):
        targets = _targets(name, nodes)
        backend.docker("kill", "--signal", "KILL", *[n.container for n in targets], timeout=60)
        log(f"power cut: {', '.join(n.name for n in targets)}")
        return [n.name for n in targets]


def power_on(name: str, nodes: list[str] | None = None, log=print, timeout: float = 180.0) -> dict[str, dict]:
    """Boot the given nodes (default: all) again, in parallel; their boot timings by node."""
    with cluster_lock(name):
        targets = _targets(name, nodes)
        marks = parallel(lambda n: cluster._start_node(name, n.name, log, timeout), targets)
        return {n.name: m for n, m in zip(targets, marks)}


def crash_at_boot(name: str, node: str, message: str | None = CRASH_DEFAULT, log=print) -> None:
    """Make (message None: stop making) every rank started on the node die during its boot with `message`."""
    n = inventory.node(name, node)
    script = f'printf "%s\\n" "$1" > {CRASH_FILE}' if message else f"rm -f {CRASH_FILE}"
    r = backend.exec_in(n.container, "sh", "-c", script, "sh", message or "", timeout=30)
    if r.returncode != 0:
        raise SimError(f"{n.name}: crash-at-boot failed: {(r.stderr or r.stdout).strip()}")
    log(f"{n.name}: ranks {'die at every boot: ' + message if message else 'boot normally'}")
