"""One quoting discipline, proven by execution.

Every string of the stack config reaches the nodes' shells only through one quoting function
(`commands.q`, shlex.quote). This file proves it for every string field of the config model and for
the secrets: each gets shell-injection payloads whose only effect would be creating a marker file
(MARK, unique per case). A case is either

- refused at preview: `parse_cluster` raises ConfigError, `rules.check` returns errors, or the program
  refuses it (`config.load`: pulumi.RunError), or
- executed: the program runs under Pulumi mocks (harness.run_program) and every shell script it
  registered (remote/local Command create/update/delete, rank containers' `/bin/sh -c` entrypoints
  with their args) runs under /bin/sh with a PATH of stub tools only, in a sandbox, in three node
  states (broken node, fresh node, same node again), so failure branches and "already done" branches
  run too. MARK must never be created.

The string fields are walked from `ClusterConfig.model_fields`, so a field added later is covered
without touching this file. Identical script invocations are executed once (memoized): a script
that does not contain the case's payload is the same text as one already run.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import time
import types
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pulumi
import pytest
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

import harness
from components import commands, rules
from components.config import ClusterConfig, ConfigError, parse_cluster

STACKS = ("tp4", "tp2", "sim", "sim-tp2", "tp3")
TIMEOUT = 10  # seconds per script run: a hanging script fails the test instead of hanging it

# Every payload only ever creates MARK (an absolute path in the sandbox, unique per case).
PAYLOADS = {
    "dollar-paren": "$(touch {mark})",
    "backticks": "`touch {mark}`",
    "single-quote": "'; touch {mark}; '",
    "double-quote": '"; touch {mark}; "',
    "newline": "\ntouch {mark}\n",
    "semicolon": ";touch {mark}",
    # No whitespace: gets through checks that refuse spaces (paths, secrets) and still runs unquoted.
    "ifs-dollar-paren": "$(touch${{IFS}}{mark})",
    "ifs-single-quote": "';touch${{IFS}}{mark};'",
    "ifs-double-quote": '";touch${{IFS}}{mark};"',
}

# Secrets are config keys of their own, not fields of the model: (run_program argument, value prefix).
SECRETS = {
    "secret:apiKey": ("api_key", harness.TEST_API_KEY),
    "secret:sshPrivateKey": ("ssh_key", "-----BEGIN TEST KEY-----"),
    "secret:hfToken": ("hfToken", "hf_0123456789abcdef"),
}

# ------------------------------------------------------------------------------ the config model

ITEM, KEY, VALUE = "[]", "<key>", "<value>"


def _strip(tp: Any) -> Any:
    """Annotated[T, ...] -> T (pydantic keeps Annotated inside unions, lists and dicts)."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _options(tp: Any) -> list[Any]:
    """The non-None members of an Optional/Union, or [tp]."""
    tp = _strip(tp)
    if get_origin(tp) in (Union, types.UnionType):
        return [_strip(a) for a in get_args(tp) if a is not type(None)]
    return [tp]


def _model(tp: Any) -> type[BaseModel] | None:
    for t in _options(tp):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def _walk_type(tp: Any, path: tuple[str, ...]):
    for t in _options(tp):
        origin = get_origin(t)
        if t is str or (origin is Literal and all(isinstance(a, str) for a in get_args(t))):
            yield path
        elif origin is list:
            yield from _walk_type(get_args(t)[0], path + (ITEM,))
        elif origin is dict:
            key, value = get_args(t)
            if str in _options(key):
                yield path + (KEY,)
            yield from _walk_type(value, path + (VALUE,))
        elif isinstance(t, type) and issubclass(t, BaseModel):
            yield from string_fields(t, path)
        elif t in (int, float, bool) or origin is Literal:
            continue
        else:
            raise TypeError(f"{'.'.join(path)}: teach this test the field type {t!r}")


