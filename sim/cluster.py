"""Lifecycle of a simulated DGX Spark cluster (dspark-sim): plan, create, delete, status, ssh info, stop/start a node.

Each node is a container ``<cluster>-spark<i>`` (hostname ``spark<i>``) on a private management network
``dspark-<cluster>`` with a fixed IP ``<subnet>.1<i>``, running sshd and its own docker engine, and on two
data-plane networks (the ConnectX-7 twins, MTU 9000, internal): rail A ``dspark-<cluster>-rail-a``
(``10.X.1.0/24``) and rail B ``dspark-<cluster>-rail-b`` (``10.X.2.0/24``), X = the management subnet's
third octet, node i at ``.1i`` on each. The node's link model is ``/etc/dspark-sim/fabric.json``
(``sim.fabric``). Nodes are found by label (``sim.inventory``); the ssh material is in ``sim.sshconfig``, the
images a node's engine holds in ``sim.nodeimages``, the faults (fabric, memory, GPU hook, power, crashing ranks) in
``sim.faults``. State outside docker is only the per-cluster ssh material under
``~/.local/state/deepseek-spark-sim/<cluster>/`` (``id_ed25519``, ``known_hosts``, ``ssh_config``);
everything else is rebuilt from docker labels and the nodes' fabric models.
"""
from __future__ import annotations

import ipaddress
import re
import shutil
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import backend, images, inventory, nodeimages, sshconfig
from . import fabric as fab
from .backend import LABEL_CLUSTER, LABEL_IP, LABEL_NODE, NS
from .inventory import DEFAULT_CLUSTER, LABEL_RAIL_IPS, LABEL_VERSION, NodeInfo, SimError, cluster_lock, parallel
from .nodeimages import NODE_IMAGES
from .sshconfig import SshInfo, ssh_check, ssh_paths

LABEL_RAIL = f"{NS}.rail"
RAIL_LETTERS = ("a", "b")
RAIL_MTU = 9000

DEFAULT_SUBNET = "172.30.99.0/24"
# The project's simulated clusters, each on a subnet of its own, so that none deletes or shadows another: `sim` is the
# one the checked-in sim stack files point at (a hand-made cluster: `python -m sim create`); the demo runs each stack
# on a cluster of its own (`<stack>-demo`, dspark demo), the e2e tier on `e2e`, tests/sim on `simtest`. Their stack
# files are the checked-in ones with the addresses moved to their cluster (sim.retarget).
SUBNETS = {
    "sim": DEFAULT_SUBNET,
    "simtest": "172.30.98.0/24",
    "e2e": "172.30.97.0/24",
    "e2e-b": "172.30.96.0/24",  # a second e2e tier beside the first (another checkout's: DSPARK_E2E_CLUSTER=e2e-b)
    "sim-demo": "172.30.91.0/24",
    "sim-tp2-demo": "172.30.92.0/24",
    "sim-x2-demo": "172.30.93.0/24",
    "sim-team-demo": "172.30.94.0/24",
}
MAX_NODES = 9
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")


# ------------------------------------------------------------------------------- pure parts ----
@dataclass
class ClusterPlan:
    name: str
    network: str
    subnet: str
    gateway: str
    ip_range: str
    nodes: list[NodeInfo]
    rail_networks: list[str] = field(default_factory=list)  # rail A, rail B
    rail_subnets: list[str] = field(default_factory=list)


def rail_subnets(subnet: str) -> list[str]:
    """Rail A/B subnets of a management subnet: 10.X.1.0/24 and 10.X.2.0/24, X its third octet."""
    x = ipaddress.ip_network(subnet).network_address.packed[2]
    return [f"10.{x}.{k}.0/24" for k in (1, 2)]


def subnet_of(name: str) -> str:
    """The management subnet of a cluster: its own for the project's clusters (SUBNETS), else the default."""
    return SUBNETS.get(name, DEFAULT_SUBNET)


