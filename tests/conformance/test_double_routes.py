"""The engine TEST DOUBLES serve the REAL engines' routes behind the REAL API-key rules: for every route of the
explicit lists below (the ones the project relies on, and the ones a key holder or a stranger can reach), the
double gives the same auth outcome (needs the key / open; SGLang: per key configuration and Authorization header)
and serves it when the real app does (404 and 405 where it does not), read from the packages' own apps
(tests/conformance/routes_driver.py: vLLM's build_app, once with VLLM_SERVER_DEV_MODE=1; SGLang's http_server
app with its decide_request_auth and, for worker ranks, its dummy health server really listening). The doubles
run in this process on loopback (openai_api.serve_local). sglang 0.5.23; vllm 0.31.0 (the tp2 image's) and
0.33.0 (the newest)."""
from __future__ import annotations

import json
from functools import lru_cache
from http.client import HTTPConnection

import pytest

from conformance.realenv import HERE, run_script
from sim.testdouble import openai_api, server, vllm_serve

KEY, ADMIN = "k", "adm"  # as routes_driver.py

# vLLM: (method, path). Guarded by prefix, open, development (VLLM_SERVER_DEV_MODE=1 only), and routes vLLM
# does not have (the double must not have them either).
VLLM_PROBES = [
    ("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
    ("GET", "/v1/no-such-route"), ("POST", "/v1/chat/completions/render"), ("POST", "/v2/rerank"),
    ("POST", "/inference/v1/generate"), ("POST", "/cohere/v2/chat"),
    ("POST", "/invocations"), ("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/generative_scoring"),
    ("POST", "/scale_elastic_ep"), ("POST", "/is_scaling_elastic_ep"), ("GET", "/version"), ("GET", "/load"),
    ("GET", "/kv_event_sources"), ("GET", "/ping"), ("POST", "/ping"), ("GET", "/health"), ("GET", "/metrics"),
    ("GET", "/metrics/x"), ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/redoc"),
    ("POST", "/pause"), ("POST", "/resume"), ("GET", "/is_paused"), ("POST", "/abort_requests"), ("POST", "/sleep"),
    ("POST", "/wake_up"), ("GET", "/is_sleeping"), ("POST", "/reset_prefix_cache"), ("POST", "/reset_mm_cache"),
    ("POST", "/reset_encoder_cache"), ("GET", "/server_info"),
    ("POST", "/health"), ("GET", "/tokenize"), ("OPTIONS", "/v1/models"), ("GET", "/health_generate"),
    ("GET", "/get_server_info"), ("GET", "/get_model_info"), ("POST", "/flush_cache"), ("GET", "/ready"),
    ("POST", "/generate"), ("GET", "/no/such/route"),
]  # fmt: skip

# SGLang: open prefixes, guarded routes, the admin ones, routes it does not have, methods it does not take.
SGLANG_PROBES = [
    ("GET", "/health"), ("GET", "/health_generate"), ("GET", "/ready"), ("GET", "/metrics"), ("POST", "/metrics"),
    ("GET", "/metrics/x"), ("GET", "/health_whatever"),
    ("GET", "/ping"), ("POST", "/invocations"), ("POST", "/generate"), ("PUT", "/generate"), ("GET", "/get_model_info"),
    ("GET", "/model_info"), ("GET", "/get_server_info"), ("GET", "/server_info"), ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/openapi.json"), ("GET", "/docs"),
    ("GET", "/flush_cache"), ("POST", "/flush_cache"), ("POST", "/update_weights_from_disk"),
    ("GET", "/no/such/route"), ("POST", "/pause"), ("GET", "/version"),
    ("POST", "/health"), ("DELETE", "/generate"), ("GET", "/invocations"), ("OPTIONS", "/get_server_info"),
]  # fmt: skip

CONFIGS = {"api": ["--api-key", KEY], "admin": ["--admin-api-key", ADMIN],
           "both": ["--api-key", KEY, "--admin-api-key", ADMIN], "none": []}
HEADERS = {"none": None, "api": f"Bearer {KEY}", "admin": f"Bearer {ADMIN}", "wrong": "Bearer wrong"}


@lru_cache(maxsize=None)
def real(env: str) -> dict:
    engine = env.split("-")[0]
    probes = {"vllm": VLLM_PROBES, "sglang": SGLANG_PROBES}[engine]
    return run_script(env, HERE / "routes_driver.py", engine, json.dumps(probes))


def call(base: str, method: str, path: str, authorization: str | None = None) -> tuple[int, str]:
    conn = HTTPConnection(base.split("//", 1)[1], timeout=10)
    headers = {"Content-Type": "application/json"}
    if authorization:
        headers["Authorization"] = authorization
    try:
        conn.request(method, path, body=b"{}" if method in ("POST", "PUT") else None, headers=headers)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


@pytest.fixture()
def serve():
    """serve(handler) -> base URL; every server stopped at the end."""
    with openai_api.local_servers() as start:
        yield start


def served(status: int) -> str:
    """A double's answer to an authorized request, as the real app's route match: full, partial (405), none (404)."""
    return {404: "none", 405: "partial"}.get(status, "full")


@pytest.mark.parametrize("env", ["vllm-0.31.0", "vllm-0.33.0"])
@pytest.mark.parametrize("dev", ["0", "1"])
def test_vllm_double_routes_and_auth_are_the_real_apps(env, dev, serve):
    got = real(env)["dev" + dev]
    base = serve(vllm_serve.http_api(["/ckpt", "--api-key", KEY], env={"VLLM_SERVER_DEV_MODE": dev},
                                     version=env.split("-")[1]))
    wrong = []
    for row in got["probes"]:
        method, path = row["method"], row["path"]
        real_guarded = row["no_key"] == 401
        assert real_guarded == (row["wrong_key"] == 401), row
        no_key, _ = call(base, method, path)
        double_guarded = no_key == 401
        with_key, _ = call(base, method, path, f"Bearer {KEY}")
        if dev == "1":  # what a probe paused or put to sleep is undone before the next one
            call(base, "POST", "/resume")
            call(base, "POST", "/wake_up")
        if real_guarded != double_guarded:
            wrong.append(f"{method} {path}: real {'needs the key' if real_guarded else 'open'}, double "
                         f"{'needs the key' if double_guarded else 'open'} ({no_key})")
        elif row["match"] != served(with_key):
            wrong.append(f"{method} {path}: real route match {row['match']}, double answered {with_key}")
    assert wrong == [], "\n".join(wrong)
    # the project's routes: what the lists above say, so that a probe the real app dropped is noticed
    guarded = {(p["method"], p["path"]) for p in got["probes"] if p["no_key"] == 401}
    assert guarded >= {("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v2/rerank")}
    open_served = {(p["method"], p["path"]) for p in got["probes"] if p["no_key"] != 401 and p["match"] == "full"}
    assert {("POST", "/invocations"), ("POST", "/tokenize"), ("POST", "/scale_elastic_ep"), ("GET", "/metrics"),
            ("GET", "/health")} <= open_served  # fmt: skip
    assert (("POST", "/pause") in open_served) == (dev == "1")


@pytest.mark.parametrize("env", ["vllm-0.31.0", "vllm-0.33.0"])
def test_vllm_double_answers_as_the_real_app(env, serve):
    """The bodies the real app gives without an engine: the 401, 404 and 405, and the elastic EP routes' answers
    when vLLM runs no elastic EP (their argument checks)."""
    bodies = real(env)["dev0"]["bodies"]
    base = serve(vllm_serve.http_api(["/ckpt", "--api-key", KEY], env={}, version=env.split("-")[1]))
    mine = {"unauthorized": call(base, "GET", "/v1/models"),
            "not_found": call(base, "GET", "/no/such/route", f"Bearer {KEY}"),
            "method_not_allowed": call(base, "GET", "/tokenize", f"Bearer {KEY}")}
    for name, body in (("is_scaling_elastic_ep", None), ("scale_elastic_ep_missing", {}),
                       ("scale_elastic_ep_bad", {"new_data_parallel_size": 0}),
                       ("scale_elastic_ep_bad_drain", {"new_data_parallel_size": 1, "drain_timeout": "x"})):
        conn = HTTPConnection(base.split("//", 1)[1], timeout=10)
        path = "/is_scaling_elastic_ep" if body is None else "/scale_elastic_ep"
        conn.request("POST", path, body=json.dumps(body or {}), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        mine[name] = (r.status, r.read().decode())
        conn.close()
    for name, (code, text) in bodies.items():
        assert (mine[name][0], json.loads(mine[name][1])) == (code, json.loads(text)), name


def test_sglang_double_auth_is_decide_request_auth_for_every_key_configuration(serve):
    """Every probe, every key configuration (--api-key, --admin-api-key, both, none), every Authorization
    header: the double lets through exactly what the real decide_request_auth lets through (at the auth level
    the real app's route gives the path), and refuses with the same status."""
    got = real("sglang-0.5.23")
    wrong = []
    for cname, flags in CONFIGS.items():
        base = serve(server.http_api(["--model-path", "/m", "--enable-metrics", *flags]))
        for row in got["probes"]:
            method, path = row["method"], row["path"]
            for hname, header in HEADERS.items():
                allowed, status = row["decisions"][f"{cname}/{hname}"]
                code, _ = call(base, method, path, header)
                if allowed != (code not in (401, 403)) or (not allowed and code != status):
                    wrong.append(f"{cname} keys, {hname} header, {method} {path} ({row['level']}): real "
                                 f"{'allowed' if allowed else status}, double {code}")
    assert wrong == [], "\n".join(wrong)


def test_sglang_double_serves_what_the_real_app_serves(serve):
    got = real("sglang-0.5.23")
    base = serve(server.http_api(["--model-path", "/m", "--enable-metrics"]))  # no key: every route reachable
    wrong = [f"{r['method']} {r['path']}: real route match {r['match']}, double answered {code}"
             for r in got["probes"] if r["match"] != served(code := call(base, r["method"], r["path"])[0])]
    assert wrong == [], "\n".join(wrong)
    levels = {(r["method"], r["path"]): r["level"] for r in got["probes"]}
    assert levels[("POST", "/flush_cache")] == levels[("POST", "/update_weights_from_disk")] == "admin_optional"
    assert levels[("GET", "/get_server_info")] == levels[("POST", "/invocations")] == "normal"
    bodies = got["bodies"]
    keyed = serve(server.http_api(["--model-path", "/m", "--api-key", KEY]))
    mine = {"unauthorized": call(keyed, "GET", "/get_server_info"),
            "not_found": call(keyed, "GET", "/no/such/route", f"Bearer {KEY}"),
            "method_not_allowed": call(keyed, "DELETE", "/generate", f"Bearer {KEY}")}
    for name in mine:
        code, text = bodies[name]
        assert (mine[name][0], json.loads(mine[name][1])) == (code, json.loads(text)), name
    # the real middleware end to end (--api-key): what it refuses without a key, the double refuses
    refused = {p for p, code in bodies["probe_no_key"].items() if code == 401}
    mine_refused = {f"{m} {p}" for m, p in SGLANG_PROBES if call(keyed, m, p)[0] == 401}
    assert refused == mine_refused


def test_sglang_worker_rank_double_is_the_dummy_health_server(serve):
    """A worker rank (--node-rank 1) with --api-key and --enable-metrics: the same status as the real dummy health
    server for every probe, without a key."""
    got = real("sglang-0.5.23")["dummy"]
    base = serve(server.http_api(["--model-path", "/m", "--api-key", KEY, "--enable-metrics", "--node-rank", "1",
                                  "--nnodes", "2", "--dist-init-addr", "127.0.0.1:1"]))  # fmt: skip
    wrong = [f"{r['method']} {r['path']}: real {r['no_key']}, double {code}"
             for r in got if (code := call(base, r["method"], r["path"])[0]) != r["no_key"]]
    assert wrong == [], "\n".join(wrong)
    assert {(r["method"], r["path"]) for r in got if r["no_key"] == 200} >= {
        ("GET", "/ping"), ("GET", "/health"), ("GET", "/health_generate"), ("GET", "/metrics")}
