"""Shell commands: run them against stub tools in a temp dir and check what they do."""

import os
import shlex
import shutil
import stat
import subprocess
import time

import pytest

from planning import commands, plan
from declared.cluster import parse_cluster
from harness import cluster_of, group_of

import fakefabric

STUBS = {
    "docker": 'case "$1" in info) echo 28.0;; ps) [ -n "${MINE:-}" ] && echo abc123;; esac; exit 0',
    "nvidia-smi": (
        'case "$1" in -L) [ -z "${NO_GPU:-}" ] && echo "GPU 0: NVIDIA GB10 (UUID: GPU-x)";; '
        '--query-compute-apps=*) [ -n "${BUSY:-}" ] && echo 4242;; esac; exit 0'
    ),
    "ethtool": 'printf "Settings for %s:\\n\\tSpeed: %sMb/s\\n\\tLink detected: %s\\n" "$1" "${SPEED:-200000}" "${LINK:-yes}"',
    "ping": '[ -z "${PING_FAIL:-}" ]',
    "sudo": '[ -z "${NO_SUDO:-}" ] && [ "$1" = -n ] && [ "$2" = -l ] && echo "$3"',
    "ib_write_bw": "exit 0",
    "df": 'echo "Filesystem 1024-blocks Used Available Capacity Mounted on"; echo "/dev/nvme0n1 1 1 ${AVAIL_KB:-999999999} 1% /"',
}


@pytest.fixture
def node_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    for i in range(1, 49):
        (ckpt / f"model-{i:05d}-of-00048.safetensors").write_text("")
    (tmp_path / "engram").mkdir()
    return tmp_path


def cfg_for(tmp_path, stack="tp4", **changes):
    raw = cluster_of(stack)
    raw["model"]["checkpointDir"] = str(tmp_path / "ckpt")
    raw["engram"]["dir"] = str(tmp_path / "engram")
    raw["stateDir"] = str(tmp_path / "state")
    for node in raw["nodes"]:
        node["sshUser"] = "root"
    for key, value in changes.items():
        raw[key] = value
    return parse_cluster(raw)


def run(script, tmp_path, stdin=None, rank=0, **env):
    """`script` with the stub tools first on PATH; a node with spark<rank+1>'s fabric (tests/fakefabric)."""
    fake = fakefabric.install(tmp_path / f"fabric{rank}", tmp_path / "bin", fakefabric.spark_ifaces(rank + 1))
    full_env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", **fake, **env}
    return subprocess.run(["/bin/sh", "-c", script], env=full_env, input=stdin, capture_output=True, text=True)


def test_preflight_passes_on_a_healthy_head(node_env):
    out = run(commands.preflight(cfg_for(node_env), "tp4", 0), node_env)
    for check in ("docker", "gpu", "gpu-idle", "fabric-ip", "fabric-rails", "fabric-gid", "fabric-link",
                  "fabric-link-speed", "fabric-mtu", "fabric-peer", "checkpoint-config", "checkpoint-shards",
                  "engram-space"):  # fmt: skip
        assert f"preflight spark1: ok {check}" in out.stdout
    # This machine has no RDMA devices: the only failure may be that one, and it must say so.
    if os.path.exists("/dev/infiniband"):
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode == 1
        assert out.stderr.splitlines()[0] == (
            "preflight spark1: FAIL infiniband: /dev/infiniband is missing; install the MLNX/DOCA OFED drivers"
        )
        assert out.stderr.count("FAIL") == 1


@pytest.mark.parametrize(
    "env,check",
    [
        ({"NO_GPU": "1"}, "gpu"),
        ({"BUSY": "1"}, "gpu-idle"),
        ({"LINK": "no"}, "fabric-link"),
        ({"SPEED": "100000"}, "fabric-link-speed"),
        ({"PING_FAIL": "1"}, "fabric-peer"),
        ({"AVAIL_KB": "1024"}, "engram-space"),
    ],
)
def test_preflight_names_node_and_failed_check(node_env, env, check):
    out = run(commands.preflight(cfg_for(node_env), "tp4", 2), node_env, rank=2, **env)
    assert out.returncode == 1
    assert f"preflight spark3: FAIL {check}:" in out.stderr
    assert "nothing was changed" in out.stderr


