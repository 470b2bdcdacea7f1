"""`doctor`: run every node's preflight now, and look for drift between the nodes and the stack:
ranks stopped or missing, rank containers with another group revision than the stack's output,
engram shard files missing (SGLang), a checkpoint volume missing, a stale NFS checkpoint mount, the node's
fence (planning/exposure.py) missing, changed by hand or not the plan's (and, as a note, what a host on the
management network can reach there),
(when all ranks run the stack's revision) a rank 0 that does not answer /health, and the self-healing
guard itself (running on every node, its leader looking, not given up, its token and archive as the
program wrote them). Each finding names the node, what is wrong and the fix.

Exit code 0 when nothing was found, 1 otherwise (notes do not count).

JSON shape (`--json`):

    {
      "stack": "tp3", "engine": "sglang",
      "revision": {"expected": "0123456789abcdef", "source": "outputs" | "config", "planned": "..."},
      "nodes": [
        {"rank": 0, "node": "spark1", "reachable": true,
         "preflight": {"exit_code": 0, "ok": ["docker", "gpu", ...], "failed": [{"check": "gpu-idle", "message": "..."}]},
         "fabric": null | {"hca": "rocep1s0f1,roceP2p1s0f1", "socket_ifname", "gid_index", "rails": [...], "ports": {}},
         "memory": null | {"availableMiB", "totalMiB", "freeMiB", "cachedMiB", "needMiB", "ok", ...},  # programs/memgate.py
         "container": {"name": "tp3-rank0", "state": "running", "exit_code": 0, "revision": "..."},
         "nccl_transport": null | "NET/IB" | "NET/Socket",   # from the rank's log (serving.ncclDebug: true)
         "engram": null | {"dir": "...", "present": ["engram-l1-r0of3.bin"], "missing": ["engram-l14-r0of3.bin"]},
         "checkpoint_volume": null | {"name": "tp3-checkpoint", "exists": true, "mountpoint": "...",
                                      "mounted": true, "stat": "ok" | "hung" | "stale" | "failed" | "unknown"},
         "fence": null | "fence live=present|missing saved=same|differs boot=ok|differs"}
      ],
      "health": null | {"url": "...", "status": 200 | null, "error": null | "..."},
      "fabric_gate": null | {"<group>": {"floorGbps", "minGbps", "ok", "pairs": [{"a", "b", "totalGbps", "rails"}]}},
      "findings": [{"node": "spark2", "rank": 1, "check": "rank-stopped", "what": "...", "fix": "..."}],
      "notes": ["..."],
      "exit_code": 0 | 1
    }
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from typing import Callable, Optional, TextIO

import yaml

from planning import commands, plan, stackplan
from programs import bootlog, probe

from . import api, cmd_guard
from .nodes import (
    SSH_FAILED, Node, Nodes, fabric_report, files_cmd, inspect_cmd, logs_cmd, memory_cmd, parse_files, parse_inspect,
    parse_memory, parse_preflight, parse_preflight_notes, preflight_cmd, volume_probe_cmd,
)  # fmt: skip
from .render import table, to_json
from .stack import Stack

NOT_RUNNING = {"created", "paused", "restarting", "removing", "exited", "dead"}


@dataclass(frozen=True)
class Finding:
    node: str
    rank: Optional[int]
    check: str
    what: str
    fix: str


OUTSIDE = "192.0.2.77"  # TEST-NET-1: a host of the office network that is none of the stack's sources


def project_name(stack: Stack) -> str:
    try:
        doc = yaml.safe_load((stack.project_dir / "Pulumi.yaml").read_text()) or {}
        name = doc.get("name") if isinstance(doc, dict) else None
        return name if isinstance(name, str) and name else "deepseek-spark"
    except (OSError, yaml.YAMLError):
        return "deepseek-spark"


def engram_shard_urn(stack: Stack, node_name: str) -> str:
    """URN of a node's engram pack command (`<stack>[-<group>]-engram-<node>` under the cluster component)."""
    s = stack.plan_name
    return (
        f"urn:pulumi:{stack.short}::{project_name(stack)}::deepseek-spark:index:DeepSeekCluster$"
        f"deepseek-spark:index:EngramShards$command:remote:Command::{s}-engram-{node_name}"
    )


