"""The engine TEST DOUBLES' HTTP routes and API-key rules are the real engines' (no docker: each double's API runs
in this process on loopback, ``openai_api.serve_local``; a few checks start the real entry points as processes).

vLLM (its AuthenticationMiddleware): only /v1, /v2, /inference and /cohere need the key, so SageMaker's /invocations
answers a chat completion without one, as do /tokenize, /generative_scoring, the elastic EP routes and, with
VLLM_SERVER_DEV_MODE=1, the development routes. SGLang (decide_request_auth): everything but /health*, /ready* and
/metrics* needs the key; the admin routes take --admin-api-key when it is set; worker ranks serve an unguarded
dummy health server. tests/conformance/test_double_routes.py holds the doubles against the real packages' apps.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.client import HTTPConnection
from pathlib import Path

import pytest

import engine_double
from sim.testdouble import engram, openai_api, server, vllm_serve

ROOT = Path(__file__).resolve().parents[2]
Q = {"messages": [{"role": "user", "content": "What is 19 + 23?"}]}


def call(base: str, method: str, path: str, key: str | None = None, body=None, headers: dict | None = None,
         timeout: float = 10) -> tuple[int, str]:
    """One request (any method, the path sent as given); (status, body text)."""
    host = base.split("//", 1)[1]
    conn = HTTPConnection(host, timeout=timeout)
    hdrs = dict(headers or {})
    if key:
        hdrs["Authorization"] = f"Bearer {key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=hdrs)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def content(text: str) -> str:
    j = json.loads(text)
    c = j["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


@pytest.fixture()
def serve():
    """serve(handler) -> base URL; every server stopped at the end."""
    with openai_api.local_servers() as start:
        yield start


def vllm(serve, *extra: str, env: dict | None = None) -> str:
    return serve(vllm_serve.http_api(["/ckpt", "--served-model-name", "m", "--api-key", "k", *extra], env=env or {}))


def sglang(serve, *extra: str, ready: bool = True) -> str:
    return serve(server.http_api(["--model-path", "/m", "--served-model-name", "m", "--enable-metrics", *extra],
                                 ready=ready))


# ---------------------------------------------------------------------------------------------- vLLM ----
def test_vllm_invocations_is_a_keyless_chat_completion(serve):
    base = vllm(serve)
    code, body = call(base, "POST", "/v1/chat/completions", None, Q)
    assert (code, json.loads(body)) == (401, {"error": "Unauthorized"})
    code, keyed = call(base, "POST", "/v1/chat/completions", "k", Q)
    assert code == 200 and content(keyed) == "42"
    code, open_ = call(base, "POST", "/invocations", None, Q)  # SageMaker: no key, same answer
    assert code == 200 and content(open_) == "42"
    a, b = json.loads(keyed), json.loads(open_)
    assert a["object"] == b["object"] == "chat.completion" and a["usage"] == b["usage"] and a["model"] == b["model"]
    code, body = call(base, "POST", "/invocations", None, {"prompt": "What is 19 + 23?"})  # a CompletionRequest
    assert code == 200 and json.loads(body)["object"] == "text_completion" and content(body) == "42"
    code, body = call(base, "POST", "/v1/completions", "k", {"prompt": "What is 19 + 23?"})
    assert code == 200 and content(body) == "42"
    code, body = call(base, "POST", "/invocations", None, {"prompt": ""})  # neither request type validates
    assert code == 400 and "Cannot find suitable handler" in json.loads(body)["error"]["message"]
    code, body = call(base, "POST", "/invocations", None, dict(Q, stream=True))
    assert code == 200 and '"content": "42"' in body and body.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize("path,method", [("/v1/models", "GET"), ("/v1/chat/completions", "POST"),
                                         ("/v1/completions", "POST"), ("/v1/no-such-route", "GET"),
                                         ("/v2/rerank", "POST"), ("/inference/v1/generate", "POST"),
                                         ("/cohere/v2/chat", "POST"), ("/%761/models", "GET")])
def test_vllm_guarded_prefixes_answer_401_before_routing(serve, path, method):
    base = vllm(serve)
    assert call(base, method, path, None, {} if method == "POST" else None) == (401, '{"error": "Unauthorized"}')
    assert call(base, method, path, "wrong", {} if method == "POST" else None)[0] == 401
    assert call(base, method, path, None, headers={"Authorization": "Basic k"})[0] == 401
    assert call(base, method, path, "k", Q if method == "POST" else None)[0] != 401


def test_vllm_every_key_and_any_case_of_bearer(serve):
    base = serve(vllm_serve.http_api(["/ckpt", "--api-key", "k1", "k2"], env={}))
    for header in ("Bearer k1", "Bearer k2", "bearer k1", "BEARER k2"):
        assert call(base, "GET", "/v1/models", headers={"Authorization": header})[0] == 200, header
    assert call(base, "GET", "/v1/models", headers={"Authorization": "Bearer k3"})[0] == 401
    env_key = serve(vllm_serve.http_api(["/ckpt"], env={"VLLM_API_KEY": "e"}))  # $VLLM_API_KEY when no --api-key
    assert call(env_key, "GET", "/v1/models")[0] == 401 and call(env_key, "GET", "/v1/models", "e")[0] == 200
    both = serve(vllm_serve.http_api(["/ckpt", "--api-key", "f"], env={"VLLM_API_KEY": "e"}))  # the flag wins
    assert call(both, "GET", "/v1/models", "e")[0] == 401 and call(both, "GET", "/v1/models", "f")[0] == 200


def test_vllm_open_routes(serve):
    base = vllm(serve)
    assert call(base, "GET", "/health") == (200, "") and call(base, "GET", "/ping") == (200, "")
    assert call(base, "POST", "/ping") == (200, "")
    assert call(base, "POST", "/health") == (405, '{"detail": "Method Not Allowed"}')
    assert json.loads(call(base, "GET", "/version")[1]) == {"version": vllm_serve.__version__}
    assert json.loads(call(base, "GET", "/load")[1]) == {"server_load": 0}
    assert json.loads(call(base, "GET", "/kv_event_sources")[1]) == {}
    for path in ("/metrics", "/metrics/", "/metricsx"):  # the Prometheus mount: the prefix, any method
        code, text = call(base, "GET", path)
        assert code == 200 and "vllm:num_requests_running" in text, path
    assert call(base, "POST", "/metrics")[0] == 200
    code, body = call(base, "POST", "/tokenize", None, {"prompt": "hi", "return_token_strs": True})
    assert code == 200 and json.loads(body) == {"count": 2, "max_model_len": 131072, "tokens": [104, 105],
                                                "token_strs": ["h", "i"]}  # fmt: skip
    assert json.loads(call(base, "POST", "/tokenize", None, Q)[1])["count"] == len("What is 19 + 23?")
    assert call(base, "POST", "/detokenize", None, {"tokens": [104, 105]}) == (200, '{"prompt": "hi"}')
    assert call(base, "POST", "/tokenize", None, {"prompt": "x", "model": "other"})[0] == 404
    code, body = call(base, "POST", "/generative_scoring", None, {"query": "q", "items": ["a", "b"],
                                                                 "label_token_ids": [1, 2, 3, 4]})  # fmt: skip
    assert code == 200 and [d["score"] for d in json.loads(body)["data"]] == [0.25, 0.25]
    code, body = call(base, "POST", "/generative_scoring", None, {"query": "q", "items": [], "label_token_ids": [1]})
    assert code == 400 and json.loads(body)["error"]["message"] == "items must contain at least one item."
    assert call(base, "GET", "/openapi.json")[0] == 200 and call(base, "GET", "/docs")[0] == 200
    assert call(base, "GET", "/no/such/route", "k") == (404, '{"detail": "Not Found"}')
    assert call(base, "GET", "/tokenize") == (405, '{"detail": "Method Not Allowed"}')
    assert call(base, "OPTIONS", "/v1/models")[0] == 405  # OPTIONS passes the key check, then no such method
    nodocs = serve(vllm_serve.http_api(["/ckpt", "--disable-fastapi-docs"], env={}))
    assert call(nodocs, "GET", "/openapi.json")[0] == 404


def test_vllm_elastic_ep_routes_without_elastic_ep(serve):
    """What vLLM answers when it runs no elastic EP (data parallel size 1, AsyncMPClient): the same size is a
    no-op reported as done, another fails in the engine client (500 "Scale failed")."""
    base = vllm(serve)
    assert call(base, "POST", "/is_scaling_elastic_ep") == (200, '{"is_scaling_elastic_ep": false}')

    def scale(body):
        code, text = call(base, "POST", "/scale_elastic_ep", None, body)
        return code, json.loads(text)

    assert scale({"new_data_parallel_size": 1}) == (200, {"message": "Scaled to 1 data parallel engines"})
    code, j = scale({"new_data_parallel_size": 2})
    assert code == 500 and j["error"] == {"message": "Scale failed", "type": "Internal Server Error", "param": None,
                                          "code": 500}  # fmt: skip
    assert scale({})[1]["error"]["message"] == "new_data_parallel_size is required"
    assert scale({"new_data_parallel_size": 0})[1]["error"]["message"] == (
        "new_data_parallel_size must be a positive integer")
    assert scale({"new_data_parallel_size": 1, "drain_timeout": "x"})[0] == 400


def test_vllm_0_33_differences(serve):
    """Standing in for 0.33.0 (DSPARK_SIM_VLLM_VERSION): the scale-out routes answer 403 while they are off, and
    /is_scaling_elastic_ep adds the external elastic EP status fields."""
    old = serve(vllm_serve.http_api(["/ckpt", "--api-key", "k"], env={}, version="0.31.0"))
    new = serve(vllm_serve.http_api(["/ckpt", "--api-key", "k"], env={}, version="0.33.0"))
    for path in vllm_serve.SCALE_OUT_ROUTES:
        unauthorized = (401, '{"error": "Unauthorized"}')
        assert call(old, "POST", path, None, {}) == call(new, "POST", path, None, {}) == unauthorized
        assert call(old, "POST", path, "k", {})[0] == 404
        code, body = call(new, "POST", path, "k", {})
        assert code == 403 and json.loads(body)["error"]["type"] == "PermissionDeniedError", path
    assert json.loads(call(old, "POST", "/is_scaling_elastic_ep")[1]) == {"is_scaling_elastic_ep": False}
    assert json.loads(call(new, "POST", "/is_scaling_elastic_ep")[1]) == dict(
        is_scaling_elastic_ep=False, phase="idle", epoch=None, error=None, requested_data_parallel_size=None)


def test_vllm_dev_routes_only_in_dev_mode(serve):
    plain = vllm(serve)
    for method, path in (("POST", "/pause"), ("GET", "/is_paused"), ("POST", "/sleep"), ("GET", "/server_info")):
        assert call(plain, method, path)[0] == 404, path
    base = vllm(serve, env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_API_KEY": "x", "VLLM_LOGGING_LEVEL": "INFO"})
    assert call(base, "GET", "/is_paused") == (200, '{"is_paused": false}')
    assert call(base, "POST", "/pause") == (200, '{"status": "paused"}')  # no key: open
    assert call(base, "GET", "/is_paused") == (200, '{"is_paused": true}')
    done = {}
    t = threading.Thread(target=lambda: done.update(r=call(base, "POST", "/invocations", None, Q)))
    t.start()
    time.sleep(0.5)
    assert t.is_alive()  # held: a paused engine schedules nothing
    assert call(base, "POST", "/resume") == (200, '{"status": "resumed"}')
    t.join(10)
    assert done["r"][0] == 200 and content(done["r"][1]) == "42"
    assert call(base, "POST", "/pause?mode=later")[0] == 400
    assert call(base, "POST", "/sleep?level=1") == (200, "")
    assert call(base, "GET", "/is_sleeping") == (200, '{"is_sleeping": true}')
    assert call(base, "POST", "/wake_up?tags=weights")[0] == 200
    assert json.loads(call(base, "GET", "/is_sleeping")[1]) == {"is_sleeping": True}  # the KV cache still asleep
    assert call(base, "POST", "/wake_up")[0] == 200
    assert call(base, "GET", "/is_sleeping") == (200, '{"is_sleeping": false}')
    assert call(base, "POST", "/reset_prefix_cache") == (200, '{"success": true}')
    code, body = call(base, "GET", "/server_info")
    info = json.loads(body)
    assert code == 200 and set(info) == {"vllm_config", "vllm_env", "system_env"}
    assert info["vllm_env"] == {"VLLM_LOGGING_LEVEL": "INFO", "VLLM_SERVER_DEV_MODE": "1"}  # no *KEY* variable
    assert call(base, "GET", "/v1/models")[0] == 401  # the guarded prefixes stay guarded


def test_vllm_refuses_a_dev_mode_value_int_refuses(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_bytes(engram.checkpoint_files()["config.json"])
    r = subprocess.run([sys.executable, "-m", "sim.testdouble.vllm_serve", "serve", str(ckpt), "--port",
                        str(engine_double.free_port()), "--host", "127.0.0.1"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "VLLM_SERVER_DEV_MODE": "yes"})
    assert r.returncode == 1 and "ValueError: invalid literal for int() with base 10: 'yes'" in r.stdout


def test_vllm_process_serves_invocations_without_a_key(tmp_path):
    """The real entry point (`vllm serve` double as a process): /invocations answers without the key."""
    e = engine_double.Engine("vllm", tmp_path, env={"VLLM_SERVER_DEV_MODE": "1"})
    try:
        code, body = engine_double.http(e.base + "/invocations", None, dict(Q, model=engine_double.MODEL))
        assert code == 200 and content(body) == "42"
        assert engine_double.http(e.base + "/v1/chat/completions", None, Q)[0] == 401
        assert engine_double.http(e.base + "/is_paused")[0] == 200
    finally:
        e.stop()


# -------------------------------------------------------------------------------------------- SGLang ----
def test_sglang_guards_everything_but_health_ready_and_metrics(serve):
    base = sglang(serve, "--api-key", "k")
    for method, path in (("GET", "/get_server_info"), ("GET", "/server_info"), ("GET", "/get_model_info"),
                         ("GET", "/model_info"), ("POST", "/flush_cache"), ("GET", "/flush_cache"),
                         ("POST", "/update_weights_from_disk"), ("POST", "/invocations"), ("POST", "/generate"),
                         ("GET", "/ping"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                         ("GET", "/openapi.json"), ("GET", "/no/such/route")):  # fmt: skip
        assert call(base, method, path, None, {} if method == "POST" else None) == (401, '{"error": "Unauthorized"}')
        assert call(base, method, path, "Bearer-ish", None)[0] == 401
    for method, path in (("GET", "/health"), ("GET", "/health_generate"), ("GET", "/ready"), ("GET", "/metrics"),
                         ("POST", "/metrics"), ("GET", "/metrics/x")):  # fmt: skip
        assert call(base, method, path)[0] == 200, path
    assert call(base, "GET", "/health_whatever") == (404, '{"detail": "Not Found"}')  # open prefix, no route
    assert call(base, "OPTIONS", "/get_server_info")[0] == 405  # OPTIONS passes, then no such method
    code, body = call(base, "GET", "/get_server_info", "k")
    assert code == 200 and json.loads(body)["api_key"] == "k"  # the real one reports its resolved args, keys too
    assert call(base, "GET", "/get_server_info", headers={"Authorization": "bearer k"})[0] == 200
    code, body = call(base, "POST", "/invocations", "k", Q)
    assert code == 200 and content(body) == "42"
    code, body = call(base, "POST", "/generate", "k", {"text": "What is 19 + 23?"})
    assert code == 200 and json.loads(body)["text"] == "42"
    assert json.loads(call(base, "GET", "/get_model_info", "k")[1])["served_model_name"] == "m"
    assert call(base, "POST", "/flush_cache", "k")[1].startswith("Cache flushed.")
    code, body = call(base, "POST", "/update_weights_from_disk", "k", {"model_path": "/nonexistent"})
    assert code == 400 and json.loads(body)["success"] is False


def test_sglang_health_generate_is_open_and_generates_once_ready(serve):
    base = sglang(serve, "--api-key", "k", ready=False)
    assert call(base, "GET", "/health_generate") == (503, "") and call(base, "GET", "/health") == (503, "")
    assert call(base, "GET", "/ready") == (503, "")
    assert call(base, "GET", "/get_server_info", "k")[0] == 503  # the group is not formed yet
    base = sglang(serve, "--api-key", "k")
    before = call(base, "GET", "/metrics")[1]
    start = time.monotonic()
    assert call(base, "GET", "/health_generate") == (200, "")  # no key
    assert time.monotonic() - start >= openai_api.DECODE_SECONDS_PER_TOKEN  # it decoded its one token
    assert call(base, "GET", "/metrics")[1] == before  # a health check is not counted (log_metrics=False)


@pytest.mark.parametrize("keys,route,ok,refused", [
    # --admin-api-key set: the admin routes take only it; the others only the API key
    (("--api-key", "k", "--admin-api-key", "a"), ("POST", "/flush_cache"), ["a"], [None, "k"]),
    (("--api-key", "k", "--admin-api-key", "a"), ("POST", "/update_weights_from_disk"), ["a"], [None, "k"]),
    (("--api-key", "k", "--admin-api-key", "a"), ("GET", "/get_server_info"), ["k"], [None, "a"]),
    # only --api-key: it opens everything
    (("--api-key", "k"), ("GET", "/flush_cache"), ["k"], [None, "a"]),
    # only --admin-api-key: the admin routes need it, the others are open
    (("--admin-api-key", "a"), ("POST", "/flush_cache"), ["a"], [None, "k"]),
    (("--admin-api-key", "a"), ("GET", "/get_server_info"), [None, "a", "k"], []),
    (("--admin-api-key", "a"), ("POST", "/invocations"), [None], []),
    # no key: all open
    ((), ("POST", "/flush_cache"), [None, "x"], []),
])
def test_sglang_admin_api_key(serve, keys, route, ok, refused):
    base = sglang(serve, *keys)
    method, path = route
    body = {"model_path": "/"} if path == "/update_weights_from_disk" else Q if path == "/invocations" else None
    for key in ok:
        assert call(base, method, path, key, body)[0] == 200, (key, route)
    for key in refused:
        assert call(base, method, path, key, body) == (401, '{"error": "Unauthorized"}'), (key, route)


def test_sglang_decide_request_auth_table():
    d = server.decide_request_auth
    assert d("OPTIONS", "/flush_cache", None, "k", "a", server.ADMIN_OPTIONAL) is None
    assert d("GET", "/metrics_anything", None, "k", "a", server.NORMAL) is None
    assert d("GET", "/readyz", None, "k", None, server.NORMAL) is None
    assert d("GET", "/ping", None, "k", None, server.NORMAL) == 401
    assert d("GET", "/ping", "Bearer  k", "k", None, server.NORMAL) == 401  # split(" ", 1): " k" is not "k"
    assert d("GET", "/x", "Bearer k", "k", "a", server.NORMAL) is None
    assert d("GET", "/x", "Bearer a", "k", "a", server.NORMAL) == 401


def test_sglang_worker_rank_serves_the_dummy_health_server_open(serve):
    base = sglang(serve, "--api-key", "k", "--node-rank", "1", "--nnodes", "2", "--dist-init-addr", "127.0.0.1:1")
    for path in ("/ping", "/health", "/health_generate"):
        assert call(base, "GET", path) == (200, ""), path
    for path in ("/metrics", "/metrics/x"):
        assert call(base, "GET", path)[0] == 200, path
    for method, path in (("GET", "/v1/models"), ("POST", "/invocations"), ("GET", "/get_server_info"),
                         ("GET", "/ready")):  # no key needed to learn there is nothing: 404, not 401
        assert call(base, method, path, None, {} if method == "POST" else None) == (404, '{"detail": "Not Found"}')
    assert call(base, "POST", "/health") == (405, '{"detail": "Method Not Allowed"}')
    assert call(base, "GET", "/openapi.json")[0] == 200  # FastAPI's docs: the dummy app keeps them
    nometrics = serve(server.http_api(["--model-path", "/m", "--node-rank", "1", "--nnodes", "2",
                                       "--dist-init-addr", "127.0.0.1:1"]))
    assert call(nometrics, "GET", "/metrics")[0] == 404


def test_sglang_process_guards_get_server_info(tmp_path):
    """The real entry point (launch_server double as a process)."""
    e = engine_double.Engine("sglang", tmp_path)
    try:
        assert engine_double.http(e.base + "/get_server_info") == (401, '{"error": "Unauthorized"}')
        assert engine_double.http(e.base + "/get_server_info", engine_double.KEY)[0] == 200
        assert engine_double.http(e.base + "/health_generate") == (200, "")
    finally:
        e.stop()
