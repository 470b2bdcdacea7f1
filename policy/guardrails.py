"""The deepseek-spark guardrails as plain functions (no Pulumi import).

A resource check takes what pulumi-policy hands a resource validation (an object with
`resource_type`, `props`, `name`, `urn` and `opts.delete_before_replace`, i.e. a
`ResourceValidationArgs`), the policy's config (a dict) and `StackFacts` (values read from the stack
config), and returns violation messages. A stack check takes the list of resources instead.
`policies.py` wraps them into pulumi-policy objects; the tests call the same functions with the
resources the real program registers under mocks.

What a policy can see at preview, and so what these checks can enforce:
- the *inputs* each resource will be created or updated with, never what a command does at run time.
  Shell scripts are read statically (shlex): a delete whose path cannot be read from the script
  (a variable set at run time, a relative path, `xargs`) is refused rather than guessed.
- no deletes: a policy is not told that a resource is going away. "The checkpoint is never deleted"
  is therefore enforced on what could delete it later: every command's `create`/`update`/`delete`
  script (stored in state, run on replace/destroy), every container's mounts of it, and the NFS
  export and mounts (read-only). Deleting a docker volume is allowed: removing a `local` volume
  with bind/NFS options never removes the source directory.
- secrets arrive unwrapped: pulumi-policy drops the secret marker before validators run, so a policy
  cannot tell a secret input from a plain one. The secret check instead looks for the stack's actual
  secret values (the CLI hands the analyzer the decrypted stack config) and for secret-shaped
  literals in every field that is not one of the secret-carrying inputs; that those inputs really are
  secrets is asserted by the program tests (tests/program).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

from declared import shapes  # the program's own validators (policy/__main__.py puts the project on sys.path)
from resources import (
    COMMANDS, CONTAINER, LOCAL_COMMAND, PROJECT, REMOTE_COMMAND, VOLUME, StackFacts, envs_of, is_guard, is_rank, items_of,
    labels_of, prop, resource_label, scripts_of, strings,
)  # fmt: skip
from shellscan import SimpleCommand, deleted_paths, expand, operands, overlaps, walk_script

# ------------------------------------------------------------------------------------------- checks

Check = Callable[[Any, Mapping[str, Any], StackFacts], list[str]]


def check_privileged(res: Any, config: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """No `--privileged` (nor `--cap-add ALL`) unless the policy config allows it. The groups' guards are
    privileged by design: they drop the page cache and read the node's memory and rails before a heal, on the node
    itself, as the program's memory gate and preflight do over ssh (the docker socket they hold is root anyway)."""
    if res.resource_type != CONTAINER or bool(config.get("allowPrivileged", False)) or is_guard(res):
        return []
    out = []
    fix = ("ranks need only /dev/infiniband and IPC_LOCK; or allow it for this stack with the policy config "
           '{"no-privileged-containers": {"allowPrivileged": true}}')  # fmt: skip
    if prop(res.props, "privileged") is True:
        out.append(f"container {resource_label(res)} is privileged (every device and capability of the node); {fix}")
    adds = [str(a).upper() for a in items_of(prop(prop(res.props, "capabilities", {}), "adds"))]
    if "ALL" in adds or "CAP_ALL" in adds:
        out.append(f"container {resource_label(res)} adds ALL capabilities, which is as good as privileged; {fix}")
    return out