def fence_urn(stack: Stack, node_name: str) -> str:
    """URN of a node's fence command (`<stack>-fence-<node>` under the Fence component)."""
    return (f"urn:pulumi:{stack.short}::{project_name(stack)}::deepseek-spark:index:Fence$command:local:Command::"
            f"{stack.short}-fence-{node_name}")


def fence_cmd(table: str, stack: str, digest: str) -> str:
    """On the node: is the table in force (`live`), the same as when the fence was confirmed (`saved`), and is the
    file loaded at boot the plan's rule set (`boot`, against its `digest`)?"""
    d = shlex.quote(f"/etc/deepseek-spark/fence-{stack}")
    return "sh -c " + shlex.quote(f'S=""; [ "$(id -u)" = 0 ] || S="sudo -n"; '
            f'if live=$($S nft list table inet {shlex.quote(table)} 2>/dev/null); then l=present; else l=missing; fi; '
            f'if [ "$l" = present ] && [ "$live" = "$($S cat {d}.live 2>/dev/null)" ]; then s=same; else s=differs; fi; '
            f'if [ "$($S cat {d}.nft 2>/dev/null | sha256sum | cut -c1-16)" = {shlex.quote(digest)} ]; then b=ok; '
            'else b=differs; fi; echo "fence live=$l saved=$s boot=$b"')  # fmt: skip


def fence_findings(stack: Stack, node: Node, ne, out: str) -> list[Finding]:
    """The node's fence against the plan: in force, as confirmed, the boot file the plan's."""
    line = next((ln for ln in out.splitlines() if ln.startswith("fence ")), "")
    got = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
    fix = (f"put it back: `pulumi up --stack {stack.short} --replace '{fence_urn(stack, node.name)}'` (it applies "
           "the planned rules the safe way: refused if they would cut your ssh, rolled back unless confirmed)")
    if not line:
        return [Finding(node.name, node.rank, "fence-unknown", f"could not read the fence: {out.strip()[-200:]}",
                        "check `sudo -n nft list tables` on the node")]  # fmt: skip
    if got.get("live") != "present":
        return [Finding(node.name, node.rank, "fence-missing", f"the fence (table inet {ne.table}) is not in force: "
                        "every listener answers whoever reaches the node", fix)]  # fmt: skip
    out_findings = []
    if got.get("saved") != "same":
        out_findings.append(Finding(node.name, node.rank, "fence-altered", f"table inet {ne.table} differs from the "
                                    "rules confirmed at the last `up` (someone changed it by hand)", fix))  # fmt: skip
    if got.get("boot") != "ok":
        out_findings.append(Finding(node.name, node.rank, "fence-stale", "the fence the node loads at boot is not the "
                                    "one the plan renders (a pending change, or a file changed by hand)", fix))  # fmt: skip
    return out_findings


def _refresh_fix(name: str, what: str) -> str:
    return (f"run `pulumi up --refresh --stack {name}`: refresh records the {what}, up restarts the whole group "
            "(workers first, the head last)")  # fmt: skip


def _stat_result(lines: dict[str, str]) -> str:
    stat = lines.get("stat", "")
    if stat == "ok":
        return "ok"
    words = stat.split(" ", 2)
    rc = words[1] if len(words) > 1 else ""
    msg = words[2] if len(words) > 2 else ""
    if rc in ("124", "137"):
        return "hung"
    if "Stale file handle" in msg:
        return "stale"
    if "Permission denied" in msg or "password is required" in msg or msg.startswith("sudo:"):
        return "unknown"
    return "failed"


