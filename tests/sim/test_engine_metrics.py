"""In-flight request gauges of the TEST DOUBLES (``GET /metrics``), run locally on 127.0.0.1 (no docker).

SGLang double: ``sglang:num_running_reqs`` / ``sglang:num_queue_reqs`` only with ``--enable-metrics``
(else 404); vLLM double: ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` always. Both
unauthenticated, as the real servers. A drain step waits on these, so the count must be exact: a
request counts from the moment it starts generating until its answer is written, its stream
finished, or its client went away. Also: the doubles' keep-alive behaviour a router's connection pool
relies on.
"""
from __future__ import annotations

from http.client import HTTPConnection
import json
import re
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sim_helpers import http, sse, wait_for

from sim.testdouble import engram, openai_api

ROOT = Path(__file__).resolve().parents[2]
KEY = "k1"
MODEL = "deepseek-v4.1-flash"
GAUGES = {"sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
          "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Engine:
    """One TEST DOUBLE process (one rank, API key KEY) on 127.0.0.1; killed by its own handle."""

    def __init__(self, engine: str, tmp: Path, metrics: bool = True):
        self.engine, self.port = engine, _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        if engine == "sglang":
            argv = ["-m", "sim.testdouble.launch_server", "--model-path", "/m", "--served-model-name", MODEL,
                    "--host", "127.0.0.1", "--port", str(self.port), "--api-key", KEY,
                    "--nnodes", "1", "--node-rank", "0", "--tp", "1"] + (["--enable-metrics"] if metrics else [])
        else:
            ckpt = tmp / "ckpt"
            ckpt.mkdir(exist_ok=True)
            (ckpt / "config.json").write_bytes(engram.checkpoint_files()["config.json"])
            argv = ["-m", "sim.testdouble.vllm_serve", "serve", str(ckpt), "--served-model-name", MODEL,
                    "--host", "127.0.0.1", "--port", str(self.port), "--api-key", KEY]
        self.log = tmp / f"{engine}-{self.port}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        if not wait_for(lambda: http(self.base + "/health")[0] == 200, 20, 0.1):
            self.stop()
            raise AssertionError(f"{engine} double did not come up: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def gauges(self) -> dict[str, float]:
        """The two gauges of /metrics (fetched without a key), by metric name; asserts their labels."""
        code, body = http(self.base + "/metrics")
        assert code == 200, (code, body)
        out = {}
        for name in GAUGES[self.engine]:
            assert f"# TYPE {name} gauge" in body
            m = re.search(rf'^{re.escape(name)}\{{model_name="{re.escape(MODEL)}"\}} (\S+)$', body, re.M)
            assert m, body
            out[name] = float(m.group(1))
        return out

    def running(self) -> float:
        return self.gauges()[GAUGES[self.engine][0]]

    def open_stream(self, max_tokens: int) -> HTTPConnection:
        """Start a streaming chat request of ``max_tokens`` tokens and read its first chunk (so the
        request is generating); returns the open connection (its response in ``.resp``)."""
        conn = HTTPConnection("127.0.0.1", self.port, timeout=30)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "ignore_eos": True, "max_tokens": max_tokens}
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        conn.resp = conn.getresponse()
        assert conn.resp.status == 200
        assert conn.resp.readline().startswith(b"data: ")
        return conn


def hang_up(conn: HTTPConnection) -> None:
    """Close the client side of a stream (the response owns the socket once the server said close)."""
    conn.resp.close()
    conn.close()


@pytest.fixture(params=["sglang", "vllm"])
def engine(request, tmp_path):
    e = Engine(request.param, tmp_path)
    yield e
    e.stop()


def test_gauges_idle_unauthenticated_and_prometheus_text(engine):
    running, waiting = GAUGES[engine.engine]
    assert engine.gauges() == {running: 0.0, waiting: 0.0}
    conn = HTTPConnection("127.0.0.1", engine.port, timeout=5)
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    conn.close()
    assert http(engine.base + "/metrics", "wrong-key")[0] == 200  # no key needed, a wrong one is ignored
    assert http(engine.base + "/v1/models")[0] == 401              # the API itself still needs the key


def test_in_flight_count_exact_under_concurrent_streams(engine):
    """N long streams + M short ones at once: the gauge is exactly N + M; the short ones finishing
    and the long ones' clients disconnecting each bring it down exactly; idle again it is 0."""
    n_long, n_short = 6, 4
    with ThreadPoolExecutor(n_long + n_short) as ex:
        long = list(ex.map(lambda _: engine.open_stream(3000), range(n_long)))       # 30 s at 100 tok/s
        short = list(ex.map(lambda _: engine.open_stream(40), range(n_short)))       # 0.4 s
        assert engine.running() == n_long + n_short
        assert engine.gauges()[GAUGES[engine.engine][1]] == 0.0                     # the double never queues

        def finish(conn):
            rest = conn.resp.read().decode()
            hang_up(conn)
            return rest

        assert all(r.rstrip().endswith("data: [DONE]") for r in ex.map(finish, short))
    assert wait_for(lambda: engine.running() == n_long, 5, 0.05), engine.gauges()
    for i, conn in enumerate(long[:3]):  # clients going away mid-stream
        hang_up(conn)
        assert wait_for(lambda: engine.running() == n_long - i - 1, 5, 0.05), engine.gauges()
    # a non-streaming request and a finished short stream in between leave the count where it was
    code, body = http(engine.base + "/v1/chat/completions", KEY, {"model": MODEL, "messages": [{"role": "user",
                                                                                               "content": "x"}]})
    assert code == 200 and json.loads(body)["object"] == "chat.completion"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in sse(
        engine.base + "/v1/chat/completions", KEY, {"model": MODEL, "messages": [{"role": "user",
                                                                                 "content": "What is 19 + 23?"}]})
        if c["choices"]) == "42"
    assert wait_for(lambda: engine.running() == 3, 5, 0.05), engine.gauges()
    for conn in long[3:]:
        hang_up(conn)
    assert wait_for(lambda: engine.running() == 0, 5, 0.05), engine.gauges()
    assert engine.gauges() == {GAUGES[engine.engine][0]: 0.0, GAUGES[engine.engine][1]: 0.0}
    assert engine.proc.poll() is None and "Traceback" not in engine.log.read_text()


