"""`plan`: what every node runs, from the config alone (no Pulumi, no node, no secret).

JSON shape (`--json`):

    {
      "stack": "tp3", "engine": "sglang", "topology": "direct", "tp_size": 3,
      "config": {...},                       # the validated cluster config (camelCase, defaults filled)
      "validation": {"errors": [{"rule", "field", "value", "problem", "fix"}], "warnings": [...]},
      "endpoint": "http://10.0.0.1:8888/v1", "model": "deepseek-v4.1-flash",
      "image": {"name": "lmsysorg/sglang:dev-dsv41",
                "build": null | {"context", "dockerfile", "args", "platform", "digest"}},
      "group_revision": "0123456789abcdef",  # label deepseek-spark.group-revision on every rank
      "memory_plan": {...},                  # memoryplan.memory_plan(cfg).to_output() (the `memory_plan` output)
      "memory_budget": [{"node", "unifiedMiB", "reserveMiB", "budgetMiB", "limitsMiB", "freeMiB", "headroomMiB",
                         "containers": [{"container", "role", "limitMiB", "needMiB"}]}],   # per node, budget.py
      "fabric": {"bootstrap": "fabric", "links": [{"a", "b", "a_ip", "b_ip", "subnet"}],
                 "checkpoint": [{"rank", "node", "how", "via", "read_gbps", "minutes"}],   # boot read model
                 "gate": null | {"floorGbps", "command"}, "summary": "..."},
      "nodes": [
        {"rank": 0, "role": "head", "name": "spark1", "host": "10.0.0.1", "fabric_ip": "10.0.0.1",
         "ssh": {"user": "zurih", "port": 22, "target": "zurih@10.0.0.1"},
         "preflight": {"checks": ["docker", "gpu", ...], "script": "..."},
         "checkpoint_volume": {"name": "tp3-checkpoint", "driver_opts": {"type": "none", "o": "bind", "device": "..."}},
         "engram": null | {"dir": "/home/zurih/dsv41-engram", "files": ["engram-l1-r0of3.bin", ...]},
         "container": {"name": "tp3-rank0", "image": "...", "entrypoint": [...], "args": [...],
                       "env": {...}, "mounts": [{"target", "source", "type", "read_only"}],
                       "labels": {"deepseek-spark.group-revision": "...", ...}, "restart": "no",
                       "network_mode": "host", "ipc_mode": "host", "gpus": "all", "devices": [...],
                       "ulimits": {"memlock": [-1, -1], ...}, "generation": 0},
         "memory": {"role": "head", "staticPoolGiB", ..., "headroomGiB"}}   # this rank's memory_plan entry
      ]
    }

Exit code 0, or 1 when the config breaks a validation rule (as `pulumi preview` would refuse it).
"""

from __future__ import annotations

import shlex
from dataclasses import asdict
from typing import Any, TextIO

from planning import fabric, plan, rulebook, rules

from .nodes import preflight_checks
from .render import table, to_json
from .stack import Stack


def _finding(f: rulebook.Finding) -> dict:
    return {"rule": f.rule, "field": f.field, "value": f.value, "problem": f.problem, "fix": f.fix}