def check_node(stack: Stack, nodes: Nodes, node: Node, expected: str) -> dict:
    cfg, name = stack.cfg, stack.plan_name
    result: dict = {"rank": node.rank, "node": node.name, "reachable": True, "preflight": None, "fabric": None,
                    "memory": None, "container": None, "nccl_transport": None, "engram": None,
                    "checkpoint_volume": None, "fence": None, "_findings": [], "_notes": []}  # fmt: skip
    findings: list[Finding] = result["_findings"]
    code, out = nodes.run(node, preflight_cmd(commands.preflight(cfg, name, node.rank)))
    ok, failed = parse_preflight(out)
    if code == SSH_FAILED and not ok and not failed:
        result["reachable"] = False
        why = out.strip().splitlines()[-1] if out.strip() else "ssh exit code 255"
        findings.append(Finding(node.name, node.rank, "unreachable", f"ssh to {node.target} port {node.port} failed: {why}",
                                "check the node is up and that ssh reaches it with the stack's options: "
                                f"`{nodes.ssh_hint(node)}` (ssh.identityFile, ssh.knownHostsFile)"))  # fmt: skip
        return result
    result["preflight"] = {"exit_code": code, "ok": ok, "failed": [{"check": c, "message": m} for c, m in failed]}
    result["fabric"] = fabric_report(out)  # the rails, GIDs and socket interface NCCL gets on this node
    result["_notes"] += parse_preflight_notes(out)
    for check, message in failed:
        problem, _, fix = message.partition("; ")
        findings.append(Finding(node.name, node.rank, f"preflight:{check}", problem, fix or "see the message"))
    if code != 0 and not failed:
        findings.append(Finding(node.name, node.rank, "preflight", f"the preflight script exited {code} without "
                                f"naming a check: {out.strip()[-200:]}", "run it by hand: `python -m dspark plan "
                                f"--stack {stack.name} --json` holds the script"))  # fmt: skip

    c = parse_inspect(*nodes.run(node, inspect_cmd(node.container)))
    revision = c.labels.get(plan.REVISION_LABEL) if c.exists else None
    result["container"] = {"name": node.container, "state": c.state, "exit_code": c.exit_code, "revision": revision}
    if c.state == "missing":
        findings.append(Finding(node.name, node.rank, "rank-missing", f"rank {node.rank} ({node.container}) does not exist",
                                _refresh_fix(stack.name, "removed rank")))  # fmt: skip
    elif c.state in NOT_RUNNING:
        findings.append(Finding(node.name, node.rank, "rank-stopped",
                                f"rank {node.rank} ({node.container}) is {c.state} (exit code {c.exit_code}"
                                f"{', OOM killed' if c.oom_killed else ''}{', finished ' + c.finished_at if c.finished_at else ''})",
                                _refresh_fix(stack.name, "stopped rank")))  # fmt: skip
    elif not c.known:
        findings.append(Finding(node.name, node.rank, "rank-unknown", f"docker inspect {node.container} failed: {c.error}",
                                "check docker on the node (the preflight's `docker` check)"))  # fmt: skip
    if c.exists and revision != expected:
        findings.append(Finding(node.name, node.rank, "revision-mismatch",
                                f"rank {node.rank} ({node.container}) has group revision {revision or '(no label)'}, "
                                f"the stack's is {expected}",
                                f"run `pulumi up --refresh --stack {stack.name}`: refresh reads the label, up replaces "
                                "the whole group with the stack's revision"))  # fmt: skip

    # the memory gate's figures (report-only: no drop); a verdict only while the rank does not run, since a
    # running rank's own memory is not available
    _, mout = nodes.run(node, memory_cmd(commands.memgate(cfg, node.rank, report_only=True), stackplan.MEMGATE_PROGRAM))
    mem = result["memory"] = parse_memory(mout)
    if mem and not mem["ok"] and c.state != "running":
        findings.append(Finding(node.name, node.rank, "memory", f"{mem['availableMiB']} MiB available of "
                                f"{mem['totalMiB']} MiB ({mem['cachedMiB']} MiB page cache), the memory plan needs "
                                f"{mem['needMiB']} MiB for rank {node.rank}: the next group start fails its memory gate",
                                "stop what holds the memory on the node (another model, a leftover container), "
                                "or lower the plan (serving.memFractionStatic, maxTotalTokens)"))  # fmt: skip
    elif mem is None:
        result["_notes"].append(f"{node.name}: the memory figures could not be read: {mout.strip()[-200:]}")

    if c.state == "running":  # which transport this rank's NCCL chose (logged at serving.ncclDebug: true)
        lcode, ltext = nodes.run(node, logs_cmd(node.container, tail="5000"))
        transport = bootlog.nccl_transport(ltext) if lcode == 0 else None
        result["nccl_transport"] = transport
        if transport == "NET/Socket":
            findings.append(Finding(node.name, node.rank, "nccl-socket",
                                    f"rank {node.rank}'s NCCL moves data over NET/Socket (TCP), not RoCE",
                                    "check the rails (the fabric lines above, `dspark logs --nccl`), then restart the "
                                    "group: bump serving.generation"))  # fmt: skip
        elif transport is None and lcode == 0 and not cfg.serving.nccl_debug:
            result["_notes"].append(f"{node.name}: NCCL logged no transport (NCCL_DEBUG=WARN); set serving.ncclDebug: "
                                    "true for the next restart to see it")

    if cfg.engine == "sglang" and cfg.engram is not None:
        files = plan.shard_files(node.rank, cfg.serving.tp_size)
        paths = [f"{cfg.engram.dir}/{f}" for f in files]
        fcode, fout = nodes.run(node, files_cmd(paths))
        present, missing = parse_files(fout)
        base = lambda p: p.rsplit("/", 1)[-1]  # noqa: E731
        result["engram"] = {"dir": cfg.engram.dir, "present": [base(p) for p in present],
                            "missing": [base(p) for p in missing]}  # fmt: skip
        if fcode != 0 and not present and not missing:
            result["_notes"].append(f"{node.name}: could not list the engram shards (exit {fcode})")
        for path in missing:
            urn = engram_shard_urn(stack, node.name)
            findings.append(Finding(node.name, node.rank, "engram-shard-missing", f"engram shard {path} is missing",
                                    f"re-pack it: `pulumi up --stack {stack.name} --replace '{urn}'` (~10 min; a "
                                    "plain `pulumi up` does not re-run the pack, it runs only when the checkpoint "
                                    "revision, TP, rank or engram.dir change); a group started without it fails at "
                                    "boot, so restart a running one afterwards (bump serving.generation)"))  # fmt: skip

    ne = stack.exposure().get(node.name)
    if ne is not None and ne.enabled:
        _, fout = nodes.run(node, fence_cmd(ne.table, stack.short, ne.digest))
        result["fence"] = fout.strip().splitlines()[-1] if fout.strip() else None
        findings += fence_findings(stack, node, ne, fout)
        reach = [f"{lst.port} ({lst.what.split(' (')[0].split(':')[0]})" for lst in ne.reachable_from(OUTSIDE)]
        result["_notes"].append(f"{node.name}: a host on the management network outside the stack's sources reaches "
                                f"{', '.join(reach) or 'nothing'} (docs/exposure.md)")  # fmt: skip

    volume = plan.checkpoint_volume_name(name)
    sudo = "" if node.user == "root" else "sudo -n "
    vcode, vout = nodes.run(node, volume_probe_cmd(volume, sudo))
    lines = {}
    for line in vout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("volume", "mountpoint", "mounted", "stat"):
            lines[word] = rest if word != "stat" else line[len("stat "):]
    nfs = plan.volume_options(cfg, node.rank).get("type") == "nfs"
    if "volume" in lines:
        gone = "no such volume" in lines["volume"].lower()
        result["checkpoint_volume"] = {"name": volume, "exists": False if gone else None, "mountpoint": None,
                                       "mounted": None, "stat": None}  # fmt: skip
        if gone:
            findings.append(Finding(node.name, node.rank, "checkpoint-volume-missing",
                                    f"the checkpoint volume {volume} does not exist",
                                    f"run `pulumi up --refresh --stack {stack.name}`: refresh finds it gone, up recreates "
                                    "it and restarts the group (every rank mounts it)"))  # fmt: skip
        else:
            result["_notes"].append(f"{node.name}: docker volume inspect {volume} failed: {lines['volume'][:200]}")
    elif "mountpoint" in lines:
        stat = _stat_result(lines)
        mounted = lines.get("mounted") == "yes"
        result["checkpoint_volume"] = {"name": volume, "exists": True, "mountpoint": lines["mountpoint"],
                                       "mounted": mounted, "stat": stat}  # fmt: skip
        if nfs and stat in ("hung", "stale"):
            head = cfg.nodes[0]
            server = plan.volume_options(cfg, node.rank)["o"].split(",", 1)[0].removeprefix("addr=")
            findings.append(Finding(node.name, node.rank, "nfs-stale",
                                    f"the checkpoint NFS mount {lines['mountpoint']} ({volume}) "
                                    f"{'does not answer within 5 s' if stat == 'hung' else 'has a stale file handle'}",
                                    f"check the head's export (`sudo exportfs -v` on {head.name}) and the fabric link "
                                    f"to {server}; the mount is made again when no container uses the volume: restart "
                                    f"the group (bump serving.generation, `pulumi up --stack {stack.name}`)"))  # fmt: skip
        elif nfs and stat == "unknown":
            result["_notes"].append(f"{node.name}: cannot stat the NFS mount {lines['mountpoint']} "
                                    f"(needs root or passwordless sudo): {lines.get('stat', '')[:200]}")  # fmt: skip
        elif nfs and stat == "failed":
            findings.append(Finding(node.name, node.rank, "nfs-mount", f"stat -f {lines['mountpoint']} failed: "
                                    f"{lines.get('stat', '')[:200]}", f"check the NFS mount of {volume} on {node.name}"))  # fmt: skip
    elif vcode != 0:
        result["_notes"].append(f"{node.name}: could not probe the checkpoint volume (exit {vcode})")
    return result


