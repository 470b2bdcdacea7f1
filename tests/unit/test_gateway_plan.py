"""The team gateway's plan (planning/gateway.py): the command strings it builds, run for real in sh where
that is the point, the LiteLLM config, and where it runs."""

import subprocess

import pytest

from declared.cluster import ConfigError
from declared.settings import parse_member_keys
from declared.stack import GatewayConfig, MemberConfig, parse_stack
from harness import cluster_of, with_known_hosts
from planning import gateway, rules, stackplan


def test_files_write_writes_every_file_verbatim_and_nothing_in_it_is_expanded(tmp_path):
    files = {
        "a.py": "x = '$HOME' + \"`id`\" + '\\\\n'\nprint($(echo no))\n",
        "start-x": "#!/bin/sh\necho \"$1\"\n",
        "tricky": "DSPARK_EOF\n'EOF'\nno newline at the end",
    }
    target = tmp_path / "etc dir"
    r = subprocess.run(["sh", "-c", gateway.files_write(str(target), files)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (target / "a.py").read_text() == files["a.py"]
    assert (target / "tricky").read_text() == files["tricky"] + "\n"
    assert (target / "start-x").stat().st_mode & 0o777 == 0o755
    assert (target / "a.py").stat().st_mode & 0o777 == 0o644
    assert not list(target.glob("*.tmp"))


def test_member_commands_quote_every_value_and_never_carry_the_key():
    m = MemberConfig(name="al.ice", models=["deepseek-v4.1-flash"], rpm_limit=60, tpm_limit=1000)
    add = gateway.member_add("st-gateway", m)
    assert add == ("docker exec -i st-gateway python3 /etc/dspark-gateway/gateway_admin.py add --member al.ice "
                   "--models deepseek-v4.1-flash --rpm 60 --tpm 1000\n")
    budget = gateway.member_add("st-gateway", MemberConfig(name="bob", token_budget=50000, budget_period="day"))
    assert budget.endswith("add --member bob --token-budget 50000 --budget-period day\n")
    revoke = gateway.member_revoke("st-gateway", "al'ice")
    assert revoke.endswith("revoke --member 'al'\"'\"'ice'\n") and "PULUMI_COMMAND" not in revoke


def test_the_secrets_file_is_shell_quoted_and_sourceable(tmp_path):
    text = gateway.secrets_env("sk-a'b", "sk-m", "in ternal", "pw", 5433)
    env = tmp_path / "secrets.env"
    env.write_text(text)
    out = subprocess.run(["sh", "-c", f". {env}; printf '%s|%s|%s' \"$LITELLM_MASTER_KEY\" \"$DSPARK_UPSTREAM_KEY\" "
                          "\"$DSPARK_DB_PORT\""], capture_output=True, text=True).stdout  # fmt: skip
    assert out == "sk-a'b|in ternal|5433"


def test_litellm_config_routes_the_one_model_upstream_with_the_internal_key_by_reference():
    cfg = gateway.litellm_config(GatewayConfig(), "m", "http://h:8000/v1")
    params = cfg["model_list"][0]["litellm_params"]
    assert params == {"model": "openai/m", "api_base": "http://h:8000/v1", "api_key": "os.environ/DSPARK_UPSTREAM_KEY",
                      "timeout": 1800}  # fmt: skip
    assert cfg["general_settings"]["master_key"] == "os.environ/LITELLM_MASTER_KEY"
    assert cfg["general_settings"]["custom_auth"] == "dspark_gateway.user_api_key_auth"
    assert "dspark_gateway.usage_logger" in cfg["litellm_settings"]["callbacks"]


def _team(**gw):
    raw = with_known_hosts(cluster_of("sim-tp2"))
    raw["gateway"] = {"members": [{"name": "alice"}, {"name": "bob"}], **gw}
    return parse_stack(raw)


def test_the_gateway_runs_on_the_head_of_a_one_group_stack_in_front_of_its_endpoint():
    cp = stackplan.build_stack(_team(), "st")
    gp = cp.gateway
    assert gp.node.name == "spark1" and cp.endpoint == "http://172.30.99.11:4000/v1" == gp.endpoint
    assert gp.upstream == "http://172.30.99.11:8000/v1" == cp.upstream
    assert [m.name for m in gp.members] == ["alice", "bob"]
    assert gp.volume == "st-gateway-db" and gp.keep_data
    assert gp.database.mounts[0] == ("/var/lib/postgresql/data", "st-gateway-db", "volume", False)
    assert all(ro for t, _, _, ro in gp.gateway.mounts)
    assert "--url http://172.30.99.11:4000/v1" in gp.readiness


@pytest.mark.parametrize("change, field", [
    ({"node": "spark9"}, "gateway.node"),
    ({"node": "local"}, "gateway.node"),
    ({"port": 8000}, "gateway.port"),
    ({"databasePort": 6379}, "gateway.databasePort"),
    ({"members": [{"name": "a", "models": ["other"]}]}, "gateway.members[0].models"),
])  # fmt: skip
def test_bad_gateway_settings_name_the_field(change, field):
    errors, _ = rules.check_stack(_team(**change), "st")
    assert any(e.field == field for e in errors), [str(e) for e in errors]


def test_a_member_listed_twice_is_refused_with_the_name():
    with pytest.raises(ConfigError, match="alice listed twice"):
        _team(members=[{"name": "alice"}, {"name": "alice"}])


def test_the_gateways_own_key_names_are_no_members_name():
    with pytest.raises(ConfigError, match=r"gateway\.members\[0\].*'admin' is what the gateway calls its own admin key"):
        _team(members=[{"name": "admin"}])


def test_a_budget_period_without_a_budget_is_refused_naming_both_fields():
    with pytest.raises(ConfigError, match=r"gateway\.members\[1\].*budgetPeriod: 'day' without tokenBudget"):
        _team(members=[{"name": "alice", "tokenBudget": 1000}, {"name": "bob", "budgetPeriod": "day"}])
    with pytest.raises(ConfigError, match="gateway.members.0..budgetPeriod"):
        _team(members=[{"name": "alice", "tokenBudget": 1000, "budgetPeriod": "year"}])


def test_member_keys_must_be_secret_known_and_well_formed_and_no_message_shows_a_key():
    gw = GatewayConfig(members=[MemberConfig(name="alice")])
    good = "sk-" + "a" * 40
    assert parse_member_keys('{"alice": "%s"}' % good, True, gw, "st") == {"alice": good}
    with pytest.raises(ConfigError, match="plain text"):
        parse_member_keys('{"alice": "%s"}' % good, False, gw, "st")
    with pytest.raises(ConfigError, match="memberKeys.carol: no such member"):
        parse_member_keys('{"carol": "%s"}' % good, True, gw, "st")
    with pytest.raises(ConfigError) as exc:
        parse_member_keys('{"alice": "sk-short-secret"}', True, gw, "st")
    assert "memberKeys.alice: must be sk-" in str(exc.value) and "sk-short-secret" not in str(exc.value)


def test_gateway_limits_come_out_of_the_side_reserve_and_are_refused_beyond_it():
    """The gateway's containers share the head's budget: they come out of memory.sideReserveGiB (the rank's limit
    stays as it was), and limits beyond it are an error naming the node, the figures and the gateway's fields.
    (A sim-* stack name: the test double's memory figures are refused anywhere else.)"""
    assert rules.check_stack(_team(), "sim-st")[0] == []
    cp = stackplan.build_stack(_team(), "sim-st")
    gp, (head, worker) = cp.gateway, cp.budgets
    assert (gp.gateway.memory_mib, gp.database.memory_mib) == (1024, 512)
    assert [c.container for c in head.containers] == ["sim-st-rank0", "sim-st-gateway", "sim-st-gateway-db",
                                                      "sim-st-node-exporter", "sim-st-guard"]  # fmt: skip
    assert [c.container for c in worker.containers] == ["sim-st-rank1", "sim-st-node-exporter", "sim-st-guard"]
    errors, _ = rules.check_stack(_team(memoryMiB=16384, databaseMemoryMiB=16384), "sim-st")
    found = [e for e in errors if e.rule == "node-memory-budget"][0]
    assert found.field == "gateway.memoryMiB" and found.value == 16384
    assert "on spark1" in found.problem and "sim-st-gateway 16,384 + sim-st-gateway-db 16,384" in found.problem
    assert ("(gateway.memoryMiB, gateway.databaseMemoryMiB, monitoring.nodeExporter.memoryMiB), place some on another "
            "node, or raise memory.sideReserveGiB") in found.fix
    assert head.rank.limit_mib == worker.rank.limit_mib  # the gateway's node's rank keeps the same limit


def test_the_prometheus_output_and_dashboard_cover_the_gateway_per_member():
    from dspark import dashboard
    from planning import monitoring

    cp = stackplan.build_stack(_team(), "st")
    job = next(c for c in monitoring.scrape_configs(cp) if c["job_name"] == "st-gateway")
    assert job["metrics_path"] == "/metrics/" and job["static_configs"][0]["targets"] == ["172.30.99.11:4000"]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "/etc/prometheus/st-gateway-metrics-key"}
    panels = dashboard.dashboard(monitoring.scrape_configs(cp), "st")["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    for series in monitoring.SERIES["gateway"]:
        assert any(series in e and "by (member" in e or series.endswith("rejected_total") and series in e for e in exprs)
    no_gateway = stackplan.build_stack(parse_stack(with_known_hosts(cluster_of("sim-tp2"))), "st")
    assert not [c for c in monitoring.scrape_configs(no_gateway) if c["job_name"].endswith("-gateway")]