def test_preflight_proves_on_every_node_what_the_late_steps_need(node_env):
    # the memory gate's sudo (every node, after the old ranks are gone), the bandwidth gate's ib_write_bw, the
    # download's room: each failed a step after the running group had stopped; now preflight refuses first
    raw = cluster_of("tp2")
    raw["model"]["checkpointDir"] = str(node_env / "models" / "nvfp4")
    cfg = parse_cluster(raw)
    assert cfg.nodes[1].ssh_user != "root" and cfg.model.source == "download"
    script = commands.preflight(cfg, "tp2", 1)
    out = run(script, node_env, rank=1)
    for check in ("sudo-drop-caches", "perftest", "checkpoint-space"):
        assert f"preflight spark2: ok {check}" in out.stdout, out.stdout
    out = run(script, node_env, rank=1, NO_SUDO="1", AVAIL_KB=str(100 * 1024 * 1024))
    assert ("FAIL sudo-drop-caches: " in out.stderr and "NOPASSWD: /usr/sbin/sysctl -w vm.drop_caches=3" in out.stderr
            and "FAIL checkpoint-space: " in out.stderr and "100 GiB free, the checkpoint needs 400 GiB" in out.stderr)
    (node_env / "bin" / "ib_write_bw").unlink()
    if not shutil.which("ib_write_bw"):
        assert "FAIL perftest: ib_write_bw is missing" in run(script, node_env, rank=1).stderr
    done = node_env / "models" / "nvfp4"
    done.mkdir(parents=True)
    (done / ".deepseek-spark-download").write_text(cfg.model.revision)
    for i in range(cfg.model.expected_shards):
        (done / f"model-{i:05d}.safetensors").write_text("")
    assert "ok checkpoint-space" in run(script, node_env, rank=1, AVAIL_KB="1").stdout  # complete: needs no room
    # root needs no sudo; no gate, no ib_write_bw
    raw["nodes"][1]["sshUser"] = "root"
    raw["fabric"] = {**raw.get("fabric", {}), "bandwidthGate": False}
    relaxed = commands.preflight(parse_cluster(raw), "tp2", 1)
    assert "sudo-drop-caches" not in relaxed and "perftest" not in relaxed


def test_preflight_gpu_used_by_our_own_rank_is_not_busy(node_env):
    out = run(commands.preflight(cfg_for(node_env), "tp4", 1), node_env, rank=1, BUSY="1", MINE="1")
    assert "ok gpu-idle" in out.stdout


def test_preflight_counts_checkpoint_shards_on_the_head(node_env):
    (node_env / "ckpt" / "model-00048-of-00048.safetensors").unlink()
    out = run(commands.preflight(cfg_for(node_env), "tp4", 0), node_env)
    assert "FAIL checkpoint-shards: 47 of 48" in out.stderr


def test_preflight_skips_checkpoint_on_nfs_workers_but_not_in_local_mode(node_env):
    assert "checkpoint-" not in commands.preflight(cfg_for(node_env), "tp4", 1)
    local = cfg_for(node_env, share={"mode": "local"})
    assert "checkpoint-shards" in commands.preflight(local, "tp4", 1)


def test_preflight_space_check_passes_when_shards_exist(node_env):
    for name in plan.shard_files(0, 4):
        (node_env / "engram" / name).write_text("x")
    out = run(commands.preflight(cfg_for(node_env), "tp4", 0), node_env, AVAIL_KB="1")
    assert "ok engram-space" in out.stdout