def run(stack: Stack, nodes: Nodes, as_json: bool, out: TextIO, http_status: Optional[Callable] = None) -> int:
    outputs, outputs_error = stack.try_outputs()
    expected, source = stack.expected_revision()
    planned = stack.planned_revision()
    results = nodes.each(lambda n: check_node(stack, nodes, n, expected))
    findings: list[Finding] = [f for r in results for f in r.pop("_findings")]
    notes: list[str] = [n for r in results for n in r.pop("_notes")]
    if outputs is None:
        notes.insert(0, f"{outputs_error}; compared revisions with what Pulumi.{stack.short}.yaml plans")
    elif source == "outputs" and planned != expected:
        notes.insert(0, f"Pulumi.{stack.short}.yaml plans group revision {planned}, the stack runs {expected}: "
                        f"`pulumi preview --diff --stack {stack.name}` shows the pending group replacement")  # fmt: skip
    health = None
    all_good = all(r["reachable"] and r["container"] and r["container"]["state"] == "running"
                   and r["container"]["revision"] == expected for r in results)  # fmt: skip
    if all_good:
        url = probe.health_url(stack.endpoint())
        # a group behind the stack's router or gateway: its API is an inner port, reached through ssh to its head
        status, error = (http_status or api.group_status(nodes, stack.fronted))(url, 5.0)
        health = {"url": url, "status": status, "error": error}
        if status != 200:
            findings.append(Finding(stack.cfg.nodes[0].name, 0, "health",
                                    f"every rank runs the stack's revision but {url} answers "
                                    f"{status if status is not None else error}",
                                    f"a boot takes 12-13 min: `python -m dspark status --stack {stack.name} --watch 30` "
                                    "shows the phase; if the group hangs, restart it: bump serving.generation in "
                                    f"Pulumi.{stack.short}.yaml and run `pulumi up --stack {stack.name}`"))  # fmt: skip
    guard = cmd_guard.collect(stack, nodes)
    if guard is not None:
        findings += guard_findings(stack, nodes, guard)
        if guard["state"] == "paused":
            notes.append(f"the guard is {guard['reason']}: `python -m dspark guard resume --stack {stack.name}`")
    code = 1 if findings else 0
    doc = {
        "stack": stack.short,
        "engine": stack.cfg.engine,
        "revision": {"expected": expected, "source": source, "planned": planned},
        "nodes": results,
        "health": health,
        # the bandwidth the fabric gate measured at the group's last (re)start (the `fabric` output)
        "fabric_gate": (outputs or {}).get("fabric"),
        "findings": [asdict(f) for f in findings],
        "notes": notes,
        "exit_code": code,
    }
    out.write(to_json(doc) + "\n" if as_json else render_text(doc))
    return code


