"""vllm-sim + ray-sim TEST DOUBLES without docker: flag tables, auth rule, the Ray registry and the
head/worker wrappers run locally on 127.0.0.1 (exact files of the engine image overlay)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sim_helpers import HEAD_WRAPPER, WORKER_WRAPPER, http, serve_args, sse, wait_for, worker_args

from sim import images
from sim.testdouble import engram, flags, ray_sim

ROOT = Path(__file__).resolve().parents[2]
Q = {"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": "What is 19 + 23?"}]}


# ---------------------------------------------------------------- flag tables ----
def _valid_value(table: str, flag: str) -> list[str]:
    kind = flags.TABLES[table][flag]
    if kind == "bool":
        return [flag]
    if flag in flags.CHOICES[table]:
        return [flag, flags.CHOICES[table][flag][-1]]
    typ = flags.TYPES[table].get(flag, str)
    return [flag, {int: "7", float: "0.5", flags.human_int: "128k"}.get(typ, "x")]


def test_vllm_all_known_flags_accepted():
    argv = ["/m"]
    for flag in flags.VLLM_FLAGS:
        argv += _valid_value("vllm", flag)
    a = flags.parse_args(argv, "vllm")
    assert a.model == "/m" and a.tensor_parallel_size == 7 and a.max_model_len == 131072
    assert a.gpu_memory_utilization == 0.5 and a.max_num_seqs == 7 and a.served_model_name == ["x"]
    assert a.trust_remote_code and a.enforce_eager and a.disable_custom_all_reduce and a.enable_prefix_caching
    assert a.disable_log_requests


def test_vllm_program_command_line_parses():
    a = flags.build_vllm_cli().parse_args(serve_args(extra=("--enforce-eager",)))
    assert (a.subparser, a.model, a.served_model_name, a.tensor_parallel_size) == \
        ("serve", "/models/checkpoint", ["deepseek-v4.1-flash"], 2)
    assert (a.distributed_executor_backend, a.kv_cache_dtype, a.max_model_len, a.host, a.port) == \
        ("ray", "fp8_ds_mla", 131072, "0.0.0.0", 8000)
    assert a.gpu_memory_utilization == 0.85 and a.max_num_seqs == 16 and a.enforce_eager and a.api_key is None


def test_vllm_alias_underscores_and_defaults():
    a = flags.parse_args(["/m", "-tp", "2", "--max_model_len=128k", "--gpu_memory_utilization", "0.8"], "vllm")
    assert a.tensor_parallel_size == 2 and a.max_model_len == 131072 and a.gpu_memory_utilization == 0.8
    d = flags.parse_args(["/m"], "vllm")
    assert (d.tensor_parallel_size, d.port, d.host, d.kv_cache_dtype, d.distributed_executor_backend) == \
        (1, 8000, "0.0.0.0", "auto", None)
    assert [flags.human_int(x) for x in ("131072", "128k", "1M", "0.5k")] == [131072, 131072, 2**20, 512]


@pytest.mark.parametrize("argv", [
    ["/m", "--bogus-flag", "1"],
    ["/m", "--tp", "2"],                      # SGLang's flag, not vLLM's
    ["/m", "--tensor-parallel", "2"],         # no abbreviations
    ["/m", "--ray-address", "1.2.3.4:6379"],  # vLLM reads RAY_ADDRESS from the environment
    ["/m", "--kv-cache-dtype", "fp9"],
    ["/m", "--distributed-executor-backend", "torch"],
    ["/m", "--max-model-len", "lots"],
    ["/m", "--port", "eighty"],
    ["/m", "--trust-remote-code", "yes"],     # a switch takes no value -> "yes" is an extra argument
    [],                                       # MODEL is required
])
def test_vllm_rejects_with_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        flags.parse_args(argv, "vllm")
    assert e.value.code == 2


def test_ray_start_flags():
    argv = []
    for flag in flags.RAY_START_FLAGS:
        argv += _valid_value("ray start", flag)
    a = flags.parse_args(argv, "ray start")
    assert a.head and a.block and a.disable_usage_stats and a.num_gpus == 7 and a.port == 7
    assert flags.parse_args(["--address", "h:1"], "ray start").port == 6379
    for bad in (["--bogus"], ["--num-gpu", "1"], ["--port", "x"], ["--head", "yes"]):
        with pytest.raises(SystemExit) as e:
            flags.parse_args(bad, "ray start")
        assert e.value.code == 2, bad


def test_tables_live_in_flags_only():
    assert set(flags.ENGINES) == {"sglang", "vllm"} and set(flags.TABLES) == {"sglang", "vllm", "ray start"}
    for name in flags.TABLES:
        assert set(flags.TYPES[name]) <= set(flags.TABLES[name]), name
        assert set(flags.CHOICES[name]) <= set(flags.TABLES[name]), name
        assert set(flags.TABLE_DEFAULTS[name]) <= set(flags.TABLES[name]), name
        assert set(flags.ALIASES[name]) <= set(flags.TABLES[name]), name
        assert set(flags.TABLES[name].values()) <= {"value", "values", "bool"}, name


# ---------------------------------------------------------------- image layout, locally ----
@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    """The engine image overlay's python packages and CLIs, written under a temp dir (exact bytes,
    only the ``#!/usr/bin/python3`` shebang points at this interpreter)."""
    root = tmp_path_factory.mktemp("engine-image")
    ov = images.engine_overlay(images.ENGINE_ROOTFS.key())
    site, bindir = "usr/lib/python3/dist-packages/", "usr/local/bin/"
    for path, (data, mode) in ov.files.items():
        if path.startswith(site):
            dest = root / "site" / path[len(site):]
        elif path.startswith(bindir):
            dest = root / "bin" / path[len(bindir):]
            data = data.replace(b"#!/usr/bin/python3", f"#!{sys.executable}".encode(), 1)
        else:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        dest.chmod(mode)
    (root / "bin" / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (root / "bin" / "python3").chmod(0o755)
    ckpt = root / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_bytes(engram.checkpoint_files()["config.json"])
    return root


@pytest.fixture()
def env(image_root, tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "VLLM_", "DSPARK_", "CUDA_"))}
    e.update(PATH=f"{image_root / 'bin'}:{os.environ['PATH']}", PYTHONPATH=str(image_root / "site"),
             RAY_TMPDIR=str(tmp_path / "ray"), PYTHONUNBUFFERED="1")
    yield e
    subprocess.run(["ray", "stop"], env=e, capture_output=True, timeout=30)  # the background heads we started


