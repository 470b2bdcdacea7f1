"""Pure parts of the simulator: no docker needed."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import itertools
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sim import cluster, fabric, images, inventory, rootfs, sshconfig
from sim.inventory import SimError
from sim.testdouble import engram, flags

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "sim" / "assets" / "node"


# ---------------------------------------------------------------- plan / ssh config ----
def test_plan_default_addresses():
    p = cluster.plan("sim", 4)
    assert p.network == "dspark-sim" and p.subnet == "172.30.99.0/24"
    assert [(n.name, n.ip, n.container) for n in p.nodes] == [
        ("spark1", "172.30.99.11", "sim-spark1"), ("spark2", "172.30.99.12", "sim-spark2"),
        ("spark3", "172.30.99.13", "sim-spark3"), ("spark4", "172.30.99.14", "sim-spark4")]
    assert p.ip_range == "172.30.99.128/25"  # dynamic addresses never collide with node IPs


def test_plan_reports_all_errors():
    with pytest.raises(inventory.SimError) as e:
        cluster.plan("Bad_Name", 0, "10.0.0.0/28")
    msg = str(e.value)
    assert "Bad_Name" in msg and "nodes=0" in msg and "/24" in msg


def test_state_paths_for_sim(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    key, kh, cfg = sshconfig.ssh_paths("sim")
    assert key == tmp_path / ".local/state/deepseek-spark-sim/sim/id_ed25519"
    assert kh == tmp_path / ".local/state/deepseek-spark-sim/sim/known_hosts"
    assert cfg == tmp_path / ".local/state/deepseek-spark-sim/sim/ssh_config"


def test_render_ssh_config(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    nodes = cluster.plan("sim", 2).nodes
    d = tmp_path / ".local/state/deepseek-spark-sim/sim"
    text = sshconfig.render_ssh_config("sim", nodes, d / "id_ed25519", d / "known_hosts")
    assert "Host spark1 sim-spark1 172.30.99.11\n    HostName 172.30.99.11\n    User root\n" in text
    assert "Host spark2 sim-spark2 172.30.99.12" in text
    assert text.count("IdentityFile ~/.local/state/deepseek-spark-sim/sim/id_ed25519") == 2
    assert text.count("UserKnownHostsFile ~/.local/state/deepseek-spark-sim/sim/known_hosts") == 2
    assert text.count("StrictHostKeyChecking yes") == 2
    assert str(tmp_path) not in text  # no machine-specific absolute paths


def test_render_known_hosts():
    n = cluster.plan("sim", 1).nodes
    text = sshconfig.render_known_hosts("sim", [(n[0], ["ssh-ed25519 AAAAkey root@spark1", "bogus"])])
    assert text == "172.30.99.11,spark1,sim-spark1 ssh-ed25519 AAAAkey\n"


def test_include_block_is_first_keyed_and_idempotent():
    user = "Host *\n    ServerAliveInterval 30\n"
    once = sshconfig.add_include_block(user, "sim", "~/.local/state/deepseek-spark-sim/sim/ssh_config")
    assert once.startswith("# BEGIN dspark-sim sim\nInclude ~/.local/state/deepseek-spark-sim/sim/ssh_config\n")
    assert once.endswith(user)
    assert sshconfig.add_include_block(once, "sim", "~/x") .count("BEGIN dspark-sim sim") == 1
    other = sshconfig.add_include_block(once, "simtest", "~/y")
    assert sshconfig.remove_include_block(other, "simtest") == once
    assert sshconfig.remove_include_block(once, "sim") == user


def test_ssh_info_json_shape(tmp_path):
    nodes = cluster.plan("sim", 3).nodes
    si = sshconfig.SshInfo("sim", nodes, "root", tmp_path / "id_ed25519", tmp_path / "known_hosts",
                         tmp_path / "ssh_config", "")
    j = si.to_json()
    assert j["nodes"][0] == {"name": "spark1", "host": "172.30.99.11", "user": "root", "port": 22,
                             "container": "sim-spark1", "host_key": None}
    (tmp_path / "known_hosts").write_text(sshconfig.render_known_hosts("sim", [(nodes[1], ["ssh-ed25519 AAAAk x"])]))
    assert si.to_json()["nodes"][1]["host_key"] == "ssh-ed25519 AAAAk"
    assert j["private_key"].endswith("id_ed25519") and j["known_hosts"].endswith("known_hosts")
    assert j["ssh_opts"][:2] == ["-i", str(tmp_path / "id_ed25519")]
    assert "StrictHostKeyChecking=yes" in j["ssh_opts"]


# ---------------------------------------------------------------- mirror / cache key ----
DEB822 = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822():
    assert rootfs.mirror_from_sources([DEB822]) == "http://mirror.example/debian"


def test_mirror_deb822_security_only_and_disabled():
    sec = DEB822.split("\n\n")[1]
    assert rootfs.mirror_from_sources([sec]) is None
    disabled = "Enabled: no\n" + DEB822.split("\n\n")[0]
    assert rootfs.mirror_from_sources([disabled], "deb http://one.example/debian/ bookworm main") == \
        "http://one.example/debian"


def test_mirror_from_one_line_list():
    lst = """# comment
