"""Pure planning: launch flags, env, memory figures, shard names, group revision, rank entrypoint."""

import os
import subprocess
from dataclasses import replace

import pytest

from planning import launch, memoryplan, plan
from declared.cluster import parse_cluster
from harness import cluster_of, group_of

import fakefabric


def cfg_of(stack, **serving):
    raw = cluster_of(stack)
    raw["serving"].update(serving)
    return parse_cluster(raw)


def _flag(args, name):
    return args[args.index(name) + 1]


@pytest.mark.parametrize("stack,n", [("tp3", 3), ("tp4", 4)])
def test_launch_flags_per_rank(stack, n):
    cfg = cfg_of(stack)
    for rank in range(n):
        args = launch.sglang_args(cfg, rank)
        assert _flag(args, "--node-rank") == str(rank)
        assert _flag(args, "--nnodes") == str(n)
        assert _flag(args, "--tp") == str(n)
        # tp4: the head's ConnectX-7 address; tp3 (a triangle, fabric.bootstrap: management): its host
        assert _flag(args, "--dist-init-addr") == {"tp3": "10.0.0.1:20000", "tp4": "10.0.22.1:20000"}[stack]
        assert _flag(args, "--port") == "8888"
        assert _flag(args, "--speculative-algorithm") == "DSPARK"
        assert _flag(args, "--speculative-dspark-block-size") == "3"
        assert "--api-key" not in args


def test_spec_off_drops_speculative_flags():
    args = launch.sglang_args(cfg_of("tp4", specAlgo="off"), 0)
    assert not [a for a in args if a.startswith("--speculative")]


def test_extra_args_are_appended_last():
    cfg = cfg_of("tp4", extraArgs=["--log-level", "debug"])
    assert launch.sglang_args(cfg, 1)[-2:] == ["--log-level", "debug"]


def test_every_rank_serves_metrics_once_even_when_extra_args_ask_for_them():
    """Observed by default: Prometheus scrapes rank 0's /metrics, the router's drain reads it."""
    for rank in range(4):
        assert launch.sglang_args(cfg_of("tp4"), rank).count("--enable-metrics") == 1
        assert launch.sglang_args(cfg_of("tp4", extraArgs=["--enable-metrics"]), rank).count("--enable-metrics") == 1


def test_dist_init_uses_head_fabric_ip_not_management():
    raw = cluster_of("tp4")
    raw["nodes"][0]["fabricIp"] = "192.168.100.1"
    assert _flag(launch.sglang_args(parse_cluster(raw), 2), "--dist-init-addr") == "192.168.100.1:20000"


def test_nccl_tuned_buffers_and_ring_mode():
    cfg = cfg_of("tp4")
    env = launch.nccl_env(cfg)
    assert env["NCCL_BUFFSIZE"] == "1048576" and env["NCCL_PROTO"] == "^LL128"
    assert "NCCL_IB_HCA" not in env and "GLOO_SOCKET_IFNAME" not in env  # found on the node at every start
    assert "NCCL_ALGO" not in env and "NCCL_IB_GID_INDEX" not in env
    raw = cluster_of("tp4")
    raw["topology"] = "ring"
    raw["fabric"]["tunedBuffers"] = False
    raw["fabric"]["gidIndex"] = 5
    env = launch.nccl_env(parse_cluster(raw))
    assert env["NCCL_ALGO"] == "Ring" and env["NCCL_MIN_NCHANNELS"] == "4"
    assert "NCCL_BUFFSIZE" not in env and env["NCCL_IB_GID_INDEX"] == "5"


def test_rank_env_per_node_and_extra_env_override():
    cfg = cfg_of("tp4", extraEnv={"NCCL_DEBUG": "INFO"})
    env = launch.rank_env(cfg, 2)
    assert env["HOST_IP"] == env["SGLANG_HOST_IP"] == "10.0.22.3" and env["NODE_RANK"] == "2"
    assert env["NCCL_DEBUG"] == "INFO" and env["OFFLOAD_MODE"] == "nvme"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"


