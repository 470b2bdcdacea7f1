"""Prometheus alert rules for a stack, from its plan (pure): exported as the `alert_rules` output and written by
`python -m dspark.clients --format prometheus-rules` as a rules file; tested with `promtool test rules`
(tests/unit/promtool/). Every rule reads series the stack's exporters serve (what `monitoring.scrape_configs`
scrapes), and every alert carries `severity`, `stack` and `group` (the name `dspark --group` takes), `node` and
`rank` where one node is at fault; its summary names them and the `dspark` command that shows more.

The series, by exporter (labels the rules select on):
- the engines' rank 0 (`up{stack, group, role="engine"}`; SGLang `sglang:*`, vLLM `vllm:*`, the real families:
  sim/testdouble/metric_families.py);
- each node's guard (`dspark_guard_*{stack, group=<plan name>}`, the leader's; and every node's own
  `dspark_node_rail_up{stack, group, node, rail, hca}`, `dspark_fabric_pair_gbps{stack, group, a, b}`,
  `dspark_fabric_floor_gbps{stack, group}`);
- each node's node-exporter (`node_memory_MemAvailable_bytes{stack, node}`, `node_memory_Cached_bytes`);
- the team gateway (`dspark_gateway_requests_total{stack, member, status}`,
  `dspark_gateway_budget_tokens` / `dspark_gateway_budget_used_tokens{stack, member, period}`);
- every target's `up` (Prometheus's own).

Thresholds from the plan: the KV pool below readiness.minKvShare of what the plan expects (SGLang: vLLM refuses to
start without room for one request of maxModelLen, which is what its plan expects, so its group-down alert covers
it); a node's MemAvailable below memory.runtimeFloorGiB (what the plan keeps free outside the static pool while the
group serves: less, and the next allocation of a rank or the OS can OOM a rank, and a head OOM hangs every rank);
the fabric gate's own floor (fabric.minBandwidthGbps, as the guard serves it); alerts.ttftSeconds (p95 over 5m).
"""

from __future__ import annotations

from typing import Any, Optional

from .clusterplan import ClusterPlan, StackPlan
from .monitoring import serves_metrics

GIB = 1 << 30
DOWN_FOR = "30s"  # a group, rank or rail down this long: scrape, evaluation and Alertmanager still fit in a minute
BAD_STATES = ("unhealthy", "waiting", "healing", "backoff", "exhausted", "blocked")  # programs/guard/decide.STATES
GATEWAY_ERROR_RATIO = 0.05  # failed requests among those that reached the model, over 5 minutes


def command(cp: ClusterPlan, sp: Optional[StackPlan], verb: str, *more: str) -> str:
    """`python -m dspark <verb> --stack S [--group G] ...`: the operator command that shows more."""
    group = f" --group {sp.name}" if sp is not None and sp.name else ""
    return " ".join((f"python -m dspark {verb} --stack {cp.stack}{group}", *more)).strip()


def rank_of(sp: StackPlan, label: str) -> str:
    """A template that prints the rank of the node named by `$labels.<label>` (the group's nodes are known here)."""
    chain = "".join(f'{{{{ {"if" if i == 0 else "else if"} eq $labels.{label} "{n.name}" }}}}{n.rank}'
                    for i, n in enumerate(sp.nodes))  # fmt: skip
    return chain + "{{ else }}?{{ end }}"