def string_fields(model: type[BaseModel] = ClusterConfig, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every place a string goes in the config, as a path of YAML (camelCase) names, ITEM, KEY, VALUE."""
    out = []
    for name, info in model.model_fields.items():
        out += _walk_type(info.annotation, path + (info.alias or name,))
    return out


def label(path: tuple[str, ...]) -> str:
    out = ""
    for part in path:
        out += part if part == ITEM else (f".{part}" if out else part)
    return out


def _field_info(model: type[BaseModel], alias: str):
    return next(info for name, info in model.model_fields.items() if (info.alias or name) == alias)


def _filler(tp: Any, seeds: dict[str, Any], where: str) -> Any:
    """A value for a required field of a section the stack does not have."""
    if where in seeds:
        return seeds[where]
    model = _model(tp)
    if model is not None:
        return _section(model, seeds, where)
    t = _options(tp)[0]
    if get_origin(t) is Literal:
        return get_args(t)[0]
    return {str: "x", int: 1, float: 1.0, bool: False}.get(t, [] if get_origin(t) is list else {})


def _section(model: type[BaseModel], seeds: dict[str, Any], where: str) -> dict:
    return {
        (info.alias or name): _filler(info.annotation, seeds, f"{where}.{info.alias or name}")
        for name, info in model.model_fields.items()
        if info.is_required()
    }


def _put(data: Any, path: tuple[str, ...], tp: Any, payload: str, index: int, seeds: dict, where: str) -> Any:
    """`data` (raw YAML value of type `tp`) with the payload placed at `path`."""
    if not path:  # the string itself: keep what was there (a valid prefix gets past shape checks)
        return (data if isinstance(data, str) else "") + payload
    head, rest = path[0], path[1:]
    model = _model(tp)
    if model is not None:
        out = dict(data) if isinstance(data, dict) else _section(model, seeds, where)
        info = _field_info(model, head)
        current = out.get(head)
        if current is None and isinstance(info.default, str):
            current = info.default
        elif current is None and info.default_factory is not None:
            current = info.default_factory()
        out[head] = _put(current, rest, info.annotation, payload, index, seeds, f"{where}.{head}")
        return out
    t = next(t for t in _options(tp) if get_origin(t) in (list, dict))
    if get_origin(t) is list:
        items = list(data) if isinstance(data, list) else []
        elem = get_args(t)[0]
        if _model(elem) is not None:  # a list of sections (nodes): payload one of them
            if not items:
                items = [_section(_model(elem), seeds, where)]
            i = index % len(items)
            items[i] = _put(items[i], rest, elem, payload, index, seeds, where)
        else:  # a list of strings: one more item
            items.append(_put(None, rest, elem, payload, index, seeds, where))
        return items
    out = dict(data) if isinstance(data, dict) else {}
    if head == KEY:
        out[payload] = "injected"
    else:
        out["DSPARK_INJECTED"] = _put(None, rest, get_args(t)[1], payload, index, seeds, where)
    return out


def inject(raw: dict, path: tuple[str, ...], payload: str, index: int, seeds: dict) -> dict:
    return _put(copy.deepcopy(raw), path, ClusterConfig, payload, index, seeds, "")


def node_indices(path: tuple[str, ...], raw: dict) -> list[int]:
    """Which list item a payload goes to: the head and the last worker for `nodes[]...` fields."""
    if ITEM not in path or path[path.index(ITEM) - 1] != "nodes":
        return [0]
    return sorted({0, len(raw.get("nodes", [])) - 1})


# ------------------------------------------------------------------------------ the sandbox

REAL_TOOLS = ("awk", "basename", "cat", "cut", "date", "dirname", "echo", "env", "expr", "false", "grep", "head",
              "id", "ls", "printf", "sed", "seq", "sort", "stat", "tail", "test", "tr", "true", "uname", "wc",
              "xargs")  # fmt: skip
WRITERS = ("chmod", "chown", "cp", "install", "ln", "mkdir", "mv", "rm", "rmdir", "tee", "touch", "truncate")
STUBS = {
    "docker": r"""[ -n "${STUB_BROKEN:-}" ] && { echo "docker: cannot connect to the daemon" >&2; exit 1; }
case "$1" in
  info) echo 28.0 ;;
  run)
    dl=""; out=""; rank=0; tp=1; prev=""
    for a in "$@"; do
      case "$a" in *:/download) dl=${a%:/download} ;; *:/engram) out=${a%:/engram} ;; esac
      case "$prev" in --rank) rank=$a ;; --tp) tp=$a ;; esac
      prev=$a
    done
    case "$dl" in __ROOT__/*) i=1; while [ "$i" -le 64 ]; do : > "$dl/model-$i.safetensors"; i=$((i + 1)); done ;; esac
    case "$out" in __ROOT__/*) for l in 1 14; do echo packed > "$out/engram-l$l-r${rank}of$tp.bin"; done ;; esac ;;
esac
exit 0""",
    "nvidia-smi": r"""case "$1" in
  -L) [ -z "${STUB_BROKEN:-}" ] && echo "GPU 0: NVIDIA GB10 (UUID: GPU-x)" ;;
  --query-compute-apps=*) [ -n "${STUB_BROKEN:-}" ] && echo 4242 ;;
esac
exit 0""",
    "ethtool": r"""if [ -n "${STUB_BROKEN:-}" ]; then speed=1000; link=no; else speed=10000000; link=yes; fi
printf 'Settings for %s:\n\tSpeed: %sMb/s\n\tLink detected: %s\n' "$1" "$speed" "$link"
""",
    "df": r"""if [ -n "${STUB_BROKEN:-}" ]; then avail=1; else avail=999999999999; fi
echo "Filesystem 1024-blocks Used Available Capacity Mounted on"; echo "/dev/nvme0n1 1 1 $avail 1% /"
""",
    "sudo": r"""[ -n "${STUB_BROKEN:-}" ] && { echo "sudo: a password is required" >&2; exit 1; }
while [ "$#" -gt 0 ]; do case "$1" in --) shift; break ;; -*) shift ;; *) break ;; esac; done
exec "$@"
""",
    "python3": "cat >/dev/null 2>&1; exit 0",
    "sleep": "exit 0",
    **{name: "exit 0" for name in ("ssh", "scp", "exportfs", "mount", "umount", "ibdev2netdev", "ray", "vllm",
                                   "huggingface-cli", "hf", "systemctl", "ip", "curl", "wget", "nvidia-ctk")},
}  # fmt: skip
GUARD = r"""# the real {name}, but only on paths inside the sandbox
for a in "$@"; do
  case "$a" in
    *..*) ok=0 ;;
    --*|-*[!A-Za-z]*) ok=0 ;;
    /*) case "$a" in {root}/*) ok=1 ;; *) ok=0 ;; esac ;;
    *) ok=1 ;;
  esac
  if [ "$ok" -eq 0 ]; then
    echo "stub {name}: refused $a (outside the sandbox)" >&2
    {drain}exit 0
  fi
done
exec {real} "$@"
"""
MODES = (  # (name, reset the node first, environment)
    ("broken-node", True, {"STUB_BROKEN": "1"}),
    ("fresh-node", True, {}),
    ("same-node-again", False, {}),
)


@dataclass(frozen=True)
class Invocation:
    resource: str
    what: str  # create / update / delete / entrypoint
    argv: tuple[str, ...]
    stdin: str | None
    env: tuple[tuple[str, str], ...]

    def text(self) -> str:
        return "\0".join([*self.argv, self.stdin or "", *(f"{k}={v}" for k, v in self.env)])


@dataclass
class Run:
    inv: Invocation
    mode: str
    rc: int
    stderr: str


class Sandbox:
    """A stub PATH and a node's directories, all under one tmp dir."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.marks = root / "marks"
        self.data = root / "data"  # reset before each fresh run: checkpoint, engram, state, HOME, cwd
        self.known_hosts_dir = root / "kh"
        for d in (self.bin, self.marks, self.known_hosts_dir):
            d.mkdir(parents=True)
        self._write_tools()
        self.ckpt, self.engram, self.state = self.data / "ckpt", self.data / "engram", self.data / "state"
        self.home, self.work = self.data / "home", self.data / "work"
        self.reset(broken=False)
        self.done: dict[Invocation, list[Run]] = {}
        self._ids = itertools.count()

    def _write_tools(self) -> None:
        path = "/usr/local/bin:/usr/bin:/bin"
        for name in REAL_TOOLS:
            real = shutil.which(name, path=path)
            if real:
                (self.bin / name).symlink_to(real)
        (self.bin / "sh").symlink_to("/bin/sh")
        for name, body in STUBS.items():
            self._script(name, body.replace("__ROOT__", shlex.quote(str(self.root))))
        for name in WRITERS:
            real = shutil.which(name, path=path)
            if real:
                drain = "cat >/dev/null; " if name == "tee" else ""
                self._script(name, GUARD.format(name=name, root=shlex.quote(str(self.root)), real=real, drain=drain))

    def _script(self, name: str, body: str) -> None:
        (self.bin / name).write_text("#!/bin/sh\n" + body + "\n")
        (self.bin / name).chmod(0o755)

    def mark(self) -> Path:
        return self.marks / f"mark-{next(self._ids)}.x"  # no mark's path is a prefix of another's

    def reset(self, broken: bool) -> None:
        shutil.rmtree(self.data, ignore_errors=True)
        for d in (self.ckpt, self.engram, self.state, self.home, self.work):
            d.mkdir(parents=True)
        if broken:  # stale stamps of another revision: the re-download / re-pack branches run
            (self.ckpt / ".deepseek-spark-download").write_text("stale\n")
            for tp in range(1, 9):
                for rank in range(tp):
                    (self.engram / f".engram-r{rank}of{tp}.revision").write_text("stale\n")
        else:  # a complete checkpoint: the preflight checks pass
            (self.ckpt / "config.json").write_text("{}")
            for i in range(1, 65):
                (self.ckpt / f"model-{i:05d}-of-00064.safetensors").write_text("")

    def base(self, stack: str) -> dict:
        """The stack file's cluster with every node path inside the sandbox."""
        raw = harness.cluster_of(stack)
        raw["model"]["checkpointDir"] = str(self.ckpt)
        if isinstance(raw.get("engram"), dict):
            raw["engram"]["dir"] = str(self.engram)
        raw["stateDir"] = str(self.state)
        raw["ssh"] = {**raw.get("ssh", {}), "knownHostsFile": str(self.known_hosts_dir / "known_hosts")}
        return raw

    def seeds(self) -> dict[str, Any]:
        """Required fields of sections a stack file does not have."""
        return {".imageBuild.context": "sim/overlay", ".engram.dir": str(self.engram)}

    def prepare_known_hosts(self, raw: dict) -> None:
        """run_program replaces a known_hosts file that does not exist: write the nodes' (fake) keys to
        the one the case names, so a payload in ssh.knownHostsFile reaches the program."""
        path = (raw.get("ssh") or {}).get("knownHostsFile")
        if not isinstance(path, str) or not path.startswith(str(self.root) + "/") or ".." in path:
            return
        text = ""
        if hasattr(harness, "with_known_hosts"):
            other = {**raw, "ssh": {k: v for k, v in raw["ssh"].items() if k != "knownHostsFile"}}
            made = harness.with_known_hosts(other).get("ssh", {}).get("knownHostsFile")
            text = Path(made).read_text() if made else ""
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        except OSError:
            pass

    def execute(self, inv: Invocation) -> list[Run]:
        """Run one invocation in every node state (once: identical invocations are memoized)."""
        if inv in self.done:
            return []
        runs = []
        for mode, reset, mode_env in MODES:
            if reset:
                self.reset(broken=bool(mode_env))
            env = {k: v for k, v in inv.env if k and "=" not in k and "\0" not in k + v}
            env.update(PATH=str(self.bin), HOME=str(self.home), TMPDIR=str(self.work), LC_ALL="C", **mode_env)
            rc, err = _run(list(inv.argv), inv.stdin, env, self.work)
            runs.append(Run(inv, mode, rc, err))
        self.done[inv] = runs
        return runs


def _run(argv: list[str], stdin: str | None, env: dict[str, str], cwd: Path) -> tuple[int, str]:
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True, text=True,
    )  # fmt: skip
    try:
        _, err = proc.communicate(stdin, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return -1, err + f"\n[timed out after {TIMEOUT}s]"
    return proc.returncode, err


# ------------------------------------------------------------------------------ the program's scripts

SHELLS = ("/bin/sh", "sh", "/bin/bash", "bash", "/bin/dash", "dash", "/usr/bin/env sh")
COMMANDS = ("command:remote:Command", "command:local:Command")
CONTAINER = "docker:index/container:Container"
# Resource types whose inputs reach no shell: image names, volume options, ssh argv for the provider.
NO_SHELL = ("pulumi:providers:docker", "pulumi:providers:command", "docker:index/remoteImage:RemoteImage",
            "docker:index/image:Image", "docker:index/volume:Volume", "docker:index/network:Network")  # fmt: skip


def scripts(rec: harness.Recording) -> tuple[list[Invocation], list[str]]:
    """Every shell invocation the program registered, and the types this test does not know."""
    out, unknown = [], []
    for r in rec.resources:
        plain = r.plain
        if r.type in COMMANDS:
            interpreter = plain.get("interpreter") or ["/bin/sh", "-c"]
            env = tuple(sorted((plain.get("environment") or {}).items()))
            for what in ("create", "update", "delete"):
                if plain.get(what):
                    out.append(Invocation(r.name, what, (*interpreter, plain[what]), plain.get("stdin"), env))
        elif r.type == CONTAINER:
            full = [*(plain.get("entrypoints") or []), *(plain.get("command") or [])]
            env = tuple(sorted(tuple(e.split("=", 1)) for e in plain.get("envs") or [] if "=" in e))
            if len(full) >= 3 and full[0] in SHELLS and full[1] == "-c":
                out.append(Invocation(r.name, "entrypoint", ("/bin/sh", "-c", *full[2:]), None, env))
            else:  # exec form: no shell parses the arguments
                assert not full or os.path.basename(full[0]) not in ("sh", "bash", "dash"), (r.name, full[:2])
        elif r.custom and r.type not in NO_SHELL:
            unknown.append(r.type)
    return out, unknown


def script_texts(rec: harness.Recording) -> list[str]:
    """What may never hold a secret: scripts, container args and env, labels (stdin and a local
    command's environment are where secrets go)."""
    texts = []
    for r in rec.resources:
        p = r.plain
        if r.type in COMMANDS:
            texts += [p.get(k) or "" for k in ("create", "update", "delete")]
        elif r.type == CONTAINER:
            texts += [*(p.get("entrypoints") or []), *(p.get("command") or []), *(p.get("envs") or [])]
            texts += [str(label) for label in p.get("labels") or []]
    return texts


# ------------------------------------------------------------------------------ cases


@dataclass
class Outcome:
    stack: str
    field: str  # label of the field, with [i] for the node it went to
    payload: str
    status: str  # refused:parse, refused:rules, refused:load, executed
    reached_shell: bool = False  # the payload was part of a script, its args, env or stdin
    runs: int = 0  # script runs of this case (memoized invocations excluded)
    problems: list[str] = field(default_factory=list)


def _rule_errors(cfg: ClusterConfig, stack: str) -> list:
    params = inspect.signature(rules.check).parameters
    errors, _ = rules.check(cfg, stack) if len(params) > 1 else rules.check(cfg)
    return errors


def run_case(sb: Sandbox, stack: str, where: str, raw: dict, payload_name: str, secret_args: dict,
             value: str, mark: Path) -> Outcome:  # fmt: skip
    out = Outcome(stack, where, payload_name, "executed")
    try:
        cfg = parse_cluster(raw)
    except ConfigError:
        out.status = "refused:parse"
        return out
    if _rule_errors(cfg, stack):
        out.status = "refused:rules"
        return out
    sb.prepare_known_hosts(raw)
    run_args = {k: v for k, v in secret_args.items() if k in ("api_key", "ssh_key")}
    extra = {k: v for k, v in secret_args.items() if k not in run_args}
    try:
        rec = harness.run_program(stack, cluster=raw, secrets=extra or None, **run_args)
    except (pulumi.RunError, ConfigError):
        out.status = "refused:load"
        return out
    invocations, unknown = scripts(rec)
    if unknown:
        out.problems.append(f"resource types this test cannot classify (do they run a shell?): {sorted(set(unknown))}")
    if secret_args:
        leaked = [t[:80] for t in script_texts(rec) if value in t]
        if leaked:
            out.problems.append(f"the secret is part of a script, an argument or a container env: {leaked}")
    out.reached_shell = any(str(mark) in inv.text() for inv in invocations)
    for inv in invocations:
        for run in sb.execute(inv):
            out.runs += 1
            if run.rc == -1:
                out.problems.append(f"{inv.resource} {inv.what} ({run.mode}) hung: {run.stderr[-300:]}")
            if mark.exists():
                out.problems.append(
                    f"INJECTION: {inv.resource} {inv.what} ({run.mode}) created the marker; stderr: {run.stderr[-300:]!r}"
                )
                mark.unlink()
    return out


def stack_cases(sb: Sandbox, stack: str):
    """(field label, raw config, payload name, secret args, value, mark) for every case of a stack."""
    base = sb.base(stack)
    for path in string_fields():
        for index in node_indices(path, base):
            where = label(path).replace("nodes[]", f"nodes[{index}]")
            for name, template in PAYLOADS.items():
                mark = sb.mark()
                payload = template.format(mark=mark)
                yield where, inject(base, path, payload, index, sb.seeds()), name, {}, payload, mark
    for secret, (arg, prefix) in SECRETS.items():
        for name, template in PAYLOADS.items():
            mark = sb.mark()
            value = prefix + template.format(mark=mark)
            yield secret, base, name, {arg: value}, value, mark


_RESULTS: dict[str, list[Outcome]] = {}
_TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Sandbox:
    return Sandbox(tmp_path_factory.mktemp("shell-injection"))


def results(sb: Sandbox, stack: str) -> list[Outcome]:
    if stack not in _RESULTS:
        start = time.monotonic()
        _RESULTS[stack] = [run_case(sb, stack, *case) for case in stack_cases(sb, stack)]
        _TIMES[stack] = time.monotonic() - start
    return _RESULTS[stack]


# ------------------------------------------------------------------------------ tests


def test_the_walk_finds_the_string_fields_of_the_model():
    found = {label(p) for p in string_fields()}
    for expected in ("nodes[].name", "nodes[].host", "model.checkpointDir", "model.hfRepo", "fabric.iface",
                     "serving.extraArgs[]", "serving.extraEnv.<key>", "serving.extraEnv.<value>",
                     "imageBuild.args.<key>", "readiness.prompt", "ssh.identityFile", "stateDir", "engine"):  # fmt: skip
        assert expected in found
    assert not {"serving.tpSize", "nodes[].sshPort", "memory.unifiedGiB"} & found


@pytest.mark.parametrize("name", PAYLOADS)
def test_the_executor_catches_naive_quoting(sandbox, name):
    """Self-check: each payload does create MARK in some naive context (bare, '...', "..."), and never
    once shlex.quote'd. So a MARK-free run below means the quoting held, not a blind executor."""
    fired = []
    for context in ("echo {}", "echo '{}'", 'echo "{}"', "x={}; echo \"$x\""):
        mark = sandbox.mark()
        payload = PAYLOADS[name].format(mark=mark)
        inv = Invocation("naive", context, ("/bin/sh", "-c", context.format(payload)), None, ())
        sandbox.execute(inv)
        if mark.exists():
            fired.append(context)
            mark.unlink()
        quoted = Invocation("quoted", context, ("/bin/sh", "-c", f"echo {commands.q(payload)}"), None, ())
        sandbox.execute(quoted)
        assert not mark.exists(), f"{name}: shlex.quote did not hold"
    assert fired, f"payload {name} never fires, even unquoted: it proves nothing"


def test_the_pipeline_catches_a_planted_bug(sandbox, monkeypatch):
    """Self-check of the whole chain (run_program -> collected scripts -> execution): a preflight
    that echoes readiness.prompt inside double quotes is caught."""
    original = commands.preflight
    monkeypatch.setattr(
        commands, "preflight", lambda cfg, stack, rank: f'echo "{cfg.readiness.prompt}"\n' + original(cfg, stack, rank)
    )
    mark = sandbox.mark()
    payload = PAYLOADS["dollar-paren"].format(mark=mark)
    raw = inject(sandbox.base("tp4"), ("readiness", "prompt"), payload, 0, sandbox.seeds())
    out = run_case(sandbox, "tp4", "readiness.prompt", raw, "dollar-paren", {}, payload, mark)
    if out.status != "executed":
        pytest.skip(f"readiness.prompt is now refused ({out.status}): plant the bug in another free-text field")
    assert out.reached_shell and any(p.startswith("INJECTION: tp4-spark1-preflight") for p in out.problems), out


@pytest.mark.parametrize("stack", STACKS)
def test_every_tool_the_scripts_call_is_stubbed(sandbox, stack):
    """The unmodified stack's scripts run against the stubs: no tool is missing (a missing tool would
    end a `set -e` script early and leave its later lines untested) and nothing hangs."""
    raw = sandbox.base(stack)
    sandbox.prepare_known_hosts(raw)
    invocations, unknown = scripts(harness.run_program(stack, cluster=raw))
    assert invocations and not unknown
    missing = []
    for inv in invocations:
        for run in sandbox.execute(inv) or sandbox.done[inv]:
            assert run.rc != -1, f"{inv.resource} {inv.what} hung"
            missing += [f"{inv.resource} {inv.what}: {line}" for line in run.stderr.splitlines() if "not found" in line]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("stack", STACKS)
def test_no_config_value_or_secret_is_ever_run_by_a_shell(sandbox, stack):
    outcomes = results(sandbox, stack)
    bad = [f"{o.field} <- {o.payload} ({o.status}): " + "; ".join(o.problems) for o in outcomes if o.problems]
    assert not bad, f"{len(bad)} case(s) of stack {stack} failed:\n  " + "\n  ".join(bad)
    assert not list(sandbox.marks.iterdir()), "a marker exists: some script ran a payload"


def test_summary(sandbox, capsys):
    """Which fields each stack refused at preview, and which reached the scripts and ran harmlessly."""
    per_field: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    counts: dict[str, int] = defaultdict(int)
    for stack in STACKS:
        for o in results(sandbox, stack):
            status = "executed+shell" if o.reached_shell else o.status
            per_field[o.field][status].add(stack)
            counts[o.status] += 1
            counts["runs"] += o.runs
    lines = [f"shell injection: {sum(v for k, v in counts.items() if k != 'runs')} cases, "
             f"{counts['executed']} executed ({counts['runs']} script runs), "
             f"{sum(v for k, v in counts.items() if k.startswith('refused'))} refused "
             f"(parse {counts['refused:parse']}, rules {counts['refused:rules']}, load {counts['refused:load']}); "
             + ", ".join(f"{s} {_TIMES.get(s, 0):.1f}s" for s in STACKS)]  # fmt: skip
    for name in sorted(per_field):
        parts = [f"{status}: {','.join(sorted(stacks))}" for status, stacks in sorted(per_field[name].items())]
        lines.append(f"  {name:32} " + " | ".join(parts))
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert counts["executed"] > 0, "every case was refused: the test proves nothing about the scripts"
    engines = {stack: harness.cluster_of(stack).get("engine", "sglang") for stack in STACKS}
    for engine in set(engines.values()):
        covered = {o.field for s in STACKS if engines[s] == engine for o in results(sandbox, s)}
        walked = {label(p) for p in string_fields()}
        assert {f.split("[", 1)[0] for f in walked} <= {f.split("[", 1)[0] for f in covered}, engine