deb http://security.example/debian-security bookworm-security main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main contrib
"""
    assert rootfs.mirror_from_sources([], lst) == "http://one.example/debian"
    assert rootfs.mirror_from_sources([], lst, suite="trixie") is None


def test_rootfs_cache_key():
    a = rootfs.RootfsSpec("node", ("python3", "sudo"))
    assert a.key() == rootfs.RootfsSpec("node", ("sudo", "python3")).key()  # order-free
    assert a.key() != rootfs.RootfsSpec("node", ("python3", "sudo", "curl")).key()
    assert a.key() != rootfs.RootfsSpec("node", ("python3", "sudo"), suite="trixie").key()
    assert len(a.key()) == 16


def test_engine_wheels_pinned_once_and_in_the_key():
    """Ray's and the SGLang router's sets together: every requirement an exact pin, each name once
    (a name shared by both sets is pinned in RAY_WHEELS only), all of it in the engine rootfs key."""
    names = [r.split("==")[0].lower().replace("_", "-") for r in rootfs.ENGINE_WHEELS]
    assert all(r.count("==") == 1 and r.split("==")[1] for r in rootfs.ENGINE_WHEELS)
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert f"sglang-router=={rootfs.ROUTER_VERSION}" in rootfs.ENGINE_ROOTFS.wheels
    assert f"ray=={rootfs.RAY_VERSION}" in rootfs.ENGINE_ROOTFS.wheels
    assert set(rootfs.ENGINE_ROOTFS.wheels) == set(rootfs.RAY_WHEELS) | set(rootfs.ROUTER_WHEELS)
    without = rootfs.RootfsSpec("engine", ("python3",), wheels=rootfs.RAY_WHEELS)
    assert rootfs.ENGINE_ROOTFS.key() != without.key()
    shuffled = rootfs.RootfsSpec("engine", ("python3",), wheels=tuple(reversed(rootfs.ENGINE_WHEELS)))
    assert rootfs.ENGINE_ROOTFS.key() == shuffled.key()  # order-free, deterministic


def test_image_tags_follow_overlay_content():
    spec = rootfs.ENGINE_ROOTFS
    ov = images.engine_overlay(spec.key())
    t1 = images.image_tag("sglang-sim", spec, ov)
    assert t1 == images.image_tag("sglang-sim", spec, images.engine_overlay(spec.key()))  # deterministic
    ov.add("opt/extra", b"x")
    assert images.image_tag("sglang-sim", spec, ov) != t1
    assert images.files_tar({"a/b": (b"1", 0o644)}) == images.files_tar({"a/b": (b"1", 0o644)})


def test_standins_are_marked():
    for name in ("sim-entrypoint", "sim-runc", "nvidia-smi", "ethtool", "ibdev2netdev",
                 "nvidia-container-runtime-hook", "sshd-sim.conf"):
        assert "SIMULATOR STAND-IN" in (ASSETS / name).read_text(), name


def _sh(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(ASSETS / script), *args], capture_output=True, text=True)


def test_nvidia_smi_standin():
    r = _sh("nvidia-smi", "-L")
    assert r.stdout.startswith("GPU 0: NVIDIA GB10 (UUID: GPU-sim-")
    assert _sh("nvidia-smi", "--query-gpu=name", "--format=csv,noheader").stdout == "NVIDIA GB10\n"
    r = _sh("nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader")
    assert r.returncode == 0 and r.stdout == ""
    assert "NVIDIA GB10" in _sh("nvidia-smi").stdout


def test_fabric_standins_hand_over_to_sim_fabric():
    for name, sub in (("ethtool", "ethtool"), ("ibdev2netdev", "ibdev2netdev")):
        assert f'exec /usr/local/sbin/sim-fabric {sub} "$@"' in (ASSETS / name).read_text()


# ---------------------------------------------------------------- stand-in launcher flags ----
def test_double_parses_the_program_command_line_with_the_real_table():
    argv = ["--model-path", "/m", "--tp", "3", "--nnodes", "3", "--node-rank", "2", "--cuda-graph-max-bs-decode", "4",
            "--enable-decoder-swa-bounded-replay", "--sleep-on-idle", "--enable-metrics"]
    a = flags.parse_args(argv)
    assert a.tp_size == 3 and a.nnodes == 3 and a.node_rank == 2 and a.model_path == "/m"  # --tp abbreviates --tp-size
    assert a.cuda_graph_max_bs_decode == 4 and a.enable_decoder_swa_bounded_replay and a.enable_metrics
    assert flags.parse_args(["--model", "/m"]).model_path == "/m"  # the real alias


@pytest.mark.parametrize("argv", [["--bogus-flag", "1"], ["--cuda-graph-max-bs", "4"], ["--tp"],
                                  ["--nnodes", "three"], ["--attention-backend", "nope"], []])
def test_flags_rejected_with_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        flags.parse_args((["--model-path", "/m"] if argv else []) + argv)
    assert e.value.code == 2
    if argv[:1] == ["--cuda-graph-max-bs"]:
        assert "ambiguous option: --cuda-graph-max-bs could match" in capsys.readouterr().err


def test_double_reads_the_real_option_tables():
    from declared import flags as program_flags

    for engine in ("sglang", "vllm"):
        table = flags.load_table(engine)
        assert table == program_flags.load_options(engine, flags.VERSIONS[engine])
        assert table["allow_abbrev"] is True


# ---------------------------------------------------------------- engram pack ----
@pytest.fixture()
def ckpt(tmp_path):
    root = tmp_path / "DS4.1"
    for rel, data in engram.checkpoint_files().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_checkpoint_layout_deterministic():
    files = engram.checkpoint_files()
    assert files == engram.checkpoint_files()
    assert {f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)} <= set(files)
    assert "config.json" in files and "engram/index.json" in files
    for layer, rows in engram.LAYER_ROWS.items():
        assert len(files[f"engram/layer{layer}.bin"]) == rows * 264


@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_pack_covers_rows_exactly(ckpt, tmp_path, tp):
    out = tmp_path / "out"
    for rank in range(tp):
        engram.pack(str(ckpt), str(out), rank, tp, log=lambda m: None)
    for layer, rows in engram.LAYER_ROWS.items():
        table = (ckpt / f"engram/layer{layer}.bin").read_bytes()
        joined = b""
        for rank in range(tp):
            f = out / f"engram-l{layer}-r{rank}of{tp}.bin"
            assert f.name == engram.shard_name(layer, rank, tp)
            data = f.read_bytes()
            lo, hi = rows * rank // tp, rows * (rank + 1) // tp
            assert len(data) == 4096 + (hi - lo) * 264 == engram.shard_size(rows, rank, tp)
            assert data[:8] == b"DSV41EN1"
            assert engram.parse_header(data) == {"layer": layer, "lo": lo, "hi": hi, "rows": hi - lo,
                                                 "record_size": 264}
            joined += data[4096:]
        assert joined == table
    assert not list(out.glob("*.partial"))


def test_pack_idempotent_and_cli(ckpt, tmp_path):
    out = tmp_path / "out"
    script = [sys.executable, "-m", "sim.testdouble.engram"]
    args = ["--model", str(ckpt), "--out", str(out), "--rank", "1", "--tp", "3", "--layers", "14"]
    r = subprocess.run(script + args, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "packed" in r.stdout and "engram-l14-r1of3.bin" in r.stdout
    f = out / "engram-l14-r1of3.bin"
    os.utime(f, (1_000_000, 1_000_000))
    r = subprocess.run(script + args, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and "skip" in r.stdout
    assert f.stat().st_mtime == 1_000_000  # untouched
    f.write_bytes(b"truncated")
    r = subprocess.run(script + args, capture_output=True, text=True, cwd=ROOT)
    assert "packed" in r.stdout and f.stat().st_size == engram.shard_size(3001, 1, 3)
    assert not (out / "engram-l1-r1of3.bin").exists()
    bad = subprocess.run(script + ["--model", str(ckpt), "--out", str(out), "--rank", "3", "--tp", "3"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2


# ---------------------------------------------------------------- stand-in server, local ----
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, key=None, data=None):
    req = urllib.request.Request(url, data=data)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def _wait(pred, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    return pred()


def test_local_group_lifecycle():
    """Two ranks on localhost: 503 before formed, API, auth, then losing the worker kills rank 0."""
    dist, http0, http1 = _free_port(), _free_port(), _free_port()
    common = ["--model-path", "/m", "--served-model-name", "dsv41", "--tp", "2", "--nnodes", "2",
              "--dist-init-addr", f"127.0.0.1:{dist}", "--host", "127.0.0.1", "--api-key", "k"]
    cmd = [sys.executable, "-m", "sim.testdouble.launch_server"]
    r0 = subprocess.Popen(cmd + common + ["--node-rank", "0", "--port", str(http0)], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    r1 = None
    try:
        base = f"http://127.0.0.1:{http0}"
        assert _wait(lambda: _get(base + "/health")[0] == 503)
        assert _get(base + "/v1/models", "k")[0] == 503
        r1 = subprocess.Popen(cmd + common + ["--node-rank", "1", "--port", str(http1)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert _wait(lambda: _get(base + "/health")[0] == 200)
        assert _get(f"http://127.0.0.1:{http1}/health")[0] == 200
        assert _get(base + "/health_generate")[0] == 200  # /health* is exempt from auth
        assert _get(base + "/v1/models") == (401, '{"error": "Unauthorized"}')
        code, body = _get(base + "/v1/models", "k")
        assert code == 200 and json.loads(body)["data"][0]["id"] == "dsv41"
        q = json.dumps({"model": "dsv41", "messages": [{"role": "user", "content": "What is 19 + 23?"}]}).encode()
        code, body = _get(base + "/v1/chat/completions", "k", q)
        j = json.loads(body)
        assert j["choices"][0]["message"]["content"] == "42" and j["choices"][0]["finish_reason"] == "stop"
        assert j["usage"]["total_tokens"] == j["usage"]["prompt_tokens"] + j["usage"]["completion_tokens"]
        assert _get(base + "/v1/chat/completions", "wrong", q)[0] == 401
        r1.kill()
        r1.wait()
        assert r0.wait(timeout=20) != 0
        out = r0.stdout.read()
        assert "joined rank 1" in out and "group formed" in out and "lost rank 1" in out
    finally:
        for p in (r0, r1):
            if p and p.poll() is None:
                p.kill()
                p.wait()


# ---------------------------------------------------------------- fabric: plan and model ----
def test_plan_rail_networks_and_addresses():
    p = cluster.plan("sim", 3)
    assert p.rail_networks == ["dspark-sim-rail-a", "dspark-sim-rail-b"]
    assert p.rail_subnets == ["10.99.1.0/24", "10.99.2.0/24"]
    assert [(n.name, n.ip, n.rail_a, n.rail_b) for n in p.nodes] == [
        ("spark1", "172.30.99.11", "10.99.1.11", "10.99.2.11"), ("spark2", "172.30.99.12", "10.99.1.12", "10.99.2.12"),
        ("spark3", "172.30.99.13", "10.99.1.13", "10.99.2.13")]
    t = cluster.plan("simtest", 2, "172.30.98.0/24")
    assert t.rail_subnets == ["10.98.1.0/24", "10.98.2.0/24"] and t.nodes[1].rail_ips == ["10.98.1.12", "10.98.2.12"]
    si = sshconfig.SshInfo("sim", p.nodes, "root", Path("/k"), Path("/kh"), Path("/c"), "")
    info = cluster.ClusterInfo("sim", p.network, p.subnet, p.nodes, si, rail_networks=p.rail_networks,
                               rail_subnets=p.rail_subnets)
    j = info.to_json()
    assert j["rail_subnets"] == ["10.99.1.0/24", "10.99.2.0/24"] and j["nodes"][0]["rail_a"] == "10.99.1.11"
    d = info.describe()
    assert "dspark-sim-rail-a (10.99.1.0/24, MTU 9000)" in d and "10.99.2.13" in d


def test_node_fabric_model_schema():
    m = cluster.node_fabric(cluster.plan("sim", 1).nodes[0])
    assert m == {
        "node": "spark1",
        "management": {"netdev": "enP7s7", "ip": "172.30.99.11", "prefix": 24, "speed_mbps": 10000},
        "rails": [
            {"hca": "rocep1s0f1", "netdev": "enp1s0f1np1", "pci": "0000:01:00.1", "ip": "10.99.1.11", "prefix": 24,
             "state": "ACTIVE", "speed_mbps": 200000, "gbps": 93.5, "mtu": 9000, "gid_index": 3},
            {"hca": "roceP2p1s0f1", "netdev": "enP2p1s0f1np1", "pci": "0002:01:00.1", "ip": "10.99.2.11", "prefix": 24,
             "state": "ACTIVE", "speed_mbps": 200000, "gbps": 93.5, "mtu": 9000, "gid_index": 3}]}
    assert json.loads(fabric.dumps(m)) == m


def test_with_rail_changes_one_rail_and_validates():
    m = fabric.node_model("spark2", "172.30.99.12", ["10.99.1.12", "10.99.2.12"])
    down = fabric.with_rail(m, "roceP2p1s0f1", state="down")
    assert [r["state"] for r in down["rails"]] == ["ACTIVE", "DOWN"] and m["rails"][1]["state"] == "ACTIVE"
    slow = fabric.with_rail(fabric.with_rail(m, "enp1s0f1np1", speed_mbps=100000, gbps=46),
                            "enP2p1s0f1np1", speed_mbps=100000, gbps=46)
    assert {(r["speed_mbps"], r["gbps"]) for r in slow["rails"]} == {(100000, 46)}
    assert fabric.with_rail(m, "rocep1s0f1", gbps=6.5)["rails"][0]["speed_mbps"] == 200000  # 13 Gb/s on 200G
    for bad, msg in (({"state": "UP"}, "state"), ({"mtu": 20}, "mtu"), ({"gbps": 250.0}, "exceeds"),
                     ({"gid_index": 4}, "gid_index"), ({"speed_mbps": 0}, "speed_mbps")):
        with pytest.raises(fabric.FabricError, match=msg):
            fabric.with_rail(m, "rocep1s0f1", **bad)
    with pytest.raises(fabric.FabricError, match="no rail 'mlx5_0'"):
        fabric.with_rail(m, "mlx5_0", state="DOWN")


def test_gids_as_sysfs_prints_them():
    assert fabric.ipv4_gid("10.99.1.11") == "0000:0000:0000:0000:0000:ffff:0a63:010b"
    assert fabric.link_local_gid("02:42:0a:63:01:0b") == "fe80:0000:0000:0000:0042:0aff:fe63:010b"
    r = dict(fabric.RAILS[0], ip="10.99.1.11", **fabric.RAIL_DEFAULTS)
    e = fabric.gid_entries(r, "02:42:0a:63:01:0b")
    assert [(i, t) for i, (_, t) in sorted(e.items())] == [(0, "IB/RoCE v1"), (1, "RoCE v2"), (2, "IB/RoCE v1"),
                                                           (3, "RoCE v2")]
    assert e[3][0] == e[2][0] == fabric.ipv4_gid("10.99.1.11")
    assert sorted(fabric.gid_entries(dict(r, state="DOWN"), "02:42:0a:63:01:0b")) == [0, 1]  # no IPv4 GIDs
    five = fabric.gid_entries(dict(r, gid_index=5), "02:42:0a:63:01:0b")
    assert five[5] == (fabric.ipv4_gid("10.99.1.11"), "RoCE v2") and five[3][0].startswith("fd00:")


MACS = {"enp1s0f1np1": "02:42:0a:63:01:0b", "enP2p1s0f1np1": "02:42:0a:63:02:0b", "enP7s7": "02:42:ac:1e:63:0b"}


def spark_root(tmp_path, model=None, devices=True, carrier=None):
    """A temporary sysfs (+ /dev) laid out as sim-fabric lays a node out for ``model``."""
    m = model or fabric.node_model("spark1", "172.30.99.11", ["10.99.1.11", "10.99.2.11"])
    root = tmp_path / "sys"
    up = {r["netdev"]: r["state"] == "ACTIVE" for r in m["rails"]}
    up["enP7s7"] = True
    netdevs = {nd: {"operstate": "up" if u else "down", "address": MACS[nd],
                    **({"carrier": 1} if u else {})} for nd, u in up.items()}
    fabric.write_tree(str(root), fabric.sysfs_tree(m, MACS), netdevs)
    dev = tmp_path / "dev"
    (dev / "infiniband").mkdir(parents=True)
    if devices:
        for i in range(len(m["rails"])):
            (dev / "infiniband" / f"uverbs{i}").write_text("")
    return m, str(root), str(dev)


def test_sysfs_tree_layout(tmp_path):
    m, root, _ = spark_root(tmp_path)
    for r in m["rails"]:
        ib = Path(root) / "class/infiniband" / r["hca"]
        assert os.path.basename(os.path.realpath(ib / "device")) == r["pci"]
        assert (ib / "device" / "net" / r["netdev"]).is_dir()
        assert (ib / "device/vendor").read_text() == "0x15b3\n"
        port = ib / "ports/1"
        assert (port / "state").read_text() == "4: ACTIVE\n" and (port / "phys_state").read_text() == "5: LinkUp\n"
        assert (port / "gids/3").read_text().strip() == fabric.ipv4_gid(r["ip"])
        assert (port / "gid_attrs/types/3").read_text() == "RoCE v2\n"
        assert (port / "gid_attrs/types/2").read_text() == "IB/RoCE v1\n"
        assert (port / "gid_attrs/ndevs/3").read_text() == r["netdev"] + "\n"
        assert (port / "gids/9").read_text().strip() == fabric.ZERO_GID
        assert len(os.listdir(port / "gids")) == fabric.GID_TABLE_LEN
        assert os.path.basename(os.path.realpath(Path(root) / "bus/pci/devices" / r["pci"])) == r["pci"]
    assert sorted(os.listdir(Path(root) / "class/infiniband")) == ["roceP2p1s0f1", "rocep1s0f1"]
    verbs = Path(root) / "class/infiniband_verbs"
    assert (verbs / "abi_version").read_text() == "6\n" and (verbs / "uverbs1/ibdev").read_text() == "roceP2p1s0f1\n"


def test_sysfs_tree_rail_down(tmp_path):
    m = fabric.with_rail(fabric.node_model("spark2", "172.30.99.12", ["10.99.1.12", "10.99.2.12"]),
                         "roceP2p1s0f1", state="DOWN")
    _, root, _ = spark_root(tmp_path, m)
    port = Path(root) / "class/infiniband/roceP2p1s0f1/ports/1"
    assert (port / "state").read_text() == "1: DOWN\n" and (port / "phys_state").read_text() == "3: Disabled\n"
    assert (port / "gids/3").read_text().strip() == fabric.ZERO_GID and not (port / "gid_attrs/types/3").exists()
    assert (port / "gid_attrs/ndevs/0").read_text() == "enP2p1s0f1np1\n"  # the link-local GIDs stay


def test_ethtool_output_from_the_model(tmp_path):
    m, root, _ = spark_root(tmp_path, fabric.with_rail(
        fabric.node_model("spark1", "172.30.99.11", ["10.99.1.11", "10.99.2.11"]), "roceP2p1s0f1", state="DOWN"))
    rc, out, err = fabric.ethtool_output(["enp1s0f1np1"], m, root)
    assert rc == 0 and out.startswith("Settings for enp1s0f1np1:\n\tSupported ports: [ FIBRE ]\n")
    assert "\tSpeed: 200000Mb/s\n\tLanes: 4\n\tDuplex: Full\n" in out and out.endswith("\tLink detected: yes\n")
    rc, out, _ = fabric.ethtool_output(["enP2p1s0f1np1"], m, root)
    assert "\tSpeed: Unknown!\n\tDuplex: Unknown! (255)\n" in out and out.endswith("\tLink detected: no\n")
    rc, out, _ = fabric.ethtool_output(["enP7s7"], m, root)
    assert "\tSpeed: 10000Mb/s\n" in out and "\tPort: Twisted Pair\n" in out and "Link detected: yes" in out
    rc, out, _ = fabric.ethtool_output(["-i", "enP2p1s0f1np1"], m, root)
    assert "driver: mlx5_core\n" in out and "bus-info: 0002:01:00.1\n" in out
    slow = fabric.with_rail(m, "rocep1s0f1", speed_mbps=100000, gbps=46)
    assert "\tSpeed: 100000Mb/s\n\tLanes: 2\n" in fabric.ethtool_output(["enp1s0f1np1"], slow, root)[1]
    assert fabric.ethtool_output(["eth0"], m, root) is None               # not modelled: the real ethtool
    assert fabric.ethtool_output(["-S", "enp1s0f1np1"], m, root) is None
    assert fabric.ethtool_fallback(["eth0"], root) == (75, "No data available\n", fabric.NO_DEVICE)


def node_files(tmp_path) -> Path:
    """The node image overlay's sim-fabric and python packages, written under a temp dir (exact bytes)."""
    root = tmp_path / "node-image"
    for path, (data, mode) in images.node_overlay("k").files.items():
        if path == "usr/local/sbin/sim-fabric" or path.startswith("usr/lib/python3/dist-packages/"):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)
            (root / path).chmod(mode)
    return root