def test_export_line_is_read_only_to_exactly_the_workers():
    cfg = parse_cluster(group_of("tp4"))
    line = commands.export_line(cfg)
    path, *clients = line.split()
    assert path == "/home/zurih/NewModels/DS4.1"
    assert [c.split("(")[0] for c in clients] == ["10.0.22.2", "10.0.22.3", "10.0.22.4"]  # their ConnectX-7 addresses
    assert all("(ro," in c for c in clients) and "*" not in line and "rw" not in line.split(",")


def test_export_commands_use_sudo_for_non_root_and_own_file():
    cfg = parse_cluster(group_of("tp4"))
    create = commands.export_create(cfg, "tp4")
    assert "sudo -n tee /etc/exports.d/deepseek-spark-tp4.exports" in create
    assert "sudo -n exportfs -ra" in create
    assert commands.export_delete(cfg, "tp4") == (
        "set -eu\nsudo -n rm -f /etc/exports.d/deepseek-spark-tp4.exports\nsudo -n exportfs -ra\n"
    )


def test_hostile_values_stay_quoted(node_env):
    # What the strict shapes still let through that a shell would treat specially: the prompt is free text.
    cfg = cfg_for(node_env, readiness={"prompt": "q $(touch PWNED) `touch PWNED` 'x\" ; touch PWNED"})
    for script in (commands.preflight(cfg, "tp4", 0), commands.export_create(cfg, "tp4"),
                   commands.engram_pack(cfg, "tp4", 0), commands.readiness(cfg, "tp4")):  # fmt: skip
        assert subprocess.run(["/bin/sh", "-n", "-c", script]).returncode == 0
    run(commands.preflight(cfg, "tp4", 0), node_env)
    assert not (node_env / "PWNED").exists() and not os.path.exists("PWNED")
    assert shlex.quote(commands.export_line(cfg)) in commands.export_create(cfg, "tp4")
    assert shlex.quote(cfg.readiness.prompt) in commands.readiness(cfg, "tp4")


@pytest.fixture
def docker_stub(node_env):
    """A `docker run` stand-in that writes the shard files into the -v ...:/engram directory."""
    (node_env / "bin" / "docker").write_text(
        "#!/bin/sh\n"
        'echo "$@" >> "$CALLS"\n'
        '[ "$1" = run ] || exit 0\n'
        'case "$*" in *"--entrypoint test"*) [ -z "${NO_ADAPTER:-}" ]; exit;; esac\n'
        'for a in "$@"; do case "$a" in *:/engram) out=${a%:/engram};; esac; done\n'
        'rank=$(echo "$@" | sed -n "s/.*--rank \\([0-9]*\\).*/\\1/p"); tp=$(echo "$@" | sed -n "s/.*--tp \\([0-9]*\\).*/\\1/p")\n'
        'for l in 1 14; do echo packed > "$out/engram-l$l-r${rank}of$tp.bin"; done\n'
    )
    return node_env


def test_engram_pack_is_idempotent_and_repacks_on_new_revision(docker_stub):
    calls = docker_stub / "calls"
    cfg = cfg_for(docker_stub)
    script = commands.engram_pack(cfg, "tp4", 2)
    out = run(script, docker_stub, CALLS=str(calls))
    assert out.returncode == 0, out.stderr
    shard = docker_stub / "engram" / "engram-l14-r2of4.bin"
    assert shard.exists() and (docker_stub / "engram" / ".engram-r2of4.revision").read_text().strip() == cfg.model.revision
    assert "--rank 2 --tp 4" in calls.read_text() and "tp4-checkpoint:/models/DeepSeek-V4.1-Flash:ro" in calls.read_text()
    runs = calls.read_text().count("pack_engram.py --model")
    mtime = shard.stat().st_mtime_ns

    again = run(script, docker_stub, CALLS=str(calls))
    assert "already packed" in again.stdout
    assert calls.read_text().count("pack_engram.py --model") == runs and shard.stat().st_mtime_ns == mtime

    newer = cfg_for(docker_stub, model={**cluster_of("tp4")["model"], "checkpointDir": str(docker_stub / "ckpt"),
                                        "revision": "0123abc"})  # fmt: skip
    out = run(commands.engram_pack(newer, "tp4", 2), docker_stub, CALLS=str(calls))
    assert out.returncode == 0 and calls.read_text().count("pack_engram.py --model") == runs + 1
    assert (docker_stub / "engram" / ".engram-r2of4.revision").read_text().strip() == "0123abc"


