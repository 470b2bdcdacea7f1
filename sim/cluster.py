"""Library API of the simulated DGX Spark cluster (dspark-sim).

Each node is a container ``<cluster>-spark<i>`` (hostname ``spark<i>``) on a private management network
``dspark-<cluster>`` with a fixed IP ``<subnet>.1<i>``, running sshd and its own docker engine, and on two
data-plane networks (the ConnectX-7 twins, MTU 9000, internal): rail A ``dspark-<cluster>-rail-a``
(``10.X.1.0/24``) and rail B ``dspark-<cluster>-rail-b`` (``10.X.2.0/24``), X = the management subnet's
third octet, node i at ``.1i`` on each. The node's link model is ``/etc/dspark-sim/fabric.json``
(``sim.fabric``; faults: ``set_rail``, ``reset_fabric``).
State outside docker is only the per-cluster ssh material under
``~/.local/state/deepseek-spark-sim/<cluster>/`` (``id_ed25519``, ``known_hosts``, ``ssh_config``);
everything else is rebuilt from docker labels and the nodes' fabric models.
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import backend, images
from . import fabric as fab
from .backend import LABEL_CLUSTER, LABEL_IP, LABEL_NODE, NS

LABEL_VERSION = f"{NS}.version"
LABEL_RAIL_IPS = (f"{NS}.rail-a-ip", f"{NS}.rail-b-ip")
LABEL_RAIL = f"{NS}.rail"
RAIL_LETTERS = ("a", "b")
RAIL_MTU = 9000

DEFAULT_CLUSTER = "sim"
DEFAULT_SUBNET = "172.30.99.0/24"
MAX_NODES = 9
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")
INCLUDE_BEGIN = "# BEGIN dspark-sim {name}"
INCLUDE_END = "# END dspark-sim {name}"


class SimError(RuntimeError):
    pass


# ------------------------------------------------------------------------------- pure parts ----
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


def plan(name: str = DEFAULT_CLUSTER, nodes: int = 3, subnet: str | None = None) -> ClusterPlan:
    """Names and addresses of a cluster; validates everything and reports all errors at once."""
    errors = []
    if not NAME_RE.match(name or ""):
        errors.append(f"cluster name {name!r} must match {NAME_RE.pattern}")
    if not 1 <= nodes <= MAX_NODES:
        errors.append(f"nodes={nodes} must be within 1..{MAX_NODES}")
    try:
        net = ipaddress.ip_network(subnet or DEFAULT_SUBNET)
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


def state_dir(name: str) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "deepseek-spark-sim" / name


def _tilde(p: Path) -> str:
    """Render a path with ``~`` when it is under the home directory (ssh expands it)."""
    try:
        rel = Path(p).resolve().relative_to(Path.home().resolve())
        s = f"~/{rel.as_posix()}"
    except ValueError:
        s = str(p)
    return f'"{s}"' if " " in s else s


def render_ssh_config(cluster: str, nodes: list[NodeInfo], key_path: Path, known_hosts: Path,
                      user: str = "root") -> str:
    lines = [f"# dspark-sim cluster {cluster!r}: SIMULATED DGX Spark nodes (generated by `python -m sim`)",
             "# use: ssh -F <this file> spark1   or   Include it from ~/.ssh/config", ""]
    for n in nodes:
        lines += [
            f"Host {n.name} {cluster}-{n.name} {n.ip}",
            f"    HostName {n.ip}",
            f"    User {user}",
            "    Port 22",
            f"    IdentityFile {_tilde(key_path)}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {_tilde(known_hosts)}",
            "    StrictHostKeyChecking yes",
            "    LogLevel ERROR",
            "",
        ]
    return "\n".join(lines)


def render_known_hosts(cluster: str, entries: list[tuple[NodeInfo, list[str]]]) -> str:
    """``entries``: (node, host public key lines as in ``/etc/ssh/ssh_host_*_key.pub``)."""
    out = []
    for node, keys in entries:
        names = f"{node.ip},{node.name},{cluster}-{node.name}"
        for k in keys:
            parts = k.split()
            if len(parts) >= 2:
                out.append(f"{names} {parts[0]} {parts[1]}")
    return "\n".join(out) + "\n"


def add_include_block(config_text: str, cluster: str, include_path: str) -> str:
    """Put our keyed Include block first (Include must precede any Host/Match block)."""
    text = remove_include_block(config_text, cluster)
    block = f"{INCLUDE_BEGIN.format(name=cluster)}\nInclude {include_path}\n{INCLUDE_END.format(name=cluster)}\n"
    return block + text


def remove_include_block(config_text: str, cluster: str) -> str:
    begin, end = INCLUDE_BEGIN.format(name=cluster), INCLUDE_END.format(name=cluster)
    out, skipping = [], False
    for line in config_text.splitlines(keepends=True):
        if line.rstrip("\n") == begin:
            skipping = True
            continue
        if skipping:
            if line.rstrip("\n") == end:
                skipping = False
            continue
        out.append(line)
    return "".join(out)


@dataclass
class SshInfo:
    cluster: str
    nodes: list[NodeInfo]
    user: str
    private_key: Path
    known_hosts: Path
    ssh_config: Path
    ssh_config_text: str

    def ssh_opts(self) -> list[str]:
        """What a tool that shells out to ssh needs (e.g. pulumi-docker ``ssh_opts``)."""
        return ["-i", str(self.private_key), "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes"]

    def host_keys(self) -> dict[str, str]:
        """ip -> ``ssh-ed25519 AAAA...`` from known_hosts (for tools that pin one host key)."""
        keys: dict[str, str] = {}
        if self.known_hosts.exists():
            for line in self.known_hosts.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[1] == "ssh-ed25519":
                    keys[parts[0].split(",")[0]] = f"{parts[1]} {parts[2]}"
        return keys

    def to_json(self) -> dict:
        hk = self.host_keys()
        return {
            "cluster": self.cluster,
            "nodes": [{"name": n.name, "host": n.ip, "user": self.user, "port": 22, "container": n.container,
                       "host_key": hk.get(n.ip)} for n in self.nodes],
            "private_key": str(self.private_key),
            "public_key": str(self.private_key) + ".pub",
            "known_hosts": str(self.known_hosts),
            "ssh_config": str(self.ssh_config),
            "ssh_opts": self.ssh_opts(),
        }


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
def _row_labels(row: dict) -> dict:
    return dict(kv.split("=", 1) for kv in row.get("Labels", "").split(",") if "=" in kv)


def _nodes_from_docker(name: str) -> list[NodeInfo]:
    rows = backend.containers_by_label(LABEL_CLUSTER, name)
    nodes = []
    for row in rows:
        labels = _row_labels(row)
        i = int(labels.get(LABEL_NODE, "0"))
        nodes.append(NodeInfo(f"spark{i}", i, labels.get(LABEL_IP, ""), row["Names"].split(",")[0],
                              labels.get(LABEL_RAIL_IPS[0], ""), labels.get(LABEL_RAIL_IPS[1], "")))
    return sorted(nodes, key=lambda n: n.index)


def _versions_from_docker(name: str) -> dict[str, str]:
    """container -> its sim version label (``""`` for nodes built before versions were labelled)."""
    return {row["Names"].split(",")[0]: _row_labels(row).get(LABEL_VERSION, "")
            for row in backend.containers_by_label(LABEL_CLUSTER, name)}


def _ssh_paths(name: str) -> tuple[Path, Path, Path]:
    d = state_dir(name)
    return d / "id_ed25519", d / "known_hosts", d / "ssh_config"


def ssh_info(name: str = DEFAULT_CLUSTER) -> SshInfo:
    nodes = _nodes_from_docker(name)
    if not nodes:
        raise SimError(f"cluster {name!r} does not exist (python -m sim create --name {name})")
    key, kh, cfg = _ssh_paths(name)
    text = cfg.read_text() if cfg.exists() else render_ssh_config(name, nodes, key, kh)
    return SshInfo(name, nodes, "root", key, kh, cfg, text)


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _ensure_key(name: str) -> Path:
    key, _, _ = _ssh_paths(name)
    key.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(key.parent, 0o700)
    if not key.exists() or not key.with_suffix(".pub").exists():
        for p in (key, key.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"dspark-sim-{name}", "-f", str(key)],
                       check=True)
    return key


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
    create."""
    return f"dspark-sim-{cluster}-node{index}-docker"


