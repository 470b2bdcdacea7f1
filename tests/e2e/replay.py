"""Replay the program's registered resources against real daemons (the simulated cluster).

The Pulumi CLI and its docker plugin cannot be installed on our machines, so this is a small,
strict stand-in for the engine + providers: it takes a harness Recording (what `__main__.py`
registered under mocks, inputs and options) and executes it in dependency order:

- `pulumi:providers:docker`: `ssh://user@host` + `sshOpts`, reached like pulumi-docker does it:
  through the system `ssh` with exactly those options (a PATH shim prepends them), with the docker
  SDK speaking `docker system dial-stdio` over it;
- `docker:index/remoteImage:RemoteImage`, `volume:Volume`, `container:Container`: docker SDK calls;
- `command:remote:Command`: `create`/`update`/`delete` over ssh with the connection's user, port,
  private key and (when pinned) host key, `stdin` piped in;
- `command:local:Command`: run locally with `environment` added, like pulumi-command.

Diff semantics follow the providers: any container/volume/image input change replaces; a command
is replaced only when `triggers` change, otherwise updated (`update`, else `create` again);
`replace_with` cascades replacement. Steps follow the engine: resources are visited in dependency
order; a delete-before-replace deletes the old resource right before creating the new one, and
first deletes the old dependents whose *inputs* come from it (property dependencies) and that would
be replaced by that change (the engine's dependent replacements; plain `depends_on` does not count);
other replacements create first and delete after; resources gone from the program are deleted last,
dependents first. `retain_on_delete` skips the provider delete. An input the replay does not
understand fails the run: no silent drops.
State (inputs per URN) is kept in a JSON file between runs, like a stack's state.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import docker
from docker.types import DeviceRequest, Mount, Ulimit

from components.plan import build_context_digest
from harness import Recording, Registered, Secret, reveal

CONTAINER = "docker:index/container:Container"
VOLUME = "docker:index/volume:Volume"
IMAGE = "docker:index/remoteImage:RemoteImage"
BUILD = "docker:index/image:Image"
DOCKER_PROVIDER = "pulumi:providers:docker"
REMOTE = "command:remote:Command"
LOCAL = "command:local:Command"

KNOWN_INPUTS = {
    DOCKER_PROVIDER: {"host", "sshOpts"},
    IMAGE: {"name", "keepLocally"},
    BUILD: {"imageName", "build", "skipPush", "buildOnPreview"},
    VOLUME: {"name", "driver", "driverOpts", "labels"},
    CONTAINER: {
        "name", "image", "entrypoints", "command", "envs", "labels", "networkMode", "ipcMode", "gpus", "devices",
        "capabilities", "ulimits", "mounts", "restart", "mustRun", "wait", "destroyGraceSeconds",
    },
    REMOTE: {"connection", "create", "update", "delete", "triggers", "stdin", "logging", "addPreviousOutputInEnv"},
    LOCAL: {"create", "update", "delete", "triggers", "environment", "logging", "addPreviousOutputInEnv"},
}  # fmt: skip
KNOWN_CONNECTION = {"host", "port", "user", "privateKey", "hostKey", "dialErrorLimit", "perDialTimeout"}


class ReplayError(Exception):
    pass


@dataclass
class Step:
    op: str  # create | update | replace | delete | same
    urn: str
    name: str
    type: str
    seconds: float = 0.0
    detail: str = ""


def _encode(value: Any) -> Any:
    if isinstance(value, Secret):
        return {"$secret": _encode(value.value)}
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$secret"}:
            return Secret(_decode(value["$secret"]))
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


@dataclass
class Replay:
    state_file: Path
    node_names: dict[str, str] = field(default_factory=dict)  # host -> node name, for messages
    cwd: Path = Path(".")
    log: Callable[[str], None] = print
    before_step: Callable[[Step], None] | None = None
    _clients: dict[str, docker.DockerClient] = field(default_factory=dict)

    # ------------------------------------------------------------------ state

    def load_state(self) -> dict[str, dict]:
        if not self.state_file.exists():
            return {}
        return {urn: _decode(entry) for urn, entry in json.loads(self.state_file.read_text()).items()}

    def _save(self, state: dict[str, dict]) -> None:
        self.state_file.write_text(json.dumps({u: _encode(e) for u, e in state.items()}, indent=1, sort_keys=True))

    # ------------------------------------------------------------------ planning

    def _entry(self, res: Registered) -> dict:
        extra = {}
        if res.type == BUILD:  # like pulumi-docker, a changed build context (content) is a diff: rebuild
            b = res.inputs["build"]
            context = self.cwd / b["context"]
            extra["contextDigest"] = build_context_digest(context, Path(b["dockerfile"]).name)
        return {
            **extra,
            "type": res.type,
            "name": res.name,
            "inputs": res.inputs,
            "provider": res.provider_urn,
            "dependencies": sorted(set(res.dependencies) | ({res.provider_urn} if res.provider_urn else set())),
            "propertyDependencies": {k: sorted(v) for k, v in sorted(res.property_dependencies.items())},
            "deleteBeforeReplace": res.delete_before_replace,
            "retainOnDelete": res.retain_on_delete,
            "replaceWith": sorted(res.replace_with),
        }

    @staticmethod
    def _diff(kind: str, old: dict, new: dict) -> str:
        if old == new:
            return "same"
        if kind in (CONTAINER, VOLUME):
            return "replace"
        if kind == IMAGE:
            return "replace" if old.get("name") != new.get("name") else "update"
        if kind == BUILD:
            return "replace" if old.get("imageName") != new.get("imageName") else "update"
        if kind in (REMOTE, LOCAL):
            return "replace" if old.get("triggers") != new.get("triggers") else "update"
        return "update"

    @staticmethod
    def _order(entries: dict[str, dict]) -> list[str]:
        """Dependencies before dependents; ties broken by name so runs are deterministic."""
        remaining = {u: {d for d in e["dependencies"] if d in entries} for u, e in entries.items()}
        out: list[str] = []
        while remaining:
            ready = sorted((u for u, deps in remaining.items() if not deps), key=lambda u: entries[u]["name"])
            if not ready:
                raise ReplayError(f"dependency cycle among {sorted(remaining)}")
            for u in ready:
                out.append(u)
                del remaining[u]
            for deps in remaining.values():
                deps.difference_update(ready)
        return out

    def _check_inputs(self, entry: dict) -> None:
        kind = entry["type"]
        if kind not in KNOWN_INPUTS:
            raise ReplayError(f"{entry['name']}: the replay does not know resource type {kind}")
        unknown = set(entry["inputs"]) - KNOWN_INPUTS[kind]
        if kind == REMOTE:
            unknown |= {f"connection.{k}" for k in set(reveal(entry["inputs"]["connection"])) - KNOWN_CONNECTION}
        if unknown:
            raise ReplayError(f"{entry['name']}: inputs the replay does not understand: {sorted(unknown)}")

    # ------------------------------------------------------------------ running

    def up(self, rec: Recording) -> list[Step]:
        """Converge the nodes to `rec`: create, update, replace and delete like `pulumi up`."""
        state = self.load_state()
        desired = {r.urn: self._entry(r) for r in rec.resources if r.custom}
        for entry in desired.values():
            self._check_inputs(entry)
        order = self._order(desired)
        ops: dict[str, str] = {}
        for urn in order:
            old = state.get(urn)
            if old is None:
                ops[urn] = "create"
                continue
            ops[urn] = self._diff(desired[urn]["type"], old["inputs"], desired[urn]["inputs"])
            if ops[urn] == "same" and old.get("contextDigest") != desired[urn].get("contextDigest"):
                ops[urn] = "update"
        cascading = True
        while cascading:  # replace_with: replaced whenever any listed resource is replaced
            cascading = False
            for urn in order:
                if ops[urn] in ("same", "update") and any(ops.get(w) == "replace" for w in desired[urn]["replaceWith"]):
                    ops[urn] = "replace"
                    cascading = True
        gone = [u for u in state if u not in desired]
        steps: list[Step] = []
        with self._ssh_shim(desired, state):
            for urn in order:
                op = ops[urn]
                entry = desired[urn]
                replacing_first = op == "replace" and entry["deleteBeforeReplace"] and urn in state
                if replacing_first:
                    self._delete_dependents(urn, state, steps)
                    self._run_delete(urn, state, steps, replacing=True)
                step = Step(op, urn, entry["name"], entry["type"])
                if self.before_step:
                    self.before_step(step)
                t0 = time.monotonic()
                try:
                    if op == "same":
                        pass
                    elif op == "create" or (op == "replace" and urn not in state):
                        self._create(entry, desired)
                    elif op == "update":
                        self._update(entry, state[urn], desired)
                    elif op == "replace":  # create-before-delete
                        self._create(entry, desired)
                        self._delete(state[urn], state)
                except ReplayError:
                    self._save(state)
                    raise
                step.seconds = time.monotonic() - t0
                state[urn] = entry
                self._save(state)
                steps.append(step)
                if op != "same":
                    self.log(f"replay: {op:7s} {entry['name']} ({step.seconds:.1f}s)")
            # Resources no longer in the program go last, dependents first.
            for urn in reversed(self._order({u: state[u] for u in gone})):
                self._run_delete(urn, state, steps, replacing=False)
        return steps

    @staticmethod
    def _replaced_by_unknown(entry: dict, prop: str) -> bool:
        """Would this resource be replaced if input `prop` became unknown? (the provider's Diff)"""
        if entry["type"] in (CONTAINER, VOLUME):
            return True  # every docker container/volume input forces a new resource
        if entry["type"] == BUILD:
            return prop == "imageName"
        if entry["type"] in (REMOTE, LOCAL):
            return prop == "triggers"
        return entry["type"] == IMAGE and prop == "name"

    def _delete_dependents(self, urn: str, state: dict, steps: list[Step]) -> None:
        """Before a delete-before-replace of `urn`: delete the old dependents it would replace."""
        for other in [u for u in list(state) if u != urn]:
            if other not in state:
                continue
            props = [p for p, urns in state[other].get("propertyDependencies", {}).items() if urn in urns]
            if any(self._replaced_by_unknown(state[other], p) for p in props):
                self._delete_dependents(other, state, steps)
                self._run_delete(other, state, steps, replacing=True)

    def destroy(self) -> list[Step]:
        """Delete everything in state, dependents first (like `pulumi destroy`)."""
        state = self.load_state()
        steps: list[Step] = []
        with self._ssh_shim(state, state):
            for urn in reversed(self._order(state)):
                self._run_delete(urn, state, steps, replacing=False)
        return steps

    def _run_delete(self, urn: str, state: dict, steps: list[Step], replacing: bool) -> None:
        entry = state[urn]
        step = Step("delete", urn, entry["name"], entry["type"], detail="replace" if replacing else "")
        if self.before_step:
            self.before_step(step)
        t0 = time.monotonic()
        retained = entry["retainOnDelete"]
        if not retained:
            try:
                self._delete(entry, state)
            except ReplayError:
                self._save(state)
                raise
        step.seconds = time.monotonic() - t0
        step.detail += " retained" if retained else ""
        del state[urn]
        self._save(state)
        steps.append(step)
        self.log(f"replay: delete  {entry['name']}{' (retained)' if retained else ''}")

    # ------------------------------------------------------------------ docker

    @contextmanager
    def _ssh_shim(self, *sources: dict[str, dict]):
        """Put an `ssh` on PATH that adds each docker provider's sshOpts, as pulumi-docker does."""
        cases = []
        for source in sources:
            for entry in source.values():
                if entry["type"] != DOCKER_PROVIDER:
                    continue
                host = entry["inputs"]["host"].split("://", 1)[1].split("@")[-1].split(":")[0]
                opts = entry["inputs"].get("sshOpts") or "[]"
                opts = json.loads(opts) if isinstance(opts, str) else opts
                cases.append(f"    {shlex.quote(host)}) exec /usr/bin/ssh {' '.join(map(shlex.quote, opts))} \"$@\" ;;")
        with tempfile.TemporaryDirectory(prefix="replay-ssh-") as tmp:
            shim = Path(tmp) / "ssh"
            shim.write_text(
                "#!/bin/sh\n# replay: the system ssh with the docker provider's ssh_opts for that host\n"
                'for a in "$@"; do\n  case "$a" in\n' + "\n".join(dict.fromkeys(cases)) + "\n  esac\ndone\n"
                'echo "replay ssh shim: no docker provider for: $*" >&2\nexit 255\n'
            )
            shim.chmod(0o755)
            old_path = os.environ["PATH"]
            os.environ["PATH"] = f"{tmp}:{old_path}"
            try:
                yield
            finally:
                os.environ["PATH"] = old_path
                for client in self._clients.values():
                    client.close()
                self._clients.clear()

    def _where(self, provider_entry: dict) -> str:
        host = provider_entry["inputs"]["host"]
        bare = host.split("://", 1)[1].split("@")[-1].split(":")[0]
        name = self.node_names.get(bare)
        return f"node {name} ({host})" if name else host

    def _docker(self, entry: dict, entries: dict) -> tuple[docker.DockerClient, str]:
        provider = entries[entry["provider"]]
        host = provider["inputs"]["host"]
        where = self._where(provider)
        if host not in self._clients:
            try:
                client = docker.DockerClient(base_url=host, use_ssh_client=True, timeout=120)
                client.ping()
            except Exception as exc:  # noqa: BLE001 - any failure to reach the engine
                raise ReplayError(f"{entry['name']}: cannot reach docker on {where}: {exc}") from None
            self._clients[host] = client
        return self._clients[host], where

    def _create(self, entry: dict, entries: dict) -> None:
        kind = entry["type"]
        inputs = reveal(entry["inputs"])
        if kind == DOCKER_PROVIDER:
            return
        if kind in (REMOTE, LOCAL):
            self._command(entry, inputs.get("create"), inputs)
            return
        client, where = self._docker(entry, entries)
        try:
            if kind == IMAGE:
                try:
                    client.images.get(inputs["name"])
                except docker.errors.ImageNotFound:
                    client.images.pull(inputs["name"])
            elif kind == BUILD:
                self._build(client, inputs)
            elif kind == VOLUME:
                labels = {lab["label"]: lab["value"] for lab in inputs.get("labels", [])}
                client.volumes.create(name=inputs["name"], driver=inputs.get("driver", "local"),
                                      driver_opts=inputs.get("driverOpts", {}), labels=labels)  # fmt: skip
            elif kind == CONTAINER:
                self._run_container(client, inputs)
        except Exception as exc:  # noqa: BLE001 - docker, ssh and transport errors alike
            raise ReplayError(f"{entry['name']} on {where}: {type(exc).__name__}: {exc}") from None

    def _run_container(self, client: docker.DockerClient, i: dict) -> None:
        ulimits = []
        for u in i.get("ulimits", []):
            ulimits.append(Ulimit(name=u["name"], soft=u["soft"], hard=u["hard"]))
        device_requests = []
        if i.get("gpus"):
            count = -1 if i["gpus"] == "all" else int(i["gpus"])
            device_requests.append(DeviceRequest(count=count, capabilities=[["gpu"]]))
        container = client.containers.create(
            image=i["image"],
            name=i["name"],
            entrypoint=i.get("entrypoints"),
            command=i.get("command"),
            environment=i.get("envs", []),
            labels={lab["label"]: lab["value"] for lab in i.get("labels", [])},
            network_mode=i.get("networkMode"),
            ipc_mode=i.get("ipcMode"),
            device_requests=device_requests or None,
            devices=[f"{d['hostPath']}:{d.get('containerPath') or d['hostPath']}:{d.get('permissions', 'rwm')}"
                     for d in i.get("devices", [])],  # fmt: skip
            cap_add=(i.get("capabilities") or {}).get("adds"),
            cap_drop=(i.get("capabilities") or {}).get("drops"),
            ulimits=ulimits,
            mounts=[Mount(target=m["target"], source=m.get("source"), type=m["type"], read_only=m.get("readOnly", False))
                    for m in i.get("mounts", [])],  # fmt: skip
            restart_policy={"Name": i.get("restart", "no")},
        )
        container.start()
        if i.get("mustRun", True):
            time.sleep(1)
            container.reload()
            if container.status != "running":
                logs = container.logs(tail=20).decode(errors="replace")
                raise docker.errors.DockerException(f"container {i['name']} exited right away:\n{logs}")

    def _build(self, client: docker.DockerClient, inputs: dict) -> None:
        """docker build on the node's engine, the context uploaded from here (as pulumi-docker does)."""
        b = inputs["build"]
        context = self.cwd / b["context"]
        client.images.build(
            path=str(context),
            dockerfile=str((self.cwd / b["dockerfile"]).relative_to(context)),
            tag=inputs["imageName"],
            buildargs=b.get("args") or {},
            platform=b.get("platform"),
            rm=True,
        )

    def _update(self, entry: dict, old: dict, entries: dict) -> None:
        kind = entry["type"]
        inputs = reveal(entry["inputs"])
        if kind == BUILD:
            client, where = self._docker(entry, entries)
            try:
                self._build(client, inputs)
            except Exception as exc:  # noqa: BLE001 - docker, ssh and transport errors alike
                raise ReplayError(f"{entry['name']} on {where}: {type(exc).__name__}: {exc}") from None
            return
        if kind in (REMOTE, LOCAL):
            self._command(entry, inputs.get("update") or inputs.get("create"), inputs)
        # providers and keepLocally changes need no call

    def _delete(self, entry: dict, entries: dict) -> None:
        kind = entry["type"]
        inputs = reveal(entry["inputs"])
        if kind in (DOCKER_PROVIDER, BUILD) or kind == IMAGE and inputs.get("keepLocally"):
            return  # pulumi-docker leaves a built image on the node
        if kind in (REMOTE, LOCAL):
            if inputs.get("delete"):
                self._command(entry, inputs["delete"], inputs)
            return
        client, where = self._docker(entry, entries)
        try:
            if kind == CONTAINER:
                try:
                    c = client.containers.get(inputs["name"])
                except docker.errors.NotFound:
                    return
                c.stop(timeout=inputs.get("destroyGraceSeconds", 10))
                c.remove(force=True)
            elif kind == VOLUME:
                try:
                    client.volumes.get(inputs["name"]).remove()
                except docker.errors.NotFound:
                    pass
            elif kind == IMAGE:
                client.images.remove(inputs["name"])
        except Exception as exc:  # noqa: BLE001 - docker, ssh and transport errors alike
            raise ReplayError(f"deleting {entry['name']} on {where}: {type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------------ commands

    def _command(self, entry: dict, script: str | None, inputs: dict) -> None:
        if not script:
            return
        stdin = inputs.get("stdin")
        if entry["type"] == LOCAL:
            env = {**os.environ, **(inputs.get("environment") or {})}
            proc = subprocess.run(["/bin/sh", "-c", script], cwd=self.cwd, env=env, input=stdin,
                                  capture_output=True, text=True)  # fmt: skip
            where = "locally"
        else:
            conn = inputs["connection"]
            where = f"node {self.node_names.get(conn['host'], conn['host'])} ({conn.get('user', 'root')}@{conn['host']})"
            with tempfile.TemporaryDirectory(prefix="replay-conn-") as tmp:
                args = ["/usr/bin/ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15",
                        "-p", str(int(conn.get("port", 22))), "-l", conn.get("user", "root")]  # fmt: skip
                if conn.get("hostKey"):  # pulumi-command checks the host key only when pinned
                    known = Path(tmp) / "known_hosts"
                    known.write_text(f"{conn['host']} {conn['hostKey']}\n")
                    args += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}"]
                else:
                    args += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                             "-o", "LogLevel=ERROR"]  # fmt: skip
                if conn.get("privateKey"):
                    key = Path(tmp) / "key"
                    key.write_text(conn["privateKey"])
                    key.chmod(stat.S_IRUSR | stat.S_IWUSR)
                    args += ["-o", "IdentitiesOnly=yes", "-i", str(key)]
                proc = subprocess.run([*args, "--", conn["host"], script], input=stdin or "",
                                      capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            # Like pulumi-command, report the output; unlike it, never echo the script (it could be long).
            raise ReplayError(
                f"{entry['name']} failed on {where} (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
