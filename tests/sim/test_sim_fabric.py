"""Integration: the simulated ConnectX-7 fabric of a 3-node cluster (docker engine needed; see conftest).

Rails A/B are real docker networks (MTU 9000); the nodes rename their interfaces to the Spark names at
boot; /sys/class/infiniband is the node's simulated sysfs (sim/fabric.py), also inside rank containers
given /dev/infiniband (sim-runc); faults go through faults.set_rail / the CLI and are real (ip link).
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from sim_helpers import http, ssh, wait_for

from sim import cluster, fabric, faults, images
from sim.inventory import NodeInfo, SimError

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RAILS = ("enp1s0f1np1", "enP2p1s0f1np1")
HCAS = ("rocep1s0f1", "roceP2p1s0f1")

SYSFS_PROBE = r"""
import json, os
out = {}
for dev in sorted(os.listdir("/sys/class/infiniband")):
    d = f"/sys/class/infiniband/{dev}"
    p = f"{d}/ports/1"
    rd = lambda f: open(f).read().strip() if os.path.exists(f) else None
    out[dev] = {"pci": os.path.basename(os.path.realpath(f"{d}/device")), "net": os.listdir(f"{d}/device/net"),
                "state": rd(f"{p}/state"), "phys_state": rd(f"{p}/phys_state"), "gid3": rd(f"{p}/gids/3"),
                "type3": rd(f"{p}/gid_attrs/types/3"), "ndev3": rd(f"{p}/gid_attrs/ndevs/3"), "rate": rd(f"{p}/rate")}