class Procs:
    """Processes a test starts (output to files); killed by their own handle at the end."""

    def __init__(self, tmp_path: Path, env: dict):
        self.tmp, self.env, self.procs = tmp_path, env, []

    def start(self, name: str, argv: list[str], **extra_env) -> subprocess.Popen:
        out = open(self.tmp / f"{name}.log", "w")
        p = subprocess.Popen(argv, env=dict(self.env, **extra_env), stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, cwd=self.tmp)
        p.log_path = self.tmp / f"{name}.log"
        self.procs.append(p)
        return p

    def run(self, argv: list[str], timeout: float = 30, **extra_env) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=dict(self.env, **extra_env), capture_output=True, text=True,
                              timeout=timeout, cwd=self.tmp)

    @staticmethod
    def out(p) -> str:
        return p.log_path.read_text()

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture()
def procs(tmp_path, env):
    ps = Procs(tmp_path, env)
    yield ps
    ps.stop_all()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(procs: Procs, port: int) -> int | None:
    r = procs.run(["ray", "status", "--address", f"127.0.0.1:{port}"], timeout=15)
    return r.stdout.split("Pending:")[0].count(" node_") if r.returncode == 0 else None


def test_entry_points_and_modules(procs, image_root):
    assert procs.run(["vllm", "--version"]).stdout.strip().endswith("+test-double")
    assert "test-double" in procs.run(["ray", "--version"]).stdout
    r = procs.run(["python3", "-c", "import ray, vllm; print(ray.__version__, ray.is_initialized(), vllm.__version__)"])
    assert r.returncode == 0 and r.stdout.split()[1] == "False", r.stderr
    r = procs.run(["vllm", "serve", "/m", "--no-such-flag", "1"])
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr
    assert procs.run(["vllm"]).returncode == 2
    r = procs.run(["ray", "start", "--head", "--no-such-flag"])
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr
    assert procs.run(["ray", "frobnicate"]).returncode == 2
    assert procs.run(["ray", "start"]).returncode == 1  # neither --head nor --address
    assert procs.run(["ray", "status"]).returncode == 1  # no cluster
    assert set(Path(images.TESTDOUBLE).glob("*.py")) and all(
        (image_root / "site" / "dspark_testdouble" / p.name).exists() for p in Path(images.TESTDOUBLE).glob("*.py"))