def test_fabric_cli_ethtool_and_ibdev2netdev(tmp_path):
    """sim-fabric as the node runs it: its launcher and the dspark_sim package of the node image, nothing else."""
    m, root, _ = spark_root(tmp_path, fabric.with_rail(
        fabric.node_model("spark1", "172.30.99.11", ["10.99.1.11", "10.99.2.11"]), "roceP2p1s0f1", state="DOWN"))
    model = tmp_path / "fabric.json"
    model.write_text(fabric.dumps(m))
    node = node_files(tmp_path)
    env = dict(os.environ, DSPARK_SIM_FABRIC_JSON=str(model), DSPARK_SIM_SYSFS=root,
               PYTHONPATH=str(node / "usr/lib/python3/dist-packages"))
    run = lambda *a: subprocess.run([sys.executable, "-B", str(node / "usr/local/sbin/sim-fabric"), *a],  # noqa: E731
                                    env=env, capture_output=True, text=True, cwd=tmp_path)
    r = run("ethtool", "nosuch0")  # as Debian's ethtool 6.1 answers
    assert (r.returncode, r.stdout) == (75, "No data available\n")
    assert r.stderr == "netlink error: no device matches name (offset 24)\nnetlink error: No such device\n" * 5
    assert "Link detected: no" in run("ethtool", "enP2p1s0f1np1").stdout
    r = run("ibdev2netdev")
    assert r.returncode == 0 and r.stdout == ("roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Down)\n"
                                              "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n")
    v = run("ibdev2netdev", "-v").stdout.splitlines()
    assert v[1] == "0000:01:00.1 rocep1s0f1 (MT4129 - NA)  fw 28.45.1020 port 1 (ACTIVE) ==> enp1s0f1np1 (Up)"
    assert v[0].startswith("0002:01:00.1 roceP2p1s0f1 (MT4129 - NA)  fw 28.45.1020 port 1 (DOWN  ) ==> ")
    assert run("ibdev2netdev", "-x").returncode == 255


