"""Run `__main__.py` under Pulumi mocks and record every registration (inputs *and* options).

Mocks are set before the program runs, and the program is executed fresh with runpy for every
run, so no resource can be created before the mocks exist. `MockResourceArgs` carries no options,
so the monitor keeps the raw RegisterResourceRequest (dependencies, deleteBeforeReplace, ...).
Secrets are kept as `Secret(value)` so tests can tell secret inputs from plain ones.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import os
import runpy
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from google.protobuf import json_format
from pulumi.runtime import mocks as pmocks
from pulumi.runtime import rpc
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

ROOT = Path(__file__).resolve().parent.parent
MAIN = ROOT / "__main__.py"
PROJECT = "deepseek-spark"
TEST_API_KEY = "sk-test-0123456789abcdef0123456789abcdef"
TEST_SSH_KEY = "-----BEGIN TEST KEY-----\nnot-a-real-key\n-----END TEST KEY-----\n"


@dataclass(frozen=True)
class Secret:
    value: Any


def _decode(value: Any) -> Any:
    """JSON form of a protobuf Struct -> Python, keeping secrets visible as Secret(...)."""
    if isinstance(value, dict):
        sig = value.get(rpc._special_sig_key)
        if sig == rpc._special_secret_sig:
            return Secret(_decode(value.get("value")))
        if sig == rpc._special_resource_sig:
            return {"$resource": value.get("urn")}
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def plain_strings(value: Any):
    """Every string (keys too) that is *not* under a Secret wrapper."""
    if isinstance(value, Secret):
        return
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from plain_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from plain_strings(v)
    elif isinstance(value, str):
        yield value


def reveal(value: Any) -> Any:
    """The same value with every Secret unwrapped (what the provider would receive)."""
    if isinstance(value, Secret):
        return reveal(value.value)
    if isinstance(value, dict):
        return {k: reveal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [reveal(v) for v in value]
    return value


CONTAINER = "docker:index/container:Container"


def labels_of(res: "Registered") -> dict[str, str]:
    """A container's labels as a dict."""
    return {lab["label"]: lab["value"] for lab in reveal(res.inputs).get("labels") or []}


@dataclass
class Registered:
    urn: str
    type: str
    name: str
    custom: bool
    inputs: dict
    parent: str
    provider: str  # "<provider urn>::<id>" or ""
    dependencies: list[str]
    property_dependencies: dict[str, list[str]]  # input name -> URNs its value came from
    delete_before_replace: bool
    retain_on_delete: bool
    protect: bool
    replace_with: list[str]
    custom_timeouts: dict
    ignore_changes: list[str]
    replace_on_changes: list[str] = field(default_factory=list)

    @property
    def provider_urn(self) -> str:
        return self.provider.rsplit("::", 1)[0] if self.provider else ""

    @property
    def plain(self) -> dict:
        return reveal(self.inputs)


@dataclass
class Recording:
    resources: list[Registered] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)  # Secret(...) where the output is secret
    logs: list[tuple[str, str]] = field(default_factory=list)

    def of_type(self, type_: str) -> list[Registered]:
        return [r for r in self.resources if r.type == type_]

    def containers(self, *roles: str) -> list[Registered]:
        """The docker containers whose `deepseek-spark.role` label is one of `roles` (e.g. "head", "worker":
        the ranks; "guard"; "router"), in registration order."""
        return [r for r in self.of_type(CONTAINER) if labels_of(r).get("deepseek-spark.role") in roles]

    def ranks(self) -> list[Registered]:
        return self.containers("head", "worker")

    def named(self, name: str) -> Registered:
        found = [r for r in self.resources if r.name == name]
        assert len(found) == 1, f"expected one resource named {name!r}, found {len(found)}"
        return found[0]

    def by_urn(self, urn: str) -> Registered:
        return next(r for r in self.resources if r.urn == urn)

    def warnings(self) -> list[str]:
        return [m for level, m in self.logs if level == "WARNING"]


class RecordingMonitor(pmocks.MockMonitor):
    def __init__(self, mocks: pmocks.Mocks, recording: Recording):
        super().__init__(mocks)
        self.recording = recording

    def RegisterResource(self, request):
        resp = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            obj = json_format.MessageToDict(request.object, preserving_proto_field_name=True)
            self.recording.resources.append(
                Registered(
                    urn=resp.urn,
                    type=request.type,
                    name=request.name,
                    custom=request.custom,
                    inputs=_decode(obj),
                    parent=request.parent,
                    provider=request.provider,
                    dependencies=list(request.dependencies),
                    property_dependencies={k: list(v.urns) for k, v in request.propertyDependencies.items()},
                    delete_before_replace=request.deleteBeforeReplace,
                    retain_on_delete=request.retainOnDelete,
                    protect=request.protect,
                    replace_with=list(request.replace_with),
                    custom_timeouts=json_format.MessageToDict(request.customTimeouts),
                    ignore_changes=list(request.ignoreChanges),
                    replace_on_changes=list(request.replaceOnChanges),
                )
            )
        return resp


class Mocks(pmocks.Mocks):
    """Providers echo their inputs; add the few outputs the program reads. `stdout`: what a named
    command printed (default empty)."""

    def __init__(self, stdout: dict[str, str] | None = None):
        self.stdout = stdout or {}

    def new_resource(self, args: pmocks.MockResourceArgs):
        state = dict(args.inputs)
        if args.typ == "docker:index/remoteImage:RemoteImage":
            state["imageId"] = "sha256:" + "0" * 64
            state["repoDigest"] = f"{args.inputs.get('name')}@sha256:" + "1" * 64
        if args.typ in ("command:remote:Command", "command:local:Command"):
            state.setdefault("stdout", self.stdout.get(args.name, ""))
            state.setdefault("stderr", "")
        return f"{args.name}-id", state

    def call(self, args: pmocks.MockCallArgs):
        raise AssertionError(f"the program must not invoke {args.token}: preview never reaches a node")