# ---------------------------------------------------------------- serving + auth ----
@pytest.mark.parametrize("key_via", ["flag", "env"])
def test_vllm_auth_rule_and_api(procs, image_root, key_via):
    port = _free_port()
    args = ["vllm", "serve", str(image_root / "ckpt"), "--served-model-name", "deepseek-v4.1-flash",
            "--max-model-len", "131072", "--host", "127.0.0.1", "--port", str(port)]
    p = procs.start("vllm", args + (["--api-key", "k"] if key_via == "flag" else []),
                    **({"VLLM_API_KEY": "k"} if key_via == "env" else {}))
    base = f"http://127.0.0.1:{port}"
    assert wait_for(lambda: http(base + "/health")[0] == 200, 20), procs.out(p)
    assert http(base + "/health") == (200, "")            # never authenticated, empty body like vLLM
    assert http(base + "/ping")[0] == 200 and json.loads(http(base + "/version")[1])["version"]
    assert http(base + "/v1/models") == (401, '{"error": "Unauthorized"}')
    assert http(base + "/v1/models", "wrong")[0] == 401
    assert http(base + "/v1/chat/completions", "wrong", Q)[0] == 401
    assert http(base + "/nothing-here")[0] == 404            # outside /v1: no key needed, just no route
    code, body = http(base + "/v1/models", "k")
    m = json.loads(body)["data"][0]
    assert code == 200 and m["id"] == "deepseek-v4.1-flash" and m["max_model_len"] == 131072
    code, body = http(base + "/v1/chat/completions", "k", Q)
    j = json.loads(body)
    assert code == 200 and j["object"] == "chat.completion" and j["choices"][0]["message"]["content"] == "42"
    assert j["usage"]["total_tokens"] == j["usage"]["prompt_tokens"] + j["usage"]["completion_tokens"]
    code, body = http(base + "/v1/chat/completions", "k", dict(Q, model="other"))
    assert code == 404 and json.loads(body)["error"]["type"] == "NotFoundError"
    chunks = sse(base + "/v1/chat/completions", "k", dict(Q, stream_options={"include_usage": True}))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "42"
    assert chunks[-1]["usage"]["completion_tokens"] == 1
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0 and "executor uni ready" in procs.out(p)


def test_vllm_without_key_leaves_v1_open(procs, image_root):
    port = _free_port()
    p = procs.start("vllm", ["vllm", "serve", str(image_root / "ckpt"), "--host", "127.0.0.1", "--port", str(port)])
    base = f"http://127.0.0.1:{port}"
    assert wait_for(lambda: http(base + "/health")[0] == 200, 20), procs.out(p)
    code, body = http(base + "/v1/models")
    assert code == 200 and json.loads(body)["data"][0]["id"] == str(image_root / "ckpt")  # served name = MODEL


