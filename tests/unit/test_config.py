"""Shape validation of `deepseek-spark:cluster` (types, ranges, unknown fields)."""

import pytest

from declared.cluster import ConfigError, parse_cluster
from harness import cluster_of, group_of


@pytest.mark.parametrize("stack", ["tp3", "tp4"])
def test_stack_files_parse(stack):
    cfg = parse_cluster(group_of(stack))
    assert cfg.serving.tp_size == len(cfg.nodes)
    assert cfg.nodes[0].name == "spark1"


def test_seed_values_tp4():
    cfg = parse_cluster(group_of("tp4"))
    s = cfg.serving
    assert [n.host for n in cfg.nodes] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert (s.port, s.tp_size, s.ep_size, s.context_length, s.max_total_tokens) == (8888, 4, 4, 1048576, 8000000)
    assert (s.max_running_requests, s.mem_fraction_static, s.spec_algo, s.dspark_block_size) == (8, 0.80, "DSPARK", 3)
    assert cfg.image == "lmsysorg/sglang:dev-dsv41"
    assert cfg.share.mode == "nfs" and cfg.engram.retain is True


def test_seed_values_tp3():
    s = parse_cluster(group_of("tp3")).serving
    assert (s.tp_size, s.ep_size, s.context_length, s.max_total_tokens) == (3, 3, 262144, 750000)
    assert (s.max_running_requests, s.mem_fraction_static) == (4, 0.95)


def test_unknown_field_is_named():
    raw = cluster_of("tp4")
    raw["serving"]["maxRunningRequest"] = 8  # typo
    with pytest.raises(ConfigError) as err:
        parse_cluster(raw)
    assert "cluster.serving.maxRunningRequest: unknown field" in str(err.value)


def test_unknown_node_field_is_named_with_index():
    raw = cluster_of("tp4")
    raw["nodes"][2]["ip"] = "10.0.0.3"
    with pytest.raises(ConfigError, match=r"cluster\.nodes\[2\]\.ip: unknown field"):
        parse_cluster(raw)


def test_missing_field_is_named():
    raw = cluster_of("tp4")
    del raw["model"]["checkpointDir"]
    with pytest.raises(ConfigError, match=r"cluster\.model\.checkpointDir: required field is missing"):
        parse_cluster(raw)


def test_all_problems_reported_at_once():
    raw = cluster_of("tp4")
    raw["serving"]["memFractionStatic"] = 1.5
    raw["engram"]["dir"] = "relative/engram"
    with pytest.raises(ConfigError) as err:
        parse_cluster(raw)
    text = str(err.value)
    assert "cluster.serving.memFractionStatic" in text and "1.5" in text
    assert "cluster.engram.dir" in text and "absolute" in text


def test_bad_enum_value_shows_value():
    raw = cluster_of("tp4")
    raw["topology"] = "mesh"
    with pytest.raises(ConfigError, match=r"cluster\.topology: .*'mesh'"):
        parse_cluster(raw)


def test_unset_cluster_points_to_example():
    with pytest.raises(ConfigError, match="Pulumi.tp4.yaml"):
        parse_cluster(None)


def test_defaults_from_the_seeds():
    cfg = parse_cluster(group_of("tp4"))
    assert cfg.serving.dist_port == 20000
    assert cfg.fabric.tuned_buffers is True
    assert cfg.readiness.timeout_seconds >= 13 * 60  # a cold boot takes 12-13 minutes
    assert cfg.memory.unified_gib == 121.7 and cfg.memory.runtime_floor_gib == 3.0


def test_checkpoint_dir_without_whitespace():
    raw = cluster_of("tp4")
    raw["model"]["checkpointDir"] = "/data/my models"
    with pytest.raises(ConfigError, match=r"cluster\.model\.checkpointDir: .*whitespace"):
        parse_cluster(raw)


def test_alerts_ttft_target_default_override_and_refusal():
    from declared.stack import parse_stack
    from planning import alerts, stackplan

    raw = cluster_of("tp4x2")
    assert parse_stack(raw).groups[0].cfg.alerts.ttft_seconds == 10.0
    raw["groups"][1]["alerts"] = {"ttftSeconds": 30}  # a per-group field
    cp = stackplan.build_stack(parse_stack(raw), "tp4x2")
    ttft = [r for r in alerts.rule_groups(cp)["groups"][0]["rules"] if r["alert"] == "DsparkTimeToFirstTokenHigh"]
    assert [(r["labels"]["group"], r["expr"].rsplit(" ", 1)[1]) for r in ttft] == [("a", "10"), ("b", "30")]
    raw["groups"][1]["alerts"] = {"ttftSeconds": 0}
    with pytest.raises(ConfigError, match=r"groups\[1\]\(b\)\.alerts\.ttftSeconds"):
        parse_stack(raw)