def _sim_runc():
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("sim_runc", str(ASSETS / "sim-runc"))
    spec = importlib.util.spec_from_loader("sim_runc", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def test_sim_runc_binds_sysfs_only_for_rdma_containers():
    rc = _sim_runc()
    with_dev = {"mounts": [{"destination": "/sys", "type": "sysfs"}],
                "linux": {"devices": [{"path": "/dev/infiniband/uverbs0", "type": "c", "major": 1, "minor": 3}]}}
    assert rc.has_rdma_device(with_dev)
    assert rc.add_sysfs_binds(with_dev) == ["/sys/class", "/sys/devices", "/sys/bus"]
    binds = with_dev["mounts"][1:]
    assert [(m["destination"], m["source"], m["type"]) for m in binds] == [
        ("/sys/class", "/sys/class", "bind"), ("/sys/devices", "/sys/devices", "bind"), ("/sys/bus", "/sys/bus", "bind")]
    assert all(m["options"][:2] == ["rbind", "ro"] for m in binds)
    assert rc.add_sysfs_binds(with_dev) == []  # idempotent
    plain = {"linux": {"devices": [{"path": "/dev/fuse"}]}}
    assert not rc.has_rdma_device(plain) and not rc.has_rdma_device({})


def test_create_recreates_a_cluster_of_another_sim_version(monkeypatch):
    calls, logs = [], []
    nodes = cluster.plan("simtest", 2, "172.30.98.0/24").nodes
    monkeypatch.setattr(cluster.backend, "engine_available", lambda: (True, "x"))
    monkeypatch.setattr(inventory, "nodes", lambda name: [] if calls else nodes)
    monkeypatch.setattr(inventory, "versions", lambda name: {"simtest-spark1": "1", "simtest-spark2": "1"})
    monkeypatch.setattr(cluster, "_delete", lambda name, log=print: calls.append(("delete", name)))

    class Stop(Exception):
        pass

    def stop(log=print):
        raise Stop()
    monkeypatch.setattr(cluster.images, "ensure_node_image", stop)
    with pytest.raises(Stop):
        cluster._create("simtest", 2, "172.30.98.0/24", log=logs.append)
    assert calls == [("delete", "simtest")]
    assert any("another sim version" in m and "simtest-spark1 v1" in m and "deleting and re-creating" in m for m in logs)


# ---------------------------------------------------------------- NCCL double, unit level ----
from sim.testdouble import nccl, nccl_debug, nccl_socket  # noqa: E402

RUN, UP = nccl_socket.IFF_RUNNING, nccl_socket.IFF_UP


def spark_ifaddrs(m, down=()):
    I = nccl_socket.Iface  # noqa: E741 -- getifaddrs order: lo, the management NIC, the twins
    out = [I("lo", nccl_socket.AF_INET, "127.0.0.1", UP | RUN | nccl_socket.IFF_LOOPBACK, 8),
           I("enP7s7", nccl_socket.AF_INET, m["management"]["ip"], UP | RUN)]
    for r in m["rails"]:
        gone = r["state"] != "ACTIVE" or r["netdev"] in down
        out.append(I(r["netdev"], nccl_socket.AF_INET, r["ip"], 0x1002 if gone else UP | RUN))
    return out


def run_nccl(tmp_path, env, model=None, rank=0, nranks=2, devices=True):
    import io
    m, root, dev = spark_root(tmp_path, model, devices=devices)
    buf = io.StringIO()
    try:
        comm = nccl.comm_init(rank, nranks, env=env, sysfs=root, dev_root=dev, ifaddrs=spark_ifaddrs(m), out=buf,
                              hostname="spark1")
    except nccl.NcclError as e:
        return e, buf.getvalue()
    return comm, buf.getvalue()


PROGRAM_ENV = {"NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
               "NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"}


def test_nccl_program_env_uses_both_twins(tmp_path):
    comm, out = run_nccl(tmp_path, PROGRAM_ENV)
    assert isinstance(comm, nccl.Comm) and comm.net == "IB", out
    assert [d["name"] for d in comm.devices] == ["rocep1s0f1", "roceP2p1s0f1"] and comm.oob.name == "enp1s0f1np1"
    assert comm.gid_index == {"rocep1s0f1": 3, "roceP2p1s0f1": 3}
    lines = [line.split(" NCCL INFO ", 1)[1] for line in out.splitlines() if " NCCL INFO " in line]
    assert "NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:10.99.1.11<0>" in lines
    assert "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0" in lines
    assert "Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IB/1" in lines
    assert "NCCL_SOCKET_IFNAME set by environment to enp1s0f1np1" in lines and "NCCL_IB_DISABLE set by environment to 0." in lines
    assert "NCCL version 2.30.7+cuda13.0" in lines and lines[-1].endswith("- Init COMPLETE")
    assert all(line.startswith(f"spark1:{os.getpid()}:") for line in out.splitlines() if line)
    assert "Bootstrap: Using" not in out  # BOOTSTRAP is not in NCCL_DEBUG_SUBSYS=INIT,ENV


@pytest.mark.parametrize("ifname, picked", [
    ("enp1s0f1np1", "enp1s0f1np1"), ("enp", "enp1s0f1np1"), ("enP", "enP7s7"),  # prefix match, getifaddrs order
    ("=enP2p1s0f1np1", "enP2p1s0f1np1"), ("^enP7,lo,docker", "enp1s0f1np1"), ("e", "enP7s7"),  # 1 char: auto
    (None, "enP7s7")])                                                 # auto: ^docker,lo,virbr -> the 10 GbE NIC
def test_nccl_socket_ifname_rules(tmp_path, ifname, picked):
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "BOOTSTRAP"}
    if ifname is not None:
        env["NCCL_SOCKET_IFNAME"] = ifname
    comm, out = run_nccl(tmp_path, env)
    assert comm.bootstrap.name == picked and f"Bootstrap: Using {picked}:" in out


