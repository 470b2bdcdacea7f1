"""The TEST DOUBLES' ``GET /metrics``, run locally on 127.0.0.1 (no docker): the in-flight request gauges, and the
real engines' families they serve (sim/testdouble/metric_families.py) fed by the requests they answer.

SGLang double: ``sglang:num_running_reqs`` / ``sglang:num_queue_reqs`` only with ``--enable-metrics``
(else 404); vLLM double: ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` always. Both
unauthenticated, as the real servers. A drain step waits on these, so the count must be exact: a
request counts from the moment it starts generating until its answer is written, its stream
finished, or its client went away. Also: the doubles' keep-alive behaviour a router's connection pool
relies on.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection

import pytest
from sim_helpers import http, sse, wait_for

import engine_double
import promtext
from sim.testdouble import metric_families, openai_api

KEY, MODEL = engine_double.KEY, engine_double.MODEL
GAUGES = {"sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
          "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting")}


class Engine(engine_double.Engine):
    """The double with the request gauges read exactly and long streams held open."""

    def gauges(self) -> dict[str, float]:
        """The two request gauges of /metrics (fetched without a key), by metric name; asserts their labels."""
        fams = self.families()
        out = {}
        for name in GAUGES[self.engine]:
            fam = fams[name]
            assert fam.kind == "gauge" and len(fam.samples) == 1, fam
            _, labels, value = fam.samples[0]
            assert labels["model_name"] == MODEL, labels
            out[name] = value
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
    reg = metric_families.Registry(metric_families.VLLM)
    reg.set("vllm:num_requests_running", ('a"b\\c\nd', "0"), 3)
    text = reg.render()
    assert 'vllm:num_requests_running{model_name="a\\"b\\\\c\\nd",engine="0"} 3.0' in text.splitlines()
    assert text.endswith("\n")
    fam = promtext.parse(text)["vllm:num_requests_running"]
    assert fam.samples == [("vllm:num_requests_running", {"model_name": 'a"b\\c\nd', "engine": "0"}, 3.0)]


def served(engine) -> dict:
    """(kind, label names, buckets) of every family the double serves, read back from its /metrics."""
    out = {}
    for name, fam in engine.families().items():
        buckets = sorted({float(ls["le"]) for n, ls, _ in fam.samples if n.endswith("_bucket")} - {float("inf")})
        out[name] = (fam.kind, fam.label_names, tuple(buckets))
    return out


def test_the_double_serves_exactly_its_table_of_real_families(engine):
    """Once a request of each kind was answered, every family of metric_families (the real engines' names, types,
    labels and buckets: tests/conformance checks the table against the packages) has samples, and nothing else."""
    engine.chat()
    engine.chat(stream=True, max_tokens=5)
    hang_up(engine.open_stream(3000))  # one the client gave up on
    assert wait_for(lambda: engine.running() == 0, 5, 0.05)
    table = {f.name: (f.kind, f.labels, f.buckets) for f in metric_families.FAMILIES[engine.engine]}
    assert served(engine) == table


def test_counters_and_histograms_follow_the_requests(engine):
    fams = engine.families()
    sg = engine.engine == "sglang"
    name = {"prompt": "sglang:prompt_tokens_total" if sg else "vllm:prompt_tokens_total",
            "gen": "sglang:generation_tokens_total" if sg else "vllm:generation_tokens_total",
            "ttft": "sglang:time_to_first_token_seconds" if sg else "vllm:time_to_first_token_seconds",
            "e2e": "sglang:e2e_request_latency_seconds" if sg else "vllm:e2e_request_latency_seconds",
            "itl": "sglang:inter_token_latency_seconds" if sg else "vllm:inter_token_latency_seconds"}
    if sg:  # the tokenizer's series appear with the first request, as SGLang's
        assert name["prompt"] not in fams or not fams[name["prompt"]].samples
    else:  # vLLM creates every series at start
        assert fams[name["prompt"]].value() == 0 and fams[name["ttft"]].value("_count") == 0
    engine.chat("one two three four five")                       # 5 prompt words, the fixed answer
    engine.chat("six seven", stream=True, max_tokens=40)        # 40 tokens at 100 tokens/s
    fams = engine.families()
    total = lambda n, suffix="": sum(v for s, _, v in fams[n].samples if s == n + suffix)  # noqa: E731
    answer = len(openai_api.fixed_answer(engine.engine).split())
    assert total(name["prompt"]) == 5 + 2
    assert total(name["gen"]) == answer + 40
    assert total(name["ttft"], "_count") == 2 and total(name["e2e"], "_count") == 2
    assert total(name["e2e"], "_sum") >= 39 * openai_api.DECODE_SECONDS_PER_TOKEN  # the stream's real decode time
    assert total(name["itl"], "_count") == 39                   # the gaps between the stream's 40 tokens
    assert 39 * 0.009 <= total(name["itl"], "_sum") <= 39 * 0.05
    if sg:
        assert fams["sglang:num_requests_total"].value(is_streaming="true") == 1
        assert fams["sglang:num_requests_total"].value(is_streaming="false") == 1
        assert fams["sglang:gen_throughput"].value() > 0
    else:
        assert fams["vllm:request_success_total"].value(finished_reason="stop") == 2


def test_kv_pool_and_usage(tmp_path):
    """The SGLang double's pool is its pin times DSPARK_SIM_KV_SHARE (what its boot log says too); the KV in use
    is the tokens of the requests in flight."""
    e = Engine("sglang", tmp_path, env={"DSPARK_SIM_KV_SHARE": "0.5"})
    try:
        fams = e.families()
        assert fams["sglang:max_total_num_tokens"].value() == engine_double.KV_POOL // 2
        assert fams["sglang:context_len"].value() == 65536
        assert f"max_total_num_tokens={engine_double.KV_POOL // 2}," in e.log.read_text()
        assert fams["sglang:token_usage"].value() == 0
        conn = e.open_stream(3000)
        fams = e.families()
        used = fams["sglang:num_used_tokens"].value()
        assert used >= 2 and fams["sglang:token_usage"].value() == used / (engine_double.KV_POOL // 2)
        hang_up(conn)
        assert wait_for(lambda: e.families()["sglang:num_used_tokens"].value() == 0, 5, 0.05)
        assert e.families()["sglang:num_aborted_requests_total"].value() == 1  # the client went away
    finally:
        e.stop()


def test_vllm_usage_against_the_pool_it_logged(tmp_path):
    e = Engine("vllm", tmp_path)
    try:
        conn = e.open_stream(3000)
        pool = 8192 * 4  # --max-model-len x --max-num-seqs, as its log line says
        assert f"GPU KV cache size: {pool:,} tokens" in e.log.read_text()
        usage = e.families()["vllm:kv_cache_usage_perc"].value()
        assert 0 < usage < 0.01
        hang_up(conn)
        assert wait_for(lambda: e.families()["vllm:kv_cache_usage_perc"].value() == 0, 5, 0.05)
        assert e.families()["vllm:request_success_total"].value(finished_reason="abort") == 1
    finally:
        e.stop()
