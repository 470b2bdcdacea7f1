"""What Prometheus scrapes on a stack, from its plan (pure): exported as the `prometheus` output and
rendered by `python -m dspark.clients --format prometheus` as a `scrape_configs:` block; and the series the
dashboard (dspark/dashboard.py, `--format grafana`) and the alert rules (alerts.py) read, by exporter.

- the router's own exporter (`--prometheus-port`, no key): requests, latencies, per-group health
  and outcomes (`smg_*`);
- each group's rank 0 `/metrics` where the engine serves it: vLLM always; SGLang when it runs with
  `--enable-metrics` (groups behind the router do, for the drain; add it to `serving.extraArgs`
  otherwise). Running and queued requests, throughput, TTFT (`sglang:*`, `vllm:*`).

No secret is involved in the router's and engines' scrapes: they answer without the API key (SGLang
versions that guard /metrics with it need `authorization: {credentials_file: ...}` added by hand).
- the team gateway's `/metrics/` (LiteLLM's `litellm_*` and our per-member `dspark_gateway_*`: requests,
  tokens, refusals), read with the gateway's metrics key from a credentials file.
- every node's guard (serving.selfHeal, `dspark_guard_*`: the group's state, heals by fault and result, attempts,
  given up, paused, the last fault and how long the group took to serve again), no key.
"""

from __future__ import annotations

from typing import Any

from .clusterplan import ClusterPlan, StackPlan
from programs.membership import GAUGES

# The series the dashboard (dspark/dashboard.py) and the alert rules (alerts.py) read, by exporter: what every
# target of that role (or engine) serves. tests/unit/test_dashboard.py and test_alert_rules.py check every query
# against what the exporters really serve; the e2e reads every target for them.
SERIES = {
    "router": ("smg_http_requests_total", "smg_http_request_duration_seconds_bucket", "smg_worker_health",
               "smg_worker_cb_outcomes_total"),
    # the engines' rank 0: the real families (sim/testdouble/metric_families.py); the drain reads the first two
    "sglang": (*GAUGES["sglang"], "sglang:time_to_first_token_seconds_bucket", "sglang:e2e_request_latency_seconds_bucket",
               "sglang:inter_token_latency_seconds_bucket", "sglang:prompt_tokens_total",
               "sglang:generation_tokens_total", "sglang:token_usage", "sglang:max_total_num_tokens"),
    "vllm": (*GAUGES["vllm"], "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
             "vllm:inter_token_latency_seconds_bucket", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
             "vllm:kv_cache_usage_perc"),
    "gateway": ("dspark_gateway_requests_total", "dspark_gateway_tokens_total", "dspark_gateway_rejected_total",
                "dspark_gateway_budget_tokens", "dspark_gateway_budget_used_tokens"),
    # the group's leader (node 0's guard); every guard serves dspark_guard_up
    "guard": ("dspark_guard_group_state", "dspark_guard_heals_total", "dspark_guard_exhausted",
              "dspark_guard_last_heal_seconds_to_serve", "dspark_guard_rank_up"),
    # every node's guard: its rails, and the group's last bandwidth gate
    "fabric": ("dspark_node_rail_up", "dspark_node_rail_speed_mbps", "dspark_fabric_pair_gbps", "dspark_fabric_floor_gbps"),
    # every node's node-exporter (Debian's prometheus-node-exporter: the meminfo collector), target label `node`
    "node": ("node_memory_MemAvailable_bytes", "node_memory_Cached_bytes", "node_memory_MemTotal_bytes"),
}  # fmt: skip


def serves_metrics(sp: StackPlan) -> bool:
    """Whether the group's rank 0 answers /metrics (what the plan's head args say)."""
    return sp.engine == "vllm" or "--enable-metrics" in sp.group.specs[0].args


def _host_port(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


def scrape_configs(cp: ClusterPlan) -> list[dict[str, Any]]:
    """Prometheus `scrape_configs` entries for the stack (static targets, labelled by stack/group)."""
    configs: list[dict[str, Any]] = []
    if cp.router is not None:
        configs.append({
            "job_name": f"{cp.stack}-router",
            "static_configs": [{"targets": [cp.router.metrics], "labels": {"stack": cp.stack, "role": "router"}}],
        })  # fmt: skip
    engines = [
        {"targets": [_host_port(sp.endpoint)], "labels": {"stack": cp.stack, "group": sp.name or cp.stack,
                                                          "engine": sp.engine, "role": "engine"}}
        for sp in cp.groups if serves_metrics(sp)
    ]  # fmt: skip
    if engines:
        configs.append({"job_name": f"{cp.stack}-engine", "metrics_path": "/metrics", "static_configs": engines})
    guards = [
        {"targets": [f"{n.host}:{sp.guard.port}" for n in sp.guard.nodes],
         "labels": {"stack": cp.stack, "group": sp.name or cp.stack, "role": "guard"}}
        for sp in cp.groups if sp.guard is not None
    ]  # fmt: skip
    if guards:
        # The guards' own series carry stack, group and node already (honor_labels keeps them as they are).
        configs.append({"job_name": f"{cp.stack}-guard", "metrics_path": "/metrics", "honor_labels": True,
                        "static_configs": guards})  # fmt: skip
    exporters = cp.monitoring.exporters if cp.monitoring is not None else ()
    if exporters:
        # one target per node, labelled with it: the memory alerts and panels name the node
        configs.append({"job_name": f"{cp.stack}-node", "metrics_path": "/metrics", "static_configs": [
            {"targets": [e.target], "labels": {"stack": cp.stack, "node": e.node.name, "role": "node"}}
            for e in exporters]})  # fmt: skip
    if cp.gateway is not None:
        # LiteLLM guards /metrics with a key: the gateway's metrics key (output gateway.metrics_key), which
        # may read /metrics and nothing else; write it to this file where Prometheus runs.
        configs.append({
            "job_name": f"{cp.stack}-gateway",
            "metrics_path": "/metrics/",
            "authorization": {"type": "Bearer", "credentials_file": gateway_key_file(cp.stack)},
            "static_configs": [{"targets": [cp.gateway.metrics], "labels": {"stack": cp.stack, "role": "gateway"}}],
        })  # fmt: skip
    return configs


def gateway_key_file(stack: str) -> str:
    """Where the scrape config expects the gateway's metrics key (`python -m dspark.clients --format
    prometheus --key-file` writes it there)."""
    return f"/etc/prometheus/{stack}-gateway-metrics-key"