@pytest.mark.parametrize("ifname", ["eth0", "=enp1s0f1", "^enp,enP,lo"])
def test_nccl_no_socket_interface_is_fatal(tmp_path, ifname):
    err, out = run_nccl(tmp_path, dict(PROGRAM_ENV, NCCL_SOCKET_IFNAME=ifname, NCCL_DEBUG="WARN"))
    assert isinstance(err, nccl.NcclError) and err.result == "ncclInvalidUsage"
    assert "bootstrap.cc:126 (bootstrapNetInit) NCCL WARN Bootstrap : no socket interface found" in out
    assert out.startswith("\n[")  # WARNs: a leading empty line, then the timestamp
    msg = err.torch_message()
    assert "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.30.7" in msg
    assert msg.endswith("ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
                        "Bootstrap : no socket interface found")


def test_nccl_down_interface_is_not_used(tmp_path):
    m = fabric.with_rail(fabric.node_model("spark1", "172.30.99.11", ["10.99.1.11", "10.99.2.11"]),
                         "rocep1s0f1", state="DOWN")
    err, out = run_nccl(tmp_path, dict(PROGRAM_ENV, NCCL_DEBUG="WARN"), m)  # its netdev is not IFF_RUNNING
    assert isinstance(err, nccl.NcclError) and "Bootstrap : no socket interface found" in out
    comm, out = run_nccl(tmp_path / "b", dict(PROGRAM_ENV, NCCL_SOCKET_IFNAME="enP2p1s0f1np1"), m)
    assert [d["name"] for d in comm.devices] == ["roceP2p1s0f1"]  # the DOWN port is skipped, silently
    assert "NET/IB : Using [0]roceP2p1s0f1:1/RoCE [RO]; OOB enP2p1s0f1np1:10.99.2.11<0>" in out


