"""The Grafana dashboard (dspark/dashboard.py, grafana-foundation-sdk) of every stack: a row per part the stack's
scrape configs have, every query on stack="<stack>" reading only series an exporter serves (tests/served.py), a
model Grafana's SDK reads back."""
from __future__ import annotations

import copy
import json

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel

import alertfiles
import served
from dspark import dashboard
from planning import monitoring

# per stack (its node exporters included): (rows, panels and rows)
COUNTS = {"sim": (4, 21), "sim-team": (5, 25), "sim-tp2": (4, 20), "sim-x2": (5, 26), "tp2": (4, 20), "tp3": (4, 21),
          "tp4": (4, 21), "tp4x2": (5, 26)}  # fmt: skip


def scrape(stack: str, nodes: bool = True) -> list[dict]:
    """The stack's scrape configs (`nodes=False`: without its node exporters' job)."""
    configs = copy.deepcopy(monitoring.scrape_configs(alertfiles.plan_of(stack)))
    return [c for c in configs if nodes or c["job_name"] != f"{stack}-node"]


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    return served.every(tmp_path_factory.mktemp("served"))


@pytest.mark.parametrize("stack", alertfiles.STACKS)
def test_every_query_reads_served_series_of_its_stack(stack, known):
    doc = dashboard.dashboard(scrape(stack), stack)
    panels = [p for p in doc["panels"] if p["type"] != "row"]
    assert panels and all(p["targets"] for p in panels)
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for t in p["targets"]:
            used = served.metric_names(t["expr"])
            assert used and used <= known, (p["title"], used - known)
            assert f'stack="{stack}"' in t["expr"] and "$__" not in t["expr"], t["expr"]
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])
    rows = sum(p["type"] == "row" for p in doc["panels"])
    assert (rows, len(doc["panels"])) == COUNTS[stack]


def test_rows_follow_what_the_stack_scrapes():
    titles = lambda doc: [p["title"] for p in doc["panels"] if p["type"] == "row"]  # noqa: E731
    assert titles(dashboard.dashboard(scrape("sim-x2"), "sim-x2")) == [
        "Router", "Engines (sglang)", "Self-healing guard", "Fabric", "Node memory"]
    assert titles(dashboard.dashboard(scrape("sim-team", nodes=False), "sim-team")) == [
        "Engines (vllm)", "Team gateway", "Self-healing guard", "Fabric"]
    exprs = [t["expr"] for p in dashboard.dashboard(scrape("sim-team"), "sim-team")["panels"] for t in p.get("targets", [])]
    assert any("dspark_gateway_budget_used_tokens" in e and "by (member, period)" in e for e in exprs)
    assert not any("sglang:" in e for e in exprs)


def test_grafanas_sdk_reads_the_model_back():
    doc = dashboard.dashboard(scrape("sim-x2"), "sim-x2")
    model = DashboardModel.from_json(copy.deepcopy(doc))
    assert model.title == "deepseek-spark sim-x2" and model.uid == "deepseek-spark-sim-x2"
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    assert [p["title"] for p in again["panels"]] == [p["title"] for p in doc["panels"]]