def build(stack: Stack) -> dict[str, Any]:
    cfg, name = stack.cfg, stack.plan_name
    # the whole stack's rules, as preview runs them (a node's memory budget counts the router and the gateway)
    errors, warnings = rules.check_stack(stack.config, stack.short) if stack.config else rules.check(cfg, name)
    doc: dict[str, Any] = {
        "stack": name,
        "engine": cfg.engine,
        "topology": cfg.topology,
        "tp_size": cfg.serving.tp_size,
        "config": cfg.model_dump(mode="json", by_alias=True),
        "validation": {"errors": [_finding(f) for f in errors], "warnings": [_finding(f) for f in warnings]},
        "endpoint": plan.endpoint(cfg),
        "model": cfg.model.served_name,
    }
    if errors:  # like preview: nothing is planned from a config that breaks a rule
        doc.update(image={"name": cfg.image, "build": None}, group_revision=None, memory_plan=None, nodes=[],
                   memory_budget=[])
        return doc
    sp = stack.group_plan()  # the same object the program builds its resources from
    b = sp.image.build
    doc["image"] = {
        "name": sp.image.name,
        "build": None if b is None else {
            "context": b.context, "dockerfile": b.dockerfile, "args": dict(b.args), "platform": b.platform,
            "digest": plan.image_build_digest(cfg),
        },
    }  # fmt: skip
    doc["group_revision"] = sp.revision
    memory = sp.memory.to_output()
    doc["memory_plan"] = memory
    by_role = {r["role"]: r for r in memory["ranks"]}
    nodes = []
    for spec, node, nb in zip(sp.group.specs, sp.nodes, sp.budgets):
        nodes.append(
            {
                "rank": node.rank,
                "role": node.role,
                "name": node.name,
                "host": node.host,
                "fabric_ip": node.fabric_ip,
                "ssh": {"user": node.ssh_user, "port": node.ssh_port, "target": f"{node.ssh_user}@{node.host}"},
                "preflight": {"checks": preflight_checks(node.preflight), "script": node.preflight},
                "checkpoint_volume": {"name": node.volume_name, "driver_opts": dict(node.volume_options)},
                "engram": None if node.shard is None else {"dir": cfg.engram.dir, "files": list(node.shard.files)},
                "container": {
                    "name": spec.container_name,
                    "image": spec.image,
                    "entrypoint": list(spec.entrypoint),
                    "args": list(spec.args),
                    "env": dict(spec.env),
                    "mounts": [asdict(m) for m in spec.mounts],
                    "labels": {
                        plan.REVISION_LABEL: sp.revision,
                        "deepseek-spark.stack": name,
                        "deepseek-spark.rank": str(node.rank),
                        "deepseek-spark.role": spec.role,
                        "deepseek-spark.engine": sp.engine,
                    },
                    "restart": spec.restart,
                    "network_mode": spec.network_mode,
                    "ipc_mode": spec.ipc_mode,
                    "gpus": spec.gpus,
                    "devices": list(spec.devices),
                    "ulimits": {k: list(v) for k, v in spec.ulimits.items()},
                    "generation": spec.generation,
                },
                "memory": by_role.get(spec.role) or by_role.get("head"),
                # the rank container's limit (memory = memorySwap) and what the memory gate wants available
                "memory_limit_mib": spec.memory_mib,
                "memory_gate_need_mib": nb.rank.need_mib if cfg.memory.memory_gate else None,
            }  # fmt: skip
        )
    doc["nodes"] = nodes
    # per node: unified memory less the reserve, and every container the stack places there (planning/budget.py)
    doc["memory_budget"] = [b.to_output() for b in sp.budgets]
    # which network carries what: links, bootstrap plane, the checkpoint's path to each rank, the gate
    doc["fabric"] = {
        "bootstrap": cfg.fabric.bootstrap,
        "links": [{"a": cfg.nodes[lk.a].name, "b": cfg.nodes[lk.b].name, "a_ip": lk.a_ip, "b_ip": lk.b_ip,
                   "subnet": lk.subnet} for lk in fabric.links(cfg)],  # fmt: skip
        "checkpoint": fabric.boot_read_minutes(cfg, sp.memory.ranks[0].weights_gib),
        "gate": None if sp.group.fabric_gate is None else {"floorGbps": cfg.fabric.min_bandwidth_gbps,
                                                           "command": sp.group.fabric_gate},  # fmt: skip
        "summary": sp.planes,
    }
    doc["gateway"] = _gateway(stack)
    return doc


def _gateway(stack: Stack) -> dict | None:
    """The team gateway in front of the stack (the same plan the program builds it from); None without one."""
    gp = stack.gateway_plan()
    if gp is None:
        return None
    return {"node": gp.node.name, "endpoint": gp.endpoint, "upstream": gp.upstream, "image": gp.image,
            "containers": [gp.gateway.name, gp.database.name], "volume": gp.volume, "keep_data": gp.keep_data,
            "members": [m.name for m in gp.members]}  # fmt: skip


