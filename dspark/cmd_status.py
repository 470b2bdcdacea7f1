"""`status`: every rank's container, its group revision, its last error line, its node's GPU memory,
rank 0's health and (while it is not healthy) its boot phase, the team gateway's containers, readiness
and members (key state, usage), the self-healing guard (its state, the heal in progress, the last heals);
one verdict.

Verdict and exit code:
  0 healthy   every rank running with the stack's group revision, and rank 0's /health is 200
  1 degraded  rank 0 answers 200 and every rank that could be asked runs, but something is off:
              a rank with another group revision, a node ssh cannot reach, outputs unavailable
  2 down      rank 0's /health is not 200, or a rank is not running (stopped, missing), or the team
              gateway (the stack's endpoint, when it has one) is not running or not ready

JSON shape (`--json`; with `--watch`, one such object per line and round):

    {
      "stack": "tp3", "engine": "sglang", "time": "2025-01-01T00:00:00Z",
      "endpoint": "http://10.0.0.1:8888/v1",
      "revision": {"expected": "0123456789abcdef", "source": "outputs" | "config",
                   "planned": "0123456789abcdef"},        # what Pulumi.<stack>.yaml plans now
      "ranks": [
        {"rank": 0, "role": "head", "node": "spark1", "host": "10.0.0.1", "container": "tp3-rank0",
         "state": "running" | "exited" | "created" | ... | "missing" | "unreachable" | "error",
         "exit_code": 0, "oom_killed": false, "started_at": "2025-01-01T00:00:00Z", "finished_at": null,
         "error": null,                                   # docker's or ssh's message, if any
         "revision": "0123456789abcdef", "revision_ok": true | false | null,
         "last_error": null | "RuntimeError: ...",        # last error-like line of the log, key redacted
         "log_withheld": false,                           # true when the key is unknown (nothing to redact with)
         "gpu_memory_used_mib": 81234 | null, "gpu_memory_source": "memory.used" | "compute-apps" | null}
      ],
      "health": {"url": "http://10.0.0.1:8888/health", "status": 200 | null, "error": null | "..."},
      "boot_phase": null | {"phase": "loading weights", "line": "..." | null},   # rank 0, when not healthy
      "boot": null | {"kvTokens": 750000 | null, "expectedKvTokens": 750000, "speculative": "DSPARK" | "off" | null,
                      "contextLength": 262144 | null, "shortfall": null | "...", ...},  # the `boot` output
      "gateway": null | {"node": "spark1", "endpoint": "http://10.0.0.1:4000/v1",
                  "containers": {"sim-team-gateway": "running", "sim-team-gateway-db": "running"},
                  "readiness": {"url": ".../health/readiness", "status": 200 | null, "error": null | "..."},
                  "members": {"alice": {"key": "active" | "revoked" | "not registered" | "admin key", "requests": 12,
                                        "failures": 0, "prompt_tokens": 340, "completion_tokens": 96}} | null,
                  "members_error": null | "..."},                 # the gateway's database, read on its node
      "guard": null | {"state": "serving" | "healing" | "backoff" | "waiting" | "exhausted" | "paused" | ... |
                       "not looking", "reason": "...", "leader": "spark1", "containers": {"spark1": "running"},
                       "heartbeat_age_s": 2.1, "attempts": 0, "max_attempts": 3, "healing": null | {...},
                       "heals": [{"fault": "rank-exited", "fault_at": 1.7e9, "detected_at": ..., "restarted_at": ...,
                                  "serving_at": ..., "seconds_to_serve": 6.9, "result": "served", ...}],
                       "error": null | "..."},               # serving.selfHeal's guard (null when off)
      "verdict": "healthy" | "degraded" | "down", "exit_code": 0 | 1 | 2,
      "problems": ["..."], "fixes": ["..."], "notes": ["..."]
    }
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, TextIO

from declared.stack import RESERVED_MEMBERS
from planning import gateway as gateway_plan
from planning import plan
from programs import probe

from . import api, cmd_guard
from .nodes import GPU_MEMORY, Container, Node, Nodes, inspect_cmd, logs_cmd, parse_gpu, parse_inspect, redact
from .render import cell, short, table, to_json
from .stack import Stack

LOG_SCAN_LINES = 300

ERROR_LINE = re.compile(
    r"\b(error|exception|traceback|fatal|failed|failure|out of memory|oom|killed|abort(?:ed)?|segmentation fault)\b",
    re.I,
)
SERVING = probe.BOOT_PHASES[-1][0]  # the last phase: the engine says it serves
NOT_RUNNING = {"created", "paused", "restarting", "removing", "exited", "dead", "missing"}


def boot_phase(lines: list[str]) -> Optional[tuple[str, str]]:
    """(phase, the log line that shows it) of rank 0's boot: the phase the readiness probe names
    (`programs.probe.BOOT_PHASES`, one source of truth), or None when no line shows one."""
    name = probe.boot_phase("\n".join(lines))
    if name is None:
        return None
    pattern = re.compile(dict(probe.BOOT_PHASES)[name])
    line = next((line for line in reversed(lines) if pattern.search(line)), "")
    return name, line


def last_error_line(lines: list[str]) -> Optional[str]:
    for line in reversed(lines):
        if ERROR_LINE.search(line):
            return line.strip()
    return None


@dataclass
class RankStatus:
    node: Node
    container: Container
    revision: Optional[str] = None
    revision_ok: Optional[bool] = None
    last_error: Optional[str] = None
    log_withheld: bool = False
    log_lines: list[str] = field(default_factory=list)
    gpu_mib: Optional[int] = None
    gpu_source: Optional[str] = None

    def to_json(self) -> dict:
        c = self.container
        return {
            "rank": self.node.rank, "role": self.node.role, "node": self.node.name, "host": self.node.host,
            "container": self.node.container, "state": c.state, "exit_code": c.exit_code, "oom_killed": c.oom_killed,
            "started_at": c.started_at, "finished_at": c.finished_at, "error": c.error,
            "revision": self.revision, "revision_ok": self.revision_ok, "last_error": self.last_error,
            "log_withheld": self.log_withheld, "gpu_memory_used_mib": self.gpu_mib,
            "gpu_memory_source": self.gpu_source,
        }  # fmt: skip


def rank_status(nodes: Nodes, node: Node, expected: str, key: Optional[str]) -> RankStatus:
    container = parse_inspect(*nodes.run(node, inspect_cmd(node.container)))
    st = RankStatus(node, container)
    if container.exists:
        st.revision = container.labels.get(plan.REVISION_LABEL)
        st.revision_ok = st.revision == expected
        code, out = nodes.run(node, logs_cmd(node.container, tail=str(LOG_SCAN_LINES)))
        if code == 0:
            if key:
                st.log_lines = redact(out, key).splitlines()
                st.last_error = short(last_error_line(st.log_lines), 200)
            else:  # cannot redact what we do not know: keep the lines for phase names only
                st.log_lines = out.splitlines()
                st.log_withheld = True
    if container.state != "unreachable":
        st.gpu_mib, st.gpu_source = parse_gpu(*nodes.run(node, GPU_MEMORY))
    return st


def collect(stack: Stack, nodes: Nodes, http_status: Optional[Callable] = None, now: Optional[Callable] = None) -> dict:
    cfg = stack.cfg
    outputs, outputs_error = stack.try_outputs()
    key = stack.api_key()
    expected, source = stack.expected_revision()
    planned = stack.planned_revision()
    ranks = nodes.each(lambda n: rank_status(nodes, n, expected, key))
    endpoint = stack.endpoint()
    url = probe.health_url(endpoint)
    # a group behind the stack's router or gateway: its API is an inner port, reached through ssh to its head
    status, error = (http_status or api.group_status(nodes, stack.fronted))(url, 5.0)
    doc: dict = {
        "stack": stack.short,
        "engine": cfg.engine,
        "time": (now or (lambda: dt.datetime.now(dt.timezone.utc)))().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "endpoint": endpoint,
        "revision": {"expected": expected, "source": source, "planned": planned},
        "ranks": [r.to_json() for r in ranks],
        "health": {"url": url, "status": status, "error": error},
        "boot_phase": None,
        # what rank 0 reported it obtained at the last `up` (the `boot` output), None before one
        "boot": ((outputs or {}).get("boot") or {}).get(stack.group or stack.short),
    }
    head = ranks[0]
    if status != 200 and head.log_lines:
        found = boot_phase(head.log_lines)
        if found:
            doc["boot_phase"] = {"phase": found[0], "line": None if head.log_withheld else short(found[1], 200)}
    notes = []
    if outputs is None:
        notes.append(f"{outputs_error}; compared with the revision Pulumi.{stack.short}.yaml plans instead")
    elif source == "config":
        notes.append("the stack outputs have no group_revision (no successful `up` yet?); compared with the "
                     f"revision Pulumi.{stack.short}.yaml plans instead")  # fmt: skip
    if source == "outputs" and planned != expected:
        notes.append(f"Pulumi.{stack.short}.yaml plans group revision {planned}, the stack runs {expected}: "
                     f"`pulumi preview --diff --stack {stack.name}` shows the pending replacement of the group")  # fmt: skip
    if not key:
        notes.append("log lines withheld: the API key (to redact them) is not in the stack outputs")
    doc["gateway"] = gateway_status(stack, nodes, http_status or api.get_status)
    doc.update(verdict_of(stack, ranks, status, error, doc["boot_phase"]))
    if doc["gateway"]:
        _gateway_verdict(stack, doc)
    doc["notes"] = notes
    doc["guard"] = cmd_guard.collect(stack, nodes)
    if doc["guard"]:
        _guard_verdict(stack, doc)
    return doc


ACTIVE = ("healing", "backoff", "waiting", "unhealthy")  # the guard is bringing the group back by itself


def _guard_verdict(stack: Stack, doc: dict) -> None:
    """What the guard does changes what to do: while it heals, refresh + up would fight it; once it gave up, a
    person must act; without it, nothing heals."""
    g, name = doc["guard"], stack.name + (f" --group {stack.group}" if stack.group else "")
    stopped = [n for n, st in g["containers"].items() if st != "running"]
    if stopped:
        where = ", ".join(f"{g['containers'][n]} on {n}" for n in stopped)
        doc["problems"].append(f"the guard is {where}: the group does not heal itself")
        doc["fixes"].append(f"`pulumi up --refresh --stack {stack.name}` starts the guard again")
    state = g["state"]
    if doc["verdict"] == "down" and state in ACTIVE and not stopped:
        doc["fixes"] = [f"the guard is bringing the group back by itself ({state}: {g['reason']}); watch it with "
                        f"`python -m dspark status --stack {name} --watch 10`, or stop it first with "
                        f"`python -m dspark guard pause --stack {name}`"]  # fmt: skip
    elif state == "exhausted":
        doc["problems"].append(f"the guard gave up: {g['reason']}")
        doc["fixes"].insert(0, f"fix the cause, then `python -m dspark guard resume --stack {name}` (the guard tries "
                               f"again) or `python -m dspark restart --stack {name} --yes`")  # fmt: skip
    elif state == "paused":
        doc["notes"].append(f"the guard is {g['reason']}: `python -m dspark guard resume --stack {name}`")
    elif state in ("not looking", "blocked", None):
        doc["problems"].append(f"the guard on {g['leader']} is not healing the group: {g['reason']}")
    if (stopped or state in ("not looking", "blocked", None)) and doc["exit_code"] == 0:
        doc["verdict"], doc["exit_code"] = "degraded", 1
    doc["fixes"] = list(dict.fromkeys(doc["fixes"]))


def gateway_status(stack: Stack, nodes: Nodes, http_status: Callable) -> Optional[dict]:
    """The team gateway (when the stack has one): its two containers, LiteLLM's readiness, and each member's
    key state and usage from its database (gateway_admin.py on its node); None without a gateway."""
    gp = stack.gateway_plan()
    if gp is None:
        return None
    n = gp.node
    node = Node(n.rank, n.name, n.host, n.ssh_user, n.ssh_port, gp.gateway.name)
    names = (gp.gateway.name, gp.database.name)
    states = {c: parse_inspect(*nodes.run(node, inspect_cmd(c))).state for c in names}
    out = stack.output("gateway")
    endpoint = (out.get("endpoint") if isinstance(out, dict) else None) or gp.endpoint  # outputs, else the plan
    url = probe.health_url(endpoint, gateway_plan.HEALTH_PATH)
    ready, ready_error = http_status(url, 5.0)
    members, members_error = None, None
    if states[gp.gateway.name] == "running":
        replies = [nodes.run(node, gateway_plan.admin_query(gp.gateway.name, what)) for what in ("keys", "usage")]
        try:
            if any(code != 0 for code, _ in replies):
                raise ValueError(short(next(out for code, out in replies if code != 0).strip(), 200))
            keys, usage = (json.loads(out.strip().splitlines()[-1]) for _, out in replies)
        except (ValueError, IndexError) as exc:
            members_error = f"the gateway's database did not answer: {exc}"
        else:
            zero = {"requests": 0, "failures": 0, "prompt_tokens": 0, "completion_tokens": 0}
            # usage rows of the admin's key (readiness, operators) are listed under `admin`
            members = {m: {"key": keys.get(m, f"{m} key" if m in RESERVED_MEMBERS else "not registered"),
                           **zero, **usage.get(m, {})}
                       for m in sorted({*(m.name for m in gp.members), *keys, *usage})}  # fmt: skip
    return {"node": n.name, "endpoint": endpoint, "containers": states,
            "readiness": {"url": url, "status": ready, "error": ready_error},
            "members": members, "members_error": members_error}  # fmt: skip


def _gateway_verdict(stack: Stack, doc: dict) -> None:
    """The gateway is the stack's endpoint: not running or not ready, clients are down whatever the ranks do."""
    gw = doc["gateway"]
    stopped = [c for c, st in gw["containers"].items() if st in NOT_RUNNING]
    unknown = [c for c, st in gw["containers"].items() if st not in NOT_RUNNING and st != "running"]
    for c in stopped + unknown:
        doc["problems"].append(f"gateway container {c} on {gw['node']} is {gw['containers'][c]}")
    r = gw["readiness"]
    if r["status"] != 200:
        doc["problems"].append(f"gateway readiness {r['url']}: {r['status'] if r['status'] is not None else r['error']}")
    if gw["members_error"]:
        doc["problems"].append(gw["members_error"])
    if stopped:
        doc["fixes"].append(f"run `pulumi up --refresh --stack {stack.name}`: refresh records the stopped or missing "
                            "gateway container, up starts it again; keys and usage are on its database volume")  # fmt: skip
    elif r["status"] != 200 and not unknown:
        doc["fixes"].append(f"the gateway runs but is not ready: `docker logs --tail 50 {next(iter(gw['containers']))}` "
                            f"on {gw['node']}")  # fmt: skip
    if unknown:
        doc["fixes"].append("check ssh to the gateway's node with the stack's ssh options (ssh.identityFile, "
                            "ssh.knownHostsFile)")  # fmt: skip
    if stopped or r["status"] != 200:
        doc["verdict"], doc["exit_code"] = "down", 2
    elif (unknown or gw["members_error"]) and doc["exit_code"] == 0:
        doc["verdict"], doc["exit_code"] = "degraded", 1
    doc["fixes"] = list(dict.fromkeys(doc["fixes"]))