def plan(name: str = DEFAULT_CLUSTER, nodes: int = 3, subnet: str | None = None) -> ClusterPlan:
    """Names and addresses of a cluster (on `subnet`, else its own: subnet_of); validates everything and reports
    all errors at once."""
    errors = []
    if not NAME_RE.match(name or ""):
        errors.append(f"cluster name {name!r} must match {NAME_RE.pattern}")
    if not 1 <= nodes <= MAX_NODES:
        errors.append(f"nodes={nodes} must be within 1..{MAX_NODES}")
    try:
        net = ipaddress.ip_network(subnet or subnet_of(name))
        if net.version != 4 or net.prefixlen > 24:
            errors.append(f"subnet {net} must be an IPv4 /24 or larger")
    except ValueError as e:
        errors.append(f"subnet: {e}")
        net = None
    if errors:
        raise SimError("; ".join(errors))
    base = net.network_address
    rails = rail_subnets(str(net))
    rbase = [ipaddress.ip_network(r).network_address for r in rails]
    node_list = [NodeInfo(f"spark{i}", i, str(base + 10 + i), f"{name}-spark{i}",
                          str(rbase[0] + 10 + i), str(rbase[1] + 10 + i)) for i in range(1, nodes + 1)]
    ip_range = str(ipaddress.ip_network(f"{base + 128}/25"))
    return ClusterPlan(name, f"dspark-{name}", str(net), str(base + 1), ip_range, node_list,
                       [f"dspark-{name}-rail-{x}" for x in RAIL_LETTERS], rails)


def node_fabric(n: NodeInfo) -> dict:
    """The healthy link model of a node (what create writes and reset_fabric restores)."""
    return fab.node_model(n.name, n.ip, n.rail_ips)


@dataclass
class ClusterInfo:
    name: str
    network: str
    subnet: str
    nodes: list[NodeInfo]
    ssh: SshInfo
    node_image: str = ""
    engine_image: str = images.ENGINE_IMAGE
    packaged_images: tuple[str, ...] = tuple(i.name for i in images.PACKAGED)
    timings: dict = field(default_factory=dict)
    rail_networks: list[str] = field(default_factory=list)
    rail_subnets: list[str] = field(default_factory=list)

    def describe(self) -> str:
        rails = ", ".join(f"{net} ({sub}, MTU {RAIL_MTU})" for net, sub in zip(self.rail_networks, self.rail_subnets))
        lines = [f"cluster {self.name}: {len(self.nodes)} node(s) on network {self.network} ({self.subnet})",
                 f"  fabric rails {rails}"]
        for n in self.nodes:
            lines.append(f"  {n.name:8s} {n.ip:15s} rails {n.rail_a:15s} {n.rail_b:15s} container {n.container}")
        lines += [f"  ssh key      {self.ssh.private_key}", f"  known_hosts  {self.ssh.known_hosts}",
                  f"  ssh config   {self.ssh.ssh_config}   (ssh -F {self.ssh.ssh_config} spark1)",
                  f"  engine image {', '.join(images.ENGINE_IMAGES)} (one TEST DOUBLE image) loaded on every node",
                  f"  packaged images {', '.join(self.packaged_images)} (REAL registry packages) loaded on every node"]
        if self.timings:
            lines.append("  timings      " + ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()))
        return "\n".join(lines)

    def to_json(self) -> dict:
        d = {"name": self.name, "network": self.network, "subnet": self.subnet,
             "rail_networks": list(self.rail_networks), "rail_subnets": list(self.rail_subnets),
             "nodes": [asdict(n) for n in self.nodes], "node_image": self.node_image,
             "engine_image": self.engine_image, "engine_images": list(images.ENGINE_IMAGES),
             "packaged_images": list(self.packaged_images), "timings": self.timings}
        d["ssh"] = self.ssh.to_json()
        return d


# ----------------------------------------------------------------------------- docker side ----
def ssh_info(name: str = DEFAULT_CLUSTER) -> SshInfo:
    nodes = inventory.nodes(name)
    if not nodes:
        raise SimError(f"cluster {name!r} does not exist (python -m sim create --name {name})")
    key, kh, cfg = ssh_paths(name)
    text = cfg.read_text() if cfg.exists() else sshconfig.render_ssh_config(name, nodes, key, kh)
    return SshInfo(name, nodes, "root", key, kh, cfg, text)


def _ensure_one_network(cluster: str, network: str, subnet: str, extra: list[str]) -> None:
    net = backend.inspect(network, "network")
    if net:
        labels = net.get("Labels") or {}
        subnets = [c.get("Subnet") for c in (net.get("IPAM") or {}).get("Config") or []]
        if labels.get(LABEL_CLUSTER) != cluster or subnet not in subnets:
            raise SimError(f"network {network} exists but is not this cluster's "
                           f"(labels {labels}, subnets {subnets}); remove it or pick another --name/--subnet")
        return
    sn = ipaddress.ip_network(subnet)
    r = backend.docker("network", "create", "--driver", "bridge", "--subnet", subnet, "--gateway",
                       str(sn.network_address + 1), "--ip-range", str(ipaddress.ip_network(f"{sn.network_address + 128}/25")),
                       "--label", f"{LABEL_CLUSTER}={cluster}", *extra, network, check=False)
    if r.returncode != 0 and "already exists" not in r.stderr:
        raise SimError(f"cannot create network {network} ({subnet}): {r.stderr.strip()}")


