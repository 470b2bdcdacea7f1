"""pulumi-docker's resources as the TEST DOUBLE models them, without gRPC: the schema (inputs, defaults,
which changes replace), diff rules, the container inputs mapped to the docker SDK, and the image build
context digest. Pure functions; sim/providers/docker.py serves them to the engine."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import posixpath
import re
import stat
from pathlib import Path
from typing import Any

from docker.types import DeviceRequest, DriverConfig, Healthcheck, LogConfig, Mount, Ulimit
from docker.utils.build import PatternMatcher

from sim.providers.base import Diff, ProviderError, diff_inputs, reveal
from sim.providers.detailed_diff import detailed_diff

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


# The shapes of the container's collection properties, for the bridge's detailed diff (lists keep order).
CONTAINER_SHAPES = {**{k: "set" for k in CONTAINER_SETS}, "command": "list", "entrypoints": "list", "tmpfs": "map",
                    "sysctls": "map", "logOpts": "map", "storageOpts": "map", "capabilities": "object"}  # fmt: skip


def _bridged(d: Diff, o: dict, n: dict, force_new: frozenset, shapes: dict) -> Diff:
    """`d` with the bridge's detailed diff (MakeDetailedDiffV2: nested paths) of the keys it found changed."""
    d.detailed = detailed_diff({k: o.get(k) for k in d.changed}, {k: n.get(k) for k in d.changed}, shapes, force_new)
    return d


def diff_container(olds: dict, news: dict, ignore: list[str]) -> Diff:
    o, n = _normalized_container(olds), _normalized_container(news)
    for key in CONTAINER_COMPUTED:
        if key in o and key not in n:
            n[key] = o[key]  # Optional+Computed: not set = keep what is there
    d = diff_inputs(o, n, set(CONTAINER_FORCE_NEW), ignore)
    d.delete_before_replace = True  # pulumi-docker's resources.go: DeleteBeforeReplace for docker_container
    return _bridged(d, o, n, CONTAINER_FORCE_NEW, CONTAINER_SHAPES)


def diff_volume(olds: dict, news: dict, ignore: list[str]) -> Diff:
    o, n = _normalized(olds, {}, frozenset({"labels"})), _normalized(news, {}, frozenset({"labels"}))
    for key in ("name", "driver"):  # Optional+Computed
        if key in o and key not in n:
            n[key] = o[key]
    d = diff_inputs(o, n, set(VOLUME_FORCE_NEW), ignore)
    return _bridged(d, o, n, VOLUME_FORCE_NEW, {"labels": "set", "driverOpts": "map"})


def diff_remote_image(olds: dict, news: dict, ignore: list[str]) -> Diff:
    defaults = {"platform": ""}
    sets = frozenset({"pullTriggers"})
    o, n = _normalized(olds, defaults, sets), _normalized(news, defaults, sets)
    d = diff_inputs(o, n, set(REMOTE_IMAGE_FORCE_NEW), ignore)
    return _bridged(d, o, n, REMOTE_IMAGE_FORCE_NEW, {"pullTriggers": "set", "triggers": "map"})


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


# ---------------------------------------------------------------------------------------- read (refresh)


def _mb(value: int | None) -> int:
    """Bytes as the schema's MB figure (integer division, as Go's /1024/1024); 0 and -1 (unlimited) as they are."""
    value = int(value or 0)
    return value // (1024 * 1024) if value > 0 else value


