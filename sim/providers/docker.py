"""TEST DOUBLE of pulumi-docker 5.2.0's resource plugin (`pulumi-resource-docker`).

The real plugin (Go: a Terraform bridge over kreuzwerker/terraform-provider-docker v4.5.0 plus a
native `docker.Image`) cannot be built here, so the engine runs this instead (launcher:
sim/providers/bin/pulumi-resource-docker). It implements what the program uses, with the real
provider's semantics as read in its source; anything else fails with a clear error, no silent drops.

- Provider config (one plugin process = one provider instance = one node): `host` (`ssh://user@host[:port]`,
  or any docker URL such as `unix:///var/run/docker.sock`) and `sshOpts`. For ssh hosts an `ssh` shim that
  adds `sshOpts` is put first on this process's PATH (the real provider also shells out to the system
  ssh with those options) and the docker SDK speaks `docker system dial-stdio` through it. The engine
  is reached lazily, on the first operation that needs it: never at preview.
- `docker:index/container:Container`: Diff = the Terraform schema's ForceNew fields replace (name, image,
  command, entrypoints, envs, labels, mounts, devices, ulimits, capabilities, networkMode, ipcMode, gpus,
  ...), others (restart, mustRun, wait, destroyGraceSeconds, memory, ...) update; set-typed inputs
  (envs, labels, mounts, ...) compare without order; a Computed input dropped from the program is no
  change; the Diff asks for delete-before-replace (pulumi-docker sets it for containers). Create = docker
  create + start (the image must be on the node: no pull), then like the real one reads the container
  back: one that already exited is still created, with `mustRun: false` and `exitCode` in its state.
  Update applies the restart policy / resources (`docker update`) and starts the container when
  `mustRun` goes false -> true; nothing else. Delete stops with `destroyGraceSeconds` (0 when unset,
  as the real one) and removes it (force, anonymous volumes unless `removeVolumes: false`); a missing
  container is fine. Read: gone -> dropped; stopped -> `mustRun: false` (+ `exitCode`) in state and
  inputs, as the real provider reports it; running -> unchanged (the real one re-reads more fields).
- `docker:index/volume:Volume`: name, driver, driverOpts, labels replace; create/remove (retrying
  "in use" for 30 s like the real one; missing is fine); Read: gone if missing.
- `docker:index/remoteImage:RemoteImage`: name, platform, triggers, pullTriggers replace; Create/Update
  ensure the image is on the node (pull when missing); outputs `imageId`, `repoDigest`; id = imageId +
  name; Delete removes it unless `keepLocally`; Read: gone if missing.
- `docker:index/image:Image` (native in pulumi-docker): Check adds `buildOnPreview` (false), defaults
  `build.context` (".") / `build.dockerfile` (<context>/Dockerfile) / `build.platform` (linux/<this
  machine's arch>), and `build.contextDigest`: sha256 of the Dockerfile and every build-context file not
  excluded by `<dockerfile>.dockerignore` or `<context>/.dockerignore` (names, modes, contents), so a
  changed context file is a diff (update = rebuild) and an ignored one is not. Every change is an
  update, `imageName` included: pulumi-docker's Diff never replaces an Image. Create/Update build on the
  node's engine, the context uploaded from the plugin's cwd (the project dir), tagged `imageName`; never
  at preview; outputs add imageName, baseImageName, context, dockerfile, platform, registryServer and
  `repoDigest` (the image id, as with skipPush). Read changes nothing, Delete leaves the image.

Deliberate limits of the double: no push (`skipPush` must be true) and no `buildOnPreview`; the classic
builder instead of BuildKit; inputs the program does not use (volumes, uploads, networksAdvanced, ...)
are rejected at Check; a Create that fails after `docker create` removes the container again (the real
provider would keep a half-created resource in the state, which this gRPC base cannot express).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import posixpath
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import DeviceRequest, DriverConfig, Healthcheck, LogConfig, Mount, Ulimit
from docker.utils.build import PatternMatcher
from docker.utils.build import tar as build_tar

from sim.providers.base import (
    UNKNOWN,
    Diff,
    Provider,
    ProviderError,
    diff_inputs,
    from_struct,
    has_unknown,
    reveal,
    serve,
    type_of,
)

CONTAINER = "docker:index/container:Container"
VOLUME = "docker:index/volume:Volume"
REMOTE_IMAGE = "docker:index/remoteImage:RemoteImage"
IMAGE = "docker:index/image:Image"
TYPES = (CONTAINER, VOLUME, REMOTE_IMAGE, IMAGE)

# Builds and stops can stream nothing for minutes; the SDK's timeout is per socket read.
DOCKER_TIMEOUT = 600
VOLUME_IN_USE_RETRY_SECONDS = 30  # resourceDockerVolumeDelete's retry window
SHIM_PREFIX = "docker-double-ssh-"

# ---------------------------------------------------------------------------------------- schema
# Container fields, Terraform name -> Pulumi name (lists pluralised), from resource_docker_container.go.
CONTAINER_FORCE_NEW = frozenset({
    "name", "readOnly", "image", "hostname", "domainname", "command", "entrypoints", "user", "dns", "dnsOpts",
    "dnsSearches", "publishAllPorts", "workingDir", "capabilities", "securityOpts", "runtime", "platform",
    "stopSignal", "stopTimeout", "mounts", "volumes", "ports", "hosts", "ulimits", "envs", "privileged", "devices",
    "deviceRequests", "labels", "shmSize", "logDriver", "logOpts", "networkMode", "networksAdvanced", "pidMode",
    "usernsMode", "uploads", "sysctls", "ipcMode", "groupAdds", "tty", "stdinOpen", "storageOpts", "gpus", "cpus",
    "cgroupnsMode", "cgroupParent",
})  # fmt: skip
# TypeSet fields: order does not matter.
CONTAINER_SETS = frozenset({
    "dns", "dnsOpts", "dnsSearches", "securityOpts", "mounts", "volumes", "hosts", "ulimits", "envs", "devices",
    "deviceReadBps", "deviceReadIops", "deviceWriteBps", "deviceWriteIops", "deviceRequests", "labels",
    "networksAdvanced", "uploads", "groupAdds",
})  # fmt: skip
# Optional+Computed fields: dropping one from the program keeps the old value (no diff).
CONTAINER_COMPUTED = frozenset({
    "hostname", "command", "entrypoints", "securityOpts", "runtime", "platform", "stopSignal", "stopTimeout", "envs",
    "labels", "shmSize", "logDriver", "healthcheck", "ipcMode", "init",
})  # fmt: skip
CONTAINER_DEFAULTS = {
    "rm": False, "readOnly": False, "start": True, "wait": False, "waitTimeout": 60, "attach": False, "logs": False,
    "mustRun": True, "restart": "no", "removeVolumes": True, "memoryReservation": 0, "networkMode": "bridge",
    "containerReadRefreshTimeoutMilliseconds": 15000, "tty": False, "stdinOpen": False,
}  # fmt: skip
# What `docker update` changes in place (resourceDockerContainerUpdate); other updates only touch the state.
CONTAINER_UPDATABLE = ("restart", "maxRetryCount", "cpuShares", "memory", "memoryReservation", "cpuSet", "memorySwap")
CONTAINER_SUPPORTED = frozenset({
    "name", "image", "command", "entrypoints", "envs", "labels", "networkMode", "ipcMode", "pidMode", "gpus",
    "devices", "capabilities", "ulimits", "mounts", "ports", "hosts", "restart", "maxRetryCount", "mustRun", "start",
    "wait", "waitTimeout", "destroyGraceSeconds", "removeVolumes", "rm", "hostname", "domainname", "user",
    "workingDir", "privileged", "readOnly", "tty", "stdinOpen", "init", "shmSize", "memory", "memoryReservation",
    "memorySwap", "cpuShares", "cpuSet", "cpus", "sysctls", "tmpfs", "logDriver", "logOpts", "healthcheck",
    "stopSignal", "groupAdds", "securityOpts", "dns", "dnsOpts", "dnsSearches", "runtime", "platform",
    "containerReadRefreshTimeoutMilliseconds",
})  # fmt: skip

VOLUME_FORCE_NEW = frozenset({"name", "driver", "driverOpts", "labels", "cluster"})
VOLUME_SUPPORTED = frozenset({"name", "driver", "driverOpts", "labels"})

REMOTE_IMAGE_FORCE_NEW = frozenset({"name", "pullTriggers", "triggers", "platform", "build"})
REMOTE_IMAGE_SUPPORTED = frozenset({"name", "keepLocally", "forceRemove", "platform", "pullTriggers", "triggers"})

IMAGE_SUPPORTED = frozenset({"imageName", "build", "skipPush", "buildOnPreview", "registry"})
IMAGE_BUILD_SUPPORTED = frozenset({"context", "dockerfile", "args", "platform", "target", "network", "builderVersion",
                                   "contextDigest"})  # fmt: skip


# ---------------------------------------------------------------------------------------- diff


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {}


def _as_set(value: Any) -> Any:
    """A Terraform set: order and duplicates do not matter."""
    if not isinstance(value, list):
        return value  # unknown
    unique = {json.dumps(v, sort_keys=True): v for v in value}
    return [unique[k] for k in sorted(unique)]


def _normalized(inputs: dict, defaults: dict, sets: frozenset) -> dict:
    """Comparable form of (revealed) inputs: defaults filled in, empty values dropped, sets sorted."""
    out = {**defaults, **{k: v for k, v in reveal(inputs).items() if not _empty(v)}}
    for key in sets & out.keys():
        out[key] = _as_set(out[key])
    return out


def _normalized_container(inputs: dict) -> dict:
    out = _normalized(inputs, CONTAINER_DEFAULTS, CONTAINER_SETS)
    caps = out.get("capabilities")
    if isinstance(caps, dict):  # a set of one {add, drop} block, each a set
        caps = {k: _as_set(v) for k, v in caps.items() if not _empty(v)}
        out["capabilities"] = caps
        if not caps:
            del out["capabilities"]
    if isinstance(out.get("mounts"), list):
        out["mounts"] = _as_set([{"readOnly": False, **m} if isinstance(m, dict) else m for m in out["mounts"]])
    if isinstance(out.get("devices"), list):
        out["devices"] = _as_set([{"permissions": "rwm", **d} if isinstance(d, dict) else d for d in out["devices"]])
    return out


def diff_container(olds: dict, news: dict, ignore: list[str]) -> Diff:
    o, n = _normalized_container(olds), _normalized_container(news)
    for key in CONTAINER_COMPUTED:
        if key in o and key not in n:
            n[key] = o[key]  # Optional+Computed: not set = keep what is there
    d = diff_inputs(o, n, set(CONTAINER_FORCE_NEW), ignore)
    d.delete_before_replace = True  # pulumi-docker's resources.go: DeleteBeforeReplace for docker_container
    return d


def diff_volume(olds: dict, news: dict, ignore: list[str]) -> Diff:
    o, n = _normalized(olds, {}, frozenset({"labels"})), _normalized(news, {}, frozenset({"labels"}))
    for key in ("name", "driver"):  # Optional+Computed
        if key in o and key not in n:
            n[key] = o[key]
    return diff_inputs(o, n, set(VOLUME_FORCE_NEW), ignore)


def diff_remote_image(olds: dict, news: dict, ignore: list[str]) -> Diff:
    defaults = {"platform": ""}
    sets = frozenset({"pullTriggers"})
    return diff_inputs(_normalized(olds, defaults, sets), _normalized(news, defaults, sets),
                       set(REMOTE_IMAGE_FORCE_NEW), ignore)  # fmt: skip


def diff_image(olds: dict, news: dict, ignore: list[str]) -> Diff:
    """pulumi-docker provider.go Diff: old inputs vs new, every change an UPDATE (never a replace);
    of `registry` only `server` counts (credentials rotate without a rebuild)."""

    def comparable(inputs: dict) -> dict:
        out = dict(inputs)
        if isinstance(reveal(out.get("registry")), dict):
            out["registry"] = {"server": reveal(out["registry"]).get("server")}
        return out

    return diff_inputs(comparable(olds), comparable(news), set(), ignore)


# ---------------------------------------------------------------------------------------- container mapping

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


def go_duration_ns(text: str) -> int:
    """A Go duration string ("1m30s", "500ms", "0s") in nanoseconds, as the healthcheck needs."""
    if text in ("", "0"):
        return 0
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ProviderError(f"healthcheck: not a duration: {text!r}")
    return int(sum(float(n) * _DURATION_NS[u] for n, u in parts))


def labels_map(labels: list[dict] | None) -> dict[str, str]:
    return {lab["label"]: lab["value"] for lab in labels or []}


def gpu_device_requests(gpus: str) -> list[DeviceRequest]:
    """docker CLI `--gpus` (opts.GpuOpts) as the real provider parses it: all | N | device=ID[,ID]."""
    value = gpus.strip().strip("\"'")
    if value == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if value.startswith("device="):
        return [DeviceRequest(device_ids=value[len("device="):].split(","), capabilities=[["gpu"]])]
    try:
        return [DeviceRequest(count=int(value), capabilities=[["gpu"]])]
    except ValueError:
        raise ProviderError(f"gpus: unsupported value {gpus!r} (all, a count or device=IDs)") from None


def _mount(m: dict) -> Mount:
    kwargs: dict[str, Any] = {}
    bind, vol, tmpfs = m.get("bindOptions") or {}, m.get("volumeOptions") or {}, m.get("tmpfsOptions") or {}
    if m["type"] == "bind" and bind.get("propagation"):
        kwargs["propagation"] = bind["propagation"]
    if m["type"] == "volume" and vol:
        if vol.get("subpath"):
            raise ProviderError("mounts.volumeOptions.subpath is not implemented by the docker TEST DOUBLE")
        kwargs["no_copy"] = bool(vol.get("noCopy", False))
        kwargs["labels"] = labels_map(vol.get("labels")) or None
        if vol.get("driverName") or vol.get("driverOptions"):
            kwargs["driver_config"] = DriverConfig(vol.get("driverName", ""), vol.get("driverOptions"))
    if m["type"] == "tmpfs" and tmpfs:
        kwargs["tmpfs_size"] = tmpfs.get("sizeBytes")
        kwargs["tmpfs_mode"] = tmpfs.get("mode")
    return Mount(target=m["target"], source=m.get("source", ""), type=m["type"],
                 read_only=bool(m.get("readOnly", False)), **kwargs)  # fmt: skip


def container_create_kwargs(i: dict) -> dict[str, Any]:
    """docker SDK `containers.create` arguments for revealed Container inputs (resourceDockerContainerCreate)."""
    d = {**CONTAINER_DEFAULTS, **{k: v for k, v in i.items() if v is not None}}
    kw: dict[str, Any] = {
        "image": d["image"],
        "name": d.get("name"),
        "restart_policy": {"Name": d["restart"], "MaximumRetryCount": int(d.get("maxRetryCount", 0))},
        "network_mode": d["networkMode"],
        "auto_remove": d["rm"],
        "read_only": d["readOnly"],
        "tty": d["tty"],
        "stdin_open": d["stdinOpen"],
        "init": bool(d.get("init", False)),  # the real one always sends Init (false when unset)
        "privileged": bool(d.get("privileged", False)),
    }
    if d.get("command"):
        if any(arg == "" for arg in d["command"]):
            raise ProviderError("values for command may not be empty")  # the real provider's check
        kw["command"] = d["command"]
    if d.get("entrypoints"):
        kw["entrypoint"] = d["entrypoints"]
    if d.get("envs"):
        kw["environment"] = list(d["envs"])
    if d.get("labels"):
        kw["labels"] = labels_map(d["labels"])
    for key, arg in (("ipcMode", "ipc_mode"), ("pidMode", "pid_mode"), ("hostname", "hostname"),
                     ("domainname", "domainname"), ("user", "user"), ("workingDir", "working_dir"),
                     ("runtime", "runtime"), ("platform", "platform"), ("stopSignal", "stop_signal"),
                     ("cpuSet", "cpuset_cpus"), ("cpuShares", "cpu_shares"), ("sysctls", "sysctls"),
                     ("tmpfs", "tmpfs"), ("groupAdds", "group_add"), ("securityOpts", "security_opt"),
                     ("dns", "dns"), ("dnsOpts", "dns_opt"), ("dnsSearches", "dns_search")):  # fmt: skip
        if d.get(key):
            kw[arg] = d[key]
    if d.get("gpus"):
        kw["device_requests"] = gpu_device_requests(d["gpus"])
    if d.get("devices"):
        kw["devices"] = [
            f"{dev['hostPath']}:{dev.get('containerPath') or dev['hostPath']}:{dev.get('permissions') or 'rwm'}"
            for dev in d["devices"]
        ]
    caps = d.get("capabilities") or {}
    if caps.get("adds"):
        kw["cap_add"] = caps["adds"]
    if caps.get("drops"):
        kw["cap_drop"] = caps["drops"]
    if d.get("ulimits"):
        kw["ulimits"] = [Ulimit(name=u["name"], soft=int(u["soft"]), hard=int(u["hard"])) for u in d["ulimits"]]
    if d.get("mounts"):
        kw["mounts"] = [_mount(m) for m in d["mounts"]]
    if d.get("ports"):
        ports: dict[str, list] = {}
        for p in d["ports"]:
            ports.setdefault(f"{p['internal']}/{p.get('protocol', 'tcp')}", []).append(
                (p.get("ip", "0.0.0.0"), p.get("external"))
            )
        kw["ports"] = ports
    if d.get("hosts"):
        kw["extra_hosts"] = {h["host"]: h["ip"] for h in d["hosts"]}
    if d.get("shmSize"):
        kw["shm_size"] = int(d["shmSize"]) * 1024 * 1024  # MB in the schema
    kw.update(_memory_kwargs(d))
    if d.get("cpus"):
        kw["nano_cpus"] = int(round(float(d["cpus"]) * 1e9))
    if d.get("logDriver") or d.get("logOpts"):
        kw["log_config"] = LogConfig(type=d.get("logDriver", ""), config=d.get("logOpts") or {})
    if d.get("healthcheck"):
        h = d["healthcheck"]
        kw["healthcheck"] = Healthcheck(
            test=h["test"], interval=go_duration_ns(h.get("interval", "0s")),
            timeout=go_duration_ns(h.get("timeout", "0s")), retries=int(h.get("retries", 0)),
            start_period=go_duration_ns(h.get("startPeriod", "0s")),
        )  # fmt: skip
    return kw


def _memory_kwargs(d: dict) -> dict[str, Any]:
    """Memory limits (MB in the schema) as docker-py takes them, for create and update alike."""
    kw: dict[str, Any] = {}
    if d.get("memory"):
        kw["mem_limit"] = int(d["memory"]) * 1024 * 1024
    if d.get("memoryReservation"):
        kw["mem_reservation"] = int(d["memoryReservation"]) * 1024 * 1024
    if d.get("memorySwap"):
        swap = int(d["memorySwap"])
        kw["memswap_limit"] = swap * 1024 * 1024 if swap > 0 else swap
    return kw


def container_update_kwargs(i: dict) -> dict[str, Any]:
    """`container.update` arguments: the restart policy and resources, as resourceDockerContainerUpdate sends them."""
    d = {**CONTAINER_DEFAULTS, **i}
    kw: dict[str, Any] = {"restart_policy": {"Name": d["restart"], "MaximumRetryCount": int(d.get("maxRetryCount", 0))}}
    if d.get("cpuShares"):
        kw["cpu_shares"] = int(d["cpuShares"])
    if d.get("cpuSet"):
        kw["cpuset_cpus"] = d["cpuSet"]
    kw.update(_memory_kwargs(d))
    return kw


def stopped_fields(attrs: dict) -> dict:
    """What the real Read writes for a container that is not running: its exit code and mustRun=false."""
    state = attrs.get("State") or {}
    if state.get("Running"):
        return {}
    return {"exitCode": int(state.get("ExitCode", 0)), "mustRun": False}


def repo_digest(name: str, repo_digests: list[str]) -> str:
    """terraform-provider-docker's determineRepoDigest."""
    if not repo_digests:
        return ""
    if len(repo_digests) == 1:
        return repo_digests[0]
    base = name.split(":")[0]
    return next((d for d in repo_digests if d.startswith(base)), repo_digests[0])


