"""Faults of whole nodes and of ranks at boot, for the self-healing tests (the fabric's, memory's and the GPU
hook's faults are in sim.cluster).

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

from . import backend
from .cluster import SimError, _cluster_lock, _node_by_name, _nodes_from_docker, _parallel, _start_node

CRASH_FILE = "/run/sim-rank-crash"  # read by sim-runc (sim/assets/node/sim-runc)
CRASH_DEFAULT = ("RuntimeError: CUDA error: an illegal memory access was encountered (simulated fault: this node's "
                 "ranks die at every boot)")


def _targets(name: str, nodes: list[str] | None):
    return [_node_by_name(name, n) for n in nodes] if nodes else _nodes_from_docker(name)


def power_cut(name: str, nodes: list[str] | None = None, log=print) -> list[str]:
    """SIGKILL the given nodes (default: all) at once; returns their names."""
    with _cluster_lock(name):
        targets = _targets(name, nodes)
        backend.docker("kill", "--signal", "KILL", *[n.container for n in targets], timeout=60)
        log(f"power cut: {', '.join(n.name for n in targets)}")
        return [n.name for n in targets]


def power_on(name: str, nodes: list[str] | None = None, log=print, timeout: float = 180.0) -> dict[str, dict]:
    """Boot the given nodes (default: all) again, in parallel; their boot timings by node."""
    with _cluster_lock(name):
        targets = _targets(name, nodes)
        marks = _parallel(lambda n: _start_node(name, n.name, log, timeout), targets)
        return {n.name: m for n, m in zip(targets, marks)}


def crash_at_boot(name: str, node: str, message: str | None = CRASH_DEFAULT, log=print) -> None:
    """Make (message None: stop making) every rank started on the node die during its boot with `message`."""
    n = _node_by_name(name, node)
    script = f'printf "%s\\n" "$1" > {CRASH_FILE}' if message else f"rm -f {CRASH_FILE}"
    r = backend.exec_in(n.container, "sh", "-c", script, "sh", message or "", timeout=30)
    if r.returncode != 0:
        raise SimError(f"{n.name}: crash-at-boot failed: {(r.stderr or r.stdout).strip()}")
    log(f"{n.name}: ranks {'die at every boot: ' + message if message else 'boot normally'}")
