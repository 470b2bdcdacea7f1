"""vllm-sim TEST DOUBLE without docker: flag tables, auth rule and startup errors, run locally on
127.0.0.1 (exact files of the engine image overlay). Ray is REAL Ray in the engine image (not installed
on the host): the Ray paths (head, workers, gate, lost nodes) are in test_vllm_ray_cluster.py."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sim_helpers import http, serve_args, sse, wait_for

from sim import images, rootfs
from sim.testdouble import engram, flags

ROOT = Path(__file__).resolve().parents[2]
Q = {"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": "What is 19 + 23?"}]}


# ---------------------------------------------------------------- flag tables ----
def test_vllm_program_command_line_parses():
    a = flags.build_vllm_cli().parse_args(serve_args(extra=("--enforce-eager",)))
    assert (a.subparser, a.model_tag, a.served_model_name, a.tensor_parallel_size) == \
        ("serve", "/models/checkpoint", ["deepseek-v4.1-flash"], 2)
    assert (a.distributed_executor_backend, a.kv_cache_dtype, flags.human_int(a.max_model_len), a.host, a.port) == \
        ("ray", "fp8_ds_mla", 131072, "0.0.0.0", 8000)
    assert a.gpu_memory_utilization == 0.85 and a.max_num_seqs == 16 and a.enforce_eager and a.api_key is None


def test_vllm_alias_underscores_abbreviations_and_defaults():
    a = flags.parse_args(["/m", "-tp", "2", "--max_model_len=128k", "--gpu_memory_utilization", "0.8"], "vllm")
    assert a.tensor_parallel_size == 2 and flags.human_int(a.max_model_len) == 131072
    assert a.gpu_memory_utilization == 0.8
    assert flags.parse_args(["/m", "--tensor-parallel", "2"], "vllm").tensor_parallel_size == 2  # allow_abbrev
    assert flags.parse_args(["/m", "--device-memory-utilization", "0.7"], "vllm").gpu_memory_utilization == 0.7
    d = flags.parse_args(["/m"], "vllm")
    assert (d.tensor_parallel_size, d.port, d.kv_cache_dtype, d.distributed_executor_backend) == \
        (1, 8000, "auto", None)
    assert [flags.human_int(x) for x in ("131072", "128k", "1M", "0.5k")] == [131072, 131072, 2**20, 512]


@pytest.mark.parametrize("argv", [
    ["/m", "--bogus-flag", "1"],
    ["/m", "--tp", "2"],                      # SGLang's flag, not vLLM's
    ["/m", "--ray-address", "1.2.3.4:6379"],  # vLLM reads RAY_ADDRESS from the environment
    ["/m", "--kv-cache-dtype", "fp9"],
    ["/m", "--port", "eighty"],
])
def test_vllm_rejects_with_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        flags.parse_args(argv, "vllm")
    assert e.value.code == 2


# ---------------------------------------------------------------- image layout, locally ----
@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    """The engine image overlay's python packages and CLIs, written under a temp dir (exact bytes,
    only the ``#!/usr/bin/python3`` shebang points at this interpreter)."""
    root = tmp_path_factory.mktemp("engine-image")
    ov = images.engine_overlay(rootfs.ENGINE_ROOTFS.key())
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
    return e


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


def test_entry_points_and_modules(procs, image_root):
    assert procs.run(["vllm", "--version"]).stdout.strip().endswith("+test-double")
    assert not (image_root / "bin" / "ray").exists()  # Ray is the real wheel, installed into the rootfs
    r = procs.run(["python3", "-c", "import vllm; print(vllm.__version__)"])
    assert r.returncode == 0 and r.stdout.strip().endswith("+test-double"), r.stderr
    r = procs.run(["vllm", "serve", "/m", "--no-such-flag", "1"])
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr
    assert procs.run(["vllm"]).returncode == 2
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


@pytest.mark.parametrize("case", ["missing", "no-config", "mp-too-big"])
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
    r = procs.run(["vllm", "serve", model, "--port", str(_free_port()), *args], **extra_env)
    want = {"missing": "Invalid repository ID or local directory specified",
            "no-config": "No usable config.json",
            "mp-too-big": "World size (2) is larger than the number of available GPUs (1)"}[case]
    assert r.returncode == 1 and want in r.stdout, r.stdout + r.stderr