@pytest.mark.parametrize("hca, used", [
    ("rocep1s0f1,roceP2p1s0f1", ["rocep1s0f1", "roceP2p1s0f1"]), ("roce", ["rocep1s0f1", "roceP2p1s0f1"]),
    ("rocep1s0f1:1", ["rocep1s0f1"]), ("=roceP2p1s0f1", ["roceP2p1s0f1"]), ("^roceP2", ["rocep1s0f1"]),
    (None, ["rocep1s0f1", "roceP2p1s0f1"]), ("rocep1s0f1:2", []), ("=rocep1s0f", []), ("mlx5_0,mlx5_1", [])])
def test_nccl_ib_hca_rules(tmp_path, hca, used):
    env = dict(PROGRAM_ENV)
    env.pop("NCCL_IB_HCA")
    if hca is not None:
        env["NCCL_IB_HCA"] = hca
    res, out = run_nccl(tmp_path, env)
    if used:
        assert [d["name"] for d in res.devices] == used
        return
    assert isinstance(res, nccl.NcclError) and res.result == "ncclInvalidUsage"  # NCCL_NET=IB and no device
    assert "NET/IB : No device found." in out and "Failed to initialize NET plugin IB" in out
    assert "plugin/net.cc:349 (ncclNetInit) NCCL WARN Failed to initialize any NET plugin" in out