def verdict_of(stack: Stack, ranks: list[RankStatus], status: Optional[int], error: Optional[str],
               phase: Optional[dict]) -> dict:  # fmt: skip
    name = stack.name
    problems, fixes = [], []
    stopped = [r for r in ranks if r.container.state in NOT_RUNNING]
    unknown = [r for r in ranks if not r.container.known]
    mismatched = [r for r in ranks if r.revision_ok is False and r.revision is not None]
    unlabeled = [r for r in ranks if r.container.exists and r.revision is None]
    for r in stopped:
        c = r.container
        if c.state == "missing":
            problems.append(f"rank {r.node.rank} ({r.node.container} on {r.node.name}) does not exist")
        else:
            extra = f", exit code {c.exit_code}" if c.exit_code is not None else ""
            extra += ", OOM killed" if c.oom_killed else ""
            extra += f", finished {c.finished_at}" if c.finished_at else ""
            problems.append(f"rank {r.node.rank} ({r.node.container} on {r.node.name}) is {c.state}{extra}")
    if any(r.container.state == "created" for r in stopped):
        group = f" --group {stack.group}" if stack.group else ""
        fixes.append(f"a rank left `created` never started (`docker start` it on its node to see why) and a plain `up` "
                     f"does not start it; once the cause is fixed: `python -m dspark restart --stack {name}{group} --yes` "
                     "starts the whole group over")  # fmt: skip
    elif stopped:
        fixes.append(f"run `pulumi up --refresh --stack {name}`: refresh records the stopped or removed rank(s), "
                     "up restarts the whole group (workers first, the head last); a tensor-parallel group "
                     "cannot take one rank back")  # fmt: skip
    for r in unknown:
        problems.append(f"rank {r.node.rank} on {r.node.name}: {r.container.state} ({r.container.error})")
    if any(r.container.state == "unreachable" for r in unknown):
        fixes.append("check ssh to the unreachable node(s) with the stack's ssh options "
                     "(ssh.identityFile, ssh.knownHostsFile)")  # fmt: skip
    for r in mismatched:
        problems.append(f"rank {r.node.rank} ({r.node.container}) runs group revision {r.revision}, "
                        f"the stack's is {stack.expected_revision()[0]}")  # fmt: skip
    for r in unlabeled:
        problems.append(f"rank {r.node.rank} ({r.node.container}) has no {plan.REVISION_LABEL} label: "
                        "not started by this program")  # fmt: skip
    if mismatched or unlabeled:
        fixes.append(f"run `pulumi up --refresh --stack {name}`: refresh reads the containers' labels, up "
                     "replaces the whole group with the stack's revision")  # fmt: skip
    if status != 200:
        problems.append(f"rank 0 /health: {status if status is not None else error}")
        running = not stopped and not unknown
        if running and phase and phase["phase"] != SERVING:
            fixes.append(f"rank 0 is booting ({phase['phase']}); a cold boot takes 12-13 minutes: "
                         f"`python -m dspark status --stack {name} --watch 30`")  # fmt: skip
        elif running:
            fixes.append(f"see `python -m dspark logs --stack {name} --rank 0`; if the group hangs, restart it: "
                         f"bump serving.generation in Pulumi.{stack.short}.yaml and run `pulumi up --stack {name}`")  # fmt: skip
    if status != 200 or stopped:
        verdict, code = "down", 2
    elif unknown or mismatched or unlabeled:
        verdict, code = "degraded", 1
    else:
        verdict, code = "healthy", 0
    return {"verdict": verdict, "exit_code": code, "problems": problems, "fixes": list(dict.fromkeys(fixes))}