# ---------------------------------------------------------------------------------------- build context


def read_ignore_file(path: Path) -> list[str]:
    """moby/patternmatcher/ignorefile.ReadAll: comments, blanks, cleaned paths, leading '/' dropped."""
    patterns = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines()):
        if n == 0:
            line = line.lstrip("\ufeff")
        if line.startswith("#"):
            continue
        line = line.strip()
        if not line:
            continue
        invert = line.startswith("!")
        if invert:
            line = line[1:].strip()
        if line:
            line = posixpath.normpath(line)
            if len(line) > 1 and line.startswith("/"):
                line = line[1:]
        patterns.append(("!" if invert else "") + line)
    return patterns


def ignore_patterns(dockerfile: Path, context: Path) -> list[str]:
    """pulumi-docker getIgnorePatterns: `<dockerfile>.dockerignore` if present, else `<context>/.dockerignore`."""
    for candidate in (Path(f"{dockerfile}.dockerignore"), context / ".dockerignore"):
        if candidate.is_file():
            return read_ignore_file(candidate)
    return []


def go_file_mode(mode: int) -> str:
    """Go's fs.FileMode.String() for an os.lstat mode (the real digest hashes that text)."""
    kinds = ""
    if stat.S_ISDIR(mode):
        kinds += "d"
    if stat.S_ISLNK(mode):
        kinds += "L"
    if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
        kinds += "D"
    if stat.S_ISFIFO(mode):
        kinds += "p"
    if stat.S_ISSOCK(mode):
        kinds += "S"
    if mode & stat.S_ISUID:
        kinds += "u"
    if mode & stat.S_ISGID:
        kinds += "g"
    if stat.S_ISCHR(mode):
        kinds += "c"
    if mode & stat.S_ISVTX:
        kinds += "t"
    perms = "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return (kinds or "-") + perms