def test_engram_pack_explains_an_image_without_the_dsv41_adapter(docker_stub):
    out = run(commands.engram_pack(cfg_for(docker_stub), "tp4", 0), docker_stub, CALLS=str(docker_stub / "c"),
              NO_ADAPTER="1")  # fmt: skip
    assert out.returncode == 1
    assert "has no DSV4.1 adapter (/opt/dsv41); build the recipe overlay image" in out.stderr
    assert "pack_engram.py --model" not in (docker_stub / "c").read_text()


def test_engram_delete_removes_only_this_ranks_shards(docker_stub):
    cfg = cfg_for(docker_stub)
    for rank in (1, 2):
        run(commands.engram_pack(cfg, "tp4", rank), docker_stub, CALLS=str(docker_stub / "calls"))
    run(commands.engram_delete(cfg, 2), docker_stub)
    left = sorted(p.name for p in (docker_stub / "engram").iterdir())
    assert left == [".engram-r1of4.revision", "engram-l1-r1of4.bin", "engram-l14-r1of4.bin"]


def test_api_key_file_gets_stdin_with_mode_600(node_env):
    cfg = cfg_for(node_env)
    create = commands.api_key_create(cfg, "tp4")
    assert "sk-secret" not in create
    out = run(create, node_env, stdin="sk-secret")
    assert out.returncode == 0, out.stderr
    path = node_env / "state" / "tp4" / "api-key"
    assert path.read_text() == "sk-secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    run(commands.api_key_delete(cfg, "tp4"), node_env)
    assert not path.exists()


def test_sudo_only_for_non_root():
    assert commands.sudo("root") == ""
    assert commands.sudo("zurih") == "sudo -n "


def test_readiness_takes_the_key_from_the_environment():
    cmd = commands.readiness(parse_cluster(group_of("tp4")), "tp4")
    assert cmd.startswith("python3 -m programs.probe --url http://10.0.0.1:8888/v1")
    assert f"--key-env {commands.READINESS_KEY_ENV}" in cmd and "--timeout 1800" in cmd


def test_vllm_preflight_has_no_engram_or_checkpoint_check_when_downloading(node_env):
    raw = cluster_of("tp2")
    raw["model"]["checkpointDir"] = str(node_env / "ckpt")
    cfg = parse_cluster(raw)
    script = commands.preflight(cfg, "tp2", 0)
    assert "engram" not in script and "checkpoint-shards" not in script
    out = run(script, node_env)
    assert "ok fabric-link-speed" in out.stdout


@pytest.fixture
def hf_stub(node_env):
    """A `docker run ... huggingface-cli download` stand-in that writes N shards into the -v dir."""
    (node_env / "bin" / "docker").write_text(
        "#!/bin/sh\n"
        'echo "$@ token=${HF_TOKEN:-none}" >> "$CALLS"\n'
        '[ "$1" = run ] || exit 0\n'
        'for a in "$@"; do case "$a" in *:/download) out=${a%:/download};; esac; done\n'
        'for i in $(seq 1 "$SHARDS"); do : > "$out/model-$i.safetensors"; done\n'
    )
    return node_env


def _download_cfg(tmp_path, revision="main"):
    raw = cluster_of("tp2")
    raw["model"].update(checkpointDir=str(tmp_path / "weights"), revision=revision)
    return parse_cluster(raw)


