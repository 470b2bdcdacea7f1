"""The stack's Grafana dashboard, built with grafana-foundation-sdk (Grafana's typed builders, generated from its
schema) over the series the stack's exporters serve (planning/monitoring.SERIES): `python -m dspark.clients
--format grafana` writes it from the `prometheus` output, so it shows exactly what that output scrapes.

One row per part the stack has (by the targets' `role` label): the router; the engines (per engine: running and
queued requests, time to first token, end-to-end and inter-token latency, token throughput, KV cache usage and, for
SGLang, the KV pool obtained); the team gateway (per member: requests, tokens, budget used; refusals); the guard
(the group's state, ranks, heals); the fabric (rails, their speed, the last gate's pair bandwidth against its floor,
served by every node's guard); each node's memory (node-exporter). Every query selects `stack="<stack>"` and uses
fixed windows, so it runs as it is against Prometheus too (the e2e does).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from grafana_foundation_sdk.builders.dashboard import DatasourceVariable, Dashboard, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.timeseries import Panel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
Query = tuple[str, str]  # (PromQL, legend)


def roles(scrape: list[dict[str, Any]]) -> set[str]:
    return {sc.get("labels", {}).get("role", "") for c in scrape for sc in c.get("static_configs", [])}


def engines(scrape: list[dict[str, Any]]) -> list[str]:
    return sorted({sc["labels"]["engine"] for c in scrape for sc in c.get("static_configs", [])
                   if sc.get("labels", {}).get("role") == "engine"})  # fmt: skip


def panel(title: str, unit: str, queries: Iterable[Query], description: str = "") -> Panel:
    p = Panel().title(title).unit(unit).datasource(DATASOURCE).min(0)
    if description:
        p = p.description(description)
    for i, (expr, legend) in enumerate(queries):
        p = p.with_target(Dataquery().ref_id(chr(65 + i)).expr(expr).legend_format(legend).range())
    return p


def quantiles(metric: str, sel: str, window: str = "5m") -> list[Query]:
    return [(f"histogram_quantile({q}, sum by (group, le) (rate({metric}{{{sel}}}[{window}])))", f"{{{{group}}}} p{p}")
            for q, p in (("0.5", "50"), ("0.95", "95"))]  # fmt: skip


def router_panels(sel: str) -> list[Panel]:
    return [
        panel("Requests through the router", "reqps", [(f"sum(rate(smg_http_requests_total{{{sel}}}[1m]))", "req/s")]),
        panel("Router latency p95", "s", [(f"histogram_quantile(0.95, sum by (le) (rate("
                                           f"smg_http_request_duration_seconds_bucket{{{sel}}}[5m])))", "p95")]),
        panel("Groups in rotation (router health)", "short", [(f"smg_worker_health{{{sel}}}", "{{worker}}")]),
        panel("Outcomes per group", "reqps", [(f"sum by (worker, outcome) (rate(smg_worker_cb_outcomes_total{{{sel}}}"
                                               "[1m]))", "{{worker}} {{outcome}}")]),
    ]  # fmt: skip


def engine_panels(engine: str, sel: str) -> list[Panel]:
    sg = engine == "sglang"
    running, queued = ("sglang:num_running_reqs", "sglang:num_queue_reqs") if sg else (
        "vllm:num_requests_running", "vllm:num_requests_waiting")
    p = "sglang" if sg else "vllm"
    out = [
        panel(f"Running and queued requests ({engine})", "short",
              [(f"sum by (group) ({running}{{{sel}}})", "{{group}} running"),
               (f"sum by (group) ({queued}{{{sel}}})", "{{group}} queued")]),
        panel(f"Time to first token ({engine})", "s", quantiles(f"{p}:time_to_first_token_seconds_bucket", sel),
              "alerts.ttftSeconds is the p95 target (DsparkTimeToFirstTokenHigh)"),
        panel(f"End-to-end request latency ({engine})", "s", quantiles(f"{p}:e2e_request_latency_seconds_bucket", sel)),
        panel(f"Inter-token latency ({engine})", "s", quantiles(f"{p}:inter_token_latency_seconds_bucket", sel)),
        panel(f"Tokens per second ({engine})", "short",
              [(f"sum by (group) (rate({p}:prompt_tokens_total{{{sel}}}[1m]))", "{{group}} prompt"),
               (f"sum by (group) (rate({p}:generation_tokens_total{{{sel}}}[1m]))", "{{group}} generated")]),
        panel(f"KV cache in use ({engine})", "percentunit",
              [(f"max by (group) ({'sglang:token_usage' if sg else 'vllm:kv_cache_usage_perc'}{{{sel}}})", "{{group}}")]),
    ]  # fmt: skip
    if sg:
        out.append(panel("KV pool obtained (sglang)", "short",
                         [(f"max by (group) (sglang:max_total_num_tokens{{{sel}}})", "{{group}}")],
                         "the tokens rank 0 obtained at its last start; DsparkKvPoolBelowPlan fires below "
                         "readiness.minKvShare of the plan's figure"))  # fmt: skip
    return out


def gateway_panels(sel: str) -> list[Panel]:
    return [
        panel("Requests per member (gateway)", "reqps", [(f"sum by (member, status) (rate(dspark_gateway_requests_total"
                                                          f"{{{sel}}}[5m]))", "{{member}} {{status}}")]),
        panel("Tokens per member (gateway)", "short", [(f"sum by (member, kind) (rate(dspark_gateway_tokens_total"
                                                        f"{{{sel}}}[5m]))", "{{member}} {{kind}}")]),
        panel("Token budget used per member (gateway)", "percentunit",
              [(f"max by (member, period) (dspark_gateway_budget_used_tokens{{{sel}}}) / max by (member, period) "
                f"(dspark_gateway_budget_tokens{{{sel}}})", "{{member}} ({{period}})")],
              "1 = the budget is used: the gateway answers 429 until it renews (DsparkMemberBudgetUsed)"),
        panel("Refused requests (gateway)", "reqps", [(f"sum by (reason) (rate(dspark_gateway_rejected_total{{{sel}}}"
                                                       "[5m]))", "{{reason}}")]),
    ]  # fmt: skip


def guard_panels(sel: str) -> list[Panel]:
    return [
        panel("Group state (guard)", "short", [(f"max by (group, state) (dspark_guard_group_state{{{sel}}}) == 1",
                                                "{{group}} {{state}}")]),
        panel("Ranks running (guard)", "short", [(f"dspark_guard_rank_up{{{sel}}}", "{{group}} rank {{rank}} {{node}}")]),
        panel("Heals in the last hour (guard)", "short", [(f"sum by (group, fault, result) (increase("
                                                           f"dspark_guard_heals_total{{{sel}}}[1h]))",
                                                           "{{group}} {{fault}} {{result}}")]),
        panel("Seconds from the last fault to serving (guard)", "s",
              [(f"dspark_guard_last_heal_seconds_to_serve{{{sel}}}", "{{group}}")]),
        panel("Guard gave up (1: the group stays down)", "short", [(f"dspark_guard_exhausted{{{sel}}}", "{{group}}")]),
    ]  # fmt: skip


def fabric_panels(sel: str) -> list[Panel]:
    return [
        panel("Rails up (every node's guard)", "short", [(f"dspark_node_rail_up{{{sel}}}", "{{node}} {{rail}}")]),
        panel("Rail speed", "Mbits", [(f"dspark_node_rail_speed_mbps{{{sel}}}", "{{node}} {{rail}}")]),
        panel("Pair bandwidth at the last gate", "Gbits",
              [(f"max by (group, a, b) (dspark_fabric_pair_gbps{{{sel}}})", "{{a}} - {{b}}"),
               (f"max by (group) (dspark_fabric_floor_gbps{{{sel}}})", "{{group}} floor")]),
    ]  # fmt: skip


def node_panels(sel: str) -> list[Panel]:
    return [
        panel("Memory available per node", "bytes", [(f"node_memory_MemAvailable_bytes{{{sel}}}", "{{node}} available"),
                                                     (f"node_memory_MemTotal_bytes{{{sel}}}", "{{node}} total")],
              "MemAvailable under memory.runtimeFloorGiB fires DsparkNodeMemoryLow"),
        panel("Page cache per node", "bytes", [(f"node_memory_Cached_bytes{{{sel}}}", "{{node}}")]),
    ]  # fmt: skip


def sections(scrape: list[dict[str, Any]], stack: str) -> list[tuple[str, list[Panel]]]:
    """(row title, its panels) for what the stack's scrape configs have."""
    sel, have = f'stack="{stack}"', roles(scrape)
    out: list[tuple[str, list[Panel]]] = []
    if "router" in have:
        out.append(("Router", router_panels(sel)))
    for engine in engines(scrape):
        out.append((f"Engines ({engine})", engine_panels(engine, sel)))
    if "gateway" in have:
        out.append(("Team gateway", gateway_panels(sel)))
    if "guard" in have:
        out += [("Self-healing guard", guard_panels(sel)), ("Fabric", fabric_panels(sel))]
    if "node" in have:
        out.append(("Node memory", node_panels(sel)))
    return out


def dashboard(scrape: list[dict[str, Any]], stack: str) -> dict[str, Any]:
    """The Grafana dashboard (JSON model) for the series `scrape` collects on `stack`."""
    d = (Dashboard(f"deepseek-spark {stack}").uid(f"deepseek-spark-{stack}"[:40]).tags(["deepseek-spark"])
         .time("now-1h", "now").refresh("30s").with_variable(DatasourceVariable("datasource").type("prometheus")))  # fmt: skip
    pid = 0
    for title, panels in sections(scrape, stack):
        pid += 1
        d = d.with_row(Row(title).id(pid))
        for p in panels:
            pid += 1
            d = d.with_panel(p.id(pid))
    return json.loads(json.dumps(d.build(), cls=JSONEncoder))
