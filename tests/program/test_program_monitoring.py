"""__main__.py under Pulumi mocks with the monitoring (components/monitoring.py): a node exporter on every node by
default; with `monitoring.server`, Prometheus and Alertmanager on one node, the webhook a secret that reaches the
node on stdin only, the TSDB volume kept on destroy, the image built on each node from its Dockerfile."""

import copy

import pytest

from harness import CONTAINER, Secret, cluster_of, labels_of, plain_strings, reveal, run_program
from planning import prometheus

REMOTE = "command:remote:Command"
IMAGE = "docker:index/remoteImage:RemoteImage"
WEBHOOK = "https://hooks.slack.example/services/T000/B000/sEcReTwEbHoOk"
METRICS = "sk-metrics-" + "d" * 40


@pytest.fixture(scope="module")
def team():
    return run_program("sim-team", secrets={"alertWebhook": WEBHOOK},
                       command_stdout={"sim-team-gateway-metrics-key": METRICS + "\n"})  # fmt: skip


def test_every_node_runs_a_node_exporter_from_the_image_built_there(team):
    exporters = sorted(team.containers("node-exporter"), key=lambda e: e.name)  # (registered as their images resolve)
    assert [(e.plain["name"], e.name) for e in exporters] == [
        ("sim-team-node-exporter", "sim-team-monitoring-spark1-node-exporter"),
        ("sim-team-node-exporter", "sim-team-monitoring-spark2-node-exporter")]  # fmt: skip
    for e in exporters:
        node = e.name.split("-")[-3]
        image, build = team.named(f"sim-team-monitoring-{node}-image"), team.named(f"sim-team-monitoring-{node}-image-build")
        assert e.plain["image"] == image.plain["name"] == "deepseek-spark-monitoring:bookworm"
        assert image.urn in e.dependencies and build.urn in image.dependencies and image.plain["keepLocally"]
        assert e.provider_urn == image.provider_urn and "spark" in e.provider_urn or e.provider_urn
        assert e.plain["networkMode"] == "host" and e.plain["pidMode"] == "host" and e.plain["restart"] == "unless-stopped"
        assert e.plain["memory"] == 64 and e.delete_before_replace
        assert {m["target"]: m["readOnly"] for m in e.plain["mounts"]} == {prometheus.HOST_ROOT: True}
        # a new Dockerfile: the image rebuilt on the node, read again, every container started from it anew
        digest = prometheus.dockerfile_digest(prometheus.DOCKERFILE.read_text())
        assert image.plain["triggers"] == {"dockerfile": digest} and labels_of(e)[prometheus.BUILT_FROM] == digest
        assert build.plain["stdin"] == prometheus.DOCKERFILE.read_text() and build.plain["create"] == build.plain["update"]


def test_the_webhook_is_a_secret_on_stdin_and_nowhere_else(team):
    config = team.named("sim-team-monitoring-alertmanager-config")
    assert isinstance(config.inputs["stdin"], Secret) and WEBHOOK in config.inputs["stdin"].value
    assert config.delete_before_replace and config.plain["logging"] == "none"
    holders = [r.name for r in team.resources if WEBHOOK in str(reveal(r.inputs))]
    assert holders == ["sim-team-monitoring-alertmanager-config"]
    for r in team.resources:
        assert not any(WEBHOOK in s for s in plain_strings(r.inputs)), r.name
    for name, value in team.outputs.items():
        assert not any(WEBHOOK in s for s in plain_strings(value)), name


def test_prometheus_reads_the_gateway_with_its_metrics_key_from_a_0600_file(team):
    key = team.named("sim-team-monitoring-gateway-key")
    assert isinstance(key.inputs["stdin"], Secret) and key.plain["stdin"] == METRICS
    prom = team.containers("prometheus")[0]
    assert METRICS not in str(prom.plain) and key.urn in prom.dependencies
    mounts = {m["target"]: m for m in prom.plain["mounts"]}
    assert mounts[prometheus.GATEWAY_KEY]["readOnly"] and mounts["/prometheus"]["source"] == "sim-team-prometheus"


def test_prometheus_starts_after_the_stack_answers_and_restarts_when_its_files_change(team):
    prom, am = team.containers("prometheus")[0], team.containers("alertmanager")[0]
    gateway_ready = team.named("sim-team-gateway-readiness-check")
    assert gateway_ready.urn in prom.dependencies and am.urn in prom.dependencies
    files = team.named("sim-team-monitoring-files")
    assert files.urn in prom.dependencies and files.plain["create"] == files.plain["update"]
    cluster = copy.deepcopy(cluster_of("sim-team"))
    cluster["monitoring"]["server"]["scrapeIntervalSeconds"] = 30
    other = run_program("sim-team", cluster, secrets={"alertWebhook": WEBHOOK})
    assert labels_of(other.containers("prometheus")[0])["deepseek-spark.files"] != labels_of(prom)["deepseek-spark.files"]
    assert labels_of(other.containers("alertmanager")[0]) == labels_of(am)  # only what changed restarts


def test_the_tsdb_is_kept_on_destroy_unless_keep_data_is_false(team):
    assert team.named("sim-team-monitoring-tsdb").retain_on_delete
    cluster = copy.deepcopy(cluster_of("sim-team"))
    cluster["monitoring"]["server"]["keepData"] = False
    assert not run_program("sim-team", cluster).named("sim-team-monitoring-tsdb").retain_on_delete


def test_outputs_say_where_prometheus_and_alertmanager_answer(team):
    assert team.outputs["monitoring"] == {
        "node_exporters": ["172.30.99.11:9100", "172.30.99.12:9100"], "node": "spark1",
        # on spark1's loopback: an operator comes in through ssh (planning/exposure.py)
        "prometheus": "http://127.0.0.1:9090", "alertmanager": "http://127.0.0.1:9093",
        "volume": "sim-team-prometheus"}  # fmt: skip


def test_without_exporters_or_server_nothing_is_registered():
    cluster = copy.deepcopy(cluster_of("tp4"))
    cluster["monitoring"] = {"nodeExporter": {"enabled": False}}
    rec = run_program("tp4", cluster)
    assert not [r for r in rec.resources if "monitoring" in r.name] and "monitoring" not in rec.outputs
    assert not rec.containers("node-exporter", "prometheus", "alertmanager")


def test_a_server_without_a_webhook_keeps_its_alerts_and_no_gateway_no_key_file():
    rec = run_program("sim")
    config = rec.named("sim-monitoring-alertmanager-config")
    assert "webhook_configs" not in config.plain["stdin"] and "receivers" in config.plain["stdin"]
    assert not [r for r in rec.of_type(REMOTE) if r.name.endswith("-gateway-key")]
    assert "deepseek-spark.secrets" not in labels_of(rec.containers("prometheus")[0])