def test_download_once_per_revision_token_on_stdin(hf_stub):
    calls = hf_stub / "calls"
    script = commands.download(_download_cfg(hf_stub), "tp2")
    assert "hf_secret" not in script
    out = run(script, hf_stub, stdin="hf_secret\n", CALLS=str(calls), SHARDS="48")
    assert out.returncode == 0, out.stderr
    assert "-e HF_TOKEN" in calls.read_text() and "token=hf_secret" in calls.read_text()
    assert "download nvidia/DeepSeek-V4.1-Flash-NVFP4 --revision main --local-dir /download" in calls.read_text()
    again = run(script, hf_stub, stdin="", CALLS=str(calls), SHARDS="48")
    assert "already in" in again.stdout and calls.read_text().count("run --rm") == 1
    newer = run(commands.download(_download_cfg(hf_stub, "b" * 40), "tp2"), hf_stub, stdin="", CALLS=str(calls),
                SHARDS="48")  # fmt: skip
    assert newer.returncode == 0 and calls.read_text().count("run --rm") == 2
    assert "token=none" in calls.read_text().splitlines()[-1] and "-e HF_TOKEN" not in calls.read_text().splitlines()[-1]


def test_incomplete_download_fails_and_leaves_no_stamp(hf_stub):
    out = run(commands.download(_download_cfg(hf_stub), "tp2"), hf_stub, stdin="", CALLS=str(hf_stub / "c"),
              SHARDS="10")  # fmt: skip
    assert out.returncode == 1 and "10 of 48 safetensors files" in out.stderr
    assert not (hf_stub / "weights" / ".deepseek-spark-download").exists()


def _ray_worker_entrypoint():
    cfg = parse_cluster(group_of("tp2"))
    worker = plan.vllm_specs(cfg, "tp2")[1]
    assert worker.args[:2] == ["ray", "start"]
    return worker.entrypoint


def _fabric_env(tmp_path, rank=1):
    """A node's env for a rank entrypoint: a fake Spark fabric (tests/fakefabric), the rank's planes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = fakefabric.install(tmp_path / "fabric", bin_dir, fakefabric.spark_ifaces(rank + 1))
    ip = f"10.0.22.{rank + 1}"
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", **fake, "DSPARK_FABRIC_IP": ip, "DSPARK_BOOTSTRAP_IP": ip}


def test_ray_worker_waits_for_the_head_then_starts(tmp_path):
    """A head still starting is not a failed group: the worker waits for its GCS port (bounded)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    entry = _ray_worker_entrypoint()
    env = {**_fabric_env(tmp_path), "RAY_ADDRESS": f"127.0.0.1:{port}", "DSPARK_RAY_WAIT": "30"}

    def listen_later():
        time.sleep(2.5)
        srv.listen(1)

    threading.Thread(target=listen_later, daemon=True).start()
    t0 = time.monotonic()
    out = subprocess.run([*entry, "echo", "started"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip().endswith("started"), out
    assert "waiting for the Ray head" in out.stdout and time.monotonic() - t0 >= 2
    srv.close()


def test_ray_worker_gives_up_when_the_head_never_answers(tmp_path):
    s = __import__("socket").socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    env = {**_fabric_env(tmp_path), "RAY_ADDRESS": f"127.0.0.1:{port}", "DSPARK_RAY_WAIT": "1"}
    out = subprocess.run([*_ray_worker_entrypoint(), "echo", "started"], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 1 and "started" not in out.stdout
    assert f"the Ray head 127.0.0.1:{port} did not answer in time" in out.stdout


def test_preflight_reports_a_missing_oom_guard_as_a_note_not_a_failure(node_env):
    script = commands.preflight(cfg_for(node_env), "tp4", 1)
    without = run(script, node_env, rank=1)
    assert "preflight spark2: note oom-guard: neither earlyoom nor systemd-oomd runs" in without.stdout
    assert "FAIL oom-guard" not in without.stderr
    (node_env / "bin" / "pgrep").write_text('#!/bin/sh\n[ "$2" = earlyoom ]\n')
    (node_env / "bin" / "pgrep").chmod(0o755)
    assert "preflight spark2: ok oom-guard" in run(script, node_env, rank=1).stdout