def test_memory_plan_tp4_seed_figures():
    mp = memoryplan.memory_plan(cfg_of("tp4"))
    head, worker = mp.ranks
    assert mp.fits
    assert head.weights_gib + head.draft_gib == pytest.approx(77 + 2.5 + 1.3)
    assert worker.weights_gib + worker.draft_gib == pytest.approx(77 + 2.5)
    assert head.kv_gib == pytest.approx(8_000_000 * 1670.75 / 2**30)  # the 8M pin is ~13.4 GB
    assert head.static_pool_gib == pytest.approx(0.80 * 121.7)
    assert head.outside_gib == pytest.approx(0.20 * 121.7)  # ~24 GiB outside the pool


def test_memory_plan_tp3_is_tight_but_fits():
    mp = memoryplan.memory_plan(cfg_of("tp3"))
    head = mp.ranks[0]
    assert mp.fits
    assert head.outside_gib == pytest.approx(0.05 * 121.7)  # the seed's "~6 GB free at TP3"
    assert head.outside_gib - head.outside_needed_gib < 2.0


def test_memory_plan_untuned_nccl_costs_4_7_gib():
    raw = cluster_of("tp3")
    raw["fabric"]["tunedBuffers"] = False
    mp = memoryplan.memory_plan(parse_cluster(raw))
    assert mp.ranks[0].nccl_gib == pytest.approx(4.7)
    assert not mp.fits  # at TP3/0.95 only the tuned buffers leave room


def test_memory_plan_output_shape():
    out = memoryplan.memory_plan(cfg_of("tp4")).to_output()
    assert out["fits"] is True and [r["role"] for r in out["ranks"]] == ["head", "worker"]
    assert out["ranks"][0]["headroomGiB"] > 0


def test_shard_names_follow_the_reference():
    assert plan.shard_files(2, 4) == ["engram-l1-r2of4.bin", "engram-l14-r2of4.bin"]
    assert memoryplan.engram_shard_gib(cfg_of("tp4")) == pytest.approx(47.25)  # ~48 GiB per node


def test_group_revision_deterministic_and_sensitive():
    cfg = cfg_of("tp4")
    specs = plan.rank_specs(cfg, "tp4")
    rev = plan.group_revision(specs)
    assert rev == plan.group_revision(plan.rank_specs(cfg_of("tp4"), "tp4"))
    assert len(rev) == 16
    changed = [replace(specs[3], env={**specs[3].env, "NCCL_DEBUG": "INFO"})]
    assert plan.group_revision(specs[:3] + changed) != rev
    assert plan.group_revision(plan.rank_specs(cfg_of("tp4", maxRunningRequests=4), "tp4")) != rev


def test_only_rank0_mounts_the_api_key():
    specs = plan.rank_specs(cfg_of("tp4"), "tp4")
    assert [any(m.target == launch.API_KEY_MOUNT for m in s.mounts) for s in specs] == [True, False, False, False]
    assert specs[0].mounts[-1].source == "/home/zurih/.local/state/deepseek-spark/tp4/api-key"  # no sudo needed
    assert all(s.restart == "no" and s.network_mode == "host" and s.ipc_mode == "host" for s in specs)