def read_back_container(attrs: dict, inputs: dict) -> dict:
    """What resourceDockerContainerRead (terraform-provider-docker v4.5.0, resource_docker_container_funcs.go
    827-985) writes into the state from `docker inspect` of a container, for the fields this program sets, in
    pulumi-docker's property names. Envs and labels are deliberately not read (the real Read leaves them: they
    merge with the image's, lines 890-895); devices, ulimits and gpus only when configured (lines 884, 898, 919);
    capabilities only when the container has some (line 869)."""
    config, host = attrs.get("Config") or {}, attrs.get("HostConfig") or {}
    i = reveal(inputs)
    out: dict[str, Any] = {
        "name": str(attrs.get("Name", "")).lstrip("/"),
        # line 840: Config.Image unless the program gave an image ID
        "image": attrs.get("Image", "") if str(i.get("image", "")).startswith("sha256:") else config.get("Image", ""),
        "command": config.get("Cmd") or [],
        "entrypoints": config.get("Entrypoint") or [],
        "restart": (host.get("RestartPolicy") or {}).get("Name", ""),
        "maxRetryCount": (host.get("RestartPolicy") or {}).get("MaximumRetryCount", 0),
        "networkMode": host.get("NetworkMode", ""),
        "ipcMode": host.get("IpcMode", ""),
        "privileged": bool(host.get("Privileged")),
        "memory": _mb(host.get("Memory")),
        "memorySwap": _mb(host.get("MemorySwap")),
        "shmSize": _mb(host.get("ShmSize")),
        "logDriver": (host.get("LogConfig") or {}).get("Type", ""),
        "mounts": [
            {"target": m.get("Target", ""), "source": m.get("Source", ""), "type": m.get("Type", ""),
             "readOnly": bool(m.get("ReadOnly")),
             **({"bindOptions": {"propagation": (m.get("BindOptions") or {}).get("Propagation", "")}}
                if m.get("BindOptions") is not None else {}),
             **({"volumeOptions": {"noCopy": bool((m.get("VolumeOptions") or {}).get("NoCopy")),
                                   "labels": [{"label": k, "volume": v} for k, v in
                                              ((m.get("VolumeOptions") or {}).get("Labels") or {}).items()]}}
                if m.get("VolumeOptions") is not None else {})}
            for m in host.get("Mounts") or []
        ],  # fmt: skip
    }
    if host.get("CapAdd") or host.get("CapDrop"):
        out["capabilities"] = {"adds": host.get("CapAdd") or [], "drops": host.get("CapDrop") or []}
    if i.get("ulimits"):
        out["ulimits"] = [{"name": u.get("Name"), "soft": u.get("Soft"), "hard": u.get("Hard")}
                          for u in host.get("Ulimits") or []]  # fmt: skip
    if i.get("devices"):
        configured = {d.get("hostPath") for d in i["devices"] if d.get("hostPath") and d.get("containerPath")}
        out["devices"] = [{"hostPath": d.get("PathOnHost", ""), "permissions": d.get("CgroupPermissions", ""),
                           **({"containerPath": d.get("PathInContainer", "")} if d.get("PathOnHost") in configured else {})}
                          for d in host.get("Devices") or []]  # fmt: skip
    if i.get("gpus"):
        gpus = gpus_from_device_requests(host.get("DeviceRequests") or [])
        if gpus is not None:  # a request the attribute cannot express: the configured value stays (line 923)
            out["gpus"] = gpus
    return out


def gpus_from_device_requests(requests: list[dict]) -> str | None:
    """flattenGPUsFromDeviceRequests (resource_docker_container_funcs.go 720): "all", "device=IDs", "" or None."""
    if not requests:
        return ""
    if len(requests) != 1:
        return None
    r = requests[0]
    if r.get("DeviceIDs"):
        return "device=" + ",".join(r["DeviceIDs"])
    if r.get("Count") != -1:
        return None
    if any(str(c).lower() == "gpu" for caps in r.get("Capabilities") or [] for c in caps or []):
        return "all"
    return None


def read_back_volume(attrs: dict) -> dict:
    """resourceDockerVolumeRead: name, labels, driver, driver_opts and mountpoint from `docker volume inspect`."""
    return {
        "name": attrs.get("Name", ""),
        "driver": attrs.get("Driver", ""),
        "driverOpts": attrs.get("Options") or {},
        "labels": [{"label": k, "value": v} for k, v in sorted((attrs.get("Labels") or {}).items())],
        "mountpoint": attrs.get("Mountpoint", ""),
    }


def refreshed_inputs(inputs: dict, read: dict) -> dict:
    """The bridge's Read returns inputs extracted from the refreshed state for the keys the old inputs have
    (pulumi-terraform-bridge ExtractInputsFromOutputs): an input that drifted reads back as what the node has."""
    out = dict(inputs)
    for key, value in read.items():
        if key in inputs and reveal(inputs[key]) != value:
            out[key] = value
    return out