print(json.dumps(out))
"""


def probe(info, node, in_container: bool = False) -> dict:
    cmd = "python3 -c " + shlex.quote(SYSFS_PROBE)
    if in_container:
        cmd = ("docker run --rm --network host --device /dev/infiniband:/dev/infiniband "
               f"{images.ENGINE_IMAGE} {cmd}")
    return json.loads(ssh(info, node, cmd).stdout.strip().splitlines()[-1])


def expected_probe(n: NodeInfo) -> dict:
    return {hca: {"pci": pci, "net": [nd], "state": "4: ACTIVE", "phys_state": "5: LinkUp",
                  "gid3": fabric.ipv4_gid(ip), "type3": "RoCE v2", "ndev3": nd, "rate": "200 Gb/sec (4X HDR)"}
            for hca, nd, pci, ip in zip(HCAS, RAILS, ("0000:01:00.1", "0002:01:00.1"), n.rail_ips)}


def ping(info, node, ip: str, size: int = 8972) -> subprocess.CompletedProcess:
    return ssh(info, node, f"ping -M do -s {size} -c 2 -W 2 {ip}", check=False, timeout=60)


@pytest.fixture()
def healthy_fabric(sim_cluster):
    """Every test that injects a fault leaves the fabric healthy again."""
    yield
    faults.reset_fabric(sim_cluster.name, log=lambda m: None)


# ------------------------------------------------------------------------- healthy fabric ----
def test_interfaces_have_spark_names_by_address(sim_cluster):
    for n in sim_cluster.nodes:
        links = json.loads(ssh(sim_cluster, n, "ip -j -4 addr show").stdout)
        addrs = {lk["ifname"]: [a["local"] for a in lk["addr_info"]] for lk in links}
        assert addrs["enP7s7"] == [n.ip] and addrs["enp1s0f1np1"] == [n.rail_a] and addrs["enP2p1s0f1np1"] == [n.rail_b]
        assert not [k for k in addrs if k.startswith("eth")], addrs
        out = ssh(sim_cluster, n, "ip route show default; cat /sys/class/net/enp1s0f1np1/mtu "
                                  "/sys/class/net/enP2p1s0f1np1/mtu /sys/class/net/enP7s7/mtu").stdout.split("\n")
        assert " dev enP7s7" in out[0] and out[1:4] == ["9000", "9000", "1500"]


def test_fabric_models_cli_and_status(sim_cluster):
    models = faults.fabric(sim_cluster.name)
    assert models == {n.name: cluster.node_fabric(n) for n in sim_cluster.nodes}
    r = subprocess.run([sys.executable, "-m", "sim", "fabric", "--name", sim_cluster.name, "--json"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0 and json.loads(r.stdout) == models, r.stderr
    st = cluster.status(sim_cluster.name)
    assert [(x["node"], x["rail_a"], x["rail_b"]) for x in st["nodes"]] == \
        [(n.name, n.rail_a, n.rail_b) for n in sim_cluster.nodes]
    assert st["nodes"][0]["fabric"] == {"rocep1s0f1": "ACTIVE 200G mtu 9000", "roceP2p1s0f1": "ACTIVE 200G mtu 9000"}
    assert sim_cluster.rail_subnets == cluster.rail_subnets(sim_cluster.subnet)
    nets = {n: backend_net(n) for n in sim_cluster.rail_networks}
    for name, net in nets.items():
        assert net["Internal"] and net["Options"]["com.docker.network.driver.mtu"] == "9000", net


def backend_net(name: str) -> dict:
    from sim import backend
    return backend.inspect(name, "network")


def test_sysfs_ethtool_ibdev2netdev_on_the_node(sim_cluster):
    n = sim_cluster.nodes[0]
    assert probe(sim_cluster, n) == expected_probe(n)
    out = ssh(sim_cluster, n, "ibdev2netdev; ethtool enp1s0f1np1; ethtool enP7s7; ls /dev/infiniband").stdout
    assert "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n" in out and "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)\n" in out
    assert "Settings for enp1s0f1np1:\n" in out and "\tSpeed: 200000Mb/s\n" in out and "\tLink detected: yes\n" in out
    assert "Settings for enP7s7:\n" in out and "\tSpeed: 10000Mb/s\n" in out
    assert out.split()[-3:] == ["rdma_cm", "uverbs0", "uverbs1"]
    r = ssh(sim_cluster, n, "ethtool eth0", check=False)  # the real ethtool (6.1) answers unknown names
    assert (r.returncode, r.stdout) == (75, "No data available\n")
    assert r.stderr == fabric.NO_DEVICE
    assert "Settings for lo:" in ssh(sim_cluster, n, "ethtool lo").stdout  # the real ethtool, for the rest


def test_sysfs_in_rank_containers_with_the_rdma_devices_only(sim_cluster):
    n = sim_cluster.nodes[1]
    assert probe(sim_cluster, n, in_container=True) == expected_probe(n)
    r = ssh(sim_cluster, n, f"docker run --rm --network host {images.ENGINE_IMAGE} ls /sys/class/infiniband",
            check=False)
    assert r.returncode != 0 and "No such file or directory" in r.stderr
    assert "RDMA devices: bound the node's /sys/class, /sys/devices, /sys/bus" in \
        ssh(sim_cluster, n, "cat /var/log/sim-runc.log").stdout


def test_jumbo_no_fragment_pings_on_both_rails(sim_cluster):
    nodes = sim_cluster.nodes
    for a, b in zip(nodes, nodes[1:] + nodes[:1]):
        for ip in b.rail_ips:
            r = ping(sim_cluster, a, ip)
            assert r.returncode == 0 and "2 received" in r.stdout, (a.name, ip, r.stdout, r.stderr)
    r = ping(sim_cluster, nodes[0], nodes[1].ip)  # the 10 GbE management network keeps MTU 1500
    assert r.returncode != 0 and "message too long, mtu=1500" in (r.stdout + r.stderr)


# ------------------------------------------------------------------------------- faults ----
def test_rail_down_then_reset(sim_cluster, healthy_fabric):
    n1, n2 = sim_cluster.nodes[0], sim_cluster.nodes[1]
    r = subprocess.run([sys.executable, "-m", "sim", "set-rail", n2.name, "roceP2p1s0f1", "--state", "DOWN",
                        "--name", sim_cluster.name], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "roceP2p1s0f1/enP2p1s0f1np1: state DOWN" in r.stderr, r.stderr
    assert faults.fabric(sim_cluster.name)[n2.name]["rails"][1]["state"] == "DOWN"
    out = ssh(sim_cluster, n2, "ethtool enP2p1s0f1np1; ibdev2netdev").stdout
    assert "\tSpeed: Unknown!\n" in out and "\tLink detected: no\n" in out
    assert "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Down)" in out and "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)" in out
    p = probe(sim_cluster, n2)["roceP2p1s0f1"]
    assert (p["state"], p["phys_state"], p["gid3"], p["type3"]) == ("1: DOWN", "3: Disabled", fabric.ZERO_GID, None)
    assert probe(sim_cluster, n2, in_container=True)["roceP2p1s0f1"]["state"] == "1: DOWN"  # live in containers
    assert ping(sim_cluster, n1, n2.rail_b).returncode != 0
    assert ping(sim_cluster, n1, n2.rail_a).returncode == 0  # the twin is unaffected

    faults.reset_fabric(sim_cluster.name, log=lambda m: None)
    assert probe(sim_cluster, n2) == expected_probe(n2)
    assert ping(sim_cluster, n1, n2.rail_b).returncode == 0
    assert "\tLink detected: yes\n" in ssh(sim_cluster, n2, "ethtool enP2p1s0f1np1").stdout


def test_mtu_mismatch_breaks_jumbo_pings_only(sim_cluster, healthy_fabric):
    n1, n3 = sim_cluster.nodes[0], sim_cluster.nodes[2]
    faults.set_rail(sim_cluster.name, n3.name, "enp1s0f1np1", mtu=1500, log=lambda m: None)
    assert ssh(sim_cluster, n3, "cat /sys/class/net/enp1s0f1np1/mtu").stdout.strip() == "1500"
    assert ping(sim_cluster, n1, n3.rail_a, 8972).returncode != 0   # dropped at spark3's 1500-byte netdev
    assert ping(sim_cluster, n1, n3.rail_a, 1472).returncode == 0
    r = ping(sim_cluster, n3, n1.rail_a, 8972)
    assert r.returncode != 0 and "message too long, mtu=1500" in (r.stdout + r.stderr)
    assert ping(sim_cluster, n1, n3.rail_b, 8972).returncode == 0   # rail B keeps 9000
    faults.reset_fabric(sim_cluster.name, log=lambda m: None)
    assert ping(sim_cluster, n1, n3.rail_a, 8972).returncode == 0


def test_slow_links_are_modelled(sim_cluster, healthy_fabric):
    n = sim_cluster.nodes[0]
    for rail in HCAS:  # a switch port stuck at 100G: both twins
        faults.set_rail(sim_cluster.name, n.name, rail, speed_mbps=100000, gbps=46, log=lambda m: None)
    out = ssh(sim_cluster, n, "ethtool enp1s0f1np1; ethtool enP2p1s0f1np1").stdout
    assert out.count("\tSpeed: 100000Mb/s\n") == 2 and out.count("\tLink detected: yes\n") == 2
    assert {v["rate"] for v in probe(sim_cluster, n).values()} == {"100 Gb/sec (4X EDR)"}
    m = json.loads(ssh(sim_cluster, n, f"cat {fabric.MODEL_PATH}").stdout)
    assert [(r["speed_mbps"], r["gbps"]) for r in m["rails"]] == [(100000, 46), (100000, 46)]
    m = faults.set_rail(sim_cluster.name, n.name, "rocep1s0f1", speed_mbps=200000, gbps=6.5, log=lambda m: None)
    assert m["rails"][0]["gbps"] == 6.5  # advertises 200G, carries 13 Gb/s over both twins
    assert "\tSpeed: 200000Mb/s\n" in ssh(sim_cluster, n, "ethtool enp1s0f1np1").stdout
    with pytest.raises(SimError, match="state 'UP'"):
        faults.set_rail(sim_cluster.name, n.name, "rocep1s0f1", state="UP", log=lambda m: None)


# ----------------------------------------------------------------------- NCCL in the ranks ----
PROGRAM_NCCL = {"NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
                "NCCL_SOCKET_IFNAME": "enp1s0f1np1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_DEBUG": "INFO",
                "NCCL_DEBUG_SUBSYS": "INIT,ENV"}


def nccl_in_container(info, node, env: dict) -> subprocess.CompletedProcess:
    envs = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in env.items())
    code = "import sys; from dspark_testdouble import nccl; sys.exit(nccl.rank_init(0, 2, 2))"
    return ssh(info, node, f"docker run --rm --network host --device /dev/infiniband:/dev/infiniband {envs} "
                           f"{images.ENGINE_IMAGE} python3 -c {shlex.quote(code)}", check=False)


def test_nccl_double_in_a_rank_container(sim_cluster, healthy_fabric):
    n = sim_cluster.nodes[0]
    r = nccl_in_container(sim_cluster, n, PROGRAM_NCCL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (f"{n.name}:" in r.stdout and " NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE "
            f"[RO]; OOB enp1s0f1np1:{n.rail_a}<0>\n") in r.stdout
    assert "[send] via NET/IB/0" in r.stdout and "[send] via NET/IB/1" in r.stdout

    r = nccl_in_container(sim_cluster, n, dict(PROGRAM_NCCL, NCCL_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="enP7s7"))
    assert r.returncode == 1 and "NCCL WARN Bootstrap : no socket interface found" in r.stdout
    assert "ncclInvalidUsage: This usually reflects invalid usage of NCCL library." in r.stdout
    r = nccl_in_container(sim_cluster, n, dict(PROGRAM_NCCL, GLOO_SOCKET_IFNAME="eth0"))
    assert r.returncode == 1 and "Unable to find address for: eth0" in r.stdout

    for rail in HCAS:
        faults.set_rail(sim_cluster.name, n.name, rail, state="DOWN", log=lambda m: None)
    r = nccl_in_container(sim_cluster, n, dict(PROGRAM_NCCL, NCCL_SOCKET_IFNAME="enP7s7", GLOO_SOCKET_IFNAME="enP7s7"))
    assert r.returncode == 1 and "NET/IB : No device found." in r.stdout
    assert "NCCL WARN Failed to initialize any NET plugin" in r.stdout


SG_DIST, SG_HTTP = 20100, 8898
SG_NAMES = ("simtest-fab-rank0", "simtest-fab-rank1")


def sglang_rank(info, rank: int, env: dict) -> str:
    launch = ["--model-path", "/srv/models/DS4.1", "--served-model-name", "dsv41", "--tp", "2", "--nnodes", "2",
              "--node-rank", str(rank), "--dist-init-addr", f"{info.nodes[0].rail_a}:{SG_DIST}", "--host", "0.0.0.0",
              "--port", str(SG_HTTP)]
    cmd = ["docker", "run", "-d", "--name", SG_NAMES[rank], "--network", "host", "--device",
           "/dev/infiniband:/dev/infiniband", "-v", "/srv/models:/srv/models:ro", "--restart", "no"]
    for k, v in env.items():
        cmd += ["-e", f"{k}={v}"]
    return shlex.join(cmd + [images.ENGINE_IMAGE, "python3", "-m", "sglang.launch_server", *launch])


@pytest.fixture()
def sg_pair(sim_cluster):
    pair = sim_cluster.nodes[:2]

    def clean():
        for n, name in zip(pair, SG_NAMES):
            ssh(sim_cluster, n, f"docker rm -f {name} >/dev/null 2>&1 || true", check=False)
    clean()
    yield pair
    clean()


def state(info, node, name) -> str:
    return ssh(info, node, f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {name}",
               check=False).stdout.strip()


def test_sglang_double_inits_nccl_over_both_rails(sim_cluster, sg_pair):
    n0, n1 = sg_pair
    for rank, n in enumerate(sg_pair):
        ssh(sim_cluster, n, sglang_rank(sim_cluster, rank, PROGRAM_NCCL))
    base = f"http://{n0.ip}:{SG_HTTP}"
    logs = lambda n, name: ssh(sim_cluster, n, f"docker logs {name} 2>&1", check=False).stdout  # noqa: E731
    assert wait_for(lambda: http(base + "/health")[0] == 200, 60), logs(n0, SG_NAMES[0]) + logs(n1, SG_NAMES[1])
    for n, name in zip(sg_pair, SG_NAMES):
        out = logs(n, name)
        assert (f"NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:{n.rail_a}<0>"
                in out), out
        assert "via NET/IB/0" in out and "NCCL communicator ready" in out


def test_sglang_double_dies_on_a_bad_gid_index(sim_cluster, sg_pair):
    n0, n1 = sg_pair
    ssh(sim_cluster, n0, sglang_rank(sim_cluster, 0, PROGRAM_NCCL))
    ssh(sim_cluster, n1, sglang_rank(sim_cluster, 1, dict(PROGRAM_NCCL, NCCL_IB_GID_INDEX="7", NCCL_DEBUG="WARN")))
    st1 = wait_for(lambda: (s := state(sim_cluster, n1, SG_NAMES[1])).startswith("exited") and s, 60)
    out1 = ssh(sim_cluster, n1, f"docker logs {SG_NAMES[1]} 2>&1").stdout
    assert st1 == "exited 1", out1
    assert "NCCL WARN Call to ibv_modify_qp failed with 22 Invalid argument, on dev rocep1s0f1:1" in out1
    assert "local GID index 7" in out1 and "unhandled system error" in out1
    st0 = wait_for(lambda: (s := state(sim_cluster, n0, SG_NAMES[0])).startswith("exited") and s, 60)
    assert st0 and st0 != "exited 0", st0
    assert "lost rank 1" in ssh(sim_cluster, n0, f"docker logs {SG_NAMES[0]} 2>&1").stdout


# ----------------------------------------------------------------------- restart (last) ----
def test_fabric_survives_a_node_restart(sim_cluster, healthy_fabric):
    n = sim_cluster.nodes[2]
    faults.set_rail(sim_cluster.name, n.name, "enP2p1s0f1np1", mtu=4000, log=lambda m: None)
    cluster.stop_node(sim_cluster.name, n.name, log=lambda m: None)
    m = faults.set_rail(sim_cluster.name, n.name, "rocep1s0f1", state="DOWN", log=lambda m: None)  # while stopped
    assert m["rails"][0]["state"] == "DOWN"
    cluster.start_node(sim_cluster.name, n.name, log=lambda m: None)
    links = {lk["ifname"]: lk for lk in json.loads(ssh(sim_cluster, n, "ip -j addr show").stdout)}
    assert {"enP7s7", "enp1s0f1np1", "enP2p1s0f1np1"} <= set(links)
    assert links["enP2p1s0f1np1"]["mtu"] == 4000 and "UP" not in links["enp1s0f1np1"]["flags"]
    assert probe(sim_cluster, n)["rocep1s0f1"]["state"] == "1: DOWN"
    faults.reset_fabric(sim_cluster.name, log=lambda m: None)
    assert probe(sim_cluster, n) == expected_probe(n)
    assert ping(sim_cluster, sim_cluster.nodes[0], n.rail_a).returncode == 0