def check_rank_restart(res: Any, config: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """A rank container never restarts on its own: a lone restarted rank cannot rejoin its TP group."""
    if not is_rank(res):
        return []
    restart = prop(res.props, "restart", "no")  # the docker provider's default is "no"
    if restart != "no":
        return [
            f"rank container {resource_label(res)} has restart={restart!r}: one rank restarting alone hangs the "
            "tensor-parallel group; use restart='no' (the group is restarted as a whole by a new group revision)"
        ]
    return []


def check_rank_delete_before_replace(res: Any, config: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """Rank containers have fixed names and host ports: the old one must go before the new one starts."""
    if not is_rank(res):
        return []
    opts = getattr(res, "opts", None)
    if getattr(opts, "delete_before_replace", None) is not True:
        return [
            f"rank container {resource_label(res)} is not delete_before_replace: with a fixed container name and "
            "host networking the replacement cannot start while the old rank runs; set "
            "pulumi.ResourceOptions(delete_before_replace=True)"
        ]
    return []


_OFFLOAD_RAM = re.compile(r"(?<![A-Za-z0-9_])OFFLOAD_MODE\s*=\s*[\"']?ram(?![A-Za-z0-9_])", re.IGNORECASE)


def check_offload_mode(res: Any, config: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """OFFLOAD_MODE=ram is refused wherever it would reach an engine: container env, scripts, args."""
    if res.resource_type not in (CONTAINER, *COMMANDS):
        return []
    why = ("host RAM is GPU memory on a Spark: OFFLOAD_MODE=ram evicts the engram tables and the server "
           "cannot serve; use serving.offloadMode: nvme")  # fmt: skip
    out = []
    if envs_of(res.props).get("OFFLOAD_MODE", "").strip().strip("'\"").lower() == "ram":
        out.append(f"{resource_label(res)}: env OFFLOAD_MODE=ram; {why}")
    for path, text in strings(res.props):
        if path[:1] == ("envs",):
            continue
        if _OFFLOAD_RAM.search(text):
            out.append(f"{resource_label(res)}: {'.'.join(path)} sets OFFLOAD_MODE=ram; {why}")
    return out


# -- NFS exports

_EXPORTS = re.compile(r"^/etc/exports(\.d/.+)?$")


def _is_exports_path(path: str) -> bool:
    return bool(_EXPORTS.match(posixpath.normpath(path))) and posixpath.normpath(path) != "/etc/exports.d"


def _printf(args: list[str]) -> Optional[str]:
    if not args:
        return None
    fmt, rest = args[0].replace("\\n", "\n").replace("\\t", "\t"), args[1:]
    n = fmt.count("%s")
    if "%" in fmt.replace("%s", "").replace("%%", ""):
        return None
    if n == 0 or not rest:
        return fmt.replace("%s", "").replace("%%", "%")
    out = ""
    for i in range(0, len(rest), n):
        chunk = rest[i : i + n] + [""] * (n - len(rest[i : i + n]))
        piece = fmt
        for value in chunk:
            piece = piece.replace("%s", value.replace("%", "\0"), 1)
        out += piece.replace("%%", "%").replace("\0", "%")
    return out


def _content(producer: Optional[SimpleCommand], env: Mapping[str, str]) -> Optional[str]:
    """What a `printf`/`echo` writes, when it can be read statically."""
    if producer is None or not producer.argv:
        return None
    args = [expand(a, env) for a in producer.argv[1:]]
    if any(a is None for a in args):
        return None
    name = posixpath.basename(producer.argv[0])
    if name == "printf":
        return _printf(args)  # type: ignore[arg-type]
    if name == "echo":
        words = [a for a in args if a not in ("-n", "-e", "-E")]  # type: ignore[misc]
        return " ".join(words) + "\n"  # type: ignore[arg-type]
    return None


_WORLD = {"*", "", "0.0.0.0/0", "::/0", "0/0"}


def export_entry_problems(line: str) -> list[str]:
    """exports(5) line -> what makes it world-visible or writable."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return [f"exports line {line!r} cannot be parsed"]
    if not words:
        return []
    path, clients = words[0], words[1:]
    if not clients:
        return [f"{path} is exported to every host (no client list); list each worker's fabric IP"]
    out = []
    defaults: list[str] = []
    for spec in clients:
        if spec.startswith("-"):
            defaults = spec[1:].split(",")
            continue
        m = re.fullmatch(r"([^()]*)(?:\(([^()]*)\))?", spec)
        if not m:
            out.append(f"{path}: client {spec!r} cannot be parsed")
            continue
        client = m.group(1)
        options = [*defaults, *(m.group(2).split(",") if m.group(2) else [])]
        if client in _WORLD or any(c in client for c in "*?[") or "/" in client or client.startswith("@") or (
            client.startswith("gss/")
        ):
            shown = client or "(no host: everyone)"
            out.append(
                f"{path} is exported to {shown}, not to single hosts: list each worker's fabric IP "
                "(no wildcards, networks or netgroups)"
            )
        try:
            shapes.check_options(options)
        except ValueError as exc:
            out.append(f"{path}: options of {client or 'everyone'}: {exc}")
        access = [o for o in options if o in ("ro", "rw")]
        if access and access[-1] == "rw":
            out.append(f"{path} is exported read-write to {client or 'everyone'}: export it ro (workers only read it)")
        elif not access:
            out.append(f"{path} is exported to {client or 'everyone'} without an explicit 'ro': add ro (never rw)")
    try:
        shapes.check_path(path)
    except ValueError as exc:
        out.append(f"exported path {path!r} {exc}")
    return out


def check_nfs_exports(res: Any, config: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """Every NFS export a command writes is read-only and names its clients one by one."""
    if res.resource_type not in COMMANDS:
        return []
    out = []
    for field_name, script in scripts_of(res):
        if "/etc/exports" not in script and "exportfs" not in script:
            continue
        walked = walk_script(script)
        if walked is None:
            out.append(f"{resource_label(res)}: {field_name} touches NFS exports but cannot be parsed; the policy cannot verify it")
            continue
        for cmd, env in walked:
            if not cmd.argv:
                continue
            name, args = posixpath.basename(cmd.argv[0]), cmd.argv[1:]
            entries: list[str] = []
            if name == "exportfs":
                opts = ""
                for i, a in enumerate(args):
                    if a == "-o" and i + 1 < len(args):
                        opts = args[i + 1]
                targets = [a for i, a in enumerate(args) if ":" in a and not a.startswith("-")
                           and not (i > 0 and args[i - 1] == "-o")]  # fmt: skip
                for t in targets:
                    client, _, path = t.partition(":")
                    entries.append(f"{path} {client}({opts})")
                if targets and "-u" in args:
                    entries = []  # unexporting is always fine
            written = [w for w in cmd.writes if _is_exports_path(expand(w, env) or w)]
            tee_targets = [a for a in operands(args) if _is_exports_path(expand(a, env) or a)] if name == "tee" else []
            if written or tee_targets:
                text = _content(cmd.stdin_from if tee_targets else cmd, env)
                if text is None:
                    target = (written or tee_targets)[0]
                    out.append(
                        f"{resource_label(res)}: {field_name} writes {target} with content the policy cannot read "
                        "(use printf '%s\\n' '<line>' | tee <file>)"
                    )
                else:
                    entries += [line for line in text.splitlines() if line.strip()]
            elif name not in ("rm", "mkdir", "exportfs", "cat", "ls", "test", "[", "echo", "printf", "grep") and any(
                _is_exports_path(expand(a, env) or a) for a in args
            ):
                out.append(
                    f"{resource_label(res)}: {field_name} changes NFS exports with `{cmd.text}`, which the policy cannot verify"
                )
            for entry in entries:
                out += [f"{resource_label(res)}: {p}" for p in export_entry_problems(entry)]
    return out


# -- checkpoint


def _checkpoint_dirs(facts: StackFacts) -> list[str]:
    return [posixpath.normpath(d) for d in facts.checkpoint_dirs]


def check_checkpoint_kept(res: Any, config: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """Nothing may delete, move or write the checkpoint: scripts, container mounts, NFS mounts."""
    dirs = _checkpoint_dirs(facts.with_policy_config(config))
    if not dirs:
        return []
    out = []
    for field_name, script in scripts_of(res):
        walked = walk_script(script)
        if walked is None:
            if any(d in script for d in dirs) or re.search(r"(^|[\s;&|])(sudo\s+(-\S+\s+)*)?(rm|mv|find|rsync)\s", script):
                out.append(
                    f"{resource_label(res)}: {field_name} cannot be parsed, so the policy cannot show it leaves the checkpoint alone"
                )
            continue
        for cmd, env in walked:
            for raw in deleted_paths(cmd):
                path = None if raw == "<dynamic>" else expand(raw, env)
                if path is None or not path.startswith("/"):
                    out.append(
                        f"{resource_label(res)}: {field_name} runs `{cmd.text}` on a path known only at run time "
                        f"({raw}); the policy cannot show it spares the checkpoint: use absolute literal paths"
                    )
                    continue
                for ckpt in dirs:
                    how = overlaps(path, ckpt)
                    if how:
                        what = {
                            "is": "deletes the checkpoint",
                            "contains": "deletes a directory that contains the checkpoint",
                            "inside": "deletes files inside the checkpoint",
                        }[how]
                        if posixpath.basename(cmd.argv[0]) == "find":
                            what = "deletes what it finds there, which can be the checkpoint or files in it"
                        out.append(f"{resource_label(res)}: {field_name} runs `{cmd.text}`, which {what} ({ckpt})")
            if cmd.argv and posixpath.basename(cmd.argv[0]) in ("docker", "podman"):
                out += _docker_run_mounts(res, field_name, cmd, env, dirs, set())
    if res.resource_type == CONTAINER:
        for m in items_of(prop(res.props, "mounts")):
            source, kind = str(prop(m, "source", "")), prop(m, "type", "volume")
            if kind == "bind" and source.startswith("/") and any(overlaps(source, d) for d in dirs):
                if prop(m, "readOnly") is not True:
                    out.append(f"container {resource_label(res)} mounts the checkpoint {source} writable; set read_only=True")
        for v in items_of(prop(res.props, "volumes")):
            host = str(prop(v, "hostPath", ""))
            if host.startswith("/") and any(overlaps(host, d) for d in dirs) and prop(v, "readOnly") is not True:
                out.append(f"container {resource_label(res)} mounts the checkpoint {host} writable; set read_only=True")
    if res.resource_type == VOLUME:
        opts = prop(res.props, "driverOpts", {})
        device = str(prop(opts, "device", ""))
        source = device.split(":", 1)[1] if device.count(":") and not device.startswith("/") else device
        if source.startswith("/") and any(overlaps(source, d) in ("is", "inside") for d in dirs):
            if prop(opts, "type") == "nfs" and "ro" not in str(prop(opts, "o", "")).split(","):
                out.append(f"volume {resource_label(res)} mounts the checkpoint over NFS without 'ro' in its options")
    return out


def _is_checkpoint_download(args: Sequence[str], target: str) -> bool:
    """`docker run ... --entrypoint huggingface-cli|hf ... download REPO ... --local-dir TARGET`."""
    try:
        entry = args[args.index("--entrypoint") + 1]
        local_dir = args[args.index("--local-dir") + 1]
    except (ValueError, IndexError):
        return False
    return entry in ("huggingface-cli", "hf") and "download" in args and local_dir == target


def _docker_run_mounts(res, field_name, cmd, env, dirs, volume_names) -> list[str]:
    """`docker run -v SRC:DST[:ro]` of the checkpoint (path or volume name) must be read-only."""
    out = []
    args = cmd.argv[1:]
    if "run" not in args and "create" not in args:
        return out
    for i, a in enumerate(args[:-1]):
        if a not in ("-v", "--volume"):
            continue
        spec = expand(args[i + 1], env)
        if spec is None:
            continue
        parts = spec.split(":")
        if len(parts) < 2:
            continue
        src, mode = parts[0], (parts[2] if len(parts) > 2 else "")
        hits = (src.startswith("/") and any(overlaps(src, d) for d in dirs)) or src in volume_names
        if hits and field_name == "create" and _is_checkpoint_download(args, parts[1]):
            continue  # model.source: download fills the checkpoint dir; it only ever adds files
        if hits and "ro" not in mode.split(","):
            out.append(f"{resource_label(res)}: {field_name} runs a container with the checkpoint {src} mounted writable; add :ro")
    return out


def checkpoint_volume_names(resources: Iterable[Any], dirs: Iterable[str]) -> set[str]:
    """Names of docker volumes whose source (bind device or NFS device) is the checkpoint."""
    names = set()
    dirs = list(dirs)
    for r in resources:
        if r.resource_type != VOLUME:
            continue
        device = str(prop(prop(r.props, "driverOpts", {}), "device", ""))
        source = device.split(":", 1)[1] if ":" in device and not device.startswith("/") else device
        if source.startswith("/") and any(overlaps(source, d) in ("is", "inside") for d in dirs):
            name = prop(r.props, "name")
            if isinstance(name, str):
                names.add(name)
    return names


def check_checkpoint_volume_mounts(resources: Sequence[Any], config: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """Stack check: every mount of a checkpoint *volume* (found by its source) is read-only."""
    dirs = _checkpoint_dirs(facts.with_policy_config(config))
    names = checkpoint_volume_names(resources, dirs)
    if not names:
        return []
    out = []
    for r in resources:
        if r.resource_type == CONTAINER:
            for m in items_of(prop(r.props, "mounts")):
                if prop(m, "type", "volume") == "volume" and prop(m, "source") in names and prop(m, "readOnly") is not True:
                    out.append(
                        f"container {resource_label(r)} mounts checkpoint volume {prop(m, 'source')} writable; set read_only=True"
                    )
        for field_name, script in scripts_of(r):
            for cmd, env in walk_script(script) or []:
                if cmd.argv and posixpath.basename(cmd.argv[0]) in ("docker", "podman"):
                    out += _docker_run_mounts(r, field_name, cmd, env, [], names)
    return out


# -- secrets

# Inputs that carry secrets on purpose (the program passes them as Pulumi secrets; tests/program
# asserts they are): what a command reads on stdin or from its environment, replacement triggers
# (stored encrypted), and ssh credentials.
SECRET_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    REMOTE_COMMAND: (("stdin",), ("environment", "*"), ("triggers", "*"), ("connection", "privateKey"),
                     ("connection", "password"), ("connection", "privateKeyPassword")),
    LOCAL_COMMAND: (("stdin",), ("environment", "*"), ("triggers", "*")),
}  # fmt: skip
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_FLAG_LITERAL = re.compile(r"--api-key(?:=|\s+)(?![\"']?\$)([\"']?)([^\s\"';|&)]{8,})")
# a token after `Bearer` on the same line (a header); not `type: Bearer` then a YAML key on the next line
_BEARER_LITERAL = re.compile(r"Bearer[ \t]+(?![\"']?\$)[A-Za-z0-9._~+/=-]{12,}(?![A-Za-z0-9._~+/=:-])")
_SECRET_WORDS = {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIALS"}


def _allowed(resource_type: str, path: tuple[str, ...]) -> bool:
    for pattern in SECRET_FIELDS.get(resource_type, ()):
        if len(path) >= len(pattern) and all(p == "*" or p == s for p, s in zip(pattern, path)):
            return True
    return False


def check_no_plain_secrets(res: Any, config: Mapping[str, Any], facts: StackFacts) -> list[str]:
    """No secret value (the stack's own, or anything shaped like a key) in an input that is not one of
    the secret-carrying inputs, and a stack API key that really protects the endpoint (the program's
    own check). Messages name the field, never the value."""
    out = []
    if facts.api_key_problem and res.resource_type == CONTAINER and labels_of(res.props).get("deepseek-spark.rank") == "0":
        out.append(f"{resource_label(res)} would serve with {PROJECT}:apiKey, which {facts.api_key_problem}")
    props = res.props
    for path, text in strings(props):
        if _allowed(res.resource_type, path):
            continue
        where = f"{resource_label(res)}: {'.'.join(path) or '(value)'}"
        if any(s in text or s.strip() in text for s in facts.secrets):
            out.append(f"{where} contains a secret from the stack config; pass it on stdin or through a secret input")
        elif _PEM.search(text):
            out.append(f"{where} contains a private key; use ssh-agent or the sshPrivateKey secret")
        elif _FLAG_LITERAL.search(text):
            out.append(f"{where} passes a literal --api-key (visible in `ps` and `docker inspect`); read it from a file")
        elif _BEARER_LITERAL.search(text):
            out.append(f"{where} holds a literal bearer token; read it from the environment or a 0600 file")
    if res.resource_type == CONTAINER:
        argv = [a for a in items_of(prop(props, "command")) if isinstance(a, str)]
        for i, a in enumerate(argv[:-1]):
            if a == "--api-key" and not argv[i + 1].startswith("$"):
                out.append(f"container {resource_label(res)}: command passes --api-key as a literal argument; mount it as a file")
        for key, value in envs_of(props).items():
            if value and _SECRET_WORDS & set(key.upper().split("_")):
                out.append(
                    f"container {resource_label(res)}: env {key} holds a literal value (shown by `docker inspect`); "
                    "mount the secret as a 0600 file instead"
                )
    return list(dict.fromkeys(out))


# --------------------------------------------------------------------------------------------- table


@dataclass(frozen=True)
class PolicySpec:
    name: str
    description: str
    check: Check
    stack: bool = False  # a stack check gets the list of all resources
    config_schema: Optional[dict[str, dict[str, Any]]] = None


CHECKPOINT_DIRS_SCHEMA = {
    "checkpointDirs": {
        "type": "array",
        "items": {"type": "string"},
        "default": [],
        "description": "more checkpoint directories to protect (model.checkpointDir of the stack is always protected)",
    }
}

POLICIES: tuple[PolicySpec, ...] = (
    PolicySpec(
        "no-privileged-containers",
        "Containers do not run privileged (nor with ALL capabilities) unless the policy config allows it.",
        check_privileged,
        config_schema={"allowPrivileged": {"type": "boolean", "default": False,
                                           "description": "allow privileged containers on this stack"}},
    ),  # fmt: skip
    PolicySpec(
        "nfs-exports-read-only-to-named-hosts",
        "NFS exports written by commands are read-only and list single client hosts (never world-visible).",
        check_nfs_exports,
    ),
    PolicySpec(
        "rank-containers-restart-no",
        "SGLang rank containers have restart=no: a tensor-parallel group restarts as a whole, never one rank.",
        check_rank_restart,
    ),
    PolicySpec(
        "rank-containers-delete-before-replace",
        "SGLang rank containers are replaced delete-before-replace (fixed names, host network).",
        check_rank_delete_before_replace,
    ),
    PolicySpec(
        "checkpoint-never-deleted",
        "No command deletes, moves or truncates the checkpoint, and everything mounts it read-only.",
        check_checkpoint_kept,
        config_schema=CHECKPOINT_DIRS_SCHEMA,
    ),
    PolicySpec(
        "checkpoint-volumes-mounted-read-only",
        "Every mount of a docker volume backed by the checkpoint is read-only.",
        check_checkpoint_volume_mounts,
        stack=True,
        config_schema=CHECKPOINT_DIRS_SCHEMA,
    ),
    PolicySpec(
        "no-secrets-in-plain-inputs",
        "Secrets (the API key, ssh keys, tokens) appear only in secret-carrying inputs, never in commands, "
        "container args, env or labels.",
        check_no_plain_secrets,
    ),
    PolicySpec(
        "no-ram-offload",
        "OFFLOAD_MODE=ram is refused: on a Spark host RAM is GPU memory.",
        check_offload_mode,
    ),
)
