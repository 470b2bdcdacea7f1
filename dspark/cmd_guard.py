"""`guard`: the group's self-healing (serving.selfHeal) as it stands, and pausing it for maintenance.

    python -m dspark guard status --stack S [--group G] [--json]
    python -m dspark guard pause --stack S [--group G] [--reason TEXT] [--for 2h]
    python -m dspark guard resume --stack S [--group G]

status: every node's guard container, the leader's state and why, the heal in progress, and the last heals
(the fault, when it happened, and how many seconds after it the guard saw it, had restarted the group and
the group answered again). It reads the leader's journal on the head over ssh, as dspark reaches nodes.
pause: the maintenance marker on the head; the guard restarts nothing until `resume` (or until --for runs
out), so a rank can be stopped, a node rebooted, a switch flashed without the guard bringing the group back
halfway. resume: removes the marker and, when the guard gave up after serving.selfHeal.maxAttempts, asks it
to try again from zero.
Exit: status 0 serving, 1 anything else the guard is doing (paused, healing, waiting...), 2 no guard answers
or it gave up (exhausted, blocked); pause and resume 0 once the head has the marker.
"""

from __future__ import annotations

import getpass
import json
import re
import socket
import time
from typing import Optional, TextIO

from planning import commands
from planning import guard as guard_plan

from .nodes import SSH_FAILED, Node, Nodes, inspect_cmd, parse_inspect, sh_c
from .render import to_json
from .stack import DsparkError, Stack

q = commands.q
STALE_S = 60.0  # a journal not written for this long (plus 3 intervals): the leader is not looking
_DURATION = re.compile(r"^(\d+)([smhd])$")


def parse_for(value: str) -> float:
    """`--for 90m` -> seconds."""
    m = _DURATION.match(value)
    if not m:
        raise ValueError("a duration like 30m, 2h or 1d")
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def plan_of(stack: Stack) -> Optional[guard_plan.GuardPlan]:
    return stack.group_plan().guard


def _sudo(stack: Stack, node: Node) -> str:
    return commands.key_sudo(stack.cfg, node.user)


def journal_cmd(directory: str, sudo: str = "") -> str:
    return sh_c(f"{sudo}cat {q(directory + '/journal.json')}")


def pause_cmd(directory: str, doc: dict, sudo: str = "") -> str:
    """Write the maintenance marker (JSON, the reason is the operator's text: quoted, never run)."""
    path = f"{directory}/paused.json"
    return sh_c(f"{sudo}mkdir -p {q(directory)} && printf '%s\\n' {q(json.dumps(doc, sort_keys=True))} | "
                f"{sudo}tee {q(path + '.tmp')} >/dev/null && {sudo}mv {q(path + '.tmp')} {q(path)}")  # fmt: skip


def resume_cmd(directory: str, sudo: str = "") -> str:
    return sh_c(f"{sudo}rm -f {q(directory + '/paused.json')} && {sudo}touch {q(directory + '/retry')}")


def files_check_cmd(directory: str, sudo: str = "") -> str:
    """`token <mode> <size>` and `archive <sha256>` (or `missing`) of the guard's files on a node."""
    token, archive = q(f"{directory}/{guard_plan.TOKEN}"), q(f"{directory}/{guard_plan.ARCHIVE}")
    return sh_c(f'echo "token $({sudo}stat -c "%a %s" {token} 2>/dev/null || echo missing)"; '
                f'echo "archive $({sudo}sha256sum {archive} 2>/dev/null | cut -c1-16 || true)"')  # fmt: skip


def file_findings(stack: Stack, nodes: Nodes) -> list[tuple[str, str, str, str]]:
    """(node, check, what, fix) for every guard file that is not what the program wrote."""
    gp = plan_of(stack)
    if gp is None:
        return []
    fix = f"`pulumi up --stack {stack.name}` writes it again (the guard's archive and token are the program's)"
    out = []
    for n, (code, text) in zip(gp.nodes, nodes.each(lambda node: nodes.run(node, files_check_cmd(
            gp.nodes[node.rank].dir, _sudo(stack, node))))):  # fmt: skip
        lines = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
        token, digest = lines.get("token", "missing").split(), lines.get("archive", "").strip()
        if code == SSH_FAILED:  # the node itself is unreachable: doctor says so once
            continue
        if code != 0:
            out.append((n.node, "guard-files", f"the guard's files could not be read: {text.strip()[-200:]}", fix))
            continue
        if token == ["missing"] or len(token) != 2 or token[0] != "600" or token[1] == "0":
            out.append((n.node, "guard-token", f"{n.dir}/{guard_plan.TOKEN} is {' '.join(token)} (expected mode 600, "
                                               "not empty): the guards of the group cannot trust each other", fix))
        if digest != guard_plan.DIGEST:
            out.append((n.node, "guard-archive", f"{n.dir}/{guard_plan.ARCHIVE} is {digest or 'missing'}, the program's "
                                                 f"is {guard_plan.DIGEST}", fix))
    return out