def _run_wrapper(tmp_path, env, key=None, gid_at=None, ifaces=None, check=True):
    """The SGLang entrypoint on a fake spark1 (tests/fakefabric); the server is a stub printing what it got."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = fakefabric.install(tmp_path / "fabric", bin_dir, ifaces or fakefabric.spark_ifaces(1), gid_at=gid_at)
    (bin_dir / "server").write_text('#!/bin/sh\necho "HCA=$NCCL_IB_HCA GID=${NCCL_IB_GID_INDEX:-} '
                                    'IF=$NCCL_SOCKET_IFNAME GLOO=$GLOO_SOCKET_IFNAME OOM=$(cat /proc/self/oom_score_adj)"\n'
                                    'printf "ARG=%s\\n" "$@"\n')
    (bin_dir / "server").chmod(0o755)
    key_file = tmp_path / "key"
    if key is not None:
        key_file.write_text(key)
    script = launch.launch_wrapper('exec server "$@"', key_file=str(key_file))
    planes = {"DSPARK_FABRIC_IP": "10.0.22.1", "DSPARK_BOOTSTRAP_IP": "10.0.22.1", "NODE_RANK": "0"}
    return subprocess.run(
        ["/bin/sh", "-c", script, "sglang-launch", "--tp", "4"],
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", **fake, **planes, **env},
        capture_output=True, text=True, check=check,
    )  # fmt: skip


def test_wrapper_exports_both_twins_their_gid_and_the_socket_interface_then_appends_the_key(tmp_path):
    out = _run_wrapper(tmp_path, {}, key="sk-abc").stdout
    assert "HCA=rocep1s0f1,roceP2p1s0f1 GID=3 IF=enp1s0f1np1 GLOO=enp1s0f1np1" in out
    assert f"OOM={launch.OOM_SCORE_ADJ}" in out  # the rank is the kernel's first choice, not sshd or dockerd
    assert out.splitlines()[-4:] == ["ARG=--tp", "ARG=4", "ARG=--api-key", "ARG=sk-abc"]


def test_wrapper_without_key_file_passes_no_key(tmp_path):
    assert "--api-key" not in _run_wrapper(tmp_path, {}).stdout


def test_wrapper_finds_the_roce_v2_gid_wherever_it_sits(tmp_path):
    out = _run_wrapper(tmp_path, {}, gid_at={"rocep1s0f1": 2, "roceP2p1s0f1": 2}).stdout  # at index 5
    assert "GID=5" in out


def test_wrapper_keeps_what_the_fabric_section_pins(tmp_path):
    out = _run_wrapper(tmp_path, {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "rocep1s0f1"}).stdout
    assert "HCA=rocep1s0f1 GID=3" in out


def test_wrapper_stops_the_rank_when_the_fabric_ip_is_not_on_connectx7(tmp_path):
    out = _run_wrapper(tmp_path, {"DSPARK_FABRIC_IP": "10.0.0.1"}, check=False)
    assert out.returncode == 1 and "ARG=" not in out.stdout
    assert "FAIL ip: fabricIp 10.0.0.1 is on enP7s7, which is not a ConnectX-7 interface" in out.stderr
    assert "rank 0: the fabric is not usable (above); not starting" in out.stderr


def test_vllm_specs_head_serves_worker_joins():
    cfg = parse_cluster(group_of("tp2"))
    head, worker = plan.vllm_specs(cfg, "tp2")
    assert head.container_name == "tp2-rank0" and worker.container_name == "tp2-rank1"
    assert head.args[0] == "serve" and _flag(head.args, "--gpu-memory-utilization") == "0.85"
    assert "--max-num-seqs" not in head.args
    assert worker.args[:4] == ["ray", "start", "--block", "--address"]
    assert [m.target for m in head.mounts] == [launch.MODEL_MOUNT, launch.CACHE_MOUNT, launch.API_KEY_MOUNT]
    assert [m.target for m in worker.mounts] == [launch.MODEL_MOUNT, launch.CACHE_MOUNT]
    assert head.env["VLLM_HOST_IP"] == "10.0.22.1" and worker.env["VLLM_HOST_IP"] == "10.0.22.2"


def test_vllm_memory_plan_seed_figures():
    cfg = parse_cluster(group_of("tp2"))
    mp = memoryplan.memory_plan(cfg)
    r = mp.ranks[0]
    assert mp.fits and r.weights_gib == 79 and r.kv_gib == pytest.approx(15.0)
    assert r.static_pool_gib == pytest.approx(0.85 * 121.7)
    assert r.outside_needed_gib == pytest.approx(12e9 / 2**30)  # the seed's 8-12 GB runtime, high end
    raw = cluster_of("tp2")
    raw["serving"]["maxModelLen"] = 65536
    assert memoryplan.memory_plan(parse_cluster(raw)).ranks[0].kv_gib == pytest.approx(7.5)  # linear in the context
    high = memoryplan.vllm_memory_plan(cfg, weights="high").ranks[0]
    assert high.weights_gib == 105 and not high.static_fits


def test_vllm_head_wrapper_starts_ray_gates_then_serves(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    (bin_dir / "ray").write_text(f'#!/bin/sh\necho "ray $*" >> {log}\n')
    (bin_dir / "vllm").write_text(f'#!/bin/sh\necho "vllm $* key=$VLLM_API_KEY" >> {log}\n')
    (bin_dir / "python3").write_text('#!/bin/sh\ncase "$*" in *--format*) cat > /dev/null; exit 0;; esac\n'
                                     f'cat > /dev/null; echo "gate RAY_ADDRESS=$RAY_ADDRESS" >> {log}\n')  # fabric: none
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    key = tmp_path / "key"
    key.write_text("sk-vllm")
    script = launch.launch_wrapper(launch.vllm_head_run(parse_cluster(group_of("tp2"))), key="env:VLLM_API_KEY", key_file=str(key),
                                 sysfs=str(tmp_path / "nosys"))  # fmt: skip
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "RAY_PORT": "6379", "VLLM_HOST_IP": "10.0.0.1",
           "RAY_ADDRESS": "10.0.0.1:6379", "HOST_IP": "10.0.0.1", "DSPARK_FABRIC_IP": "10.0.22.1",
           "DSPARK_BOOTSTRAP_IP": "10.0.22.1"}  # fmt: skip
    subprocess.run(["/bin/sh", "-c", script, "vllm-head", "serve", "/m", "--port", "8000"], env=env, check=True)
    assert log.read_text().splitlines() == [
        "ray start --head --port 6379 --node-ip-address 10.0.0.1 --num-gpus 1 --disable-usage-stats"
        " --node-manager-port 6380 --object-manager-port 6381 --runtime-env-agent-port 6382 --metrics-export-port 6383"
        " --min-worker-port 6390 --max-worker-port 6479 --dashboard-host 127.0.0.1",
        "gate RAY_ADDRESS=10.0.0.1:6379",
        "vllm serve /m --port 8000 key=sk-vllm",
    ]


def test_vllm_gate_code_is_valid_python():
    code = launch.VLLM_HEAD_GATE.split("<<'GATE'\n", 1)[1].split("GATE\n", 1)[0]
    compile(code, "gate", "exec")
    assert 'ray.init(address=os.environ["RAY_ADDRESS"])' in code


def test_vllm_head_does_not_serve_when_the_ray_gate_fails(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    (bin_dir / "ray").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "python3").write_text('#!/bin/sh\ncat > /dev/null; case "$*" in *--format*) exit 0;; esac; exit 1\n')  # 1/2 joined
    (bin_dir / "vllm").write_text(f"#!/bin/sh\necho served >> {log}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = launch.launch_wrapper(launch.vllm_head_run(parse_cluster(group_of("tp2"))), key=None, sysfs=str(tmp_path / "nosys"))
    out = subprocess.run(["/bin/sh", "-c", script, "vllm-head", "serve", "/m"],
                         env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "RAY_PORT": "6379", "VLLM_HOST_IP": "10.0.0.1"},
                         capture_output=True)  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert not log.exists()


def test_rank_memory_limits_follow_the_memory_plan_and_keep_the_host_reserve():
    """TP4: static pool 97.4 + outside 5.7 + the 3 GiB floor as headroom; TP3 (0.95 of the node) is
    capped at the node less memory.hostReserveGiB, the room sshd and dockerd keep."""
    tp4, tp3 = cfg_of("tp4"), cfg_of("tp3")
    head = memoryplan.memory_plan(tp4).ranks[0]
    assert memoryplan.rank_memory_mib(tp4, 0) == memoryplan.rank_memory_mib(tp4, 3) == int(
        (head.static_pool_gib + head.outside_needed_gib + 3.0) * 1024)
    assert 106 * 1024 < memoryplan.rank_memory_mib(tp4, 0) < 107 * 1024
    assert memoryplan.rank_memory_mib(tp3, 1) == int((121.7 - 1.5 - 4) * 1024) - 256  # the side reserve, the guard
    assert all(s.memory_mib == memoryplan.rank_memory_mib(tp4, s.rank) for s in plan.rank_specs(tp4, "tp4"))
    assert all(s.memory_mib for s in plan.vllm_specs(cfg_of("tp2"), "tp2"))
    raw = cluster_of("tp3")
    raw["memory"] = {"hostReserveGiB": 4}
    assert memoryplan.rank_memory_mib(parse_cluster(raw), 0) == int((121.7 - 4 - 4) * 1024) - 256  # side, guard
