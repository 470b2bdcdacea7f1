"""The alert rules (planning/alerts.py) in Debian's promtool: every stack's rules file passes `promtool check rules`
and its scrape configs `promtool check config`; the unit tests of tests/unit/promtool/ (input series as the exporters
serve them) pass `promtool test rules`, and cover every rule of their stack firing and not firing; every query reads
only series an exporter serves."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import alertfiles
import served
from dspark.clients import main as clients_main
from planning import alerts, monitoring

HERE = Path(__file__).parent / "promtool"
TESTED = sorted(p.name.removesuffix(".test.yml") for p in HERE.glob("*.test.yml"))


@pytest.fixture(scope="module")
def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        msg = "no promtool: install Debian's prometheus package (bash .ci/setup does)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_tested_stacks_cover_both_engines_a_router_and_the_gateway():
    assert {"sim", "sim-x2", "sim-team"} <= set(TESTED)


def test_every_stacks_rules_pass_promtool_check(promtool, tmp_path):
    files = [alertfiles.write_rules(s, tmp_path) for s in alertfiles.STACKS]
    proc = run(promtool, "check", "rules", *map(str, files), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(alertfiles.STACKS)


def test_every_stacks_scrape_configs_pass_promtool_check_config(promtool, tmp_path):
    for stack in alertfiles.STACKS:
        cp = alertfiles.plan_of(stack)
        configs = monitoring.scrape_configs(cp)
        for c in configs:  # the gateway's metrics key where the operator writes it (here: a file of the test's)
            if "authorization" in c:
                key = tmp_path / f"{stack}-gateway-metrics-key"
                key.write_text("sk-metrics\n")
                c["authorization"]["credentials_file"] = str(key)
        rules = alertfiles.write_rules(stack, tmp_path)
        conf = tmp_path / f"{stack}.prometheus.yml"
        conf.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"}, "rule_files": [rules.name],
                                        "scrape_configs": configs}))  # fmt: skip
        proc = run(promtool, "check", "config", str(conf), cwd=tmp_path)
        assert proc.returncode == 0, (stack, proc.stdout + proc.stderr)


@pytest.mark.parametrize("stack", TESTED)
def test_promtool_unit_tests(promtool, tmp_path, stack):
    alertfiles.write_rules(stack, tmp_path)
    shutil.copy(HERE / f"{stack}.test.yml", tmp_path)
    proc = run(promtool, "test", "rules", f"{stack}.test.yml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_a_wrong_expectation_fails_promtool(promtool, tmp_path):
    """The check can fail: the same tests against rules whose KV floor was doubled."""
    path = alertfiles.write_rules("sim", tmp_path)
    path.write_text(path.read_text().replace("< 675000", "< 1350000"))
    shutil.copy(HERE / "sim.test.yml", tmp_path)
    proc = run(promtool, "test", "rules", "sim.test.yml", cwd=tmp_path)
    assert proc.returncode != 0 and "DsparkKvPoolBelowPlan" in proc.stdout + proc.stderr


def cases(stack: str) -> list[tuple[str, dict]]:
    doc = yaml.safe_load((HERE / f"{stack}.test.yml").read_text())
    return [(t["name"], c) for t in doc["tests"] for c in t["alert_rule_test"]]


@pytest.mark.parametrize("stack", TESTED)
def test_every_rule_fires_and_stays_quiet_in_its_stacks_tests(stack):
    rules = alerts.rule_groups(alertfiles.plan_of(stack))["groups"][0]["rules"]
    all_cases = cases(stack)
    for rule in rules:
        group = rule["labels"].get("group")
        fired = [c for _, c in all_cases if c["alertname"] == rule["alert"]
                 and any(group is None or a["exp_labels"].get("group") == group for a in c["exp_alerts"])]  # fmt: skip
        quiet = [c for _, c in all_cases if c["alertname"] == rule["alert"] and c["exp_alerts"] == []]
        assert fired, f"{stack}: no test where {rule['alert']} fires for group {group}"
        assert quiet, f"{stack}: no test where {rule['alert']} stays quiet"
    # and the healthy case feeds every series every rule reads
    healthy = yaml.safe_load((HERE / f"{stack}.test.yml").read_text())["tests"][0]
    fed = {s["series"].split("{")[0] for s in healthy["input_series"]}
    for rule in rules:
        missing = served.metric_names(rule["expr"]) - fed - {"node_memory_Cached_bytes"}
        assert not missing, f"{stack}: the healthy case gives {rule['alert']} no {missing}"


def test_rules_read_only_series_the_exporters_serve(tmp_path):
    known = served.every(tmp_path)
    for stack in alertfiles.STACKS:
        for rule in alerts.rule_groups(alertfiles.plan_of(stack))["groups"][0]["rules"]:
            used = served.metric_names(rule["expr"])
            assert used and used <= known, (stack, rule["alert"], used - known)


def test_metric_names_of_a_query():
    assert served.metric_names('histogram_quantile(0.95, sum by (le) (rate(x:y_bucket{a="b(c)"}[5m]))) > 10') == {
        "x:y_bucket"}
    assert served.metric_names("min by (a, b) (p) < on () group_left () max(f) or up == 0") == {"p", "f", "up"}


def test_every_alert_names_stack_group_and_a_dspark_command():
    for stack in alertfiles.STACKS:
        cp = alertfiles.plan_of(stack)
        for rule in alerts.rule_groups(cp)["groups"][0]["rules"]:
            labels, summary = rule["labels"], rule["annotations"]["summary"]
            assert labels["stack"] == stack and labels["severity"] in ("critical", "warning")
            assert "`python -m dspark " in summary and f"--stack {stack}" in summary, summary
            if "group" in labels:
                assert labels["group"] in {g.name or stack for g in cp.groups}
                assert f"{stack}/{labels['group']}" in summary or summary.startswith(f"{stack}:"), summary
            if "node" in labels:
                assert labels["node"] in summary and f"rank {labels['rank']}" in summary, summary


def test_prometheus_rules_format_writes_the_output(tmp_path, capsys):
    cp = alertfiles.plan_of("sim-x2")
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"alert_rules": alerts.rule_groups(cp)}))
    out = tmp_path / "rules.yml"
    assert clients_main(["--outputs-file", str(outputs), "--format", "prometheus-rules", "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text()) == alerts.rule_groups(cp)
    outputs.write_text(json.dumps({"endpoint": "http://x/v1"}))
    assert clients_main(["--outputs-file", str(outputs), "--format", "prometheus-rules"]) == 1
    assert "no `alert_rules`" in capsys.readouterr().err