# What create removes from a node's kept engine: every container, volume, network and build cache, and
# every image but the engine images and the gateway image (a node then holds what a fresh one would).
RESET_INNER = (
    "docker ps -aq | xargs -r docker rm -f -v >/dev/null; "
    "docker volume ls -q | xargs -r docker volume rm -f >/dev/null; "
    "docker network prune -f >/dev/null; docker builder prune -af >/dev/null 2>&1; "
    "keep=$(docker image inspect --format '{{.Id}}' %s 2>/dev/null | sort -u); "
    "for id in $(docker image ls -aq --no-trunc | sort -u); do "
    "echo \"$keep\" | grep -qx \"$id\" || docker rmi -f \"$id\" >/dev/null 2>&1 || true; done; "
    "docker image ls --format '{{.Repository}}:{{.Tag}}' | grep -vxF -e %s | xargs -r docker rmi >/dev/null 2>&1 || true"
)


NODE_IMAGES = (*images.ENGINE_IMAGES, *(i.name for i in images.PACKAGED))  # every image name a fresh node holds


def _reset_inner(n: NodeInfo) -> None:
    names = " ".join(NODE_IMAGES)
    flags = " -e ".join(NODE_IMAGES)
    r = backend.exec_in(n.container, "sh", "-c", RESET_INNER % (names, flags), timeout=300)
    if r.returncode != 0:
        raise SimError(f"{n.name}: resetting its kept docker engine failed: {(r.stderr or r.stdout).strip()}")


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