def guard_findings(stack: Stack, nodes: Nodes, g: dict) -> list[Finding]:
    """The guard itself: running on every node, its leader looking (a fresh journal), not given up, and its files
    (token 0600, the program's archive) as the program wrote them."""
    name = stack.name + (f" --group {stack.group}" if stack.group else "")
    refresh = f"`pulumi up --refresh --stack {stack.name}` starts it again (refresh sees it stopped)"
    out = [Finding(node, None, "guard-stopped", f"the guard is {st} on {node}: the group does not heal itself", refresh)
           for node, st in g["containers"].items() if st not in ("running", "unreachable")]  # fmt: skip
    leader = g["leader"]
    if g["state"] == "not looking":
        out.append(Finding(leader, 0, "guard-not-looking", f"the guard's leader is not looking: {g['reason']}",
                           f"`docker logs --tail 50 {stack.plan_name}-guard` on {leader}; {refresh}"))  # fmt: skip
    elif g["state"] == "exhausted":
        out.append(Finding(leader, 0, "guard-gave-up", f"the guard gave up: {g['reason']}",
                           f"fix the cause, then `python -m dspark guard resume --stack {name}` or "
                           f"`python -m dspark restart --stack {name} --yes`"))  # fmt: skip
    elif g["state"] == "blocked":
        out.append(Finding(leader, 0, "guard-blocked", g["reason"], f"`pulumi up --stack {stack.name}`"))
    ranks = {n.name: n.rank for n in nodes}
    out += [Finding(node, ranks.get(node), check, what, fix) for node, check, what, fix in cmd_guard.file_findings(stack, nodes)]
    return out