def test_nccl_without_nccl_net_falls_back_to_sockets(tmp_path):
    env = dict(PROGRAM_ENV, NCCL_IB_HCA="mlx5_0")
    env.pop("NCCL_NET")
    comm, out = run_nccl(tmp_path, env)
    assert comm.net == "Socket" and "NET/Socket : Using [0]enp1s0f1np1:10.99.1.11<0>" in out
    assert "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0" in out
    assert isinstance(run_nccl(tmp_path / "b", dict(PROGRAM_ENV, NCCL_NET="gIB"))[0], nccl.NcclError)
    comm, out = run_nccl(tmp_path / "c", dict(PROGRAM_ENV, NCCL_IB_DISABLE="1", NCCL_NET="Socket"))
    assert comm.net == "Socket"


def test_nccl_needs_the_uverbs_devices(tmp_path):
    err, out = run_nccl(tmp_path, PROGRAM_ENV, devices=False)
    assert isinstance(err, nccl.NcclError) and "NCCL WARN NET/IB : Unable to open device rocep1s0f1" in out


@pytest.mark.parametrize("env, gid, failure", [
    ({}, 3, None), ({"NCCL_IB_GID_INDEX": "3"}, 3, None), ({"NCCL_IB_GID_INDEX": "-1"}, 3, None),
    ({"NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": "AF_INET"}, 3, None),  # tsw2k's pair
    ({"NCCL_IB_GID_INDEX": "7"}, 7, "ncclSystemError"),          # no GID there
    ({"NCCL_IB_GID_INDEX": "300"}, 300, "ncclSystemError"),      # beyond the table
    ({"NCCL_IB_GID_INDEX": "2"}, 2, "ncclRemoteError"),          # RoCE v1
    ({"NCCL_IB_GID_INDEX": "0"}, 0, "ncclRemoteError"),          # link-local v1
    ({"NCCL_IB_ROCE_VERSION_NUM": "1"}, 2, "ncclRemoteError"),   # the walk picks the IPv4 v1 GID
    ({"NCCL_IB_ADDR_RANGE": "10.99.1.0/24"}, 3, None)])
def test_nccl_gid_index(tmp_path, env, gid, failure):
    res, out = run_nccl(tmp_path, dict(PROGRAM_ENV, NCCL_IB_HCA="rocep1s0f1", NCCL_DEBUG_SUBSYS="INIT,ENV,NET", **env))
    if failure is None:
        assert res.gid_index == {"rocep1s0f1": gid}, out
        return
    assert isinstance(res, nccl.NcclError) and res.result == failure, out
    if failure == "ncclSystemError":
        assert (f"NCCL WARN Call to ibv_modify_qp failed with 22 Invalid argument, on dev rocep1s0f1:1, curr state "
                f"INIT, next state RTR, local GID index {gid}, local GID ::, remote GID N/A") in out
        assert "HINT: In many cases this error occurs when the incorrect GID index is forced by NCCL_IB_GID_INDEX" in out
    else:
        assert "NCCL WARN NET/IB: Got completion from peer N/A with status=IBV_WC_RETRY_EXC_ERR(12)" in out
        assert "hca rocep1s0f1" in out


def test_nccl_gid_walk_finds_a_moved_ipv4_gid(tmp_path):
    m = fabric.node_model("spark1", "172.30.99.11", ["10.99.1.11", "10.99.2.11"])
    m = fabric.with_rail(fabric.with_rail(m, "rocep1s0f1", gid_index=5), "roceP2p1s0f1", gid_index=5)
    comm, _ = run_nccl(tmp_path, PROGRAM_ENV, m)
    assert comm.gid_index == {"rocep1s0f1": 5, "roceP2p1s0f1": 5}
    comm, _ = run_nccl(tmp_path / "b", dict(PROGRAM_ENV, NCCL_IB_GID_INDEX="3"), m)  # an IPv6 RoCE v2 GID: used
    assert comm.gid_index["rocep1s0f1"] == 3


