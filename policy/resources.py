"""What the guardrails read from a resource and the stack: the resource types and labels they look at,
StackFacts (values from the stack config), and helpers over a resource's inputs (labels, env, every
string, every shell script it carries)."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from declared import shapes  # the program's own validators (policy/__main__.py puts the project on sys.path)
from shellscan import SHELLS


PROJECT = "deepseek-spark"
CONTAINER = "docker:index/container:Container"
VOLUME = "docker:index/volume:Volume"
REMOTE_COMMAND = "command:remote:Command"
LOCAL_COMMAND = "command:local:Command"
COMMANDS = (REMOTE_COMMAND, LOCAL_COMMAND)
ROLE_LABEL = "deepseek-spark.role"
RANK_LABEL = "deepseek-spark.rank"
# A group's guard (planning/guard.py): python3 running its archive from the guard's directory.
GUARD_ROLE = "guard"
GUARD_COMMAND = "/state/guard.pyz"
DEFAULT_SECRET_KEYS = (f"{PROJECT}:apiKey", f"{PROJECT}:sshPrivateKey")
SCRIPT_FIELDS = ("create", "update", "delete")

# --------------------------------------------------------------------------------------------- facts


def _plain_key(key: str) -> str:
    """`ns:config:key` (the language hosts' legacy form) -> `ns:key`."""
    parts = key.split(":")
    return f"{parts[0]}:{parts[2]}" if len(parts) == 3 and parts[1] == "config" else key


@dataclass(frozen=True)
class StackFacts:
    """What the checks need from the stack config (passed to a policy pack in PULUMI_CONFIG)."""

    secrets: tuple[str, ...] = ()  # decrypted values of the secret config keys
    checkpoint_dirs: tuple[str, ...] = ()
    api_key_problem: Optional[str] = None  # why the stack's apiKey cannot protect the endpoint (shapes)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], secret_keys: Iterable[str] = DEFAULT_SECRET_KEYS) -> "StackFacts":
        """`config`: {"deepseek-spark:apiKey": "...", "deepseek-spark:cluster": "<json>", ...}."""
        flat = {_plain_key(k): v for k, v in config.items()}
        secrets = []
        for key in secret_keys:
            value = flat.get(_plain_key(key))
            if isinstance(value, str) and len(value.strip()) >= 8:  # shorter values would match everywhere
                secrets.append(value)
        dirs = []
        cluster = flat.get(f"{PROJECT}:cluster")
        if isinstance(cluster, str):
            try:
                cluster = json.loads(cluster)
            except ValueError:
                cluster = None
        if isinstance(cluster, Mapping):
            groups = cluster.get("groups") if isinstance(cluster.get("groups"), list) else []
            for part in (cluster, *(g for g in groups if isinstance(g, Mapping))):  # a group may override it
                model = part.get("model") if isinstance(part.get("model"), Mapping) else {}
                ckpt = model.get("checkpointDir")
                if isinstance(ckpt, str) and ckpt.startswith("/"):
                    dirs.append(posixpath.normpath(ckpt))
        key = flat.get(f"{PROJECT}:apiKey")
        problem = shapes.api_key_problem(key) if isinstance(key, str) else None
        return cls(tuple(secrets), tuple(dirs), problem)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], secret_keys: Iterable[str] = DEFAULT_SECRET_KEYS) -> "StackFacts":
        raw = environ.get("PULUMI_CONFIG") or "{}"
        try:
            config = json.loads(raw)
        except ValueError:
            config = {}
        return cls.from_config(config if isinstance(config, dict) else {}, secret_keys)

    def with_policy_config(self, config: Mapping[str, Any]) -> "StackFacts":
        """Add `checkpointDirs` from a policy's config."""
        extra = [posixpath.normpath(d) for d in (config.get("checkpointDirs") or []) if str(d).startswith("/")]
        return StackFacts(self.secrets, tuple(dict.fromkeys([*self.checkpoint_dirs, *extra])), self.api_key_problem)


# ------------------------------------------------------------------------------------------- helpers


def _is_seq(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def prop(mapping: Any, key: str, default: Any = None) -> Any:
    if not isinstance(mapping, Mapping):
        return default
    try:
        value = mapping[key] if key in mapping else default
    except Exception as exc:  # pulumi-policy's UnknownValueError: not known during preview
        if type(exc).__name__ == "UnknownValueError":
            return default
        raise
    return default if value is None else value


def items_of(value: Any) -> list[Any]:
    if not _is_seq(value):
        return []
    out = []
    for i in range(len(value)):
        try:
            out.append(value[i])
        except Exception as exc:
            if type(exc).__name__ != "UnknownValueError":
                raise
    return out


def resource_label(res: Any) -> str:
    props = getattr(res, "props", {}) or {}
    name = prop(props, "name")
    return f"{res.name} ({name})" if isinstance(name, str) and name and name != res.name else str(res.name)


def labels_of(props: Any) -> dict[str, str]:
    """docker labels, given as [{label, value}] (pulumi-docker) or as a mapping."""
    raw = prop(props, "labels")
    if isinstance(raw, Mapping):
        return {str(k): str(prop(raw, k, "")) for k in raw}
    out = {}
    for item in items_of(raw):
        key = prop(item, "label")
        if isinstance(key, str):
            out[key] = str(prop(item, "value", ""))
    return out


def is_rank(res: Any) -> bool:
    """A rank of a serving group (the router container has a role but no rank)."""
    labels = labels_of(res.props) if res.resource_type == CONTAINER else {}
    return ROLE_LABEL in labels and RANK_LABEL in labels


def is_guard(res: Any) -> bool:
    """A group's guard container: the one container that runs privileged, in the host's PID namespace (it runs
    the start gates on the node, as the program's remote commands do over ssh)."""
    if res.resource_type != CONTAINER or labels_of(res.props).get(ROLE_LABEL) != GUARD_ROLE:
        return False
    command = [str(c) for c in items_of(prop(res.props, "command"))]
    return [str(e) for e in items_of(prop(res.props, "entrypoints"))] == ["python3"] and command[:1] == [GUARD_COMMAND]


def envs_of(props: Any) -> dict[str, str]:
    out = {}
    for entry in items_of(prop(props, "envs")):
        if isinstance(entry, str) and "=" in entry:
            key, value = entry.split("=", 1)
            out[key] = value
    return out


def strings(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every string leaf of a property tree with its path (unknown values are skipped)."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key in list(value):
            try:
                child = value[key]
            except Exception as exc:
                if type(exc).__name__ == "UnknownValueError":
                    continue
                raise
            yield from strings(child, (*path, str(key)))
    elif _is_seq(value):
        for i, child in enumerate(items_of(value)):
            yield from strings(child, (*path, str(i)))


def scripts_of(res: Any) -> list[tuple[str, str]]:
    """(field, script) for every shell script a resource will run: command create/update/delete, and a
    container's `sh -c` entrypoint or command."""
    props = res.props
    out: list[tuple[str, str]] = []
    if res.resource_type in COMMANDS:
        for name in SCRIPT_FIELDS:
            value = prop(props, name)
            if isinstance(value, str):
                out.append((name, value))
    elif res.resource_type == CONTAINER:
        for name in ("entrypoints", "command"):
            argv = [a for a in items_of(prop(props, name)) if isinstance(a, str)]
            for i, arg in enumerate(argv[:-1]):
                if arg == "-c" and i >= 1 and posixpath.basename(argv[i - 1]) in SHELLS:
                    out.append((f"{name}[{i + 1}]", argv[i + 1]))
    return out