def context_files(context: Path, patterns: list[str]) -> list[str]:
    """Relative paths of the non-directory entries of a build context that the ignore patterns keep,
    in Go's WalkDir order (names sorted within each directory)."""
    matcher = PatternMatcher(patterns)
    matcher.patterns.pop()  # docker-py always keeps .dockerignore ("!.dockerignore"); the real walker does not
    exceptions = [p.cleaned_pattern for p in matcher.patterns if p.exclusion]
    out: list[str] = []

    def walk(rel: str) -> None:
        for name in sorted(os.listdir(context / rel if rel else context)):
            path = posixpath.join(rel, name) if rel else name
            excluded = matcher.matches(path)
            full = context / path
            if full.is_dir() and not full.is_symlink():
                # An excluded directory is still entered when an exception pattern may re-include something in it.
                if not excluded or any(e.startswith(path) for e in exceptions):
                    walk(path)
            elif not excluded:
                out.append(path)

    walk("")
    return out


def context_digest(context: Path, dockerfile: Path, cwd: Path) -> str:
    """pulumi-docker hashContext: sha256 over (name, Go file mode, sha256 of content) of the Dockerfile
    (always named "Dockerfile", mode 0) and of every file of the context not excluded by the ignore file."""
    acc = hashlib.sha256()

    def add(path: Path, rel: str, mode_text: str, symlink: bool) -> None:
        if symlink:  # the link's resolved path, not the target's content
            target = os.path.realpath(path)
            content = (os.path.relpath(target, cwd) if not context.is_absolute() else target).encode()
        else:
            content = path.read_bytes()
        acc.update(rel.encode() + mode_text.encode() + hashlib.sha256(content).digest() + b"\0")

    add(cwd / dockerfile, "Dockerfile", go_file_mode(0), symlink=False)
    root = cwd / context
    for rel in context_files(root, ignore_patterns(cwd / dockerfile, root)):
        mode = os.lstat(root / rel).st_mode
        add(root / rel, rel, go_file_mode(mode), symlink=stat.S_ISLNK(mode))
    return acc.hexdigest()