def test_rejected_requests_are_not_counted(engine):
    assert http(engine.base + "/v1/chat/completions", "wrong", {"messages": []})[0] == 401
    conn = HTTPConnection("127.0.0.1", engine.port, timeout=5)
    conn.request("POST", "/v1/chat/completions", b"{not json", {"Authorization": f"Bearer {KEY}"})
    assert conn.getresponse().status == 400
    conn.close()
    if engine.engine == "vllm":  # an unknown model is vLLM's 404
        assert http(engine.base + "/v1/chat/completions", KEY, {"model": "other", "messages": []})[0] == 404
    assert engine.running() == 0


def test_keep_alive_after_an_early_answer(engine):
    """A router keeps connections open: a body the double refused (401) must be consumed, not parsed
    as the next request on that connection; a chunked body is read too."""
    conn = HTTPConnection("127.0.0.1", engine.port, timeout=5)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "What is 19 + 23?"}]})
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 401 and r.read() == b'{"error": "Unauthorized"}'
    conn.request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {KEY}"})
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["choices"][0]["message"]["content"] == "42"
    conn.request("POST", "/v1/chat/completions", iter([body[:10].encode(), body[10:].encode()]),
                 {"Authorization": f"Bearer {KEY}"}, encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["choices"][0]["message"]["content"] == "42"
    conn.request("GET", "/metrics")
    assert conn.getresponse().status == 200
    conn.close()


def test_sglang_without_enable_metrics_has_no_metrics_route(tmp_path):
    e = Engine("sglang", tmp_path, metrics=False)
    try:
        assert http(e.base + "/metrics")[0] == 404        # as SGLang without --enable-metrics
        assert http(e.base + "/metrics", KEY)[0] == 404   # not an auth matter: there is no such route
        assert http(e.base + "/health")[0] == 200
        assert http(e.base + "/v1/models", KEY)[0] == 200
    finally:
        e.stop()


def test_prometheus_text_escapes_the_label():
    text = openai_api.prometheus_text(openai_api.VLLM_METRICS, 'a"b\\c\nd', 3)
    assert 'vllm:num_requests_running{model_name="a\\"b\\\\c\\nd"} 3.0' in text.splitlines()
    assert 'vllm:num_requests_waiting{model_name="a\\"b\\\\c\\nd"} 0.0' in text.splitlines()
    assert text.endswith("\n")
