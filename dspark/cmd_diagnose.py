"""`diagnose`: one support file holding what it takes to understand a failure on real Sparks, and no secret: a
.tar.gz to attach to an issue, whose SUMMARY.md a person reads first.

    python -m dspark diagnose --stack S [--group G] [--out FILE] [--timeout 60] [--tail 2000] [--up-log FILE]

Members (under one folder named after the file), in this order:
  SUMMARY.md        read first: status and doctor as they print, which node did not answer and why, the versions,
                    what each member holds, what was redacted (kinds and counts, never a value)
  diagnose.json     the same for a machine: nodes answered or not, parts gathered or why not, redaction counts
  versions.json     dspark's git revision, Python, the SDK packages, the Pulumi CLI and its plugins; per node: kernel,
                    OS, docker, NVIDIA driver and GPU, the rank's image ID, the engine's version in it
  config.json       Pulumi.<stack>.yaml, every `secure:` value shown as [secret]
  plan.json         `dspark plan --json`: every rank's argv, env and mounts, the memory plan, each node's budget
  outputs.json      the stack outputs
  status.json       `dspark status --json`: ranks, health, boot figures, gateway, guard
  doctor.json       `dspark doctor --json`: preflight, fabric rails, memory gate figures, NCCL transport, the
                    fabric gate's measured bandwidth, findings with their fixes
  logs/rank<N>-<node>.log       each rank's last --tail lines (all of it when shorter), .boot.log its first lines
  logs/gateway-<node>.log, logs/gateway-db-<node>.log, logs/guard-<node>.log
  nccl/rank<N>-<node>.log       NCCL's device and transport lines (serving.ncclDebug) of that rank
  guard/journal.json            the guard leader's journal: its state and every heal it kept
  last-up.json      the last update (`pulumi stack history`), resources left with init errors, pending operations
  last-up.txt       what `pulumi up` printed, when given with --up-log FILE

No secret: every value the stack knows is replaced wherever and however it appears (dspark/redaction.py): the
outputs' keys, the config's secrets (`pulumi config --show-secrets`), every value the state keeps encrypted
(`pulumi stack export --show-secrets`: the gateway's database password too), the ssh identity file and the
Pulumi passphrase; then whatever looks like a secret by name or shape. Without the API key (no outputs, no
config), the logs are withheld. Bounded time: a command on a node gets at most a third of --timeout and none
starts after it; a node that does not answer is asked nothing more and recorded, and the file is still written.
Exit code 0 once the file is written (SUMMARY.md names the nodes that did not answer), 3 when it cannot run.
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

import yaml

from planning import commands
from programs import bootlog, probe

from . import cmd_doctor, cmd_guard, cmd_plan, cmd_status, redaction
from .nodes import SSH_FAILED, Node, Nodes, Runner, logs_cmd, sh_c
from .render import table, to_json
from .stack import DsparkError, Stack

q = commands.q
ROOT = Path(__file__).resolve().parents[1]
TIMEOUT, TAIL, BOOT_LINES, SIDE_TAIL, PULUMI_TIMEOUT = 60.0, 2000, 3000, 300, 30.0
PACKAGES = ("pulumi", "pulumi-command", "pulumi-docker", "pydantic", "PyYAML")
VERSIONS_MARK = ": dspark-diagnose versions"
_SSH_ERROR = re.compile(r"(?i)\bssh\b|connection (refused|timed out|closed|reset)|no route to host|timed out|"
                        r"permission denied \(|host key verification failed|could not resolve")  # fmt: skip


def _descriptions(doc: str) -> dict[str, str]:
    """member -> what it holds, from the member list above (what --help shows)."""
    out: dict[str, str] = {}
    for m in re.finditer(r"^  (\S+\.(?:md|json|txt)) +(.*(?:\n {18,}.*)*)", doc, re.M):
        out[m.group(1)] = " ".join(m.group(2).split())
    return out


DESCRIPTIONS = _descriptions(__doc__ or "")


class Bounded:
    """A Runner under a deadline: a command gets at most `per_call` seconds and none starts past `deadline`; a
    host whose ssh failed or did not answer is asked nothing more (its later commands fail at once, as ssh)."""

    def __init__(self, inner: Optional[Runner], deadline: float, per_call: float,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.inner, self.deadline, self.per_call, self.clock = inner, deadline, per_call, clock
        self.down: dict[str, str] = {}  # host -> why it did not answer
        self.skipped: Counter = Counter()  # host -> commands not run: the deadline had passed
        self.lock = threading.Lock()

    def __call__(self, target: str, port: int, ssh_opts: list[str], remote: str) -> tuple[int, str]:
        host = target.partition("@")[2] or target
        with self.lock:
            why = self.down.get(host)
        if why:
            return SSH_FAILED, f"ssh: not asked: {host} did not answer before ({why})\n"
        left = min(self.per_call, self.deadline - self.clock())
        if left <= 0:
            with self.lock:
                self.skipped[host] += 1
            return SSH_FAILED, "ssh: not asked: the diagnose deadline had passed\n"
        box: list = []

        def call() -> None:
            try:
                inner = self.inner or (lambda *a: probe.on_node(*a, timeout=left))
                box.append(inner(target, port, ssh_opts, remote))
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                box.append(exc)

        worker = threading.Thread(target=call, daemon=True)  # abandoned, not waited for, past its time
        worker.start()
        worker.join(left)
        if not box:
            waited = math.ceil(left)  # whole seconds, never "0 s" when the deadline left it less than one
            self._mark(host, f"no answer within {waited} s")
            return SSH_FAILED, f"ssh: {target}: no answer within {waited} s\n"
        if isinstance(box[0], BaseException):
            raise box[0]
        code, out = box[0]
        last = out.strip().splitlines()[-1] if out.strip() else f"exit code {code}"
        if code == SSH_FAILED and _SSH_ERROR.search(last):
            self._mark(host, last)
        return code, out

    def _mark(self, host: str, why: str) -> None:
        with self.lock:
            self.down.setdefault(host, why)


class PulumiCli:
    """The Pulumi CLI in the project directory, each call bounded; (stdout, None) or (None, why not)."""

    def __init__(self, stack: Stack, deadline: float, clock: Callable[[], float] = time.monotonic):
        self.stack, self.deadline, self.clock = stack, deadline, clock

    def run(self, *args: str, with_stack: bool = True) -> tuple[Optional[str], Optional[str]]:
        exe = shutil.which("pulumi")
        shown = "pulumi " + " ".join(args)
        if not exe:
            return None, f"`{shown}`: the Pulumi CLI is not on PATH"
        timeout = max(5.0, min(PULUMI_TIMEOUT, self.deadline - self.clock()))
        argv = [exe, *args, *(["--stack", self.stack.name] if with_stack else [])]
        try:
            proc = subprocess.run(argv, cwd=self.stack.project_dir, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, env={**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"})  # fmt: skip
        except subprocess.TimeoutExpired:
            return None, f"`{shown}` took more than {timeout:.0f} s"
        except OSError as exc:
            return None, f"`{shown}`: {exc}"
        if proc.returncode != 0:
            return None, f"`{shown}` failed: {proc.stderr.strip()[-300:] or f'exit code {proc.returncode}'}"
        return proc.stdout, None

    def json(self, *args: str, with_stack: bool = True) -> tuple[Any, Optional[str]]:
        text, error = self.run(*args, with_stack=with_stack)
        if text is None:
            return None, error
        try:
            return json.loads(text), None
        except ValueError:
            return None, f"`pulumi {' '.join(args)}` printed no JSON"


# ------------------------------------------------------------------------------------------------ gathering


def versions_cmd(container: str, image: str, engine: str) -> str:
    """`<name> <value>` lines: kernel, OS, docker, driver, GPU, the rank's image, the engine's version in it."""
    version = f"import importlib.metadata as m; print(m.version({engine!r}))"
    items = (("kernel", "uname -r"), ("os", '. /etc/os-release && echo "$PRETTY_NAME"'),
             ("docker", "docker version --format '{{.Server.Version}}'"),
             ("driver", "nvidia-smi --query-gpu=driver_version --format=csv,noheader"),
             ("gpu", "nvidia-smi --query-gpu=name --format=csv,noheader"),
             ("container_image", f"docker inspect --format '{{{{.Image}}}}' {q(container)}"),
             ("image", f"docker image inspect --format '{{{{.Id}}}} {{{{json .RepoDigests}}}}' {q(image)}"),
             ("engine_version", f"timeout 10 docker exec {q(container)} python3 -c {q(version)}"))  # fmt: skip
    return sh_c("\n".join([VERSIONS_MARK, *(f"printf '%s %s\\n' {n} \"$( ({c}) 2>&1 | tail -n 1)\"" for n, c in items)]))


def parse_versions(out: str) -> dict:
    doc = {}
    for line in out.splitlines():
        name, _, value = line.partition(" ")
        if re.fullmatch(r"[a-z_]+", name):
            doc[name] = value.strip() or None
    return doc


def local_versions(cli: PulumiCli) -> dict:
    def git(*args: str) -> Optional[str]:
        try:
            proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    def version(package: str) -> Optional[str]:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    status = git("status", "--porcelain")
    cli_version, cli_error = cli.run("version", with_stack=False)
    plugins, plugins_error = cli.json("plugin", "ls", "--json", with_stack=False)
    return {"dspark": {"git": git("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)},
            "python": sys.version.split()[0], "platform": platform.platform(),
            "packages": {p: version(p) for p in PACKAGES},
            "pulumi": {"version": (cli_version or "").strip() or None, "error": cli_error},
            "plugins": [{k: p.get(k) for k in ("name", "kind", "version")} for p in plugins or [] if isinstance(p, dict)],
            "plugins_error": plugins_error}  # fmt: skip


def node_versions(stack: Stack, nodes: Nodes, images: dict[int, str]) -> list[dict]:
    def one(node: Node) -> dict:
        code, out = nodes.run(node, versions_cmd(node.container, images.get(node.rank, stack.cfg.image), stack.cfg.engine))
        doc = {"rank": node.rank, "node": node.name, "engine": stack.cfg.engine,
               "engine_version_planned": stack.cfg.engine_version}  # fmt: skip
        return {**doc, **parse_versions(out)} if code == 0 else {**doc, "error": _last(out, code)}

    return nodes.each(one)


def _last(out: str, code: int) -> str:
    return out.strip().splitlines()[-1] if out.strip() else f"exit code {code}"


def container_logs(nodes: Nodes, node: Node, container: str, tail: int, boot: bool) -> dict:
    """The last `tail` lines, and (`boot`) the first BOOT_LINES when the log is longer than that."""
    code, last = nodes.run(node, logs_cmd(container, tail=str(tail)))
    if code != 0:
        return {"error": _last(last, code)}
    doc = {"last": last, "whole": len(last.splitlines()) < tail}
    if boot and not doc["whole"]:
        hcode, head = nodes.run(node, sh_c(f"{logs_cmd(container)} | head -n {BOOT_LINES}"))
        doc["boot"] = head if hcode == 0 else None
    return doc


def masked_config(stack: Stack) -> dict:
    doc = yaml.safe_load((stack.project_dir / f"Pulumi.{stack.short}.yaml").read_text()) or {}

    def mask(v: Any) -> Any:
        if isinstance(v, dict):
            return redaction.PLACEHOLDER if set(v) == {"secure"} else {k: mask(x) for k, x in v.items()}
        return [mask(x) for x in v] if isinstance(v, list) else v

    return mask(doc)


def last_up(cli: PulumiCli, export: Optional[dict], export_error: Optional[str]) -> dict:
    history, error = cli.json("stack", "history", "--json", "--page-size", "1")
    deployment = (export or {}).get("deployment") or {}
    return {
        "update": history[0] if isinstance(history, list) and history else None, "history_error": error,
        "init_errors": [{"urn": r.get("urn"), "errors": r["initErrors"]} for r in deployment.get("resources") or []
                        if isinstance(r, dict) and r.get("initErrors")],
        "pending_operations": [{"type": p.get("type"), "urn": (p.get("resource") or {}).get("urn")}
                               for p in deployment.get("pending_operations") or [] if isinstance(p, dict)],
        "state_error": export_error,
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------ the run


def run(stack: Stack, out: TextIO, err: TextIO, runner: Optional[Runner] = None, out_file: Optional[str] = None,
        timeout: float = TIMEOUT, tail: int = TAIL, up_log: Optional[str] = None,
        http_status: Optional[Callable] = None, clock: Callable[[], float] = time.monotonic,
        forward: Optional[Callable] = None) -> int:  # fmt: skip
    started, now = clock(), dt.datetime.now(dt.timezone.utc)
    deadline = started + timeout
    target = _target(stack, out_file, now)
    red = redaction.Redactor()
    cli = PulumiCli(stack, deadline, clock)
    manifest: dict = {"stack": stack.short, "group": stack.group, "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                      "timeout_s": timeout, "parts": {}, "secret_sources": {}, "notes": []}  # fmt: skip
    parts, sources, notes = manifest["parts"], manifest["secret_sources"], manifest["notes"]

    # every secret the stack knows, before anything is written
    outputs, outputs_error = stack.try_outputs()
    plain, plain_error = cli.json("stack", "output", "--json")
    redaction.outputs_secrets(red, outputs, plain)
    sources["outputs"] = "read" if outputs else outputs_error
    sources["outputs_marked_secret"] = "read" if plain is not None else plain_error
    config_doc, config_error = cli.json("config", "--show-secrets", "--json")
    redaction.config_secrets(red, config_doc)
    sources["config"] = "read" if config_doc is not None else config_error
    export, export_error = cli.json("stack", "export", "--show-secrets")
    looked = redaction.state_secrets(red, export)
    sources["state"] = f"read ({looked} encrypted values)" if export is not None else export_error
    sources["local"] = redaction.local_secrets(red, stack.cfg.ssh.identity_file) or "none"
    with_logs = red.has("api-key")
    if not with_logs:
        notes.append("logs withheld: the API key (to redact them) is in neither the outputs nor the config")

    members: list[tuple[str, str]] = []

    def part(name: str, fn: Callable[[], Any]) -> Any:
        try:
            value = fn()
            parts.setdefault(name, "ok")
            return value
        except Exception as exc:  # noqa: BLE001 - one part failing never stops the file
            parts[name] = f"failed: {type(exc).__name__}: {exc}"
            return None

    def add(name: str, text: str) -> None:
        members.append((name, red.redact(text)))

    bounded = Bounded(runner, deadline, max(1.0, timeout / 3), clock)
    nodes = Nodes(stack.cfg, stack.plan_name, runner=bounded, forward=forward)
    local = part("versions (local)", lambda: local_versions(cli))
    config = part("config", lambda: masked_config(stack))
    plan = part("plan", lambda: cmd_plan.build(stack))
    status = part("status", lambda: cmd_status.collect(stack, nodes, http_status))
    doctor = part("doctor", lambda: _doctor(stack, nodes, http_status))
    images = {n["rank"]: n["container"]["image"] for n in (plan or {}).get("nodes") or []}
    versions = part("versions (nodes)", lambda: node_versions(stack, nodes, images))
    logs = part("logs", lambda: nodes.each(lambda n: container_logs(nodes, n, n.container, tail, True))) if with_logs else None
    gateway = part("gateway logs", lambda: _gateway_logs(stack, nodes, tail)) if with_logs else None
    guard = part("guard", lambda: _guard(stack, nodes))
    up = part("last up", lambda: last_up(cli, export, export_error))
    up_text = part("last up log", lambda: Path(up_log).read_text(errors="replace")) if up_log else None

    add("versions.json", to_json({"local": local, "nodes": versions}) + "\n")
    if config is not None:
        add("config.json", to_json(config) + "\n")
    for name, doc in (("plan.json", plan), ("outputs.json", outputs if outputs else {"error": outputs_error}),
                      ("status.json", status), ("doctor.json", doctor)):  # fmt: skip
        if doc is not None:
            add(name, to_json(doc) + "\n")
    for node, doc in zip(nodes, logs or []):
        _add_log(add, f"rank{node.rank}-{node.name}", doc, nccl=True)
    for name, doc in gateway or []:
        _add_log(add, name, doc)
    if guard:
        for name, doc in guard["logs"]:
            _add_log(add, name, doc)
        if guard["journal"] is not None:
            add("guard/journal.json", to_json(guard["journal"]) + "\n")
    if up is not None:
        add("last-up.json", to_json(up) + "\n")
    if up_text is not None:
        add("last-up.txt", up_text)

    answered = [{"rank": n.rank, "node": n.name, "host": n.host, "answered": n.host not in bounded.down,
                 "error": bounded.down.get(n.host), "commands_not_run": bounded.skipped.get(n.host, 0)} for n in nodes]  # fmt: skip
    manifest.update(nodes=answered, elapsed_s=round(clock() - started, 1))
    summary = red.redact(_summary(stack, manifest, status, doctor, versions, local, up, [m for m, _ in members]))
    manifest["redaction"] = red.report()  # counted last: the summary's own redactions included
    manifest["files"] = ["SUMMARY.md", "diagnose.json", *(m for m, _ in members)]
    summary += red.redact(_redaction_text(manifest["redaction"], sources))
    try:
        size = write_archive(target, [("SUMMARY.md", summary), ("diagnose.json", red.redact(to_json(manifest) + "\n")),
                                      *members])  # fmt: skip
    except OSError as exc:
        raise DsparkError(f"cannot write {target}: {exc}") from None
    silent = [a for a in answered if not a["answered"]]
    lines = [f"wrote {target} ({size / 1024:.0f} KiB, {len(members) + 2} files, mode 600) in {manifest['elapsed_s']} s; "
             "read its SUMMARY.md first, then attach it to an issue"]
    if status:
        lines.append(f"status {status['verdict'].upper()} (exit {status['exit_code']})" +
                     (f", doctor {len(doctor['findings'])} finding(s)" if doctor else ""))  # fmt: skip
    lines += [f"did not answer: {a['node']} ({a['host']}): {a['error']}" for a in silent]
    lines += [f"part {p}: {v}" for p, v in parts.items() if v != "ok"]
    total = sum(v["occurrences_redacted"] for v in manifest["redaction"].values())
    counts = ", ".join(f"{k} {v['occurrences_redacted']}" for k, v in manifest["redaction"].items()
                       if v["occurrences_redacted"])  # fmt: skip
    lines.append(f"redacted {total} occurrence(s) of secrets ({counts or 'none found'})")
    out.write(red.redact("\n".join(lines)) + "\n")
    return 0


def _target(stack: Stack, out_file: Optional[str], now: dt.datetime) -> Path:
    name = f"diagnose-{stack.plan_name}-{now.strftime('%Y%m%dT%H%M%SZ')}.tar.gz"
    if not out_file:
        return Path.cwd() / name
    path = Path(out_file)
    return path / name if path.is_dir() else path


def _doctor(stack: Stack, nodes: Nodes, http_status: Optional[Callable]) -> dict:
    buf = io.StringIO()
    cmd_doctor.run(stack, nodes, True, buf, http_status)
    return json.loads(buf.getvalue())


def _gateway_logs(stack: Stack, nodes: Nodes, tail: int) -> list[tuple[str, dict]]:
    gp = stack.gateway_plan()
    if gp is None:
        return []
    n = gp.node
    node = Node(n.rank, n.name, n.host, n.ssh_user, n.ssh_port, gp.gateway.name)
    return [(f"{role}-{n.name}", container_logs(nodes, node, c.name, tail, False))
            for role, c in (("gateway", gp.gateway), ("gateway-db", gp.database))]  # fmt: skip


def _guard(stack: Stack, nodes: Nodes) -> Optional[dict]:
    gp = cmd_guard.plan_of(stack)
    if gp is None:
        return None
    head = nodes[0]
    code, text = nodes.run(head, cmd_guard.journal_cmd(gp.nodes[0].dir, commands.key_sudo(stack.cfg, head.user)))
    try:
        journal = json.loads(text) if code == 0 else {"error": _last(text, code)}
    except ValueError:
        journal = {"error": "the journal is not JSON", "text": text[-2000:]}
    logs = nodes.each(lambda n: container_logs(nodes, n, gp.nodes[n.rank].container_name, SIDE_TAIL, False))
    return {"journal": journal, "logs": [(f"guard-{n.name}", doc) for n, doc in zip(nodes, logs)]}


def _add_log(add: Callable[[str, str], None], name: str, doc: dict, nccl: bool = False) -> None:
    if "error" in doc:
        add(f"logs/{name}.log", f"(no log: {doc['error']})\n")
        return
    add(f"logs/{name}.log", doc["last"])
    if doc.get("boot"):
        add(f"logs/{name}.boot.log", doc["boot"])
    if nccl:
        lines = dict.fromkeys(line for text in (doc.get("boot") or "", doc["last"]) for line in text.splitlines()
                              if bootlog.NCCL_TRANSPORT_LINE.search(line))  # fmt: skip
        add(f"nccl/{name}.log", "".join(line + "\n" for line in lines) or
            "(no NCCL transport line: NCCL logs them at serving.ncclDebug: true)\n")  # fmt: skip


# ------------------------------------------------------------------------------------------------ the file


def _summary(stack: Stack, m: dict, status: Optional[dict], doctor: Optional[dict], versions: Optional[list],
             local: Optional[dict], up: Optional[dict], files: list[str]) -> str:  # fmt: skip
    name = stack.short + (f" (group {stack.group})" if stack.group else "")
    silent = [a for a in m["nodes"] if not a["answered"]]
    out = [f"# deepseek-spark diagnose: stack {name}, {m['time']}", "",
           f"Made by `python -m dspark diagnose` (dspark {((local or {}).get('dspark') or {}).get('git') or '?'}) in "
           f"{m['elapsed_s']} s (deadline {m['timeout_s']:g} s). Every secret the stack knows is redacted: see the end.",
           "", "## Nodes", ""]  # fmt: skip
    out.append(table(["RANK", "NODE", "HOST", "ANSWERED", "WHY NOT"],
                     [[a["rank"], a["node"], a["host"], a["answered"], a["error"]] for a in m["nodes"]]))
    if silent:
        out += ["", f"**{', '.join(a['node'] for a in silent)} did not answer**: what they would have given (their "
                "rank's log, preflight, versions) is missing; the rest was gathered."]  # fmt: skip
    skipped = [a for a in m["nodes"] if a["commands_not_run"]]
    out += [f"- {a['node']}: {a['commands_not_run']} command(s) not run, the deadline had passed" for a in skipped]
    bad = {p: v for p, v in m["parts"].items() if v != "ok"}
    if bad or m["notes"]:
        out += ["", "## Not gathered", ""] + [f"- {p}: {v}" for p, v in bad.items()] + [f"- {n}" for n in m["notes"]]
    for title, text in (("status", status and cmd_status.render_text(status)),
                        ("doctor", doctor and cmd_doctor.render_text(doctor))):  # fmt: skip
        if text:
            out += ["", f"## {title.capitalize()} (`dspark {title}`)", "", "```text", text.rstrip(), "```"]
    if up:
        u = up.get("update") or {}
        out += ["", "## Last update", ""]
        out.append(f"{u.get('kind')} {u.get('result')} (started {u.get('startTime')}, ended {u.get('endTime')}), "
                   f"changes {json.dumps(u.get('resourceChanges'))}" if u else f"none found ({up.get('history_error')})")
        out += [f"- {e['urn']}: {'; '.join(map(str, e['errors']))}" for e in up["init_errors"]]
        out += [f"- pending {p['type']}: {p['urn']}" for p in up["pending_operations"]]
        if "last-up.txt" not in files:
            out.append("(what `pulumi up` printed is not in this file: save it with `pulumi up ... 2>&1 | tee up.log` "
                       "and pass --up-log up.log)")  # fmt: skip
    out += ["", "## Versions", ""]
    if local:
        pk = ", ".join(f"{k} {v}" for k, v in local["packages"].items() if v)
        plugins = ", ".join(f"{p['name']} {p['version']}" for p in local["plugins"])
        out.append(f"Pulumi CLI {local['pulumi']['version'] or local['pulumi']['error']}; Python {local['python']}; "
                   f"{pk}; plugins: {plugins or '?'}")
    if versions:
        out.append("")
        out.append(table(["NODE", "KERNEL", "DOCKER", "DRIVER", "GPU", "RANK IMAGE", "ENGINE"],
                         [[v["node"], v.get("kernel"), v.get("docker"), v.get("driver"), v.get("gpu"),
                           (v.get("container_image") or "")[:19] or None,
                           f"{v['engine']} {v.get('engine_version') or '?'} (planned {v['engine_version_planned']})"
                           if "error" not in v else v["error"]] for v in versions]))  # fmt: skip
    out += ["", "## Files", ""]
    out += [f"- `{f}`: {DESCRIPTIONS.get(f) or _describe(f)}" for f in ["diagnose.json", *files]]
    return "\n".join(out) + "\n"


def _describe(name: str) -> str:
    kind = "NCCL's device and transport lines of" if name.startswith("nccl/") else (
        "the first lines (boot) of the log of" if name.endswith(".boot.log") else "the last lines of the log of")
    return f"{kind} {Path(name).name.removesuffix('.log').removesuffix('.boot')}"


def _redaction_text(report: dict, sources: dict) -> str:
    rows = [[k, v["values_known"], v["occurrences_redacted"], v["values_too_short"]] for k, v in report.items()]
    out = ["", "## Redaction", "",
           "Every secret value below was replaced with `[redacted <kind>]` wherever it appeared, as is, base64, "
           "URL-encoded, JSON-escaped or in part (12 characters or more); then whatever reads as a secret by name or "
           "shape (`password=`, `Bearer`, a private key, `sk-`/`hf_` tokens) as `by-name-or-shape`. No value is "
           "listed here.", "",
           table(["KIND", "VALUES KNOWN", "OCCURRENCES REDACTED", "TOO SHORT TO REDACT"], rows) if rows else "(none)",
           "", "Where the secret values came from:"]  # fmt: skip
    out += [f"- {k}: {v if isinstance(v, str) else ', '.join(v)}" for k, v in sources.items()]
    return "\n".join(out) + "\n"


def write_archive(path: Path, members: list[tuple[str, str]]) -> int:
    """A .tar.gz (mode 600 from the start, renamed into place), members under a folder named after it, in order."""
    folder = path.name.removesuffix(".tar.gz").removesuffix(".tgz")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    now = int(time.time())
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            with gzip.GzipFile(filename=path.name, mode="wb", fileobj=f, mtime=now) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    for name, text in members:
                        data = text.encode()
                        info = tarfile.TarInfo(f"{folder}/{name}")
                        info.size, info.mtime, info.mode = len(data), now, 0o600
                        tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size
