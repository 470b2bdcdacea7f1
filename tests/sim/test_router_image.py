"""The REAL SGLang router (PyPI ``sglang-router``, in the engine image) in front of both TEST DOUBLES.

One container of the engine image runs a vLLM double, an SGLang double and
``python3 -m sglang_router.launch_router --policy round_robin --api-key k1`` on its loopback; the
script below (run by the image's python3) checks that the router registers both doubles, spreads chat
completions over them with the client's Bearer key, answers 401 without it, passes a stream
through, and which worker endpoints the router called while registering them (the doubles' request
logs). Needs a docker engine (marker ``integration``).
"""
from __future__ import annotations

import json
import re

import pytest

from sim import backend, images

pytestmark = pytest.mark.integration

SCRIPT = r'''
import json, os, subprocess, sys, time, urllib.error, urllib.request

KEY, MODEL = "k1", "deepseek-v4.1-flash"
os.makedirs("/tmp/ck", exist_ok=True)
open("/tmp/ck/config.json", "w").write("{}")
logs = {n: open(f"/tmp/{n}.log", "w+") for n in ("vllm", "sglang", "router")}
procs = [
    subprocess.Popen(["vllm", "serve", "/tmp/ck", "--served-model-name", MODEL, "--host", "127.0.0.1",
                      "--port", "8001", "--api-key", KEY, "--uvicorn-log-level", "debug"],
                     stdout=logs["vllm"], stderr=subprocess.STDOUT),
    subprocess.Popen(["python3", "-m", "sglang.launch_server", "--model-path", "/tmp/ck", "--served-model-name",
                      MODEL, "--host", "127.0.0.1", "--port", "8002", "--api-key", KEY, "--enable-metrics",
                      "--log-level", "debug"], stdout=logs["sglang"], stderr=subprocess.STDOUT),
]


def call(path, key=None, body=None, port=8000):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def wait(pred, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.2)
    return False


out = {}
try:
    out["doubles_up"] = all(wait(lambda p=p: call("/health", port=p)[0] == 200) for p in (8001, 8002))
    procs.append(subprocess.Popen(
        ["python3", "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", "8000",
         "--prometheus-port", "29000", "--policy", "round_robin", "--api-key", KEY,
         "--worker-urls", "http://127.0.0.1:8001", "http://127.0.0.1:8002"],
        stdout=logs["router"], stderr=subprocess.STDOUT))

    def healthy():
        code, body = call("/workers", KEY)
        return code == 200 and sum(w["is_healthy"] for w in json.loads(body)["workers"]) == 2

    out["registered"] = wait(healthy)
    q = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}
    answers = []
    for _ in range(4):
        code, body = call("/v1/chat/completions", KEY, q)
        answers.append([code, json.loads(body)["choices"][0]["message"]["content"] if code == 200 else body])
    out["answers"] = answers
    out["no_key"] = call("/v1/chat/completions", None, q)[0]
    out["wrong_key"] = call("/v1/chat/completions", "nope", q)[0]
    code, body = call("/v1/chat/completions", KEY, dict(q, stream=True,
                      messages=[{"role": "user", "content": "What is 19 + 23?"}]))
    out["stream"] = [code, body.strip().splitlines()[-1] if body.strip() else "", "42" in body]
    out["sglang_metrics"] = call("/metrics", port=8002)[0]
    out["vllm_metrics"] = call("/metrics", port=8001)[0]
finally:
    for p in procs:
        p.kill()
        p.wait()
for n, f in logs.items():
    f.seek(0)
    out[n + "_log"] = f.read()
print(json.dumps(out))
'''


def test_real_router_registers_and_routes_to_both_doubles(docker_engine):
    images.ensure_engine_image(log=lambda m: None)
    r = backend.docker("run", "--rm", "-i", "--entrypoint", "python3", images.ENGINE_IMAGE, "-", input=SCRIPT,
                       timeout=180, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    logs = "\n".join(f"--- {n}\n{out[n + '_log']}" for n in ("router", "vllm", "sglang"))
    assert out["doubles_up"] and out["registered"], logs
    assert all(code == 200 for code, _ in out["answers"]), out["answers"]
    texts = {text for _, text in out["answers"]}
    assert texts == {"This is the vllm-sim test double; it does not run a model.",
                     "This is the sglang-sim test double; it does not run a model."}, texts  # round robin: both
    assert out["no_key"] == 401 and out["wrong_key"] == 401
    assert out["stream"] == [200, "data: [DONE]", True]
    assert out["sglang_metrics"] == 200 and out["vllm_metrics"] == 200
    for name in ("vllm", "sglang"):  # registration: health, then metadata (/model_info, then /get_model_info)
        called = out[name + "_log"]
        assert '"GET /health HTTP/1.1" 200' in called, called
        if name == "vllm":  # vLLM serves neither: 404 on both, and the router goes on
            assert '"GET /get_model_info HTTP/1.1" 404' in called, called
        else:  # SGLang serves /model_info (behind its key, as the real one), so the router asks no further
            assert re.search(r'"GET /model_info HTTP/1.1" (200|401)', called), called
        assert called.count('"POST /v1/chat/completions HTTP/1.1" 200') >= 2, called
