"""The series names each exporter of a stack really serves, read from the exporters themselves where they run here,
for the tests that check the alert rules' and the dashboards' queries: a query may use only these.

- the engine doubles: their table of the real engines' families (sim/testdouble/metric_families.py, checked against
  the real packages by tests/conformance/test_real_metrics.py);
- the guard: a leader's and a follower's /metrics text (programs/guard/main.py);
- the gateway: what its exporter collects (programs/gateway/gateway_hooks.py, LiteLLM's registry);
- the guard: its fabric series too (a rails gate over a Spark's sysfs, the leader's last bandwidth gate);
- node-exporter (Debian's prometheus-node-exporter, meminfo collector): planning/monitoring.SERIES, its contract;
- the router (the real sglang-router's `smg_*`) and Prometheus's own `up`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import promtext
from planning import monitoring
from sim.testdouble import metric_families

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}  # fmt: skip


def sample_names(kind: str, name: str) -> set[str]:
    return {name + s for s in ("_bucket", "_sum", "_count")} if kind == "histogram" else {name}


def engines() -> set[str]:
    return {n for fams in metric_families.FAMILIES.values() for f in fams for n in sample_names(f.kind, f.name)}


def guard(tmp: Path) -> set[str]:
    """A follower's and a leader's series, with a rails gate (its reading: a Spark's two rails) and a bandwidth
    gate's report."""
    import subprocess

    from programs.guard import main

    token = tmp / "token"
    token.write_text("f" * 64 + "\n")
    gates = json.dumps([["rails", "rails.py", ["--fabric-ip", "10.0.22.1", "--bootstrap-ip", "10.0.22.1"]]])
    links = json.dumps([{"hca": h, "netdev": n, "up": True, "speed_mbps": 200000}
                        for h, n in (("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1"))])  # fmt: skip
    report = json.dumps({"floorGbps": 175, "pairs": [{"a": "n1", "b": "n2", "totalGbps": 186.9}]})
    names: set[str] = set()
    for role, leader in (("follower", ""), ("leader", json.dumps({"peers": [], "heal": {}, "settings": {}}))):
        argv = ["--stack", "s", "--group", "g", "--node", "n1", "--rank", "0", "--role", role, "--port", "0",
                "--state-dir", str(tmp), "--token-file", str(token), "--container", "c0", "--gates", gates]  # fmt: skip
        g = main.Guard(main.parse(argv + (["--leader", leader, "--fabric", report] if leader else [])), docker=object())
        g.host_run = lambda argv, **kw: subprocess.CompletedProcess(argv, 0, links, "")
        g.journal.extra = {"ranks": [{"rank": 0, "node": "n1", "state": "running"}]}
        for fam in promtext.parse(g.metrics()).values():
            names |= sample_names(fam.kind, fam.name)
    return names


def gateway() -> set[str]:
    import gateway_stub

    with gateway_stub.hooks() as hooks:
        fams = list(hooks.UsageCollector().collect())
    return {n for f in fams for n in sample_names(f.type, f.name + ("_total" if f.type == "counter" else ""))}


def every(tmp: Path) -> set[str]:
    return (engines() | guard(tmp) | gateway() | set(monitoring.SERIES["router"]) | set(monitoring.SERIES["node"])
            | {"up"})  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (strings, label matchers, grouping lists, ranges and functions
    left out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = m.group(0)
        after = e[m.end():].lstrip()
        if after.startswith("(") or word.lower() in PROMQL_WORDS or e[max(0, m.start() - 1)] in "$.":
            continue
        names.add(word)
    return names