def boot_text(boot: dict) -> str:
    """`KV pool 750,000 tokens (plan 750,000, 100%), speculative DSPARK, context 262,144`; `?` where unknown."""
    def num(v):
        return f"{v:,}" if isinstance(v, int) else "?"

    got, want = boot.get("kvTokens"), boot.get("expectedKvTokens")
    share = f", {got / want:.0%}" if isinstance(got, int) and want else ""
    parts = [f"KV pool {num(got)} tokens (plan {num(want)}{share})"]
    if "speculative" in boot:
        parts.append(f"speculative {boot.get('speculative') or '?'}")
    parts.append(f"context {num(boot.get('contextLength'))}")
    if boot.get("maxConcurrency") is not None:
        parts.append(f"max concurrency {boot['maxConcurrency']:.2f}x")
    text = ", ".join(parts)
    return text + (f"  SHORT: {boot['shortfall']}" if boot.get("shortfall") else "")


def render_text(doc: dict) -> str:
    rev = doc["revision"]
    lines = [
        f"stack {doc['stack']} ({doc['engine']}, {len(doc['ranks'])} ranks) at {doc['time']}",
        f"endpoint {doc['endpoint']}  group revision {rev['expected']} (from {'stack outputs' if rev['source'] == 'outputs' else 'the config'})",
        "",
    ]  # fmt: skip
    rows = []
    for r in doc["ranks"]:
        if r["revision_ok"] is True:
            revision = "ok"
        elif r["revision_ok"] is False:
            revision = f"OTHER {r['revision'] or '(none)'}"
        else:
            revision = "?"
        exit_code = r["exit_code"] if r["state"] not in ("running", "missing", "unreachable", "error") else None
        rows.append([
            r["rank"], r["node"], r["container"], r["state"], exit_code, r["started_at"], r["finished_at"], revision,
            r["gpu_memory_used_mib"] if r["gpu_memory_used_mib"] is not None else "?",
            "(withheld)" if r["log_withheld"] else short(r["last_error"], 80),
        ])  # fmt: skip
    lines.append(table(["RANK", "NODE", "CONTAINER", "STATE", "EXIT", "STARTED", "FINISHED", "REVISION", "GPU MiB",
                        "LAST ERROR LINE"], rows))  # fmt: skip
    h = doc["health"]
    lines.append(f"\nhealth {h['url']} -> {h['status'] if h['status'] is not None else 'no answer: ' + cell(h['error'])}")
    if doc.get("boot"):
        lines.append("boot (rank 0, last up): " + boot_text(doc["boot"]))
    if doc["boot_phase"]:
        bp = doc["boot_phase"]
        lines.append(f"boot phase (rank 0): {bp['phase']}" + (f'  "{bp["line"]}"' if bp["line"] else ""))
    if doc.get("gateway"):
        lines += gateway_text(doc["gateway"])
    if doc.get("guard"):
        lines += ["", *cmd_guard.render_lines(doc["guard"])]
    lines.append(f"verdict: {doc['verdict'].upper()} (exit {doc['exit_code']})")
    lines += [f"  - {p}" for p in doc["problems"]]
    lines += [f"fix: {f}" for f in doc["fixes"]]
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"


