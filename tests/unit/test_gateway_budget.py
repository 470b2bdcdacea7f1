"""The gateway's per-member budget gauges (programs/gateway): the same count the key check refuses on, one row
per member with a budget, rendered as Prometheus text by LiteLLM's exporter (prometheus_client)."""
from __future__ import annotations

import os
import sys
import types

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM reads its bundled cost map: no network
GATEWAY = os.path.join(os.path.dirname(__file__), "..", "..", "programs", "gateway")


@pytest.fixture(scope="module")
def hooks():
    """gateway_hooks as the image imports it (its folder on sys.path); fastapi and psycopg, which only the image has,
    stubbed with the names the hooks use."""
    pytest.importorskip("prometheus_client")
    stubbed = [m for m in ("fastapi", "psycopg") if m not in sys.modules]
    if "fastapi" in stubbed:
        fastapi = types.ModuleType("fastapi")

        class HTTPException(Exception):
            def __init__(self, status_code: int, detail: str = ""):
                super().__init__(detail)
                self.status_code, self.detail = status_code, detail

        fastapi.HTTPException = HTTPException
        sys.modules["fastapi"] = fastapi
    if "psycopg" in stubbed:  # no database here: every connection fails, as with the database down
        psycopg = types.ModuleType("psycopg")

        class Error(Exception):
            pass

        def connect(*_a, **_k):
            raise OSError("no database in unit tests")

        psycopg.Error, psycopg.OperationalError, psycopg.connect = Error, Error, connect
        sys.modules["psycopg"] = psycopg
    sys.path.insert(0, os.path.abspath(GATEWAY))
    try:
        import gateway_hooks
    finally:
        sys.path.remove(os.path.abspath(GATEWAY))
    yield gateway_hooks
    for m in stubbed:  # other tests see the machine's packages as they are
        sys.modules.pop(m, None)


def test_budgets_count_what_the_key_check_counts():
    sys.path.insert(0, os.path.abspath(GATEWAY))
    try:
        import gateway_admin as admin
    finally:
        sys.path.remove(os.path.abspath(GATEWAY))
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