def fabric_lines(doc: dict) -> list[str]:
    """Each node's rails (from its preflight) and the gate's figures per pair (from the stack outputs)."""
    out = []
    for r in doc["nodes"]:
        f = r.get("fabric")
        if f:
            rails = ", ".join(f"{x['hca']} ({x['netdev']} {x['ip'] or '-'}, {x['state']}, gid {x['gid_index']})"
                              for x in f["rails"]) or "none"  # fmt: skip
            used = f"; NCCL used {r['nccl_transport']}" if r.get("nccl_transport") else ""
            out.append(f"fabric {r['node']}: NCCL_IB_HCA={f['hca'] or '-'} socket {f['socket_ifname'] or '-'}; "
                       f"rails {rails}{used}")
    for r in doc["nodes"]:
        m = r.get("memory")
        if m:
            out.append(f"memory {r['node']}: {m['availableMiB']} MiB available of {m['totalMiB']} MiB, "
                       f"{m['cachedMiB']} MiB page cache; the plan needs {m['needMiB']} MiB at the next start"
                       f"{'' if m['ok'] else ' SHORT'}")  # fmt: skip
    for group, rep in sorted((doc.get("fabric_gate") or {}).items()):
        for p in (rep or {}).get("pairs", []):
            rails = ", ".join(f"{x['client']}<->{x['server']} {x['gbps']:g}" for x in p["rails"])
            out.append(f"bandwidth {group} {p['a']}<->{p['b']}: {p['totalGbps']:g} Gb/s [{rails}] (floor "
                       f"{p['floorGbps']:g}, measured at the last group start){'' if p['ok'] else ' BELOW FLOOR'}")
    return ["", *out] if out else []


def render_text(doc: dict) -> str:
    lines = [f"doctor: stack {doc['stack']} ({doc['engine']}), group revision {doc['revision']['expected']}", ""]
    rows = []
    for r in doc["nodes"]:
        pf = r["preflight"]
        c = r["container"] or {}
        e = r["engram"]
        v = r["checkpoint_volume"]
        rows.append([
            r["rank"], r["node"],
            "unreachable" if not r["reachable"] else ("ok" if pf and not pf["failed"] and pf["exit_code"] == 0
                                                      else "FAIL " + ",".join(f["check"] for f in pf["failed"])),
            c.get("state"),
            None if e is None else ("ok" if not e["missing"] else "missing " + ",".join(e["missing"])),
            None if v is None else ("missing" if v["exists"] is False else v["stat"]),
        ])  # fmt: skip
    lines.append(table(["RANK", "NODE", "PREFLIGHT", "CONTAINER", "ENGRAM", "CHECKPOINT VOLUME"], rows))
    lines += fabric_lines(doc)
    if doc["findings"]:
        lines.append(f"\n{len(doc['findings'])} finding(s):")
        for f in doc["findings"]:
            lines.append(f"  - {f['node']}: {f['what']}\n      fix: {f['fix']}")
    else:
        lines.append("\nno findings")
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines) + "\n"