def _ensure_network(p: ClusterPlan) -> None:
    """The management network, then the two rails: internal (no NAT, no default route), MTU 9000."""
    _ensure_one_network(p.name, p.network, p.subnet, [])
    for letter, net, sub in zip(RAIL_LETTERS, p.rail_networks, p.rail_subnets):
        _ensure_one_network(p.name, net, sub, ["--internal", "-o", f"com.docker.network.driver.mtu={RAIL_MTU}",
                                               "--label", f"{LABEL_RAIL}={letter}"])


def docker_volume(cluster: str, index: int) -> str:
    """The node's /var/lib/docker: a named volume kept by `delete` (unless purged), so the next cluster of
    that name starts with the engine and gateway images already loaded; everything else in it is reset at
    create (sim.nodeimages.reset_inner)."""
    return f"dspark-sim-{cluster}-node{index}-docker"


def _node_tar(pubkey: str, model: dict | None = None) -> bytes:
    files = {"root/.ssh/authorized_keys": (pubkey.encode(), 0o600)}
    if model is not None:
        files[fab.MODEL_PATH.lstrip("/")] = (fab.dumps(model).encode(), 0o644)
    return images.files_tar(files)


def _create_node(p: ClusterPlan, n: NodeInfo, image: str, pubkey: str) -> None:
    args = ["create", "--name", n.container, "--hostname", n.name,
            "--network", p.network, "--ip", n.ip,
            "--label", f"{LABEL_CLUSTER}={p.name}", "--label", f"{LABEL_NODE}={n.index}",
            "--label", f"{LABEL_IP}={n.ip}", "--label", f"{NS}.role={'head' if n.index == 1 else 'worker'}",
            "--label", f"{LABEL_RAIL_IPS[0]}={n.rail_a}", "--label", f"{LABEL_RAIL_IPS[1]}={n.rail_b}",
            "--label", f"{LABEL_VERSION}={images.SIM_VERSION}",
            "--cap-add", "ALL", "--cap-drop", "SYS_RESOURCE",
            "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "--security-opt", "systempaths=unconfined",
            "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "-v", f"{docker_volume(p.name, n.index)}:/var/lib/docker",
            "--tmpfs", "/run:rw,exec,mode=755,size=512m",
            # a Spark's /dev/shm is a large tmpfs; docker's 64 MiB default starves Ray's object store
            # (ranks share the node's IPC namespace: ipc_mode host)
            "--shm-size", "1g",
            "--restart", "no", "--stop-timeout", "30", "-t"]
    if Path("/lib/modules").is_dir():
        args += ["-v", "/lib/modules:/lib/modules:ro"]
    backend.docker(*args, image)
    # the data-plane twins; the node renames every interface by the address it holds (sim-fabric boot)
    for net, ip in zip(p.rail_networks, n.rail_ips):
        backend.docker("network", "connect", "--ip", ip, net, n.container)
    # authorized key + one parent dir with 0700, the link model; checkpoint and /srv/engram (same everywhere)
    backend.docker("cp", "-", f"{n.container}:/", input=_node_tar(pubkey, node_fabric(n)))
    backend.docker("cp", "-", f"{n.container}:/", input=images.checkpoint_tar())
    backend.docker("start", n.container)