def host_platform() -> str:
    """The default build platform pulumi-docker puts in Check: linux/<GOARCH of the plugin's machine>."""
    machine = platform.machine().lower()
    return "linux/" + {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


# ---------------------------------------------------------------------------------------- provider


def _reject_unsupported(kind: str, inputs: dict, supported: frozenset) -> None:
    extra = sorted(set(inputs) - supported)
    if extra:
        raise ProviderError(f"{kind}: inputs not implemented by the docker TEST DOUBLE: {extra}")


class DockerProvider(Provider):
    name = "docker"
    version = "5.2.0"

    def __init__(self, cwd: Path | None = None):
        self.cwd = Path(cwd or os.getcwd())  # the engine starts plugins in the project directory
        self.host: str | None = None
        self.ssh_opts: list[str] = []
        self._shim_dir: str | None = None
        self._docker: docker.DockerClient | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ connection

    def configure(self, config: dict) -> None:
        self.host = config.get("host") or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        opts = config.get("sshOpts") or []
        if isinstance(opts, str):  # config variables arrive JSON-encoded
            opts = json.loads(opts) if opts.strip() else []
        self.ssh_opts = [str(o) for o in opts]
        if self.host.startswith("ssh://"):
            self._install_ssh_shim()

    def _install_ssh_shim(self) -> None:
        """`ssh` first on PATH = the system ssh with sshOpts (docker-py runs plain `ssh ... dial-stdio`).

        The shim lives in a temp dir named after its content, shared and never deleted: the engine
        kills plugins without running exit handlers, so per-process dirs would pile up."""
        path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if SHIM_PREFIX not in d)
        real_ssh = shutil.which("ssh", path=path) or "/usr/bin/ssh"  # never another double's shim
        script = (
            "#!/bin/sh\n# docker TEST DOUBLE (sim/providers/docker.py): the system ssh with a provider's sshOpts\n"
            f"exec {' '.join(shlex.quote(a) for a in [real_ssh, *self.ssh_opts])} \"$@\"\n"
        )
        digest = hashlib.sha256(script.encode()).hexdigest()[:16]
        shim_dir = Path(tempfile.gettempdir()) / f"{SHIM_PREFIX}{os.getuid()}" / digest
        shim_dir.mkdir(parents=True, exist_ok=True)
        tmp = shim_dir / f".ssh.{os.getpid()}"
        tmp.write_text(script)
        tmp.chmod(0o755)
        os.replace(tmp, shim_dir / "ssh")  # atomic: another plugin may be running the same shim
        self._shim_dir = str(shim_dir)
        os.environ["PATH"] = f"{shim_dir}{os.pathsep}{path}"

    def client(self) -> docker.DockerClient:
        """The node's engine, connected on first use (never at preview)."""
        with self._lock:
            if self._docker is None:
                if self.host is None:
                    raise ProviderError("docker TEST DOUBLE: used before Configure (no host)")
                try:
                    c = docker.DockerClient(
                        base_url=self.host, use_ssh_client=self.host.startswith("ssh://"), timeout=DOCKER_TIMEOUT
                    )
                    c.ping()
                except Exception as exc:  # noqa: BLE001 - any failure to reach the engine
                    why = f"{type(exc).__name__}: {exc}"
                    if self.host.startswith("ssh://"):
                        why += f"; ssh says: {self._ssh_diagnosis()}"
                    raise ProviderError(f"cannot reach the docker engine at {self.host}: {why}") from None
                self._docker = c
            return self._docker

    def _ssh_diagnosis(self) -> str:
        """docker-py leaves ssh's own error on our stderr ("Broken pipe" is all it reports): ask once more."""
        u = urllib.parse.urlparse(self.host)
        args = ["ssh", *(["-l", u.username] if u.username else []), *(["-p", str(u.port)] if u.port else [])]
        try:
            proc = subprocess.run([*args, "--", u.hostname, "docker version --format '{{.Server.Version}}'"],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            return f"{type(exc).__name__}: {exc}"
        out = (proc.stderr.strip() or proc.stdout.strip())[-500:]
        return f"exit {proc.returncode}: {out}" if proc.returncode else f"ssh works, docker version {out}"

    @contextmanager
    def _on_host(self, what: str):
        """Name the host in every docker/ssh/transport failure."""
        try:
            yield
        except ProviderError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ProviderError(f"{what} on {self.host}: {type(exc).__name__}: {exc}") from None

    # ------------------------------------------------------------------ dispatch

    @staticmethod
    def _known(type_: str) -> None:
        if type_ not in TYPES:
            raise ProviderError(
                f"the docker TEST DOUBLE does not implement resource type {type_} "
                "(only Container, Volume, RemoteImage and Image)"
            )

    def check(self, type_: str, olds: dict, news: dict) -> dict:
        self._known(type_)
        if type_ == CONTAINER:
            _reject_unsupported("Container", news, CONTAINER_SUPPORTED)
        elif type_ == VOLUME:
            _reject_unsupported("Volume", news, VOLUME_SUPPORTED)
        elif type_ == REMOTE_IMAGE:
            _reject_unsupported("RemoteImage", news, REMOTE_IMAGE_SUPPORTED)
        else:
            return self.check_image(news)
        return news

    def diff(self, type_: str, id_: str, olds: dict, news: dict, ignore: list[str]) -> Diff:
        self._known(type_)
        return {CONTAINER: diff_container, VOLUME: diff_volume, REMOTE_IMAGE: diff_remote_image,
                IMAGE: diff_image}[type_](olds, news, ignore)  # fmt: skip

    def Diff(self, request, context):
        """As base, but a Container diffs `mustRun` against the prior *state* (the bridge diffs against
        state): a container seen stopped (Create/Read) has mustRun=false there, so `up` restarts it
        unless the program ignores mustRun."""
        olds = from_struct(request.old_inputs) if request.HasField("old_inputs") else from_struct(request.olds)
        state = from_struct(request.olds)
        if type_of(request.urn) == CONTAINER and "mustRun" in state:
            olds = {**olds, "mustRun": state["mustRun"]}
        try:
            d = self.diff(type_of(request.urn), request.id, olds, from_struct(request.news),
                          list(request.ignoreChanges))  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            self._fail(context, f"diff {request.urn}", exc)
        return d.response()

    def create(self, type_: str, urn: str, inputs: dict, preview: bool) -> tuple[str, dict]:
        self._known(type_)
        if preview:
            return "", inputs  # nothing is created, nothing is contacted at preview
        return {CONTAINER: self.create_container, VOLUME: self.create_volume, REMOTE_IMAGE: self.ensure_remote_image,
                IMAGE: self.build_image}[type_](inputs)  # fmt: skip

    def read(self, type_: str, urn: str, id_: str, state: dict, inputs: dict) -> tuple[dict, dict] | None:
        self._known(type_)
        if type_ == CONTAINER:
            return self.read_container(id_, state, inputs)
        if type_ == VOLUME:
            return self.read_volume(id_, state, inputs)
        if type_ == REMOTE_IMAGE:
            return self.read_remote_image(state, inputs)
        return state, inputs  # pulumi-docker's Image Read does no reconciliation

    def update(self, type_: str, urn: str, id_: str, olds: dict, news: dict, preview: bool) -> dict:
        self._known(type_)
        if preview:
            return news
        if type_ == CONTAINER:
            return self.update_container(id_, olds, news)
        if type_ == REMOTE_IMAGE:
            return self.ensure_remote_image(news)[1]
        if type_ == IMAGE:
            return self.build_image(news)[1]  # any change to an Image rebuilds it
        return news  # a Volume has nothing to update in place (cluster volumes aside)

    def delete(self, type_: str, urn: str, id_: str, state: dict) -> None:
        self._known(type_)
        if type_ == CONTAINER:
            self.delete_container(id_, state)
        elif type_ == VOLUME:
            self.delete_volume(id_, state)
        elif type_ == REMOTE_IMAGE:
            self.delete_remote_image(state)
        # IMAGE: pulumi-docker's Delete is a no-op: the built image stays on the node

    # ------------------------------------------------------------------ Container

    def create_container(self, inputs: dict) -> tuple[str, dict]:
        i = reveal(inputs)
        name = i.get("name", "")
        kwargs = container_create_kwargs(i)  # input errors before touching the node
        client = self.client()
        with self._on_host(f"creating container {name}"):
            try:
                client.images.get(i["image"])
            except docker.errors.ImageNotFound:
                raise ProviderError(
                    f"creating container {name} on {self.host}: image {i['image']} is not on the node "
                    "(the docker TEST DOUBLE does not pull for a container)"
                ) from None
            container = client.containers.create(**kwargs)
            try:
                if i.get("start", True):
                    container.start()
                    if i.get("wait", False):
                        self._wait_healthy(container, int(i.get("waitTimeout", 60)))
                container.reload()  # the real Create ends with a Read of the container
            except Exception:
                try:  # no half-created resource left behind: base cannot report one to the engine
                    container.remove(force=True)
                except docker.errors.DockerException:
                    pass
                raise
        return container.id, {**inputs, **stopped_fields(container.attrs)}

    @staticmethod
    def _wait_healthy(container, timeout: int) -> None:
        deadline = time.monotonic() + timeout
        while True:
            container.reload()
            health = (container.attrs.get("State") or {}).get("Health")
            if health is None:
                raise ProviderError(
                    "you have supplied a 'wait' argument, but the container does not have a healthcheck defined"
                )
            if health.get("Status") == "healthy":
                return
            if time.monotonic() > deadline:
                raise ProviderError(f"container {container.name} failed to be in healthy state in time")
            time.sleep(1)

    def read_container(self, id_: str, state: dict, inputs: dict) -> tuple[dict, dict] | None:
        client = self.client()
        with self._on_host(f"reading container {id_[:12]}"):
            try:
                container = client.containers.get(id_)
            except docker.errors.NotFound:
                return None
        stopped = stopped_fields(container.attrs)
        if not stopped:
            return state, inputs
        # The bridge's Read returns inputs taken from the refreshed state: mustRun=false there too.
        new_inputs = {**inputs, "mustRun": False} if "mustRun" in inputs else inputs
        return {**state, **stopped}, new_inputs

    def update_container(self, id_: str, olds: dict, news: dict) -> dict:
        o, n = reveal(olds), reveal(news)
        client = self.client()
        with self._on_host(f"updating container {n.get('name', id_[:12])}"):
            container = client.containers.get(id_)
            if any(o.get(k) != n.get(k) for k in CONTAINER_UPDATABLE):
                container.update(**container_update_kwargs(n))
            # resourceDockerContainerUpdate starts the container only when mustRun goes false -> true.
            if not o.get("mustRun", True) and n.get("mustRun", True) and n.get("start", True):
                container.start()
        return news

    def delete_container(self, id_: str, state: dict) -> None:
        s = reveal(state)
        client = self.client()
        with self._on_host(f"deleting container {s.get('name', id_[:12])}"):
            try:
                container = client.containers.get(id_)
            except docker.errors.NotFound:
                return
            if not s.get("attach", False):
                grace = int(s.get("destroyGraceSeconds") or 0)
                try:
                    container.stop(timeout=grace if grace > 0 else 0)  # unset = 0 s, as the real provider
                except docker.errors.NotFound:
                    return
            try:
                container.remove(force=True, v=bool(s.get("removeVolumes", True)))
                container.wait(condition="removed" if s.get("rm") else "not-running")
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if "is already in progress" not in str(exc):
                    raise

    # ------------------------------------------------------------------ Volume

    def create_volume(self, inputs: dict) -> tuple[str, dict]:
        i = reveal(inputs)
        client = self.client()
        with self._on_host(f"creating volume {i.get('name', '')}"):
            volume = client.volumes.create(
                name=i.get("name"), driver=i.get("driver"), driver_opts=i.get("driverOpts"),
                labels=labels_map(i.get("labels")) or None,
            )  # fmt: skip
        outputs = {**inputs, "mountpoint": volume.attrs.get("Mountpoint", "")}
        outputs.setdefault("name", volume.name)  # Optional+Computed
        outputs.setdefault("driver", volume.attrs.get("Driver", "local"))
        return volume.name, outputs

    def read_volume(self, id_: str, state: dict, inputs: dict) -> tuple[dict, dict] | None:
        client = self.client()
        with self._on_host(f"reading volume {id_}"):
            try:
                volume = client.volumes.get(id_)
            except docker.errors.NotFound:
                return None
        return {**state, "mountpoint": volume.attrs.get("Mountpoint", "")}, inputs

    def delete_volume(self, id_: str, state: dict) -> None:
        client = self.client()
        deadline = time.monotonic() + VOLUME_IN_USE_RETRY_SECONDS
        with self._on_host(f"deleting volume {id_}"):
            while True:
                try:
                    client.api.remove_volume(id_, force=True)
                    return
                except docker.errors.NotFound:
                    return
                except docker.errors.APIError as exc:
                    if "volume is in use" in str(exc) and time.monotonic() < deadline:
                        time.sleep(2)
                        continue
                    raise

    # ------------------------------------------------------------------ RemoteImage

    def ensure_remote_image(self, inputs: dict) -> tuple[str, dict]:
        """findImage: the local image, else a pull."""
        i = reveal(inputs)
        name = i["name"]
        client = self.client()
        with self._on_host(f"image {name}"):
            try:
                image = client.images.get(name)
            except docker.errors.ImageNotFound:
                try:
                    image = client.images.pull(name, platform=i.get("platform") or None)
                except Exception as exc:  # noqa: BLE001
                    raise ProviderError(
                        f"image {name} is not on {self.host} and pulling it failed: {type(exc).__name__}: {exc}"
                    ) from None
        outputs = {**inputs, "imageId": image.id, "repoDigest": repo_digest(name, image.attrs.get("RepoDigests") or [])}
        return image.id + name, outputs  # the real resource's id: image id + name

    def read_remote_image(self, state: dict, inputs: dict) -> tuple[dict, dict] | None:
        name = reveal(state).get("name") or reveal(inputs)["name"]
        client = self.client()
        with self._on_host(f"reading image {name}"):
            try:
                image = client.images.get(name)
            except docker.errors.ImageNotFound:
                return None
        digest = repo_digest(name, image.attrs.get("RepoDigests") or [])
        return {**state, "imageId": image.id, "repoDigest": digest}, inputs

    def delete_remote_image(self, state: dict) -> None:
        s = reveal(state)
        if s.get("keepLocally"):
            return  # shared, multi-GB images stay on the node
        client = self.client()
        with self._on_host(f"removing image {s['name']}"):
            try:
                client.images.remove(s["name"], force=bool(s.get("forceRemove", False)))
            except docker.errors.ImageNotFound:
                pass

    # ------------------------------------------------------------------ Image (build)

    def check_image(self, news: dict) -> dict:
        """pulumi-docker provider.go Check: defaults, Dockerfile check and `build.contextDigest`."""
        _reject_unsupported("Image", news, IMAGE_SUPPORTED)
        inputs = dict(news)
        if reveal(inputs.get("buildOnPreview")) is True:
            raise ProviderError("Image: buildOnPreview is not implemented by the docker TEST DOUBLE")
        inputs["buildOnPreview"] = False  # the real default (an unknown value counts as false too)
        if reveal(inputs.get("skipPush")) is not True and not has_unknown(inputs.get("skipPush")):
            raise ProviderError("Image: pushing is not implemented by the docker TEST DOUBLE; set skip_push=True")
        build = inputs.get("build")
        build = {} if build is None else dict(build)
        _reject_unsupported("Image build", build, IMAGE_BUILD_SUPPORTED)
        if build.get("context") is None:
            build["context"] = "."
        if build.get("dockerfile") is None and build["context"] != UNKNOWN:
            build["dockerfile"] = posixpath.join(build["context"], "Dockerfile")
        dockerfile, ctx = build.get("dockerfile"), build["context"]
        if dockerfile is not None and dockerfile != UNKNOWN:
            path = self.cwd / dockerfile
            if not path.is_file():
                if Path(dockerfile).is_absolute():
                    raise ProviderError(f"expected a relative Dockerfile path; got {dockerfile!r} instead")
                if ctx != UNKNOWN and (self.cwd / ctx / dockerfile).is_file():
                    raise ProviderError(
                        f"could not open dockerfile at relative path {dockerfile!r}. "
                        f"Try setting `dockerfile` to {posixpath.join(ctx, dockerfile)!r}"
                    )
                raise ProviderError(f"could not open dockerfile at relative path {dockerfile!r}")
            if ctx != UNKNOWN:
                build["contextDigest"] = context_digest(Path(ctx), Path(dockerfile), self.cwd)
        if build.get("platform") is None:
            build["platform"] = host_platform()
        inputs["build"] = build
        return inputs

    def build_image(self, inputs: dict) -> tuple[str, dict]:
        """docker build on the node's engine, the context uploaded from the plugin's cwd (dockerBuild)."""
        i = reveal(inputs)
        b, name = i["build"], i["imageName"]
        context, dockerfile = self.cwd / b["context"], self.cwd / b["dockerfile"]
        patterns = ignore_patterns(dockerfile, context)
        rel = os.path.relpath(dockerfile, context)
        if rel.startswith(".."):  # a Dockerfile outside the context travels inside the tar under a random name
            df_name = f".dockerfile.{uuid.uuid4().hex[:20]}"
            df = (df_name, dockerfile.read_text())
        else:
            df_name, df = rel, (rel, None)
        client = self.client()
        with self._on_host(f"building image {name}"):
            with build_tar(str(context), exclude=list(patterns), dockerfile=df) as fileobj:
                try:
                    image, _ = client.images.build(
                        fileobj=fileobj, custom_context=True, dockerfile=df_name, tag=name,
                        buildargs={k: v for k, v in (b.get("args") or {}).items()}, platform=b.get("platform"),
                        target=b.get("target"), network_mode=b.get("network"),
                        rm=True, forcerm=True,  # no intermediate containers left behind, failed build or not
                    )  # fmt: skip
                except docker.errors.BuildError as exc:
                    lines = "".join(str(x.get("stream") or x.get("error") or "") for x in exc.build_log)
                    tail = "\n".join(lines.rstrip().splitlines()[-20:])
                    raise ProviderError(f"building image {name} on {self.host}: {exc.msg}\n{tail}") from None
        outputs = {
            **inputs,
            "imageName": name,
            "baseImageName": name,
            "context": b["context"],
            "dockerfile": rel,
            "platform": b.get("platform"),
            "registryServer": (i.get("registry") or {}).get("server", ""),
            "repoDigest": image.id,  # with skipPush the real provider reports the local image id here
        }
        return name, outputs


def main() -> None:
    serve(DockerProvider())


if __name__ == "__main__":
    main()
