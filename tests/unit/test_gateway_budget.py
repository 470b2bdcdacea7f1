"""The gateway's per-member budget gauges (programs/gateway): the same count the key check refuses on, one row
per member with a budget, rendered as Prometheus text by LiteLLM's exporter (prometheus_client)."""
from __future__ import annotations

import pytest

import gateway_stub


@pytest.fixture(scope="module")
def hooks():
    pytest.importorskip("prometheus_client")
    with gateway_stub.hooks() as module:
        yield module


def test_budgets_count_what_the_key_check_counts():
    admin = gateway_stub.admin()
    assert admin.USED_IN_PERIOD in admin.KEY_CHECK and admin.USED_IN_PERIOD in admin.BUDGETS
    assert "k.revoked_at IS NULL" in admin.BUDGETS and "k.token_budget IS NOT NULL" in admin.BUDGETS
    assert "DISTINCT ON (k.member)" in admin.BUDGETS  # one row per member, whatever number of active keys


def test_budget_gauges_per_member_and_period(hooks):
    from prometheus_client import CollectorRegistry, generate_latest

    class One:
        def collect(self):
            yield from hooks.budget_families([("bob", "day", 100, 120), ("alice", "month", 5000, 30)])

    reg = CollectorRegistry()
    reg.register(One())
    text = generate_latest(reg).decode()
    assert 'dspark_gateway_budget_tokens{member="alice",period="month"} 5000.0' in text
    assert 'dspark_gateway_budget_used_tokens{member="alice",period="month"} 30.0' in text
    assert 'dspark_gateway_budget_used_tokens{member="bob",period="day"} 120.0' in text
    assert "# TYPE dspark_gateway_budget_tokens gauge" in text


def test_the_exporter_serves_the_budgets_only_with_the_database(hooks, monkeypatch):
    monkeypatch.setattr(hooks.USAGE, "seeded_to", 0)
    monkeypatch.setattr(hooks.admin, "read_budgets", lambda: [("carol", "week", 10, 10)])
    fams = {f.name: f for f in hooks.UsageCollector().collect()}
    assert [s.labels for s in fams["dspark_gateway_budget_used_tokens"].samples] == [{"member": "carol",
                                                                                        "period": "week"}]
    assert fams["dspark_gateway_budget_tokens"].samples[0].value == 10
    monkeypatch.setattr(hooks.USAGE, "seeded_to", None)
    monkeypatch.setattr(hooks.USAGE, "seed", lambda: False)  # the database does not answer
    fams = {f.name: f for f in hooks.UsageCollector().collect()}
    assert fams["dspark_gateway_usage_db_up"].samples[0].value == 0
    assert fams["dspark_gateway_budget_tokens"].samples == []
