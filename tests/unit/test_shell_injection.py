"""One quoting discipline, proven by execution.

Every string of the stack config reaches the nodes' shells only through one quoting function
(`commands.q`, shlex.quote), never inside "...". This file proves it for every string field of the
config model and for the secrets: each gets shell-injection payloads whose only effect would be
creating a marker file (MARK: an absolute path in a tmp dir, unique per case). A case is either

- refused at preview: `parse_cluster` raises ConfigError, `rules.check` returns errors, or the program
  refuses it (`settings.load`: pulumi.RunError), or
- executed: the program runs under Pulumi mocks (harness.run_program) and every shell script it
  registered (remote/local Command create/update/delete, with their stdin and environment; rank
  containers' `/bin/sh -c` entrypoints with their args and env; the client env file and curl script
  rendered from the stack outputs) runs under /bin/sh with a PATH of
  stub tools only, in a sandbox, in three node states (broken node, fresh node, same node again), so
  failure branches and "already done" branches run too. MARK must never be created.

The string fields are walked from `ClusterConfig.model_fields`, so a field added later is covered
without touching this file. Node paths (checkpointDir, engram.dir, stateDir, ssh.knownHostsFile) of
each stack file are moved into the sandbox first; writes outside it are refused by the stubs.

Speed: every case is first checked alone at preview (cheap). The cases of one payload that preview
accepts then run together, each with its own MARK, so a stack needs one program run and one
execution of its scripts per payload, not per case; a MARK names the case that created it. Identical
script invocations run once (memoized).
"""

from __future__ import annotations

import copy
import inspect
import itertools
import os
import re
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

import harness
from dspark import clients
from planning import commands, rules
from declared.cluster import ClusterConfig, ConfigError, parse_cluster

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


def item_indices(path: tuple[str, ...], raw: dict) -> list[int] | None:
    """For a field inside a list of sections (nodes[].host): the items a payload goes to, the first
    (the head) and the last (a worker); None for any other field."""
    if ITEM not in path:
        return None
    value: Any = raw
    for part in path[: path.index(ITEM)]:
        value = value.get(part) if isinstance(value, dict) else None
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        return None
    return sorted({0, len(value) - 1})


# ------------------------------------------------------------------------------ the sandbox