class _LogCapture(logging.Handler):
    def __init__(self, recording: Recording):
        super().__init__(logging.DEBUG)
        self.recording = recording

    def emit(self, record: logging.LogRecord) -> None:
        self.recording.logs.append((record.levelname, record.getMessage()))


def stack_file(stack: str) -> dict:
    return yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]


def cluster_of(stack: str) -> dict:
    return copy.deepcopy(stack_file(stack)[f"{PROJECT}:cluster"])


STACK_LEVEL = ("monitoring",)  # keys of a one-group stack's value that belong to the stack, not its group


def group_of(stack: str) -> dict:
    """A one-group stack's group config (what parse_cluster takes): its value without the stack's own keys."""
    return {k: v for k, v in cluster_of(stack).items() if k not in STACK_LEVEL}


_KNOWN_HOSTS_DIR = Path(tempfile.mkdtemp(prefix="dspark-known-hosts-"))


def fake_host_key(host: str, port: int = 22) -> str:
    """A well-formed ed25519 host key, stable per host (tests never connect)."""
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + hashlib.sha256(f"{host}:{port}".encode()).digest()
    return "ssh-ed25519 " + base64.b64encode(blob).decode()


# sim/inventory.py's state dirs (known_hosts, keys), as state_dir(name).parent computes them
SIM_STATE = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "deepseek-spark-sim"


def with_known_hosts(cluster) -> Any:
    """Like a user's machine that has ssh'd to the nodes: a known_hosts file holding every node's key
    (set as ssh.knownHostsFile when the cluster names none, or names one that does not exist here,
    like the simulated cluster's before `sim create`), so the program can pin host keys."""
    if not isinstance(cluster, dict):
        return cluster
    nodes = list(cluster.get("nodes") or []) if isinstance(cluster.get("nodes"), list) else []
    for group in cluster.get("groups") or [] if isinstance(cluster.get("groups"), list) else []:
        if isinstance(group, dict) and isinstance(group.get("nodes"), list):
            nodes += group["nodes"]
    if not nodes:
        return cluster
    ssh = cluster.get("ssh") if isinstance(cluster.get("ssh"), dict) else {}
    named = ssh.get("knownHostsFile")
    # A file a test wrote is used as it is; the simulated cluster's (the sim stacks') never: whether a
    # cluster of the right size happens to run on this machine must not decide a mock test.
    if isinstance(named, str) and Path(named).expanduser().exists() and SIM_STATE not in Path(named).expanduser().parents:
        return cluster
    lines = []
    for node in nodes:
        if isinstance(node, dict) and isinstance(node.get("host"), str):
            port = node.get("sshPort", 22)
            name = node["host"] if port == 22 else f"[{node['host']}]:{port}"
            lines.append(f"{name} {fake_host_key(node['host'], port)}\n")
    text = "".join(lines)
    path = _KNOWN_HOSTS_DIR / f"known_hosts-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    path.write_text(text)
    return {**cluster, "ssh": {**ssh, "knownHostsFile": str(path)}}


def run_program(
    stack: str,
    cluster: dict | None = None,
    api_key: str | None = TEST_API_KEY,
    ssh_key: str | None = TEST_SSH_KEY,
    plain: tuple[str, ...] = (),
    preview: bool = False,
    secrets: dict[str, str] | None = None,
    command_stdout: dict[str, str] | None = None,
) -> Recording:
    """Run __main__.py for `stack` (its stack file, or `cluster` instead of its cluster value).

    apiKey, sshPrivateKey and any `secrets` ({"hfToken": ...}) are set as secret config keys,
    except those named in `plain`.
    """
    recording = Recording()
    mocks = Mocks(command_stdout)
    logger = logging.getLogger(f"pulumi-mock-{stack}")
    logger.handlers[:] = [_LogCapture(recording)]
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    pulumi.runtime.set_mocks(
        mocks, project=PROJECT, stack=stack, preview=preview, logger=logger,
        monitor=RecordingMonitor(mocks, recording),
    )  # fmt: skip
    root = pulumi.runtime.get_root_resource()
    root.outputs = {}
    config = {}
    for key, value in stack_file(stack).items():
        config[key] = value if isinstance(value, str) else json.dumps(value)
    cluster = with_known_hosts(cluster if cluster is not None else cluster_of(stack))
    config[f"{PROJECT}:cluster"] = json.dumps(cluster)
    secret_keys = []
    for key, value in (("apiKey", api_key), ("sshPrivateKey", ssh_key), *(secrets or {}).items()):
        if value is not None:
            config[f"{PROJECT}:{key}"] = value
            if key not in plain:
                secret_keys.append(f"{PROJECT}:{key}")
    pulumi.runtime.set_all_config(config, secret_keys=secret_keys)

    async def program():
        runpy.run_path(str(MAIN), run_name="__main__")
        for name, value in root.outputs.items():
            out = pulumi.Output.from_input(value)
            resolved = await out.future()
            recording.outputs[name] = Secret(resolved) if await out.is_secret() else resolved

    pulumi.runtime.settings.SETTINGS.rpc_manager.clear()
    _sync_await(run_pulumi_func(program))
    return recording