def gateway_text(gw: dict) -> list[str]:
    r = gw["readiness"]
    states = ", ".join(f"{c} {st}" for c, st in gw["containers"].items())
    lines = [f"\ngateway {gw['endpoint']} on {gw['node']}: {states}; readiness "
             f"{r['status'] if r['status'] is not None else 'no answer: ' + cell(r['error'])}"]
    if gw["members"] is not None:
        rows = [[m, u["key"], u["requests"], u["failures"], u["prompt_tokens"], u["completion_tokens"]]
                for m, u in gw["members"].items()]  # fmt: skip
        lines.append(table(["MEMBER", "KEY", "REQUESTS", "FAILURES", "PROMPT TOKENS", "COMPLETION TOKENS"], rows))
    return lines


def run(stack: Stack, nodes: Nodes, as_json: bool, out: TextIO, watch: Optional[float] = None,
        count: Optional[int] = None, sleep: Optional[Callable[[float], None]] = None,
        http_status: Optional[Callable] = None) -> int:  # fmt: skip
    sleep = sleep or time.sleep
    key = stack.api_key()
    rounds = 0
    code = 2
    try:
        while True:
            doc = collect(stack, nodes, http_status)
            code = doc["exit_code"]
            if as_json:
                text = json.dumps(doc, default=str) if watch else to_json(doc)
            else:
                text = render_text(doc)
            if watch and not as_json and rounds:
                out.write("\n")
            out.write(redact(text, key) + ("\n" if as_json else ""))
            out.flush()
            rounds += 1
            if not watch or (count is not None and rounds >= count):
                return code
            sleep(watch)
    except KeyboardInterrupt:
        return code