def _text(doc: dict, stack: Stack) -> str:
    cfg = stack.cfg
    s = cfg.serving
    out = []
    ep = f", EP {s.ep_size}" if cfg.engine == "sglang" else ""
    out.append(f"stack {doc['stack']}: {cfg.engine}, topology {cfg.topology}, TP {s.tp_size}{ep}, {len(cfg.nodes)} nodes")
    out.append(f"endpoint {doc['endpoint']}  model {doc['model']}")
    gw = doc.get("gateway")
    if gw:
        out.append(f"gateway {gw['endpoint']} on {gw['node']} (LiteLLM, {gw['image']}) in front of {gw['upstream']}; "
                   f"members: {', '.join(gw['members']) or 'none'}; database volume {gw['volume']}"
                   f"{' (kept on destroy)' if gw['keep_data'] else ''}")  # fmt: skip
    src = "downloaded per node" if cfg.model.source == "download" else f"shared ({cfg.share.mode})"
    out.append(f"checkpoint {cfg.model.checkpoint_dir} @ {cfg.model.revision}, {src}")
    v = doc["validation"]
    if v["errors"]:
        out.append(f"\n{len(v['errors'])} problem(s) in the stack config (preview would refuse it):")
        out += [f"  - cluster.{e['field']} = {e['value']!r}: {e['problem']}; fix: {e['fix']}" for e in v["errors"]]
    if v["warnings"]:
        out.append("warnings:")
        out += [f"  - cluster.{w['field']}: {w['problem']}; fix: {w['fix']}" for w in v["warnings"]]
    if v["errors"]:
        return "\n".join(out) + "\n"
    image = doc["image"]
    b = image["build"]
    out.append(
        f"image {image['name']} "
        + (f"(built on every node from {b['context']}/{b['dockerfile']}, digest {b['digest']})" if b else "(pulled)")
    )
    out.append(f"group revision {doc['group_revision']} (label {plan.REVISION_LABEL} on every rank)")
    out.append("")
    rows = []
    for n in doc["nodes"]:
        opts = n["checkpoint_volume"]["driver_opts"]
        rows.append([
            n["rank"], n["role"], n["name"], n["host"], n["fabric_ip"], f"{n['ssh']['target']}:{n['ssh']['port']}",
            n["container"]["name"],
            f"{n['checkpoint_volume']['name']} ({' '.join(f'{k}={v}' for k, v in opts.items())})",
            ", ".join(n["engram"]["files"]) if n["engram"] else None,
        ])  # fmt: skip
    out.append(table(["RANK", "ROLE", "NODE", "HOST", "FABRIC IP", "SSH", "CONTAINER", "CHECKPOINT VOLUME (driver opts)",
                      "ENGRAM SHARDS"], rows))  # fmt: skip
    if cfg.engine == "sglang" and cfg.engram is not None:
        out.append(f"engram shards live in {cfg.engram.dir} on each node")
    out.append("\npreflight checks:")
    for n in doc["nodes"]:
        out.append(f"  {n['name']} (rank {n['rank']}): {' '.join(n['preflight']['checks'])}")
    out.append("\n" + doc["fabric"]["summary"])
    gate = doc["fabric"]["gate"]
    out.append(f"  bandwidth gate: {'ib_write_bw per linked pair over all rails, floor ' + format(gate['floorGbps'], 'g') + ' Gb/s' if gate else 'off'}")
    mp = doc["memory_plan"]
    out.append(f"\nmemory plan ({mp['profile']}, {mp['unifiedGiB']} GiB per node, static fraction "
               f"{mp['staticFraction']}): {'fits' if mp['fits'] else 'DOES NOT FIT'}")  # fmt: skip
    rows = []
    for n in doc["nodes"]:
        m = n["memory"] or {}
        rows.append([n["rank"], n["name"], m.get("role"), m.get("staticPoolGiB"), m.get("weightsGiB"), m.get("kvGiB"),
                     m.get("windowGiB"), m.get("staticUsedGiB"), m.get("outsideGiB"), m.get("outsideNeededGiB"),
                     m.get("headroomGiB"), n["memory_limit_mib"], n["memory_gate_need_mib"]])  # fmt: skip
    out.append(table(["RANK", "NODE", "ROLE", "POOL GiB", "WEIGHTS", "KV", "WINDOW", "USED", "OUTSIDE", "OUTSIDE NEED",
                      "HEADROOM", "LIMIT MiB", "GATE NEEDS MiB"], rows, indent="  "))  # fmt: skip
    out.append("  LIMIT: the rank container's memory limit (swap included); GATE NEEDS: MemAvailable the memory gate "
               "wants on the node, after dropping the page cache, before the rank starts")
    out.append("\nmemory budget per node (unified memory less memory.hostReserveGiB: what every container the stack "
               "places there may take together; MiB):")
    rows = [[b["node"], f"{b['unifiedMiB']:,}", f"{b['reserveMiB']:,}", f"{b['budgetMiB']:,}", f"{b['limitsMiB']:,}",
             f"{b['freeMiB']:,}", f"{b['headroomMiB']:,}",
             ", ".join(f"{c['container']} {c['limitMiB']:,}" + (f" (needs {c['needMiB']:,})" if c["needMiB"] is not None
                                                                 else "") for c in b["containers"])]
            for b in doc["memory_budget"]]  # fmt: skip
    out.append(table(["NODE", "UNIFIED", "RESERVE", "BUDGET", "LIMITS", "FREE", "HEADROOM", "CONTAINERS (limit, rank: needs)"],
                     rows, indent="  "))  # fmt: skip
    out.append("  HEADROOM: how far the rank may outgrow its need before its own limit stops it; FREE: what no "
               "container's limit covers")
    for n in doc["nodes"]:
        c = n["container"]
        out.append(f"\nrank {n['rank']}: {c['name']} on {n['name']} ({c['image']}, restart={c['restart']}, "
                   f"network={c['network_mode']}, ipc={c['ipc_mode']}, gpus={c['gpus']})")  # fmt: skip
        out.append(f"  args:   {shlex.join(c['args'])}")
        out.append("  env:    " + "\n          ".join(f"{k}={v}" for k, v in c["env"].items()))
        out.append("  mounts: " + "\n          ".join(
            f"{m['source']} -> {m['target']} ({m['type']}{', ro' if m['read_only'] else ''})" for m in c["mounts"]
        ))  # fmt: skip
    return "\n".join(out) + "\n"


def run(stack: Stack, as_json: bool, out: TextIO) -> int:
    doc = build(stack)
    out.write(to_json(doc) + "\n" if as_json else _text(doc, stack))
    return 1 if doc["validation"]["errors"] else 0