@pytest.mark.parametrize("case", ["missing", "no-config", "mp-too-big", "no-cluster", "auto-unreachable"])
def test_vllm_startup_errors_exit_1(procs, image_root, tmp_path, case):
    model = str(image_root / "ckpt")
    extra_env = {}
    args = ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]
    if case == "missing":
        model = str(tmp_path / "nope")
    elif case == "no-config":
        model = str(tmp_path)
    elif case == "mp-too-big":
        args = ["-tp", "2", "--distributed-executor-backend", "mp"]
    elif case == "auto-unreachable":
        extra_env = {"RAY_ADDRESS": f"127.0.0.1:{_free_port()}", "DSPARK_RAY_INIT_TIMEOUT": "1"}
    r = procs.run(["vllm", "serve", model, "--port", str(_free_port()), *args], **extra_env)
    want = {"missing": "Invalid repository ID or local directory specified",
            "no-config": "No usable config.json",
            "mp-too-big": "World size (2) is larger than the number of available GPUs (1)",
            # no RAY_ADDRESS, no local head: ray.init() starts a 1-GPU local instance, too small for tp 2
            "no-cluster": "The number of required GPUs exceeds the total number of available GPUs",
            "auto-unreachable": "ConnectionError: Failed to connect to the Ray head"}[case]
    assert r.returncode == 1 and want in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------- ray registry ----