def _sshd_banner(ip: str, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _wait_node(n: NodeInfo, timeout: float = 180.0) -> dict:
    """Wait in layers: container running -> sshd banner -> docker info inside; returns timings."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    marks = {}
    layer = "container running"

    def fail(reason: str):
        raise SimError(f"node {n.name} ({n.container}, {n.ip}): {reason} while waiting for {layer}\n"
                       f"--- last log lines of {n.container} ---\n{backend.logs_tail(n.container, 25)}")

    while True:
        st = (backend.inspect(n.container) or {}).get("State", {})
        if st.get("Running"):
            break
        if st.get("Status") in ("exited", "dead"):
            fail(f"container {st.get('Status')} (exit code {st.get('ExitCode')})")
        if time.monotonic() > deadline:
            fail("timeout")
        time.sleep(0.3)
    marks["running"] = time.monotonic() - t0
    layer = "sshd banner on :22"
    while not _sshd_banner(n.ip):
        if time.monotonic() > deadline:
            fail("timeout")
        time.sleep(0.5)
    marks["sshd"] = time.monotonic() - t0
    layer = "fabric applied (sim-fabric boot)"
    r = backend.exec_in(n.container, "test", "-f", fab.READY, timeout=30)
    if r.returncode != 0:
        fl = backend.exec_in(n.container, "tail", "-n", "15", fab.LOG).stdout
        fail(f"sim-fabric boot did not finish\n--- {fab.LOG} ---\n{fl}")
    layer = "docker info inside the node"
    while True:
        r = backend.exec_in(n.container, "docker", "info", "--format", "{{.ServerVersion}}", timeout=30)
        if r.returncode == 0:
            break
        st = (backend.inspect(n.container) or {}).get("State", {})
        if not st.get("Running"):
            fail("container stopped")
        if time.monotonic() > deadline:
            dl = backend.exec_in(n.container, "tail", "-n", "15", "/var/log/dockerd.log").stdout
            fail(f"timeout ({r.stderr.strip()})\n--- dockerd.log ---\n{dl}")
        time.sleep(1)
    marks["docker"] = time.monotonic() - t0
    return marks


def _healthy_quick(nodes: list[NodeInfo]) -> bool:
    for n in nodes:
        st = (backend.inspect(n.container) or {}).get("State", {})
        if not st.get("Running") or not _sshd_banner(n.ip):
            return False
    return True


def _create(name: str = DEFAULT_CLUSTER, nodes: int = 3, subnet: str | None = None, log=print,
           timeout: float = 240.0, retain: bool = False) -> ClusterInfo:
    """Create (or return the existing healthy) cluster; all or nothing unless ``retain``."""
    p = plan(name, nodes, subnet)
    ok, why = backend.engine_available()
    if not ok:
        raise SimError(f"no docker engine: {why} (run .ci/sim-setup)")
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    existing = inventory.nodes(name)
    stale = {c: v for c, v in inventory.versions(name).items() if v != images.SIM_VERSION} if existing else {}
    if stale:
        found = ", ".join(f"{c} v{v or '?'}" for c, v in sorted(stale.items()))
        log(f"cluster {name!r} was built by another sim version ({found}; this is v{images.SIM_VERSION}): "
            "deleting and re-creating it")
        _delete(name, log=log)
        existing = []
    if existing:
        if [n.index for n in existing] != [n.index for n in p.nodes] or \
                [(n.ip, n.rail_ips) for n in existing] != [(n.ip, n.rail_ips) for n in p.nodes]:
            raise SimError(f"cluster {name!r} exists with nodes {[n.name + '@' + n.ip for n in existing]}, "
                           f"not the requested {nodes} in {p.subnet}; run `python -m sim delete --name {name}`")
        key, kh, cfg = ssh_paths(name)
        if _healthy_quick(existing) and key.exists() and kh.exists() and cfg.exists():
            log(f"cluster {name!r} exists and is healthy")
            sshi = ssh_info(name)
        else:
            log(f"cluster {name!r} exists but is not healthy: starting nodes and re-checking")
            if not key.exists():
                raise SimError(f"cluster {name!r} exists but its ssh key {key} is gone; delete and re-create it")
            for n in existing:
                backend.docker("start", n.container, check=False)
            parallel(lambda n: _wait_node(n, timeout), existing)
            sshi = sshconfig.finish(name, existing, log)
        # engine images built after the cluster was created (e.g. vllm-sim) and the gateway image reach its
        # nodes too
        images.ensure_engine_image(log)
        tar = images.engine_image_tar(log)
        want_id = backend.image_id(images.ENGINE_IMAGE)
        packaged = nodeimages.packaged_tars(log)
        t2 = time.monotonic()
        res = parallel(lambda n: (_wait_node(n, timeout), nodeimages.load_engine_image(n, tar, want_id))[1],
                       existing)
        timings["engine_image_load"] = time.monotonic() - t2
        log(f"  {', '.join(images.ENGINE_IMAGES)}: " + ", ".join(f"{n.name} {r}" for n, r in zip(existing, res)))
        nodeimages.load_packaged(existing, packaged, timings, log)
        timings["total"] = time.monotonic() - t0
        return ClusterInfo(name, p.network, p.subnet, existing, sshi, images.node_image_tag(), timings=timings,
                           rail_networks=p.rail_networks, rail_subnets=p.rail_subnets)

    node_image = images.ensure_node_image(log)
    images.ensure_engine_image(log)
    tar = images.engine_image_tar(log)
    want_id = backend.image_id(images.ENGINE_IMAGE)
    packaged = nodeimages.packaged_tars(log)
    timings["images"] = time.monotonic() - t0
    try:
        key = sshconfig.ensure_key(name)
        pub = key.with_suffix(".pub").read_text()
        _ensure_network(p)
        t1 = time.monotonic()
        log(f"creating {nodes} node(s) on {p.network} ({p.subnet}), rails {', '.join(p.rail_subnets)}")
        parallel(lambda n: _create_node(p, n, node_image, pub), p.nodes)
        marks = parallel(lambda n: _wait_node(n, timeout), p.nodes)
        timings["nodes_ready"] = time.monotonic() - t1
        for n, m in zip(p.nodes, marks):
            log(f"  {n.name} {n.ip}: running {m['running']:.1f}s, sshd {m['sshd']:.1f}s, docker {m['docker']:.1f}s")
        t2 = time.monotonic()
        parallel(nodeimages.reset_inner, p.nodes)
        res = parallel(lambda n: nodeimages.load_engine_image(n, tar, want_id), p.nodes)
        timings["engine_image_load"] = time.monotonic() - t2
        log(f"  {', '.join(images.ENGINE_IMAGES)}: " + ", ".join(f"{n.name} {r}" for n, r in zip(p.nodes, res)))
        nodeimages.load_packaged(p.nodes, packaged, timings, log)
        t3 = time.monotonic()
        sshi = sshconfig.finish(name, p.nodes, log)
        timings["ssh"] = time.monotonic() - t3
    except BaseException:
        if not retain:
            log(f"create failed: deleting cluster {name!r} (pass retain=True to keep it)")
            try:
                _delete(name, log=log)
            except Exception as e:  # keep the original error
                log(f"cleanup failed: {e}")
        raise
    timings["total"] = time.monotonic() - t0
    return ClusterInfo(name, p.network, p.subnet, p.nodes, sshi, node_image, timings=timings,
                       rail_networks=p.rail_networks, rail_subnets=p.rail_subnets)


def _delete(name: str = DEFAULT_CLUSTER, log=print, purge: bool = False) -> None:
    """Idempotent: remove nodes, the network and ssh state; the nodes' docker engines (docker_volume) stay
    unless `purge`."""
    rows = backend.containers_by_label(LABEL_CLUSTER, name)
    ids = [r["ID"] for r in rows]
    if ids:
        backend.docker("rm", "-f", "-v", *ids, timeout=300)
        log(f"removed {len(ids)} node container(s) of {name!r}")
    if purge:
        prefix = docker_volume(name, 0)[:-len("0-docker")]
        kept = [v for v in backend.docker("volume", "ls", "-q", timeout=60).stdout.split() if v.startswith(prefix)]
        if kept:
            backend.docker("volume", "rm", "-f", *kept, timeout=300)
            log(f"removed {len(kept)} node engine volume(s) of {name!r}")
    for net in backend.networks_by_label(LABEL_CLUSTER, name):
        backend.docker("network", "rm", net, check=False)
        log(f"removed network {net}")
    sshconfig.uninstall_ssh_include(name)
    d = inventory.state_dir(name)
    if d.exists():
        shutil.rmtree(d)


def _stop_node(name: str, node: str, log=print, timeout: int = 30) -> None:
    n = inventory.node(name, node)
    backend.docker("stop", "-t", str(timeout), n.container, timeout=timeout + 60)
    log(f"stopped {n.name} ({n.container})")


def _start_node(name: str, node: str, log=print, timeout: float = 180.0) -> dict:
    """Start a stopped node; its filesystem, inner images and volumes are kept."""
    n = inventory.node(name, node)
    backend.docker("start", n.container)
    marks = _wait_node(n, timeout)
    _, kh, cfg = ssh_paths(name)
    r = ssh_check(cfg, n)
    if r.returncode != 0:
        raise SimError(f"{n.name} started but ssh fails: {r.stderr.strip()}")
    log(f"started {n.name} ({n.container}): sshd {marks['sshd']:.1f}s, docker {marks['docker']:.1f}s")
    return marks


def status(name: str = DEFAULT_CLUSTER) -> dict:
    nodes = inventory.nodes(name)
    _, _, cfg = ssh_paths(name)

    def one(n: NodeInfo) -> dict:
        st = (backend.inspect(n.container) or {}).get("State", {})
        d = {"node": n.name, "ip": n.ip, "rail_a": n.rail_a, "rail_b": n.rail_b, "container": n.container,
             "state": st.get("Status", "missing"), "ssh": False, "docker": False, "engine_image": False,
             "packaged_images": False, "fabric": None}
        if st.get("Running"):
            d["ssh"] = cfg.exists() and ssh_check(cfg, n, timeout=15).returncode == 0
            d["docker"] = backend.exec_in(n.container, "docker", "info", "--format", "{{.ServerVersion}}",
                                          timeout=30).returncode == 0
            d["engine_image"] = d["docker"] and backend.exec_in(
                n.container, "docker", "image", "inspect", *images.ENGINE_IMAGES, timeout=30).returncode == 0
            d["packaged_images"] = d["docker"] and backend.exec_in(
                n.container, "docker", "image", "inspect", *NODE_IMAGES[len(images.ENGINE_IMAGES):],
                timeout=30).returncode == 0
            try:
                m = inventory.fabric_model(n)
                d["fabric"] = {r["hca"]: f"{r['state']} {r['speed_mbps'] // 1000}G mtu {r['mtu']}" for r in m["rails"]}
            except SimError as e:
                d["fabric"] = {"error": str(e)}
        return d

    rows = parallel(one, nodes) if nodes else []
    healthy = bool(rows) and all(r["state"] == "running" and r["ssh"] and r["docker"] and r["engine_image"]
                                 and r["packaged_images"]
                                 for r in rows)
    return {"cluster": name, "exists": bool(nodes), "healthy": healthy, "nodes": rows}


def format_status(st: dict) -> str:
    if not st["exists"]:
        return f"cluster {st['cluster']!r}: does not exist"
    yn = lambda b: "ok" if b else "NO"  # noqa: E731
    lines = [f"cluster {st['cluster']!r}: {'healthy' if st['healthy'] else 'NOT healthy'}",
             f"  {'node':8s} {'ip':15s} {'rail a':15s} {'rail b':15s} {'container':10s} {'ssh':4s} {'docker':6s} "
             f"{' + '.join(images.ENGINE_IMAGES)}  {'gateway + monitoring':20s}  fabric"]
    for r in st["nodes"]:
        links = ", ".join(f"{k} {v}" for k, v in (r.get("fabric") or {}).items()) or "-"
        lines.append(f"  {r['node']:8s} {r['ip']:15s} {r.get('rail_a', ''):15s} {r.get('rail_b', ''):15s} "
                     f"{r['state']:10s} {yn(r['ssh']):4s} {yn(r['docker']):6s} {yn(r['engine_image']):<41s}  "
                     f"{yn(r.get('packaged_images')):<20s}  {links}")
    return "\n".join(lines)


def create(name: str = DEFAULT_CLUSTER, nodes: int = 3, subnet: str | None = None, log=print,
           timeout: float = 240.0, retain: bool = False) -> ClusterInfo:
    """Create the cluster, or return it when it already exists and is healthy (idempotent).

    All or nothing: on failure everything is deleted again unless ``retain``.
    """
    with cluster_lock(name):
        return _create(name, nodes, subnet, log, timeout, retain)


def delete(name: str = DEFAULT_CLUSTER, log=print, purge: bool = False) -> None:
    """Idempotent: remove nodes, the network and ssh state; the image and rootfs caches stay, and so do
    the nodes' docker engines (the engine image loaded: the next create is faster) unless `purge`."""
    with cluster_lock(name):
        _delete(name, log, purge)


def stop_node(name: str, node: str, log=print, timeout: int = 30) -> None:
    """``docker stop`` one node (its inner containers die with it); for fault tests."""
    with cluster_lock(name):
        _stop_node(name, node, log, timeout)


def start_node(name: str, node: str, log=print, timeout: float = 180.0) -> dict:
    """Start a stopped node and wait for sshd + inner dockerd; filesystem, inner images and
    volumes are kept."""
    with cluster_lock(name):
        return _start_node(name, node, log, timeout)
