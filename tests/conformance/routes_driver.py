"""Runs inside a conformance environment (the REAL engine package): the routes the engine's HTTP app serves and
what its API-key middleware decides for each of them, as JSON.

    <venv>/bin/python tests/conformance/routes_driver.py vllm|sglang PROBES_JSON > routes.json

PROBES_JSON: [[method, path], ...]. Nothing is loaded and no engine runs: the app is the engine's own, built as its
launcher builds it (vLLM: ``build_app`` over its own serve parser with ``--api-key k``, once without and once with
``VLLM_SERVER_DEV_MODE=1``; SGLang: ``http_server.app`` with its Prometheus mount and ``add_api_key_middleware``),
then requests go through it with starlette's TestClient; handlers that need the engine fail (500), which is fine:
what is read is the middleware's answer (401/403 or not) and whether a route matches (404/405 or not).

vLLM: {"dev0"|"dev1": {"routes": [[path, [methods]]], "probes": [{method, path, match, no_key, key}], "bodies"}}
SGLang: {"routes": [[path, [methods], level]], "probes": [{method, path, match, level, decisions}], "bodies",
         "dummy": [{method, path, no_key}]} (decisions: per key configuration, per header, the real
decide_request_auth's allowed/status; dummy: the worker ranks' launch_dummy_health_check_server, really served).
"""
import contextlib
import io
import json
import os
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request

KEY, ADMIN = "k", "adm"


def match_of(app, method: str, path: str) -> str:
    from starlette.routing import Match

    best = "none"
    for route in app.routes:
        try:
            m, _ = route.matches({"type": "http", "path": path, "method": method, "root_path": "", "headers": []})
        except Exception:  # noqa: BLE001 -- a route that cannot match this scope
            continue
        if m == Match.FULL:
            return "full"
        if m == Match.PARTIAL:
            best = "partial"
    return best


def routes_of(app) -> list:
    out = []
    for r in app.routes:
        path = getattr(r, "path", None)
        if path is None:
            continue
        methods = sorted(getattr(r, "methods", None) or ["*"])
        level = getattr(getattr(r, "endpoint", None), "_auth_level", None)
        out.append([path, methods] + ([getattr(level, "value", "normal") if level else "normal"]))
    return out


def call(client, method: str, path: str, key: str | None, body=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    r = client.request(method, path, headers=headers, content=json.dumps(body if body is not None else {}))
    return r.status_code, r.text


class EngineClientStub:
    """What a server without elastic EP answers for its status (0.33.0's /is_scaling_elastic_ep asks the engine
    client): the real EngineCoreClient's answer (AsyncLLM passes its core client's through, and the single-engine
    AsyncMPClient keeps the base class's). Every other attribute is missing: routes that need the engine fail (500)."""

    async def get_external_elastic_ep_status(self):
        from vllm.v1.engine.core_client import EngineCoreClient

        return await EngineCoreClient.get_external_elastic_ep_status(self)


def vllm(probes: list) -> dict:
    from starlette.testclient import TestClient

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser  # 0.33
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # 0.31
    from vllm.entrypoints.launchers.app import build_app
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    out = {}
    for dev in ("0", "1"):
        os.environ["VLLM_SERVER_DEV_MODE"] = dev
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(["/m", "--api-key", KEY])
        app = build_app(args, ("generate",))
        app.state.engine_client = EngineClientStub()
        client = TestClient(app, raise_server_exceptions=False)
        rows = []
        for method, path in probes:
            rows.append({"method": method, "path": path, "match": match_of(app, method, path),
                         "no_key": call(client, method, path, None)[0],
                         "wrong_key": call(client, method, path, "wrong")[0]})
        bodies = {
            "unauthorized": call(client, "GET", "/v1/models", None),
            "not_found": call(client, "GET", "/no/such/route", KEY),
            "method_not_allowed": call(client, "GET", "/tokenize", KEY),
            "is_scaling_elastic_ep": call(client, "POST", "/is_scaling_elastic_ep", None),
            "scale_elastic_ep_missing": call(client, "POST", "/scale_elastic_ep", None, {}),
            "scale_elastic_ep_bad": call(client, "POST", "/scale_elastic_ep", None, {"new_data_parallel_size": 0}),
            "scale_elastic_ep_bad_drain": call(client, "POST", "/scale_elastic_ep", None,
                                               {"new_data_parallel_size": 1, "drain_timeout": "x"}),
        }
        out["dev" + dev] = {"routes": routes_of(app), "probes": rows, "bodies": bodies}
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, method: str = "GET", key: str | None = None) -> int:
    req = urllib.request.Request(url, method=method)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def sglang(probes: list) -> dict:
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp())
    from starlette.testclient import TestClient

    from sglang.srt.entrypoints import http_server
    from sglang.srt.utils import common
    from sglang.srt.utils.auth import _get_auth_level_from_app_and_scope, add_api_key_middleware, decide_request_auth

    app = http_server.app
    common.add_prometheus_middleware(app)  # what the lifespan adds with --enable-metrics
    configs = {"api": (KEY, None), "admin": (None, ADMIN), "both": (KEY, ADMIN), "none": (None, None)}
    headers = {"none": None, "api": f"Bearer {KEY}", "admin": f"Bearer {ADMIN}", "wrong": "Bearer wrong"}
    rows = []
    for method, path in probes:
        scope = {"type": "http", "path": path, "method": method, "root_path": "", "headers": []}
        level = _get_auth_level_from_app_and_scope(app, scope)
        decisions = {}
        for cname, (api_key, admin_key) in configs.items():
            for hname, header in headers.items():
                d = decide_request_auth(method=method, path=path, authorization_header=header, api_key=api_key,
                                        admin_api_key=admin_key, auth_level=level)
                decisions[f"{cname}/{hname}"] = [d.allowed, None if d.allowed else d.error_status_code]
        rows.append({"method": method, "path": path, "match": match_of(app, method, path), "level": level.value,
                     "decisions": decisions})
    routes = routes_of(app)
    add_api_key_middleware(app, api_key=KEY, admin_api_key=None)  # as launch_server with --api-key
    client = TestClient(app, raise_server_exceptions=False)
    bodies = {
        "unauthorized": call(client, "GET", "/get_server_info", None),
        "not_found": call(client, "GET", "/no/such/route", KEY),
        "method_not_allowed": call(client, "DELETE", "/generate", KEY),
        "probe_no_key": {f"{m} {p}": call(client, m, p, None)[0] for m, p in probes},
    }
    # a worker rank (node_rank >= 1): the dummy health server, really listening (with --enable-metrics)
    port = free_port()
    common.launch_dummy_health_check_server("127.0.0.1", port, True)
    deadline = time.monotonic() + 30
    while http(f"http://127.0.0.1:{port}/health") != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    dummy = [{"method": m, "path": p, "no_key": http(f"http://127.0.0.1:{port}{p}", m)} for m, p in probes]
    return {"routes": routes, "probes": rows, "bodies": bodies, "dummy": dummy}


with contextlib.redirect_stdout(io.StringIO()):  # engines log while they import
    found = {"sglang": sglang, "vllm": vllm}[sys.argv[1]](json.loads(sys.argv[2]))
print(json.dumps(found, sort_keys=True))