def test_ray_api_in_process(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(RuntimeError):
        ray_sim.nodes()
    with pytest.raises(ConnectionError, match="Could not find any running Ray instance"):
        ray_sim.init("auto")
    ray_sim.init()  # nothing running: a local in-process instance
    try:
        assert ray_sim.is_initialized()
        (n,) = ray_sim.nodes()
        assert n["Alive"] and n["Resources"]["GPU"] == 2.0 and len(n["NodeID"]) == 56
        assert ray_sim.cluster_resources()["GPU"] == 2.0
        with pytest.raises(RuntimeError, match="ray.init twice"):
            ray_sim.init()
        ray_sim.init(ignore_reinit_error=True)
    finally:
        ray_sim.shutdown()
    assert not ray_sim.is_initialized()


def test_registry_marks_closed_and_silent_nodes_dead(monkeypatch):
    monkeypatch.setattr(ray_sim, "NODE_TIMEOUT_S", 1.5)
    head = ray_sim.Head("127.0.0.1", 0, 1, bind="127.0.0.1").start()
    addr = f"127.0.0.1:{head.port}"
    try:
        conns = []
        for ip in ("127.0.0.2", "127.0.0.3"):
            c = socket.create_connection(("127.0.0.1", head.port))
            c.sendall(json.dumps({"op": "register", "ip": ip, "gpus": 1}).encode() + b"\n")
            assert json.loads(c.makefile("rb").readline())["op"] == "registered"
            conns.append(c)
        nodes = ray_sim.query(addr)
        assert [(n["NodeManagerAddress"], n["Alive"], n["Resources"].get("GPU")) for n in nodes] == \
            [("127.0.0.1", True, 1.0), ("127.0.0.2", True, 1.0), ("127.0.0.3", True, 1.0)]
        assert nodes[0]["IsHead"] and "node:__internal_head__" in nodes[0]["Resources"]
        conns[0].close()  # closed connection -> dead at once
        assert wait_for(lambda: not ray_sim.query(addr)[1]["Alive"], 5)
        assert ray_sim.query(addr)[1]["DeathReasonMessage"] == "connection closed"
        # conns[1] never sends a heartbeat -> dead after NODE_TIMEOUT_S
        assert wait_for(lambda: not ray_sim.query(addr)[2]["Alive"], 5)
        assert "no heartbeat" in ray_sim.query(addr)[2]["DeathReasonMessage"]
        assert ray_sim.query(addr)[0]["Alive"]
        conns[1].close()
    finally:
        head.stop()


def test_worker_waits_for_head_then_exits_when_it_goes(procs):
    port = _free_port()
    w = procs.start("worker", worker_args("127.0.0.1", "127.0.0.2", port), DSPARK_RAY_CONNECT_TIMEOUT="60")
    time.sleep(2)  # head not up yet: the worker keeps retrying
    assert w.poll() is None
    r = procs.run(["ray", "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
                   "--num-gpus", "1", "--disable-usage-stats"])
    assert r.returncode == 0 and "Ray runtime started" in r.stdout, r.stdout + r.stderr
    assert wait_for(lambda: _alive(procs, port) == 2, 20), procs.out(w)
    r = procs.run(["python3", "-c", "import ray; ray.init('auto'); print(ray.nodes()[0]['NodeManagerAddress'])"])
    assert r.stdout.splitlines()[-1] == "127.0.0.1"  # "auto" finds the local head's recorded address
    assert f"Connected to Ray cluster at 127.0.0.1:{port}" in r.stdout
    assert procs.run(["ray", "stop"]).returncode == 0  # the head goes away
    assert w.wait(20) == 1
    assert "registered node" in procs.out(w) and "lost the Ray head" in procs.out(w)


def test_worker_gives_up_without_head(procs):
    w = procs.start("worker", worker_args("127.0.0.1", "127.0.0.2", _free_port()), DSPARK_RAY_CONNECT_TIMEOUT="2")
    assert w.wait(20) == 1 and "not reachable after 2s" in procs.out(w)


def test_head_port_in_use_fails(procs):
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen(1)
        r = procs.run(["ray", "start", "--head", "--port", str(s.getsockname()[1]), "--num-gpus", "1"])
    assert r.returncode == 1 and "cannot listen" in r.stderr


# ---------------------------------------------------------------- wrappers, locally ----
def _head(procs, image_root, ray_port, http_port, key_file=None, **extra_env):
    e = {"RAY_ADDRESS": f"127.0.0.1:{ray_port}", "RAY_PORT": str(ray_port), "VLLM_HOST_IP": "127.0.0.1",
         "DSPARK_RAY_NODES": "2", "RAY_memory_monitor_refresh_ms": "0", "NCCL_SOCKET_IFNAME": "lo",
         "GLOO_SOCKET_IFNAME": "lo", "DSPARK_API_KEY_FILE": str(key_file or "/nonexistent")}
    e.update(extra_env)
    return procs.start("head", ["/bin/sh", "-c", HEAD_WRAPPER, "vllm-head",
                                *serve_args(http_port, model=str(image_root / "ckpt"))], **e)


def test_head_and_worker_wrappers_locally(procs, image_root, tmp_path):
    ray_port, http_port = _free_port(), _free_port()
    key = tmp_path / "api-key"
    key.write_text("sekret")
    head = _head(procs, image_root, ray_port, http_port, key)
    base = f"http://127.0.0.1:{http_port}"
    assert wait_for(lambda: _alive(procs, ray_port) == 1, 20), procs.out(head)
    time.sleep(1.5)
    assert head.poll() is None and http(base + "/health")[0] is None  # gated: vllm not started yet
    worker = procs.start("worker", ["/bin/sh", "-c", WORKER_WRAPPER, "ray-worker",
                                    *worker_args("127.0.0.1", "127.0.0.2", ray_port)])
    assert wait_for(lambda: http(base + "/health")[0] == 200, 30), procs.out(head) + procs.out(worker)
    out = procs.out(head)
    assert "ray gate: 2/2 Ray nodes alive" in out and "placement group ready" in out
    assert "rank 0 on" in out and "(127.0.0.1), rank 1 on" in out and "(127.0.0.2)" in out
    assert http(base + "/v1/models")[0] == 401 and http(base + "/v1/models", "sekret")[0] == 200
    assert json.loads(http(base + "/v1/chat/completions", "sekret", Q)[1])["choices"][0]["message"]["content"] == "42"
    worker.terminate()  # docker stop: SIGTERM to the worker's ray process
    assert worker.wait(10) == 0
    assert head.wait(20) == 1, procs.out(head)
    assert "lost Ray node(s)" in procs.out(head) and "127.0.0.2" in procs.out(head)


def test_head_gate_times_out_without_worker(procs, image_root):
    head = _head(procs, image_root, _free_port(), _free_port(), DSPARK_RAY_WAIT="2")
    assert head.wait(30) == 1
    out = procs.out(head)
    assert "ray gate: only 1/2 Ray nodes alive after 2s; giving up" in out and "vllm-sim" not in out