def collect(stack: Stack, nodes: Nodes, now: Optional[float] = None) -> Optional[dict]:
    """The guard as it stands (None with serving.selfHeal off): containers by node, and the leader's journal."""
    gp = plan_of(stack)
    if gp is None:
        return None
    head = nodes[0]
    states = dict(zip([n.node for n in gp.nodes], nodes.each(
        lambda n: parse_inspect(*nodes.run(n, inspect_cmd(gp.nodes[n.rank].container_name))).state)))  # fmt: skip
    code, text = nodes.run(head, journal_cmd(gp.nodes[0].dir, _sudo(stack, head)))
    journal, error = None, None
    try:
        journal = json.loads(text) if code == 0 else None
        if code != 0:
            error = f"no journal on {head.name} ({text.strip()[-200:] or f'exit {code}'})"
    except ValueError:
        error = f"the journal on {head.name} cannot be read"
    now = time.time() if now is None else now
    age = now - float(journal["heartbeat"]) if journal and journal.get("heartbeat") else None
    stale = age is None or age > STALE_S + 3 * gp.interval
    return {
        "containers": states,
        "leader": gp.nodes[0].node,
        "state": (journal or {}).get("state") if not stale else "not looking",
        "reason": (journal or {}).get("reason") if not stale else (error or f"the journal was last written {age:.0f} s ago"),
        "heartbeat_age_s": None if age is None else round(age, 1),
        "attempts": ((journal or {}).get("memory") or {}).get("attempts", 0),
        "max_attempts": gp.settings["max_attempts"],
        "healing": (journal or {}).get("healing"),
        "heals": ((journal or {}).get("heals") or [])[-5:],
        "error": error,
    }


def heal_line(h: dict) -> str:
    """`10:07:23Z rank-exited served: detected +4.6 s, restarted +5.9 s, serving +6.9 s (rank 1 ... 137)`."""
    at = h.get("fault_at") or 0
    marks = [f"{name} +{h[key] - at:.1f} s" for name, key in (("detected", "detected_at"), ("restarted", "restarted_at"),
                                                               ("serving", "serving_at")) if h.get(key)]  # fmt: skip
    why = f" ({h['why']})" if h.get("result") != "served" and h.get("why") else ""
    return (f"{time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(at))} {h.get('fault')} attempt {h.get('attempt')} "
            f"{h.get('result')}: {', '.join(marks) or 'no step done'}{why}; {h.get('detail', '')}")


def render_lines(g: dict) -> list[str]:
    states = ", ".join(f"{node} {st}" for node, st in g["containers"].items())
    lines = [f"guard (self-healing): {g['state']} - {g['reason']}", f"  containers: {states}"]
    if g["healing"]:
        h = g["healing"]
        lines.append(f"  healing: attempt {h.get('attempt')} of {g['max_attempts']}, at {h.get('step')}")
    elif g["attempts"]:
        lines.append(f"  attempts in this episode: {g['attempts']} of {g['max_attempts']}")
    if g["heals"]:
        lines.append("  last heals (seconds after the fault):")
        lines += [f"    {heal_line(h)}" for h in reversed(g["heals"])]
    return lines


def code_of(g: Optional[dict]) -> int:
    if g is None or g["state"] in ("not looking", "exhausted", "blocked", None):
        return 2
    return 0 if g["state"] == "serving" else 1


def run(stack: Stack, nodes: Nodes, action: str, out: TextIO, as_json: bool = False, reason: str = "",
        for_s: Optional[float] = None) -> int:  # fmt: skip
    gp = plan_of(stack)
    if gp is None:
        raise DsparkError(f"{stack.short}: serving.selfHeal is off, so there is no guard (turn it on in "
                          f"Pulumi.{stack.short}.yaml and run `pulumi up --stack {stack.name}`)")  # fmt: skip
    head = nodes[0]
    if action == "status":
        g = collect(stack, nodes)
        out.write(to_json(g) + "\n" if as_json else "\n".join(render_lines(g)) + "\n")
        return code_of(g)
    if action == "pause":
        now = time.time()
        doc = {"by": f"{getpass.getuser()}@{socket.gethostname()}", "reason": reason or "maintenance",
               "since": now, "until": now + for_s if for_s else None}  # fmt: skip
        code, text = nodes.run(head, pause_cmd(gp.nodes[0].dir, doc, _sudo(stack, head)))
        done = "paused: it restarts nothing until `python -m dspark guard resume --stack " + stack.name + "`"
    else:
        code, text = nodes.run(head, resume_cmd(gp.nodes[0].dir, _sudo(stack, head)))
        done = "resumed: it heals again (and, if it had given up, tries again from zero)"
    if code != 0:
        out.write(f"{stack.short}: the guard's marker could not be written on {head.name}: {text.strip()[-300:]}\n")
        return 1
    out.write(f"{stack.short}: guard {done}\n")
    return 0
