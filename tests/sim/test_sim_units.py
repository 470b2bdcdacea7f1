"""Pure parts of the simulator: no docker needed."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sim import cluster, images
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
    with pytest.raises(cluster.SimError) as e:
        cluster.plan("Bad_Name", 0, "10.0.0.0/28")
    msg = str(e.value)
    assert "Bad_Name" in msg and "nodes=0" in msg and "/24" in msg


def test_state_paths_for_sim(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    key, kh, cfg = cluster._ssh_paths("sim")
    assert key == tmp_path / ".local/state/deepseek-spark-sim/sim/id_ed25519"
    assert kh == tmp_path / ".local/state/deepseek-spark-sim/sim/known_hosts"
    assert cfg == tmp_path / ".local/state/deepseek-spark-sim/sim/ssh_config"


def test_render_ssh_config(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    nodes = cluster.plan("sim", 2).nodes
    d = tmp_path / ".local/state/deepseek-spark-sim/sim"
    text = cluster.render_ssh_config("sim", nodes, d / "id_ed25519", d / "known_hosts")
    assert "Host spark1 sim-spark1 172.30.99.11\n    HostName 172.30.99.11\n    User root\n" in text
    assert "Host spark2 sim-spark2 172.30.99.12" in text
    assert text.count("IdentityFile ~/.local/state/deepseek-spark-sim/sim/id_ed25519") == 2
    assert text.count("UserKnownHostsFile ~/.local/state/deepseek-spark-sim/sim/known_hosts") == 2
    assert text.count("StrictHostKeyChecking yes") == 2
    assert str(tmp_path) not in text  # no machine-specific absolute paths


def test_render_known_hosts():
    n = cluster.plan("sim", 1).nodes
    text = cluster.render_known_hosts("sim", [(n[0], ["ssh-ed25519 AAAAkey root@spark1", "bogus"])])
    assert text == "172.30.99.11,spark1,sim-spark1 ssh-ed25519 AAAAkey\n"


def test_include_block_is_first_keyed_and_idempotent():
    user = "Host *\n    ServerAliveInterval 30\n"
    once = cluster.add_include_block(user, "sim", "~/.local/state/deepseek-spark-sim/sim/ssh_config")
    assert once.startswith("# BEGIN dspark-sim sim\nInclude ~/.local/state/deepseek-spark-sim/sim/ssh_config\n")
    assert once.endswith(user)
    assert cluster.add_include_block(once, "sim", "~/x") .count("BEGIN dspark-sim sim") == 1
    other = cluster.add_include_block(once, "simtest", "~/y")
    assert cluster.remove_include_block(other, "simtest") == once
    assert cluster.remove_include_block(once, "sim") == user


def test_ssh_info_json_shape(tmp_path):
    nodes = cluster.plan("sim", 3).nodes
    si = cluster.SshInfo("sim", nodes, "root", tmp_path / "id_ed25519", tmp_path / "known_hosts",
                         tmp_path / "ssh_config", "")
    j = si.to_json()
    assert j["nodes"][0] == {"name": "spark1", "host": "172.30.99.11", "user": "root", "port": 22,
                             "container": "sim-spark1", "host_key": None}
    (tmp_path / "known_hosts").write_text(cluster.render_known_hosts("sim", [(nodes[1], ["ssh-ed25519 AAAAk x"])]))
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
    assert images.mirror_from_sources([DEB822]) == "http://mirror.example/debian"


def test_mirror_deb822_security_only_and_disabled():
    sec = DEB822.split("\n\n")[1]
    assert images.mirror_from_sources([sec]) is None
    disabled = "Enabled: no\n" + DEB822.split("\n\n")[0]
    assert images.mirror_from_sources([disabled], "deb http://one.example/debian/ bookworm main") == \
        "http://one.example/debian"


def test_mirror_from_one_line_list():
    lst = """# comment
deb http://security.example/debian-security bookworm-security main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main contrib
"""
    assert images.mirror_from_sources([], lst) == "http://one.example/debian"
    assert images.mirror_from_sources([], lst, suite="trixie") is None


def test_rootfs_cache_key():
    a = images.RootfsSpec("node", ("python3", "sudo"))
    assert a.key() == images.RootfsSpec("node", ("sudo", "python3")).key()  # order-free
    assert a.key() != images.RootfsSpec("node", ("python3", "sudo", "curl")).key()
    assert a.key() != images.RootfsSpec("node", ("python3", "sudo"), suite="trixie").key()
    assert len(a.key()) == 16


def test_engine_wheels_pinned_once_and_in_the_key():
    """Ray's and the SGLang router's sets together: every requirement an exact pin, each name once
    (a name shared by both sets is pinned in RAY_WHEELS only), all of it in the engine rootfs key."""
    names = [r.split("==")[0].lower().replace("_", "-") for r in images.ENGINE_WHEELS]
    assert all(r.count("==") == 1 and r.split("==")[1] for r in images.ENGINE_WHEELS)
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert f"sglang-router=={images.ROUTER_VERSION}" in images.ENGINE_ROOTFS.wheels
    assert f"ray=={images.RAY_VERSION}" in images.ENGINE_ROOTFS.wheels
    assert set(images.ENGINE_ROOTFS.wheels) == set(images.RAY_WHEELS) | set(images.ROUTER_WHEELS)
    without = images.RootfsSpec("engine", ("python3",), wheels=images.RAY_WHEELS)
    assert images.ENGINE_ROOTFS.key() != without.key()
    shuffled = images.RootfsSpec("engine", ("python3",), wheels=tuple(reversed(images.ENGINE_WHEELS)))
    assert images.ENGINE_ROOTFS.key() == shuffled.key()  # order-free, deterministic


def test_image_tags_follow_overlay_content():
    spec = images.ENGINE_ROOTFS
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


def test_ethtool_standin():
    r = _sh("ethtool", "lo")
    assert "\tSpeed: 200000Mb/s\n" in r.stdout and "\tLink detected: yes\n" in r.stdout
    assert _sh("ethtool", "nonexistent0").returncode != 0
    assert _sh("ibdev2netdev").stdout == "rocep1s0f1 port 1 ==> eth0 (Up)\n"


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