def _rule(name: str, expr: str, for_: str, labels: dict[str, str], summary: str, description: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = dict(labels)
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def group_rules(cp: ClusterPlan, sp: StackPlan) -> list[dict[str, Any]]:
    """The rules of one serving group."""
    s, g, head = cp.stack, sp.name or cp.stack, sp.nodes[0]
    where = f"{s}/{g}"
    engine = f'stack="{s}",group="{g}"'
    nodes = "|".join(n.name for n in sp.nodes)
    at_head = {"severity": "critical", "stack": s, "group": g, "node": head.name, "rank": "0"}
    rules: list[dict[str, Any]] = []

    down = []
    if serves_metrics(sp):
        down.append(f'(max(up{{{engine},role="engine"}}) == 0)')
    guard = f'stack="{s}",group="{sp.guard.group}"' if sp.guard else ""
    if sp.guard:
        down += [f"(min(dspark_guard_rank_up{{{guard}}}) == 0)",
                 f'(max(dspark_guard_group_state{{{guard},state=~"{"|".join(BAD_STATES)}"}}) == 1)']  # fmt: skip
    if down:
        rules.append(_rule(
            "DsparkGroupDown", " or ".join(down), DOWN_FOR, at_head,
            f"{where} does not serve (head {head.name}, rank 0); run `{command(cp, sp, 'status')}`",
            f"Rank 0's API on {head.name} ({sp.endpoint}) does not answer /metrics, a rank's container is not running, "
            f"or the group's guard reports it unhealthy or healing, for {DOWN_FOR}. "
            + (f"Self-healing restarts the whole group unless paused: `{command(cp, sp, 'guard status')}`."
               if sp.guard else f"Self-healing is off: `{command(cp, sp, 'restart', '--yes')}` starts it over."),
        ))  # fmt: skip
    if sp.guard:
        attempts = sp.guard.settings["max_attempts"]
        rules += [
            _rule("DsparkRankDown", f"dspark_guard_rank_up{{{guard}}} == 0", DOWN_FOR,
                  {"severity": "critical", "stack": s, "group": g},
                  f"{where}: rank {{{{ $labels.rank }}}} on {{{{ $labels.node }}}} is not running; run "
                  f"`{command(cp, sp, 'logs', '--rank {{ $labels.rank }}')}`",
                  f"The guard sees rank {{{{ $labels.rank }}}}'s container on {{{{ $labels.node }}}} not running "
                  f"(exited, OOM-killed, or its node is down) for {DOWN_FOR}; a tensor-parallel group serves only with "
                  f"every rank. `{command(cp, sp, 'status')}` shows every rank and its last error line."),
            _rule("DsparkHealAttemptsExhausted", f"max(dspark_guard_exhausted{{{guard}}}) == 1", "", at_head,
                  f"{where}: the guard gave up after {attempts} heals (leader on {head.name}, rank 0); run "
                  f"`{command(cp, sp, 'guard status')}`",
                  f"The group stays down with the reason the guard gives. After fixing the cause: "
                  f"`{command(cp, sp, 'guard resume')}` (tries again from zero) or "
                  f"`{command(cp, sp, 'restart', '--yes')}`."),
            _rule("DsparkRailDown", f"dspark_node_rail_up{{{guard}}} == 0", DOWN_FOR,
                  {"severity": "critical", "stack": s, "group": g},
                  f"{where}: rail {{{{ $labels.rail }}}} ({{{{ $labels.hca }}}}) of {{{{ $labels.node }}}} (rank "
                  f"{rank_of(sp, 'node')}) is down; run `{command(cp, sp, 'doctor')}`",
                  f"A ConnectX-7 twin rail of {{{{ $labels.node }}}} lost its link for {DOWN_FOR}: NCCL runs on what "
                  "is left at half the bandwidth, and the next start gate refuses the group. Check the cable and "
                  "the port (`ethtool`, `ibdev2netdev` on the node)."),
            _rule("DsparkFabricPairSlow",
                  f"min by (a, b) (dspark_fabric_pair_gbps{{{guard}}}) < on () group_left () "
                  f"max(dspark_fabric_floor_gbps{{{guard}}})", "",
                  {"severity": "warning", "stack": s, "group": g},
                  f"{where}: {{{{ $labels.a }}}} (rank {rank_of(sp, 'a')}) to {{{{ $labels.b }}}} measured "
                  f"{{{{ $value | printf \"%.1f\" }}}} Gb/s at the last bandwidth gate, below its floor; run "
                  f"`{command(cp, sp, 'doctor')}`",
                  "The fabric gate measured this node pair (all rails, ib_write_bw) below fabric.minBandwidthGbps "
                  "when the group last started: decode is bound by that pair's all-reduces."),
        ]
    if sp.engine == "sglang" and serves_metrics(sp) and sp.alerts:
        a = sp.alerts
        floor = int(a.kv_tokens * a.min_kv_share)
        rules.append(_rule(
            "DsparkKvPoolBelowPlan", f"max(sglang:max_total_num_tokens{{{engine}}}) < {floor}", "1m",
            {**at_head, "severity": "warning"},
            f"{where}: rank 0 on {head.name} holds a KV pool of {{{{ $value | printf \"%.0f\" }}}} tokens, below "
            f"{a.min_kv_share:g} of the plan's {a.kv_tokens}; run `{command(cp, sp, 'status')}`",
            f"SGLang sized its KV pool from the memory it found at its last start (after a heal, say): less than "
            f"readiness.minKvShare ({a.min_kv_share:g}) of the {a.kv_tokens} tokens the plan expects means memory was "
            f"held on a node (page cache, another process). `{command(cp, sp, 'doctor')}` shows each node's memory.",
        ))  # fmt: skip
    if sp.alerts:
        floor_b = int(sp.alerts.memory_floor_gib * GIB)
        rules.append(_rule(
            "DsparkNodeMemoryLow", f'node_memory_MemAvailable_bytes{{stack="{s}",node=~"{nodes}"}} < {floor_b}', "2m",
            {"severity": "warning", "stack": s, "group": g},
            f"{where}: {{{{ $labels.node }}}} (rank {rank_of(sp, 'node')}) has {{{{ $value | humanize1024 }}}}B "
            f"available, below the plan's {sp.alerts.memory_floor_gib:g} GiB; run `{command(cp, sp, 'doctor')}`",
            f"MemAvailable under memory.runtimeFloorGiB ({sp.alerts.memory_floor_gib:g} GiB) for 2m: unified memory is "
            "the GPU's, so the next allocation of a rank or the OS can OOM a rank (a head OOM hangs every rank). Page "
            f'cache: {{{{ with printf "node_memory_Cached_bytes{{node=%q}}" $labels.node | query }}}}'
            "{{ . | first | value | humanize1024 }}B{{ else }}unknown{{ end }}.",
        ))  # fmt: skip
    if serves_metrics(sp) and sp.alerts:
        prefix = "sglang" if sp.engine == "sglang" else "vllm"
        t = sp.alerts.ttft_seconds
        rules.append(_rule(
            "DsparkTimeToFirstTokenHigh",
            f"histogram_quantile(0.95, sum by (le) (rate({prefix}:time_to_first_token_seconds_bucket{{{engine}}}[5m])))"
            f" > {t:g}", "10m", {**at_head, "severity": "warning"},
            f"{where}: p95 time to first token {{{{ $value | printf \"%.1f\" }}}} s on rank 0 ({head.name}), above "
            f"the {t:g} s target; run `{command(cp, sp, 'smoke')}`",
            f"Over the last 5 minutes, for 10 minutes, 95% of requests waited up to this long for their first token "
            f"(alerts.ttftSeconds: {t:g} s): long prompts, a full batch, or a queue. `{command(cp, sp, 'status')}` "
            "shows the group; the dashboard shows running and queued requests.",
        ))  # fmt: skip
    return rules


def stack_rules(cp: ClusterPlan) -> list[dict[str, Any]]:
    """The rules of what the stack has once: its team gateway, and every exporter's target."""
    s = cp.stack
    rules = [_rule(
        "DsparkMetricsTargetDown", f'up{{stack="{s}",role!="engine"}} == 0', "5m",
        {"severity": "warning", "stack": s},
        f"{s}: the {{{{ $labels.role }}}} exporter at {{{{ $labels.instance }}}} does not answer; run "
        f"`python -m dspark status --stack {s}`",
        "Prometheus cannot scrape it for 5m: what it reports (the router's rotation, a guard's heals, a node's memory, "
        "the gateway's members) is blind. A guard that does not answer heals nothing.",
    )]  # fmt: skip
    gp = cp.gateway
    if gp is not None:
        sp = next(g for g in cp.groups if any(n.name == gp.node.name for n in g.nodes))
        g = sp.name or s
        at = {"severity": "warning", "stack": s, "group": g, "node": gp.node.name, "rank": str(gp.node.rank)}
        req = f'dspark_gateway_requests_total{{stack="{s}"'
        rules += [
            _rule("DsparkGatewayErrors",
                  f'sum(rate({req},status="failure"}}[5m])) / sum(rate({req}}}[5m])) > {GATEWAY_ERROR_RATIO:g}',
                  "5m", at,
                  f"{s}: {{{{ $value | humanizePercentage }}}} of the gateway's requests fail (on {gp.node.name}, "
                  f"group {g} rank {gp.node.rank}); run `python -m dspark status --stack {s}`",
                  f"More than {GATEWAY_ERROR_RATIO:.0%} of the requests that reached the model over 5 minutes failed "
                  "(the gateway answered an error): the upstream group or router is down or refusing. `dspark status` "
                  "shows each member's failures."),
            _rule("DsparkMemberBudgetUsed",
                  f'dspark_gateway_budget_used_tokens{{stack="{s}"}} >= dspark_gateway_budget_tokens{{stack="{s}"}}',
                  "", {"severity": "warning", "stack": s, "group": g},
                  f"{s}: {{{{ $labels.member }}}} used their token budget for this {{{{ $labels.period }}}} "
                  f"({{{{ $value | printf \"%.0f\" }}}} tokens); run `python -m dspark status --stack {s}`",
                  "The gateway answers 429 to this member until the budget renews (cluster.gateway.members[].tokenBudget "
                  "and budgetPeriod, UTC)."),
        ]  # fmt: skip
    return rules


def rule_groups(cp: ClusterPlan) -> dict[str, Any]:
    """The `alert_rules` output: a Prometheus rules file's content, one rule group per stack."""
    rules = [r for sp in cp.groups for r in group_rules(cp, sp)] + stack_rules(cp)
    return {"groups": [{"name": f"deepseek-spark-{cp.stack}", "rules": rules}]}


def render(rules: dict[str, Any], stack: str = "") -> str:
    """The rules as a file for Prometheus's `rule_files:` (YAML)."""
    import yaml

    title = f" {stack}" if stack else ""
    return (f"# deepseek-spark{title}: alert rules; list this file under `rule_files:` of prometheus.yml.\n"
            + yaml.safe_dump(rules, sort_keys=False, width=1000, allow_unicode=True))  # fmt: skip
