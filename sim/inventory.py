"""A simulated cluster's nodes as docker holds them, shared by its lifecycle (``sim.cluster``) and its faults
(``sim.faults``): the sim's error, a node's addresses (``NodeInfo``, rebuilt from the node container's labels),
the per-cluster lock and state directory, running a step on every node at once, and reading a node's link
model (``/etc/dspark-sim/fabric.json``, ``sim.fabric``).
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import backend
from . import fabric as fab
from .backend import LABEL_CLUSTER, LABEL_IP, LABEL_NODE, NS

LABEL_VERSION = f"{NS}.version"
LABEL_RAIL_IPS = (f"{NS}.rail-a-ip", f"{NS}.rail-b-ip")
DEFAULT_CLUSTER = "sim"


class SimError(RuntimeError):
    pass


@dataclass
class NodeInfo:
    name: str        # spark<i>
    index: int       # i (1-based)
    ip: str          # management (enP7s7): ssh, docker, API
    container: str   # <cluster>-spark<i>
    rail_a: str = ""  # enp1s0f1np1 / rocep1s0f1 (the fabric IP)
    rail_b: str = ""  # enP2p1s0f1np1 / roceP2p1s0f1

    @property
    def rail_ips(self) -> list[str]:
        return [self.rail_a, self.rail_b]


def state_dir(name: str) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "deepseek-spark-sim" / name


@contextlib.contextmanager
def cluster_lock(name: str):
    """Serialize create/delete/start/stop (and faults) of one cluster across processes."""
    d = state_dir(name).parent
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _row_labels(row: dict) -> dict:
    return dict(kv.split("=", 1) for kv in row.get("Labels", "").split(",") if "=" in kv)


def nodes(name: str) -> list[NodeInfo]:
    """The cluster's nodes, from its node containers' labels (``[]``: no such cluster)."""
    rows = backend.containers_by_label(LABEL_CLUSTER, name)
    out = []
    for row in rows:
        labels = _row_labels(row)
        i = int(labels.get(LABEL_NODE, "0"))
        out.append(NodeInfo(f"spark{i}", i, labels.get(LABEL_IP, ""), row["Names"].split(",")[0],
                            labels.get(LABEL_RAIL_IPS[0], ""), labels.get(LABEL_RAIL_IPS[1], "")))
    return sorted(out, key=lambda n: n.index)


def clusters() -> list[str]:
    """The names of the simulated clusters with a node on this machine's docker engine."""
    r = backend.docker("ps", "-a", "--filter", f"label={LABEL_CLUSTER}", "--format",
                       f'{{{{.Label "{LABEL_CLUSTER}"}}}}', timeout=60)  # fmt: skip
    return sorted({c for c in r.stdout.split() if c})


def versions(name: str) -> dict[str, str]:
    """container -> its sim version label (``""`` for nodes built before versions were labelled)."""
    return {row["Names"].split(",")[0]: _row_labels(row).get(LABEL_VERSION, "")
            for row in backend.containers_by_label(LABEL_CLUSTER, name)}


def node(name: str, node: str) -> NodeInfo:
    """One node of the cluster, by name (``spark2``), container (``sim-spark2``) or index (``2``)."""
    for n in nodes(name):
        if node in (n.name, n.container, str(n.index)):
            return n
    raise SimError(f"no node {node!r} in cluster {name!r}")


def running(n: NodeInfo) -> bool:
    return bool((backend.inspect(n.container) or {}).get("State", {}).get("Running"))


def parallel(fn, items, workers: int | None = None) -> list:
    """``fn`` on every item at once; results in order, or one SimError naming every failure."""
    with ThreadPoolExecutor(max_workers=workers or max(1, len(items))) as ex:
        futs = [ex.submit(fn, it) for it in items]
        results, errors = [], []
        for f in futs:
            try:
                results.append(f.result())
            except Exception as e:  # collect all node errors
                errors.append(e)
                results.append(None)
    if errors:
        raise SimError("\n".join(str(e) for e in errors)) from errors[0]
    return results


def fabric_model(n: NodeInfo) -> dict:
    """The node's link model (``docker cp`` works on a stopped node too)."""
    r = backend.docker("cp", f"{n.container}:{fab.MODEL_PATH}", "-", check=False, text=False)
    if r.returncode != 0:
        raise SimError(f"{n.name}: cannot read {fab.MODEL_PATH}: {r.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tf:
        member = tf.getmembers()[0]
        return json.loads(tf.extractfile(member).read())