REAL_TOOLS = ("awk", "base64", "basename", "cat", "cut", "date", "dirname", "echo", "env", "expr", "false", "grep", "head",
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
    # the download (64 shards) and the engram pack (this rank's shards), written only inside the sandbox
    case "$dl" in *..*) ;; __ROOT__/*) i=1; while [ "$i" -le 64 ]; do : > "$dl/model-$i.safetensors"; i=$((i + 1)); done ;; esac
    case "$out" in *..*) ;; __ROOT__/*) for l in 1 14; do echo packed > "$out/engram-l$l-r${rank}of$tp.bin"; done ;; esac ;;
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
list=0
while [ "$#" -gt 0 ]; do case "$1" in --) shift; break ;; -l) list=1; shift ;; -*) shift ;; *) break ;; esac; done
[ "$list" -eq 1 ] && { echo "$*"; exit 0; }  # sudo -l CMD: whether the rules allow it, never running it
exec "$@"
""",
    "python3": "cat >/dev/null 2>&1; exit 0",
    # rsync: the head's seed daemon writes its pid file and lingers 2 s; a worker's copy writes the
    # shards into its destination (only inside the sandbox); the dry re-check finds nothing left
    "rsync": r"""case " $* " in
  *" --daemon "*) conf=""; prev=""; for a in "$@"; do [ "$prev" = --config ] && conf=$a; prev=$a; done
    pid=$(sed -n 's/^pid file = //p' "$conf"); case "$pid" in *..*) ;; __ROOT__/*) echo $$ > "$pid" ;; esac
    exec /bin/sleep 2 ;;
  *" -rtn "*) exit 0 ;;
esac
for dest in "$@"; do :; done
case "$dest" in *..*) ;; __ROOT__/*) i=1; while [ "$i" -le 64 ]; do : > "$dest/model-$i.safetensors"; i=$((i + 1)); done ;; esac
exit 0""",
    "nohup": 'exec "$@"',
    "setsid": 'exec "$@"',
    "timeout": 'while [ "${1#-}" != "$1" ]; do shift; done; shift; exec "$@"',
    "sleep": "exit 0",
    **{name: "exit 0" for name in ("ssh", "scp", "exportfs", "mount", "umount", "ibdev2netdev", "ray", "vllm",
                                   "huggingface-cli", "hf", "systemctl", "ip", "curl", "wget", "nvidia-ctk",
                                   "ib_write_bw")},
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
    made: list[str]  # markers this run created (removed again)


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
        self.tp, self.shards = 1, 1  # the stack's, once base() read it
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
        if broken:  # stamps of another revision: the re-download / re-pack branches run
            (self.ckpt / ".deepseek-spark-download").write_text("stale\n")
            for rank in range(self.tp):
                (self.engram / f".engram-r{rank}of{self.tp}.revision").write_text("stale\n")
        else:  # a complete checkpoint: the preflight checks pass
            (self.ckpt / "config.json").write_text("{}")
            for i in range(1, self.shards + 1):
                (self.ckpt / f"model-{i:05d}-of-{self.shards:05d}.safetensors").write_text("")

    def base(self, stack: str) -> dict:
        """The stack file's cluster with every node path inside the sandbox."""
        raw = harness.cluster_of(stack)
        self.tp = int(raw.get("serving", {}).get("tpSize", 1))
        self.shards = int(raw["model"].get("expectedShards", 48))
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

    def _state(self) -> list[tuple[str, int, int]]:
        return sorted((str(p), p.lstat().st_size, p.lstat().st_mtime_ns) for p in self.data.rglob("*"))

    def execute(self, inv: Invocation) -> list[Run]:
        """Run one invocation in every node state (once: identical invocations are memoized). The
        second healthy run is skipped when the first changed nothing on the node (it would repeat it)."""
        if inv in self.done:
            return []
        runs = []
        for mode, reset, mode_env in MODES:
            if reset:
                self.reset(broken=bool(mode_env))
                before = self._state()
            elif self._state() == before:
                continue
            env = {k: v for k, v in inv.env if k and "=" not in k and "\0" not in k + v}
            env.update(PATH=str(self.bin), HOME=str(self.home), TMPDIR=str(self.work), LC_ALL="C", **mode_env)
            rc, err = _run(list(inv.argv), inv.stdin, env, self.work)
            made = sorted(str(p) for p in self.marks.iterdir())
            for p in made:
                os.unlink(p)
            runs.append(Run(inv, mode, rc, err, made))
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

SHELLS = ("sh", "bash", "dash", "ash")
COMMANDS = ("command:remote:Command", "command:local:Command")
CONTAINER = "docker:index/container:Container"
# Resource types whose inputs reach no shell: image names, volume options, ssh argv for the provider.
NO_SHELL = ("pulumi:providers:docker", "pulumi:providers:command", "docker:index/remoteImage:RemoteImage",
            "docker:index/volume:Volume", "docker:index/network:Network")  # fmt: skip


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
            # `sh -c SCRIPT NAME ARGS...`: SCRIPT runs with NAME as $0 and ARGS as "$@". Anything else is
            # exec form: no shell parses the arguments.
            if full and os.path.basename(full[0]) in SHELLS and "-c" in full[1:-1]:
                out.append(Invocation(r.name, "entrypoint", ("/bin/sh", *full[full.index("-c"):]), None, env))
        elif r.custom and r.type not in NO_SHELL:
            unknown.append(r.type)
    # The client configs rendered from the stack outputs: an env file that is sourced by sh, a curl script.
    try:
        client = clients.client_from_outputs(harness.reveal(rec.outputs))
    except clients.ClientConfigError:
        client = None
    if client is not None:
        env_file = "set -a\n" + clients.render_openai_env(client) + "set +a\n"
        out.append(Invocation("clients openai-env", "sourced", ("/bin/sh", "-c", env_file), None, ()))
        out.append(Invocation("clients curl", "key in file", ("/bin/sh", "-c", clients.render_curl(client)), None, ()))
        curl = clients.render_curl(client, "DSPARK_KEY")
        out.append(Invocation("clients curl", "key from env", ("/bin/sh", "-c", curl), None, (("DSPARK_KEY", "sk-x"),)))
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
class Case:
    """One (stack, field, payload): refused at preview, or executed with MARK never created."""

    stack: str
    field: str  # the field's label, nodes[i] naming the node the payload went to; secret:<key> for secrets
    payload: str
    mark: Path
    value: str
    path: tuple[str, ...] | None = None  # None for a secret
    index: int = 0
    secret_arg: str | None = None  # run_program argument (api_key, ssh_key) or secrets= key
    status: str = "pending"  # refused:parse, refused:rules, refused:load, executed
    reached_shell: bool = False  # the payload was part of a script, its args, env or stdin
    problems: list[str] = field(default_factory=list)
    evidence: str = ""  # the first script that ran the payload, and its stderr


def _rule_errors(cfg: ClusterConfig, stack: str) -> list:
    params = inspect.signature(rules.check).parameters
    errors, _ = rules.check(cfg, stack) if len(params) > 1 else rules.check(cfg)
    return errors


def refusal(raw: dict, stack: str) -> str | None:
    """Why preview refuses this cluster value before the program runs, or None."""
    try:
        cfg = parse_cluster(raw)
    except ConfigError:
        return "refused:parse"
    return "refused:rules" if _rule_errors(cfg, stack) else None


def run_group(sb: Sandbox, stack: str, base: dict, cases: list[Case], stats: dict[str, int]) -> None:
    """Run the program once with every case of the group in place (each with its own MARK) and
    execute every script it registered. A group preview refuses is split until each refused case is
    alone: a case is refused only for its own value."""
    if not cases:
        return
    raw = base
    for c in cases:
        if c.path is not None:
            raw = inject(raw, c.path, c.value, c.index, sb.seeds())
    status, rec = refusal(raw, stack), None
    if status is None:
        sb.prepare_known_hosts(raw)
        secrets = {c.secret_arg: c.value for c in cases if c.secret_arg}
        run_args = {k: secrets.pop(k) for k in ("api_key", "ssh_key") if k in secrets}
        try:
            rec = harness.run_program(stack, cluster=raw, secrets=secrets or None, **run_args)
        except (pulumi.RunError, ConfigError):
            status = "refused:load"
    if status is not None:
        if len(cases) == 1:
            cases[0].status = status
        else:
            run_group(sb, stack, base, cases[: len(cases) // 2], stats)
            run_group(sb, stack, base, cases[len(cases) // 2 :], stats)
        return
    stats["programs"] += 1
    invocations, unknown = scripts(rec)
    if unknown:
        cases[0].problems.append(f"resource types this test cannot classify (a shell?): {sorted(set(unknown))}")
    texts = script_texts(rec)
    for c in cases:
        c.status = "executed"
        c.reached_shell = any(str(c.mark) in inv.text() for inv in invocations)
        if c.secret_arg and any(c.value in t for t in texts):
            c.problems.append("the secret is part of a script, a container argument, env or label")
    by_mark = {str(c.mark): c for c in cases}
    for inv in invocations:
        for run in sb.execute(inv):
            stats["runs"] += 1
            if run.rc == -1:
                owners = [c for c in cases if str(c.mark) in inv.text()] or cases[:1]
                for c in owners:
                    c.problems.append(f"{inv.resource} {inv.what} ({run.mode}) hung: {run.stderr[-300:]!r}")
            for made in run.made:
                owner = by_mark.get(made) or cases[0]
                owner.problems.append(f"INJECTION: {inv.resource} {inv.what} ({run.mode}) created {Path(made).name}")
                script = inv.argv[2] if len(inv.argv) > 2 else inv.argv[-1]
                owner.evidence = owner.evidence or (
                    f"{inv.resource} {inv.what} ({run.mode}):\n{script}\nstderr: {run.stderr[-400:]}"
                )


def stack_results(sb: Sandbox, stack: str, stats: dict[str, int]) -> list[Case]:
    """Every (field, payload) and (secret, payload) case of one stack.

    Each case is first checked alone (parse_cluster, rules.check). The cases of one payload that
    preview accepts run together (the secrets as a group of their own): one program run and one
    execution of its scripts per group instead of one per case."""
    base = sb.base(stack)
    cases: list[Case] = []
    for name, template in PAYLOADS.items():
        group = []
        for path in string_fields():
            indices = item_indices(path, base)
            for index in indices if indices is not None else [0]:
                mark = sb.mark()
                value = template.format(mark=mark)
                where = label(path).replace("[]", f"[{index}]", 1) if indices is not None else label(path)
                c = Case(stack, where, name, mark, value, path, index)
                c.status = refusal(inject(base, path, value, index, sb.seeds()), stack) or "pending"
                cases.append(c)
                if c.status == "pending":
                    group.append(c)
        run_group(sb, stack, base, group, stats)
        secrets = []
        for secret, (arg, prefix) in SECRETS.items():
            mark = sb.mark()
            secrets.append(Case(stack, secret, name, mark, prefix + template.format(mark=mark), secret_arg=arg))
        run_group(sb, stack, base, secrets, stats)
        cases += secrets
    return cases


@pytest.fixture(scope="module")
def sandboxes(tmp_path_factory):
    """One sandbox per stack (its scripts name its paths), made on first use."""
    root = tmp_path_factory.mktemp("shell-injection")
    made: dict[str, Sandbox] = {}

    def get(stack: str) -> Sandbox:
        if stack not in made:
            made[stack] = Sandbox(root / stack)
        return made[stack]

    return get


@pytest.fixture(scope="module")
def results(sandboxes):
    """The cases of a stack, run on first use; `results.stats[stack]`: program runs, script runs, seconds."""
    done: dict[str, list[Case]] = {}

    def get(stack: str) -> list[Case]:
        if stack not in done:
            stats: dict[str, float] = defaultdict(int)
            start = time.monotonic()
            done[stack] = stack_results(sandboxes(stack), stack, stats)
            stats["seconds"] = time.monotonic() - start
            get.stats[stack] = stats
        return done[stack]

    get.stats = {}
    return get


# ------------------------------------------------------------------------------ tests


def test_the_walk_finds_the_string_fields_of_the_model():
    found = {label(p) for p in string_fields()}
    for expected in ("nodes[].name", "nodes[].host", "model.checkpointDir", "model.hfRepo", "nodes[].linkIps[]",
                     "serving.extraArgs[]", "serving.extraEnv.<key>", "serving.extraEnv.<value>",
                     "imageBuild.args.<key>", "readiness.prompt", "ssh.identityFile", "stateDir", "engine"):  # fmt: skip
        assert expected in found
    assert not {"serving.tpSize", "nodes[].sshPort", "memory.unifiedGiB"} & found


@pytest.mark.parametrize("name", PAYLOADS)
def test_the_executor_catches_naive_quoting(sandboxes, name):
    """Self-check: each payload does create MARK in some naive context (bare, '...', "..."), and never
    once shlex.quote'd. So a MARK-free run below means the quoting held, not a blind executor."""
    sb = sandboxes("self-check")
    fired = []
    for context in ("echo {}", "echo '{}'", 'echo "{}"', 'x={}; echo "$x"'):
        mark = sb.mark()
        payload = PAYLOADS[name].format(mark=mark)
        naive = sb.execute(Invocation("naive", context, ("/bin/sh", "-c", context.format(payload)), None, ()))
        if any(str(mark) in run.made for run in naive):
            fired.append(context)
        quoted = f"x={commands.q(payload)}; echo {commands.q(payload)} \"$x\""
        runs = sb.execute(Invocation("quoted", context, ("/bin/sh", "-c", quoted), None, ()))
        assert not any(run.made for run in runs), f"{name}: shlex.quote did not hold"
    assert fired, f"payload {name} never fires, even unquoted: it proves nothing"


def test_the_pipeline_catches_a_planted_bug(sandboxes, monkeypatch):
    """Self-check of the whole chain (config -> run_program -> collected scripts -> execution): a
    preflight that echoes readiness.prompt inside double quotes is caught, and blamed on that field."""
    original = commands.preflight
    monkeypatch.setattr(
        commands, "preflight", lambda cfg, stack, rank: f'echo "{cfg.readiness.prompt}"\n' + original(cfg, stack, rank)
    )
    sb = sandboxes("self-check")
    base = sb.base("tp4")
    mark = sb.mark()
    case = Case("tp4", "readiness.prompt", "dollar-paren", mark, PAYLOADS["dollar-paren"].format(mark=mark),
                ("readiness", "prompt"))  # fmt: skip
    run_group(sb, "tp4", base, [case], defaultdict(int))
    if case.status != "executed":
        pytest.skip(f"readiness.prompt is now refused ({case.status}): plant the bug in another free-text field")
    assert case.reached_shell, case
    assert any(p.startswith("INJECTION: tp4-spark1-preflight create") for p in case.problems), case


@pytest.mark.parametrize("stack", STACKS)
def test_the_stacks_own_scripts_run_to_the_end_against_the_stubs(sandboxes, stack):
    """Without payloads, every script runs against the stubs: no tool is missing (a missing tool would
    end a `set -e` script early and leave its later lines untested), nothing hangs, and on a healthy
    node every script succeeds; preflight may only miss /dev/infiniband (this machine has no RDMA)."""
    sb = sandboxes(stack)
    raw = sb.base(stack)
    sb.prepare_known_hosts(raw)
    invocations, unknown = scripts(harness.run_program(stack, cluster=raw))
    assert invocations and not unknown
    problems = []
    for inv in invocations:
        for run in sb.execute(inv) or sb.done[inv]:
            where = f"{inv.resource} {inv.what} ({run.mode})"
            problems += [f"{where}: {line}" for line in run.stderr.splitlines() if "not found" in line]
            if run.rc == -1 or (run.mode != "broken-node" and run.rc != 0):
                fails = [line for line in run.stderr.splitlines() if "FAIL" in line and "FAIL infiniband" not in line]
                if run.rc == -1 or fails or "FAIL infiniband" not in run.stderr:
                    problems.append(f"{where}: exit {run.rc}: {run.stderr[-300:]}")
            assert not run.made
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("stack", STACKS)
def test_no_config_value_or_secret_is_ever_run_by_a_shell(sandboxes, results, stack):
    cases = results(stack)
    failed = [c for c in cases if c.problems]
    bad = [f"{c.field} <- {c.payload}: {len(c.problems)} problem(s), first: {c.problems[0]}" for c in failed]
    evidence = next((f"\nfirst evidence ({c.field} <- {c.payload!r}, value {c.value!r}):\n{c.evidence}"
                     for c in failed if c.evidence), "")  # fmt: skip
    assert not bad, f"{len(bad)} case(s) of stack {stack} failed:\n  " + "\n  ".join(bad) + evidence
    assert not list(sandboxes(stack).marks.iterdir()), "a marker exists: something ran a payload outside the executor"


def test_summary(results, capsys):
    """Which fields each stack refused at preview, and which reached the scripts and ran harmlessly."""
    per_field: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    counts: dict[str, int] = defaultdict(int)
    for stack in STACKS:
        for c in results(stack):
            status = "executed, in scripts" if c.reached_shell else c.status
            per_field[c.field][status].add(stack)
            counts[c.status] += 1
    refused = sum(v for k, v in counts.items() if k.startswith("refused"))
    lines = [
        f"shell injection: {sum(counts.values())} cases: {counts['executed']} executed, {refused} refused (parse "
        f"{counts['refused:parse']}, rules {counts['refused:rules']}, load {counts['refused:load']}); "
        + "; ".join(f"{s}: {st['programs']} program runs, {st['runs']} script runs, {st['seconds']:.1f}s"
                    for s, st in results.stats.items())  # fmt: skip
    ]
    for name in sorted(per_field):
        parts = [f"{status}: {','.join(sorted(stacks))}" for status, stacks in sorted(per_field[name].items())]
        lines.append(f"  {name:36} " + " | ".join(parts))
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert counts["executed"] > 0, "every case was refused: the test proves nothing about the scripts"
    assert not any(c.status == "pending" for s in STACKS for c in results(s))
    walked = {label(p) for p in string_fields()} | set(SECRETS)
    engines = {stack: harness.cluster_of(stack).get("engine", "sglang") for stack in STACKS}
    for engine in set(engines.values()):
        stacks = [s for s in STACKS if engines[s] == engine]
        covered = {re.sub(r"\[\d+\]", "[]", c.field) for s in stacks for c in results(s)}
        assert walked <= covered, f"{engine}: fields without a case: {sorted(walked - covered)}"