def test_nccl_debug_levels_and_subsystems(tmp_path):
    assert run_nccl(tmp_path, dict(PROGRAM_ENV, NCCL_DEBUG=""))[1] == ""          # NCCL_DEBUG unset: silent
    assert run_nccl(tmp_path / "w", dict(PROGRAM_ENV, NCCL_DEBUG="WARN"))[1] == "NCCL version 2.30.7+cuda13.0\n"
    out = run_nccl(tmp_path / "n", dict(PROGRAM_ENV, NCCL_DEBUG_SUBSYS="^INIT,ENV,NET"))[1]
    assert "NET/IB : Using" not in out and "set by environment" not in out and "Bootstrap: Using" in out
    out = run_nccl(tmp_path / "i", dict(PROGRAM_ENV, NCCL_DEBUG_SUBSYS="^INIT,ENV"))[1]
    assert "NET/IB : Using" in out and "NCCL_IB_HCA set to" in out  # INIT|NET, NET|ENV lines: NET is on
    assert nccl_debug.parse_subsys(None) == nccl_debug.INIT | nccl_debug.BOOTSTRAP | nccl_debug.ENV
    assert nccl_debug.parse_subsys("init,net") == nccl_debug.INIT | nccl_debug.NET


def test_nccl_string_lists_and_strtoll():
    assert nccl_socket.parse_string_list("mlx5_0:1,mlx5_1,,:2") == [("mlx5_0", 1), ("mlx5_1", -1)]
    assert [nccl_debug.strtoll(s) for s in ("3", "0x10", "010", "-1", "abc", "7x")] == [3, 16, 8, -1, 0, 7]
    assert nccl_socket.match_if_list("rocep1s0f1", 1, [("roce", -1)], False)
    assert not nccl_socket.match_if_list("rocep1s0f1", 1, [("roce", -1)], True)
    assert nccl_socket.match_if_list("anything", 1, [], True)


def test_gloo_needs_an_address_on_its_interface():
    m = fabric.node_model("spark1", "172.30.99.11", ["10.99.1.11", "10.99.2.11"])
    ifs = spark_ifaddrs(m, down=("enp1s0f1np1",))
    assert [i.name for i in nccl.gloo_device({"GLOO_SOCKET_IFNAME": "enp1s0f1np1"}, ifs)] == ["enp1s0f1np1"]
    with pytest.raises(RuntimeError, match="Unable to find address for: eth0"):
        nccl.gloo_device({"GLOO_SOCKET_IFNAME": "eth0"}, ifs)
    assert nccl.gloo_device({}, ifs) == []


def test_rank_init_prints_the_torch_error(tmp_path):
    m, root, dev = spark_root(tmp_path)
    import io
    lines, buf = [], io.StringIO()
    rc = nccl.rank_init(1, 2, env=dict(PROGRAM_ENV, NCCL_SOCKET_IFNAME="eth0"), sysfs=root, dev_root=dev,
                        ifaddrs=spark_ifaddrs(m), out=buf, log=lines.append)
    assert rc == 1 and lines[0].startswith("torch.distributed.DistBackendError: NCCL error in: ")
    assert nccl.rank_init(1, 2, env=PROGRAM_ENV, sysfs=root, dev_root=dev, ifaddrs=spark_ifaddrs(m), out=buf,
                          log=lines.append) == 0


def test_getifaddrs_sees_loopback():
    ifs = nccl_socket.getifaddrs()
    assert any(i.name == "lo" and i.addr == "127.0.0.1" and i.flags & nccl_socket.IFF_UP for i in ifs)


# ---------------------------------------------------------------- clusters of their own (sim.retarget) ----
def test_the_projects_clusters_have_subnets_that_do_not_overlap_and_plan_takes_them():
    import ipaddress

    nets = {name: ipaddress.ip_network(sub) for name, sub in cluster.SUBNETS.items()}
    for a, b in itertools.combinations(nets, 2):
        assert not nets[a].overlaps(nets[b]), (a, b)
    assert cluster.plan("e2e").subnet == "172.30.97.0/24" and cluster.plan("e2e").rail_subnets[0] == "10.97.1.0/24"
    assert cluster.plan("sim").subnet == cluster.plan("anything-else").subnet == "172.30.99.0/24"


@pytest.mark.parametrize("stack", ["sim", "sim-tp2", "sim-x2", "sim-team"])
def test_a_sim_stack_file_moved_onto_another_cluster_keeps_no_address_of_sim(stack):
    import yaml

    from sim.retarget import retarget

    text = (ROOT / f"Pulumi.{stack}.yaml").read_text()
    moved = retarget(text, "sim-team-demo")
    assert "172.30.99." not in moved and "10.99." not in moved and "deepseek-spark-sim/sim/" not in moved
    assert moved.count("#") == text.count("#")  # the comments stay
    doc = yaml.safe_load(moved)["config"]["deepseek-spark:cluster"]
    nodes = [n for g in doc.get("groups") or [doc] for n in g["nodes"]]
    assert nodes and all(n["host"].startswith("172.30.94.1") and n["fabricIp"].startswith("10.94.1.1") for n in nodes)
    assert doc["ssh"]["identityFile"] == "~/.local/state/deepseek-spark-sim/sim-team-demo/id_ed25519"
    assert retarget(text, "sim") == text


def test_retarget_refuses_an_address_of_sim_that_it_cannot_place():
    from sim.retarget import retarget

    assert retarget("http://172.30.99.13:9850 10.99.2.14 1.2.3.4 v10.99.1", "e2e") == \
        "http://172.30.97.13:9850 10.97.2.14 1.2.3.4 v10.99.1"
    with pytest.raises(SimError, match="172.30.99.200"):
        retarget("host: 172.30.99.200", "e2e")