def _host_keys(n: NodeInfo) -> list[str]:
    r = backend.exec_in(n.container, "sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub", check=True)
    return [line for line in r.stdout.splitlines() if line.strip()]


def _load_image(n: NodeInfo, names: tuple[str, ...], tar: Path, want_id: str) -> str:
    """``docker load`` the tar (one image under ``names``) on the node unless every name is current."""
    r = backend.exec_in(n.container, "docker", "image", "inspect", "--format", "{{.Id}}", *names)
    if r.returncode == 0 and r.stdout.split() == [want_id] * len(names):
        return "present"
    with open(tar, "rb") as f:
        pr = subprocess.run([backend.docker_bin(), "exec", "-i", n.container, "docker", "load"], stdin=f,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    if pr.returncode != 0:
        raise SimError(f"docker load on {n.name} failed: {pr.stderr.decode(errors='replace').strip()}")
    return "loaded"


def _load_engine_image(n: NodeInfo, tar: Path, want_id: str) -> str:
    """Load the engine image (all names in ``images.ENGINE_IMAGES``) unless every name is current."""
    return _load_image(n, images.ENGINE_IMAGES, tar, want_id)


def _packaged_tars(log) -> list[tuple[images.PackagedImage, Path, str]]:
    """Every packaged image built (or cached), with its tar and image ID."""
    out = []
    for img in images.PACKAGED:
        images.ensure_packaged(img, log)
        out.append((img, images.packaged_tar(img, log), backend.image_id(img.name)))
    return out


def _load_packaged(nodes: list[NodeInfo], tars: list[tuple[images.PackagedImage, Path, str]], timings: dict,
                   log) -> None:
    """Load each packaged image on every node unless it is current there."""
    for img, tar, want_id in tars:
        t = time.monotonic()
        res = _parallel(lambda n: _load_image(n, (img.name,), tar, want_id), nodes)
        timings[f"{img.rootfs.kind}_image_load"] = time.monotonic() - t
        log(f"  {img.name}: " + ", ".join(f"{n.name} {r}" for n, r in zip(nodes, res)))


def _ssh_check(cfg: Path, n: NodeInfo, cmd: str = "true", timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", n.name, cmd],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def _parallel(fn, items, workers: int | None = None) -> list:
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


def _finish(name: str, nodes: list[NodeInfo], log) -> SshInfo:
    """Write known_hosts (from the nodes' real host keys) + ssh_config and prove ssh works."""
    key, kh, cfg = _ssh_paths(name)
    keys = _parallel(_host_keys, nodes)
    _write_atomic(kh, render_known_hosts(name, list(zip(nodes, keys))), 0o644)
    text = render_ssh_config(name, nodes, key, kh)
    _write_atomic(cfg, text, 0o644)
    deadline = time.monotonic() + 30

    def check(n: NodeInfo):
        while True:
            r = _ssh_check(cfg, n)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise SimError(f"ssh to {n.name} ({n.ip}) with the sim key failed: {r.stderr.strip()}")
            time.sleep(1)

    _parallel(check, nodes)
    return SshInfo(name, nodes, "root", key, kh, cfg, text)


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
    existing = _nodes_from_docker(name)
    stale = {c: v for c, v in _versions_from_docker(name).items() if v != images.SIM_VERSION} if existing else {}
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
        key, kh, cfg = _ssh_paths(name)
        if _healthy_quick(existing) and key.exists() and kh.exists() and cfg.exists():
            log(f"cluster {name!r} exists and is healthy")
            sshi = ssh_info(name)
        else:
            log(f"cluster {name!r} exists but is not healthy: starting nodes and re-checking")
            if not key.exists():
                raise SimError(f"cluster {name!r} exists but its ssh key {key} is gone; delete and re-create it")
            for n in existing:
                backend.docker("start", n.container, check=False)
            _parallel(lambda n: _wait_node(n, timeout), existing)
            sshi = _finish(name, existing, log)
        # engine images built after the cluster was created (e.g. vllm-sim) and the gateway image reach its
        # nodes too
        images.ensure_engine_image(log)
        tar = images.engine_image_tar(log)
        want_id = backend.image_id(images.ENGINE_IMAGE)
        packaged = _packaged_tars(log)
        t2 = time.monotonic()
        res = _parallel(lambda n: (_wait_node(n, timeout), _load_engine_image(n, tar, want_id))[1], existing)
        timings["engine_image_load"] = time.monotonic() - t2
        log(f"  {', '.join(images.ENGINE_IMAGES)}: " + ", ".join(f"{n.name} {r}" for n, r in zip(existing, res)))
        _load_packaged(existing, packaged, timings, log)
        timings["total"] = time.monotonic() - t0
        return ClusterInfo(name, p.network, p.subnet, existing, sshi, images.node_image_tag(), timings=timings,
                           rail_networks=p.rail_networks, rail_subnets=p.rail_subnets)

    node_image = images.ensure_node_image(log)
    images.ensure_engine_image(log)
    tar = images.engine_image_tar(log)
    want_id = backend.image_id(images.ENGINE_IMAGE)
    packaged = _packaged_tars(log)
    timings["images"] = time.monotonic() - t0
    try:
        key = _ensure_key(name)
        pub = key.with_suffix(".pub").read_text()
        _ensure_network(p)
        t1 = time.monotonic()
        log(f"creating {nodes} node(s) on {p.network} ({p.subnet}), rails {', '.join(p.rail_subnets)}")
        _parallel(lambda n: _create_node(p, n, node_image, pub), p.nodes)
        marks = _parallel(lambda n: _wait_node(n, timeout), p.nodes)
        timings["nodes_ready"] = time.monotonic() - t1
        for n, m in zip(p.nodes, marks):
            log(f"  {n.name} {n.ip}: running {m['running']:.1f}s, sshd {m['sshd']:.1f}s, docker {m['docker']:.1f}s")
        t2 = time.monotonic()
        _parallel(_reset_inner, p.nodes)
        res = _parallel(lambda n: _load_engine_image(n, tar, want_id), p.nodes)
        timings["engine_image_load"] = time.monotonic() - t2
        log(f"  {', '.join(images.ENGINE_IMAGES)}: " + ", ".join(f"{n.name} {r}" for n, r in zip(p.nodes, res)))
        _load_packaged(p.nodes, packaged, timings, log)
        t3 = time.monotonic()
        sshi = _finish(name, p.nodes, log)
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
    uninstall_ssh_include(name)
    d = state_dir(name)
    if d.exists():
        shutil.rmtree(d)


def _node_by_name(name: str, node: str) -> NodeInfo:
    for n in _nodes_from_docker(name):
        if node in (n.name, n.container, str(n.index)):
            return n
    raise SimError(f"no node {node!r} in cluster {name!r}")


def _stop_node(name: str, node: str, log=print, timeout: int = 30) -> None:
    n = _node_by_name(name, node)
    backend.docker("stop", "-t", str(timeout), n.container, timeout=timeout + 60)
    log(f"stopped {n.name} ({n.container})")


def _start_node(name: str, node: str, log=print, timeout: float = 180.0) -> dict:
    """Start a stopped node; its filesystem, inner images and volumes are kept."""
    n = _node_by_name(name, node)
    backend.docker("start", n.container)
    marks = _wait_node(n, timeout)
    _, kh, cfg = _ssh_paths(name)
    r = _ssh_check(cfg, n)
    if r.returncode != 0:
        raise SimError(f"{n.name} started but ssh fails: {r.stderr.strip()}")
    log(f"started {n.name} ({n.container}): sshd {marks['sshd']:.1f}s, docker {marks['docker']:.1f}s")
    return marks


# ------------------------------------------------------------------------------ the fabric ----
def _running(n: NodeInfo) -> bool:
    return bool((backend.inspect(n.container) or {}).get("State", {}).get("Running"))


def _read_model(n: NodeInfo) -> dict:
    """The node's link model (``docker cp`` works on a stopped node too)."""
    r = backend.docker("cp", f"{n.container}:{fab.MODEL_PATH}", "-", check=False, text=False)
    if r.returncode != 0:
        raise SimError(f"{n.name}: cannot read {fab.MODEL_PATH}: {r.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tf:
        member = tf.getmembers()[0]
        return json.loads(tf.extractfile(member).read())


def _write_model(n: NodeInfo, model: dict) -> str:
    """Write the node's model and, when it runs, apply it (sim-fabric apply); returns what happened."""
    fab.validate(model)
    backend.docker("cp", "-", f"{n.container}:/", input=images.files_tar(
        {fab.MODEL_PATH.lstrip("/"): (fab.dumps(model).encode(), 0o644)}))
    if not _running(n):
        return "written (node stopped: applied at its next boot)"
    r = backend.exec_in(n.container, "/usr/local/sbin/sim-fabric", "apply", timeout=60)
    if r.returncode != 0:
        raise SimError(f"{n.name}: sim-fabric apply failed: {(r.stderr or r.stdout).strip()}")
    return "applied"


def _set_rail(name: str, node: str, rail: str, log=print, **changes) -> dict:
    n = _node_by_name(name, node)
    try:
        model = fab.with_rail(_read_model(n), rail, **changes)
    except fab.FabricError as e:
        raise SimError(str(e)) from e
    what = _write_model(n, model)
    r = fab.find_rail(model, rail)
    log(f"{n.name} {r['hca']}/{r['netdev']}: state {r['state']}, {r['speed_mbps']} Mb/s, {r['gbps']} Gb/s, "
        f"mtu {r['mtu']}, gid_index {r['gid_index']} ({what})")
    return model


def _reset_fabric(name: str, log=print) -> dict[str, dict]:
    nodes = _nodes_from_docker(name)
    if not nodes:
        raise SimError(f"cluster {name!r} does not exist")
    out = {}
    for n in nodes:
        model = node_fabric(n)
        what = _write_model(n, model)
        out[n.name] = model
        log(f"{n.name}: fabric reset to healthy ({what})")
    return out


def fabric(name: str = DEFAULT_CLUSTER) -> dict[str, dict]:
    """Every node's link model: node name -> /etc/dspark-sim/fabric.json."""
    nodes = _nodes_from_docker(name)
    if not nodes:
        raise SimError(f"cluster {name!r} does not exist")
    return {n.name: _read_model(n) for n in nodes}


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


def status(name: str = DEFAULT_CLUSTER) -> dict:
    nodes = _nodes_from_docker(name)
    _, _, cfg = _ssh_paths(name)

    def one(n: NodeInfo) -> dict:
        st = (backend.inspect(n.container) or {}).get("State", {})
        d = {"node": n.name, "ip": n.ip, "rail_a": n.rail_a, "rail_b": n.rail_b, "container": n.container,
             "state": st.get("Status", "missing"), "ssh": False, "docker": False, "engine_image": False,
             "packaged_images": False, "fabric": None}
        if st.get("Running"):
            d["ssh"] = cfg.exists() and _ssh_check(cfg, n, timeout=15).returncode == 0
            d["docker"] = backend.exec_in(n.container, "docker", "info", "--format", "{{.ServerVersion}}",
                                          timeout=30).returncode == 0
            d["engine_image"] = d["docker"] and backend.exec_in(
                n.container, "docker", "image", "inspect", *images.ENGINE_IMAGES, timeout=30).returncode == 0
            d["packaged_images"] = d["docker"] and backend.exec_in(
                n.container, "docker", "image", "inspect", *NODE_IMAGES[len(images.ENGINE_IMAGES):],
                timeout=30).returncode == 0
            try:
                m = _read_model(n)
                d["fabric"] = {r["hca"]: f"{r['state']} {r['speed_mbps'] // 1000}G mtu {r['mtu']}" for r in m["rails"]}
            except SimError as e:
                d["fabric"] = {"error": str(e)}
        return d

    rows = _parallel(one, nodes) if nodes else []
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


@contextlib.contextmanager
def _cluster_lock(name: str):
    """Serialize create/delete/start/stop of one cluster across processes."""
    d = state_dir(name).parent
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _user_ssh_config() -> Path:
    return Path.home() / ".ssh" / "config"


def install_ssh_include(name: str = DEFAULT_CLUSTER) -> Path:
    """Add ``Include <state>/ssh_config`` (keyed block, first in the file) to ~/.ssh/config, so
    tools that run plain ``ssh`` (docker CLI ``-H ssh://``) use the sim key and known_hosts."""
    _, _, cfg = _ssh_paths(name)
    uc = _user_ssh_config()
    uc.parent.mkdir(mode=0o700, exist_ok=True)
    text = uc.read_text() if uc.exists() else ""
    _write_atomic(uc, add_include_block(text, name, _tilde(cfg)), 0o600)
    return uc


def uninstall_ssh_include(name: str = DEFAULT_CLUSTER) -> Path:
    uc = _user_ssh_config()
    if uc.exists():
        text = uc.read_text()
        new = remove_include_block(text, name)
        if new != text:
            _write_atomic(uc, new, 0o600)
    return uc


def create(name: str = DEFAULT_CLUSTER, nodes: int = 3, subnet: str | None = None, log=print,
           timeout: float = 240.0, retain: bool = False) -> ClusterInfo:
    """Create the cluster, or return it when it already exists and is healthy (idempotent).

    All or nothing: on failure everything is deleted again unless ``retain``.
    """
    with _cluster_lock(name):
        return _create(name, nodes, subnet, log, timeout, retain)


def delete(name: str = DEFAULT_CLUSTER, log=print, purge: bool = False) -> None:
    """Idempotent: remove nodes, the network and ssh state; the image and rootfs caches stay, and so do
    the nodes' docker engines (the engine image loaded: the next create is faster) unless `purge`."""
    with _cluster_lock(name):
        _delete(name, log, purge)


def set_rail(name: str, node: str, rail: str, *, state: str | None = None, speed_mbps: int | None = None,
             gbps: float | None = None, mtu: int | None = None, gid_index: int | None = None, log=print) -> dict:
    """Fault injection on one rail of one node (``rail``: hca or netdev name, e.g. ``roceP2p1s0f1`` or
    ``enP2p1s0f1np1``): rewrite the node's link model and apply it. ``state`` ACTIVE/DOWN (the netdev goes
    down: pings fail, ethtool says ``Link detected: no``, the port ``1: DOWN``, no IPv4 GIDs); ``speed_mbps``
    what ethtool and sysfs report; ``gbps`` what the ib_write_bw stand-in measures; ``mtu`` the netdev's real
    MTU; ``gid_index`` where the IPv4 RoCE v2 GID sits. Returns the node's new model."""
    with _cluster_lock(name):
        return _set_rail(name, node, rail, log=log, state=state, speed_mbps=speed_mbps, gbps=gbps, mtu=mtu,
                         gid_index=gid_index)


def reset_fabric(name: str = DEFAULT_CLUSTER, log=print) -> dict[str, dict]:
    """Every node back to the healthy model (both rails ACTIVE, 200 Gb/s, 93.5 Gb/s, MTU 9000, GID 3)."""
    with _cluster_lock(name):
        return _reset_fabric(name, log)


def hold_memory(name: str, node: str, mib: int, holder: str = "sim-memory-hold", log=print) -> int:
    """A real process named `holder` on the node, counted in its /proc/meminfo model as holding `mib`
    (sim/meminfo.py); returns its pid. Ends with release_memory or the node's next boot."""
    n = _node_by_name(name, node)
    r = backend.exec_in(n.container, "/usr/local/sbin/sim-meminfo", "hold", holder, str(mib), timeout=30)
    if r.returncode != 0:
        raise SimError(f"{n.name}: sim-meminfo hold failed: {(r.stderr or r.stdout).strip()}")
    pid = int(r.stdout.split()[0])
    log(f"{n.name}: {holder} (pid {pid}) holds {mib} MiB")
    return pid


# What nvidia-container-cli prints when a container's CUDA requirement (the image's NVIDIA_REQUIRE_CUDA) is
# above what the node's driver supports: nvidia-smi still works, so preflight passes, but the prestart hook
# refuses and the container never starts (the message of libnvidia-container's requirement check).
GPU_FAULT_DEFAULT = ("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.1, please update your "
                     "driver to a newer version, or use an earlier cuda container: unknown")


def gpu_fault(name: str, node: str, message: str | None = GPU_FAULT_DEFAULT, log=print) -> None:
    """Make (or, with `message` None, stop making) the node's GPU prestart hook stand-in refuse every container
    that asks for GPUs with `message`: `docker start` fails and the container stays `Created`. Until the
    node's next boot (/run)."""
    n = _node_by_name(name, node)
    script = 'printf "%s\\n" "$1" > /run/sim-gpu-fault' if message else "rm -f /run/sim-gpu-fault"
    r = backend.exec_in(n.container, "sh", "-c", script, "sh", message or "", timeout=30)
    if r.returncode != 0:
        raise SimError(f"{n.name}: gpu-fault failed: {(r.stderr or r.stdout).strip()}")
    log(f"{n.name}: GPU hook {'refuses: ' + message if message else 'healthy'}")


def release_memory(name: str, node: str, log=print) -> list[str]:
    n = _node_by_name(name, node)
    r = backend.exec_in(n.container, "/usr/local/sbin/sim-meminfo", "release", timeout=30)
    if r.returncode != 0:
        raise SimError(f"{n.name}: sim-meminfo release failed: {(r.stderr or r.stdout).strip()}")
    gone = r.stdout.split()
    log(f"{n.name}: released {', '.join(gone) or 'nothing'}")
    return gone


def meminfo(name: str, node: str) -> dict[str, int]:
    """The node's /proc/meminfo as it reads it (kB figures in MiB)."""
    n = _node_by_name(name, node)
    r = backend.exec_in(n.container, "cat", "/proc/meminfo", timeout=30)
    out = {}
    for line in r.stdout.splitlines():
        key, _, rest = line.partition(":")
        if rest.split() and rest.split()[0].isdigit():
            out[key.strip()] = int(rest.split()[0]) // 1024
    return out


def stop_node(name: str, node: str, log=print, timeout: int = 30) -> None:
    """``docker stop`` one node (its inner containers die with it); for fault tests."""
    with _cluster_lock(name):
        _stop_node(name, node, log, timeout)


def start_node(name: str, node: str, log=print, timeout: float = 180.0) -> dict:
    """Start a stopped node and wait for sshd + inner dockerd; filesystem, inner images and
    volumes are kept."""
    with _cluster_lock(name):
        return _start_node(name, node, log, timeout)
