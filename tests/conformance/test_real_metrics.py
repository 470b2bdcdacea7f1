"""The engine TEST DOUBLES serve the REAL engines' Prometheus families: every family of
sim/testdouble/metric_families.py, and every family a double's /metrics really serves, exists in the real
package (sglang 0.5.23; vllm 0.31.0, the tp2 image's, and 0.33.0, the newest) with the same type, label names
in the same order and the same histogram buckets, read from the packages' own collectors
(tests/conformance/metrics_driver.py). So alert rules and dashboards written against the sim hold on a Spark."""
from __future__ import annotations

from functools import lru_cache

import pytest

import engine_double
from conformance.realenv import HERE, run_script
from sim.testdouble import metric_families

ENVS = {"sglang": ["sglang-0.5.23"], "vllm": ["vllm-0.31.0", "vllm-0.33.0"]}
CASES = [(engine, env) for engine, envs in ENVS.items() for env in envs]


@lru_cache(maxsize=None)
def real(env: str) -> dict:
    engine = env.split("-")[0]
    return run_script(env, HERE / "metrics_driver.py", engine)


def row(fam: metric_families.Family) -> dict:
    return {"kind": fam.kind, "labels": list(fam.labels), "buckets": list(fam.buckets)}


@pytest.mark.parametrize("engine,env", CASES)
def test_the_real_engine_registers_every_family_of_the_doubles_table(engine, env):
    got = real(env)
    assert len(got) > 20, sorted(got)  # the driver found the engine's collectors, not an empty registry
    wrong = {f.name: (row(f), got.get(f.name)) for f in metric_families.FAMILIES[engine] if got.get(f.name) != row(f)}
    assert wrong == {}, wrong


@pytest.mark.parametrize("engine,env", CASES)
def test_what_a_double_serves_is_what_the_real_engine_registers(engine, env, tmp_path):
    """The double's own /metrics after a plain, a streamed and an abandoned request: every family it serves, with
    the kind, label names and buckets its samples show."""
    e = engine_double.Engine(engine, tmp_path)
    try:
        e.chat()
        e.chat(stream=True, max_tokens=5)
        served = e.families()
    finally:
        e.stop()
    got = real(env)
    assert {f.name for f in metric_families.FAMILIES[engine]} - set(served) == set()
    for name, fam in served.items():
        assert name in got, f"the {engine} double serves {name}, which {env} does not have"
        want = got[name]
        assert fam.kind == want["kind"], (name, fam.kind, want)
        if fam.samples:
            assert list(fam.label_names) == want["labels"], (name, fam.label_names, want)
        if fam.kind == "histogram" and fam.samples:
            bounds = sorted({float(ls["le"]) for n, ls, _ in fam.samples if n.endswith("_bucket")} - {float("inf")})
            assert bounds == want["buckets"], name


def test_the_rules_and_dashboards_read_engine_series_of_the_table():
    """Every engine series the alert rules and the dashboards of every stack query is one of the table's (so one
    the tests above found in the real packages)."""
    import copy

    import alertfiles
    import served
    from dspark import dashboard
    from planning import alerts, monitoring

    table = {n for fams in metric_families.FAMILIES.values() for f in fams for n in served.sample_names(f.kind, f.name)}
    used: set[str] = set()
    for stack in alertfiles.STACKS:
        cp = alertfiles.plan_of(stack)
        exprs = [r["expr"] for r in alerts.rule_groups(cp)["groups"][0]["rules"]]
        doc = dashboard.dashboard(copy.deepcopy(monitoring.scrape_configs(cp)), stack)
        exprs += [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
        used |= {n for e in exprs for n in served.metric_names(e) if n.startswith(("sglang:", "vllm:"))}
    assert {"sglang:time_to_first_token_seconds_bucket", "sglang:max_total_num_tokens",
            "vllm:time_to_first_token_seconds_bucket", "vllm:kv_cache_usage_perc"} <= used
    assert used <= table, used - table
    for engine in ("sglang", "vllm"):  # what the e2e reads on every engine target
        assert set(monitoring.SERIES[engine]) <= table
