"""The monitoring the program runs (planning/prometheus.py): what Prometheus and Alertmanager are started with, in
Debian's own checkers (`promtool check config`, `amtool check-config`), where the webhook goes (never into a plan
string), the image's build on a node (run against a docker stand-in), and the config's refusals."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from declared.cluster import ConfigError
from declared.stack import MONITORING_IMAGE, StackConfig, parse_stack
from harness import cluster_of, with_known_hosts
from planning import alerts, clusterplan, monitoring, prometheus, rules, stackplan

WEBHOOK = "https://hooks.slack.example/services/T000/B000/sEcReTwEbHoOk"


def tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        msg = f"no {name}: install Debian's prometheus and prometheus-alertmanager packages (bash .ci/setup does)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def stack_with(stack: str, **monitoring_cfg) -> tuple[StackConfig, clusterplan.ClusterPlan]:
    raw = with_known_hosts(cluster_of(stack))
    raw["monitoring"] = {**raw.get("monitoring", {}), **monitoring_cfg}
    sc = parse_stack(raw)
    assert rules.check_stack(sc, stack)[0] == []
    return sc, stackplan.build_stack(sc, stack)


@pytest.mark.parametrize("stack", ["sim", "sim-x2", "sim-team", "tp4", "tp2"])
def test_the_servers_files_pass_promtool_and_scrape_exactly_the_prometheus_output(stack, tmp_path):
    _, cp = stack_with(stack, server={})
    sp = cp.monitoring.server
    doc = yaml.safe_load(sp.files["prometheus.yml"])
    jobs = monitoring.scrape_configs(cp)
    assert [j["job_name"] for j in doc["scrape_configs"]] == [j["job_name"] for j in jobs]
    for mine, out in zip(doc["scrape_configs"], jobs):
        assert mine["static_configs"] == out["static_configs"]
        if "authorization" in out:  # the gateway's key where the server mounts it
            assert mine["authorization"]["credentials_file"] == prometheus.GATEWAY_KEY
    assert doc["rule_files"] == [f"{prometheus.ETC}/rules.yml"]
    assert sp.files["rules.yml"] == alerts.render(alerts.rule_groups(cp), stack)
    # as Prometheus reads them in its container: the files under ETC, the key file under SECRETS
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "rules.yml").write_text(sp.files["rules.yml"])
    text = sp.files["prometheus.yml"].replace(prometheus.ETC, str(etc))
    text = text.replace(prometheus.GATEWAY_KEY, str(tmp_path / "key"))
    (tmp_path / "key").write_text("sk-metrics\n")
    (etc / "prometheus.yml").write_text(text)
    proc = subprocess.run([tool("promtool"), "check", "config", str(etc / "prometheus.yml")], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{stack}-prometheus" == sp.volume and sp.keep_data


@pytest.mark.parametrize("webhook", [WEBHOOK, None])
def test_alertmanagers_config_passes_amtool_and_sends_resolutions(webhook, tmp_path):
    text = prometheus.alertmanager_config(webhook, 2, 5)
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    proc = subprocess.run([tool("amtool"), "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = yaml.safe_load(text)
    assert doc["route"]["group_wait"] == "2s" and doc["route"]["group_interval"] == "5s"
    assert doc["route"]["group_by"] == ["alertname", "stack", "group", "node"]
    (receiver,) = doc["receivers"]
    if webhook:
        assert receiver["webhook_configs"] == [{"url": WEBHOOK, "send_resolved": True}]
    else:  # kept in Alertmanager (its API and UI), sent nowhere
        assert "webhook_configs" not in receiver


def test_the_webhook_is_in_no_plan_string_it_reaches_the_node_on_stdin():
    _, cp = stack_with("sim-team", server={})
    sp = cp.monitoring.server
    assert sp.alertmanager_create.endswith("\n") and "cat" in sp.alertmanager_create
    for text in (*sp.files.values(), sp.files_write, sp.alertmanager_create, sp.key_create, *sp.prometheus.command,
                 *sp.alertmanager.command):  # fmt: skip
        assert "hooks" not in text and "webhook_configs" not in text
    mounts = {t: (src, ro) for t, src, _, ro in sp.prometheus.mounts}
    assert mounts[prometheus.GATEWAY_KEY] == (sp.key_path, True) and mounts[prometheus.ETC][1]
    assert {t for t, *_ in sp.alertmanager.mounts} == {f"{prometheus.SECRETS}/alertmanager.yml"}


def test_without_a_gateway_no_key_file_is_written_or_mounted():
    _, cp = stack_with("sim", server={})
    sp = cp.monitoring.server
    assert sp.key_path is None and sp.key_create is None
    assert prometheus.GATEWAY_KEY not in {t for t, *_ in sp.prometheus.mounts}


def test_node_exporters_on_every_node_by_default_and_none_when_off():
    sc, cp = stack_with("tp4x2")
    assert [e.target for e in cp.monitoring.exporters] == [f"10.0.0.{i}:9100" for i in range(1, 9)]
    assert cp.monitoring.server is None and cp.monitoring.to_output() == {
        "node_exporters": [f"10.0.0.{i}:9100" for i in range(1, 9)]}
    e = cp.monitoring.exporters[0]
    assert e.container.entrypoint == ("/usr/bin/prometheus-node-exporter",)
    assert e.container.mounts == ((prometheus.HOST_ROOT, "/", "bind", True),)
    _, off = stack_with("tp4x2", nodeExporter={"enabled": False})
    assert off.monitoring.exporters == () and not [j for j in monitoring.scrape_configs(off) if j["job_name"].endswith("-node")]


def _docker_stand_in(tmp_path: Path, label: str) -> Path:
    """`docker` that answers `image inspect` with `label` (empty: no such image) and records a build with its stdin."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "docker"
    exe.write_text(f"""#!/bin/sh
if [ "$1 $2" = "image inspect" ]; then
  [ -n {label!r} ] || exit 1
  echo {label!r}; exit 0
fi
echo "$@" > {tmp_path}/build.args
cat > {tmp_path}/build.stdin
""")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.mark.parametrize("held", ["", "0123456789abcdef", "current"])
def test_the_image_is_built_on_a_node_only_when_it_holds_none_of_this_dockerfile(held, tmp_path):
    _, cp = stack_with("sim")
    mp = cp.monitoring
    assert mp.dockerfile == prometheus.DOCKERFILE.read_text() and len(mp.digest) == 16
    label = mp.digest if held == "current" else held
    env = {**os.environ, "PATH": f"{_docker_stand_in(tmp_path, label)}:{os.environ['PATH']}"}
    proc = subprocess.run(["sh", "-c", mp.build], input=mp.dockerfile, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    built = (tmp_path / "build.args").exists()
    assert built == (held != "current")
    if built:
        assert (tmp_path / "build.args").read_text().split() == [
            "build", "--label", f"{prometheus.BUILT_FROM}={mp.digest}", "-t", MONITORING_IMAGE, "-"]
        assert (tmp_path / "build.stdin").read_text() == mp.dockerfile  # no context: the Dockerfile copies nothing
    else:
        assert "is built from these inputs" in proc.stdout


def test_another_image_is_pulled_not_built():
    _, cp = stack_with("sim", image="registry.example/monitoring:1")
    assert cp.monitoring.build is None and cp.monitoring.digest == "" and cp.monitoring.image == "registry.example/monitoring:1"


def test_the_dockerfile_copies_nothing_so_stdin_is_all_a_build_needs():
    text = prometheus.DOCKERFILE.read_text()
    assert not [ln for ln in text.splitlines() if ln.split(" ", 1)[0] in ("COPY", "ADD")]


@pytest.mark.parametrize(
    "server,field,words",
    [
        ({"node": "spark9"}, "monitoring.server.node", "is not a node of any group"),
        ({"node": "local"}, "monitoring.server.node", "its TSDB must outlive the machine Pulumi runs on"),
        ({"prometheusPort": 8888}, "monitoring.server.prometheusPort", "is the group's serving.port on spark1"),
        ({"alertmanagerPort": 9100}, "monitoring.server.alertmanagerPort", "is monitoring.nodeExporter.port on spark1"),
    ],
)  # fmt: skip
def test_a_server_on_no_node_or_on_a_taken_port_is_refused_naming_the_field(server, field, words):
    raw = with_known_hosts(cluster_of("sim"))
    raw["monitoring"] = {"server": server}
    found = [f for f in rules.check_stack(parse_stack(raw), "sim")[0] if f.field == field]
    assert found and words in found[0].problem, [(f.field, f.problem) for f in rules.check_stack(parse_stack(raw), "sim")[0]]


def test_a_bad_monitoring_value_names_its_field():
    raw = cluster_of("sim")
    raw["monitoring"] = {"server": {"retention": "forever"}, "nodeExporter": {"memoryMiB": 8}}
    with pytest.raises(ConfigError) as exc:
        parse_stack(raw)
    assert "cluster.monitoring.server.retention" in str(exc.value) and "cluster.monitoring.nodeExporter.memoryMiB" in str(exc.value)


def test_the_server_counts_in_its_nodes_budget():
    sc, cp = stack_with("sim-team", server={"memoryMiB": 2048, "alertmanagerMemoryMiB": 256})
    head = cp.budgets[0]
    assert [(c.container, c.limit_mib) for c in head.others if c.role in ("prometheus", "alertmanager")] == [
        ("sim-team-prometheus", 2048), ("sim-team-alertmanager", 256)]
    assert not [c for b in cp.budgets[1:] for c in b.others if c.role in ("prometheus", "alertmanager")]
