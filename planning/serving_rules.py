"""The rules on what a group serves and how its engine is started: each engine's own fields, its ports, the
flags and environment the program manages (extraArgs and extraEnv may not override them, the declared engine
release must know every flag), the image and its build, the checkpoint's revision. Registered with the others
when planning/rules.py imports this module.
"""

from __future__ import annotations

from . import imagebuild, memoryplan, plan
from .rulebook import Finding, rule
from declared import flags
from declared.cluster import SGLANG_ONLY, SGLANG_REQUIRED, VLLM_ONLY, ClusterConfig


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@rule("engine-fields")
def engine_fields(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    """Fields of the other engine are refused; fields this engine needs must be there."""
    out = []
    s = cfg.serving
    other, mine = (VLLM_ONLY, "sglang") if cfg.engine == "sglang" else (SGLANG_ONLY, "vllm")
    # vLLM's mp backend rendezvous at distPort (rayPort is then unused, not wrong)
    if cfg.engine == "vllm" and s.distributed_executor_backend == "mp":
        other = other - {"dist_port"}
    for name in sorted(s.model_fields_set & other):
        field = f"serving.{_camel(name)}"
        out.append(Finding("engine-fields", field, getattr(s, name),
                           f"is a {'vLLM' if mine == 'sglang' else 'SGLang'} setting and this stack runs engine {mine}",
                           f"remove {field}"))  # fmt: skip
    if cfg.engine == "sglang":
        for name in SGLANG_REQUIRED:
            if getattr(s, name) is None:
                out.append(Finding("engine-fields", f"serving.{_camel(name)}", None, "is required for engine sglang",
                                   "set it (see Pulumi.tp4.yaml for the seed's values)"))  # fmt: skip
        if cfg.engram is None:
            out.append(Finding("engine-fields", "engram", None, "is required for engine sglang (packed shards on NVMe)",
                               "add engram: {dir: /path/on/nvme}"))  # fmt: skip
    elif cfg.engram is not None:
        out.append(Finding("engine-fields", "engram", "...", "engram shards are an SGLang feature; vLLM reads the "
                           "NVFP4 checkpoint's MXFP4 engram tables itself", "remove the engram section"))  # fmt: skip
    if cfg.model.source == "download" and not cfg.model.hf_repo:
        out.append(Finding("engine-fields", "model.hfRepo", None, "source: download needs the repository",
                           "set model.hfRepo, e.g. nvidia/DeepSeek-V4.1-Flash-NVFP4"))  # fmt: skip
    if cfg.model.source == "shared" and cfg.model.hf_repo:
        out.append(Finding("engine-fields", "model.hfRepo", cfg.model.hf_repo, "is only used with source: download",
                           "set model.source: download, or remove model.hfRepo"))  # fmt: skip
    return out


@rule("ep-divides-tp")
def _ep(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    s = cfg.serving
    if cfg.engine == "sglang" and s.tp_size % s.ep_size:
        return [Finding("ep-divides-tp", "serving.epSize", s.ep_size, f"does not divide tpSize {s.tp_size}",
                        f"use epSize {s.tp_size} (the seeds' value) or a divisor of it")]  # fmt: skip
    return []


RAY_DASHBOARD_PORT = 8265  # `ray start --head` listens there on every interface


@rule("ports-distinct")
def _ports(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    s = cfg.serving
    fix = "use the seeds' ports: sglang port 8888 / distPort 20000, vllm port 8000 / rayPort 6379, selfHeal.port 9850"
    # the second port: SGLang's and vLLM mp's rendezvous (distPort), or the Ray head's (rayPort)
    second = ("rayPort", s.ray_port) if cfg.engine == "vllm" and s.distributed_executor_backend == "ray" \
        else ("distPort", s.dist_port)
    ports = [("port", s.port), second] + ([("selfHeal.port", s.self_heal.port)] if s.self_heal.enabled else [])
    taken = {22: "ssh", RAY_DASHBOARD_PORT: "Ray's dashboard"}
    taken.update({n.ssh_port: f"nodes[{i}].sshPort" for i, n in enumerate(cfg.nodes)})
    out = []
    for i, (name, port) in enumerate(ports):
        same = next((other for other, p in ports[:i] if p == port), None)
        if same:
            out.append(Finding("ports-distinct", f"serving.{name}", port, f"equals serving.{same} on the nodes", fix))
    for name, port in ports:
        if port in taken:
            out.append(Finding("ports-distinct", f"serving.{name}", port, f"is {taken[port]}'s port on the nodes", fix))
    return out


def node_ports(cfg: ClusterConfig, node) -> dict[int, str]:
    """The ports a node of group `cfg` already uses: ssh, Ray's dashboard, the group's serving ports."""
    engine_port = ("distPort", cfg.serving.dist_port) if cfg.engine == "sglang" else ("rayPort", cfg.serving.ray_port)
    taken = {22: "ssh", RAY_DASHBOARD_PORT: "Ray's dashboard", node.ssh_port: "the node's sshPort",
             cfg.serving.port: "the group's serving.port", engine_port[1]: f"the group's serving.{engine_port[0]}"}
    if cfg.serving.self_heal.enabled:
        taken[cfg.serving.self_heal.port] = "the group's guard (serving.selfHeal.port)"
    return taken


@rule("no-ram-offload")
def _offload(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    why = ("host RAM is GPU memory on a Spark: OFFLOAD_MODE=ram evicts the engram tables and the "
           "server cannot serve")  # fmt: skip
    out = []
    if cfg.serving.offload_mode == "ram":
        out.append(Finding("no-ram-offload", "serving.offloadMode", "ram", why, "set serving.offloadMode: nvme"))
    if cfg.serving.extra_env.get("OFFLOAD_MODE", "").lower() == "ram":
        out.append(Finding("no-ram-offload", "serving.extraEnv.OFFLOAD_MODE", "ram", why,
                           "remove OFFLOAD_MODE from serving.extraEnv"))  # fmt: skip
    return out


MANAGED_ENV = {
    "NODE_RANK", "NNODES", "TP_SIZE", "EP_SIZE", "HOST_IP", "DSV41_SOURCE", "DSV41_PACKED_DIR", "VLLM_HOST_IP",
    "RAY_ADDRESS", "RAY_PORT", "DSPARK_RAY_NODES", "DSPARK_CHECKPOINT_REVISION", "SGLANG_HOST_IP",
    "DSPARK_FABRIC_IP", "DSPARK_BOOTSTRAP_IP", "DSPARK_LINK_IPS",
    # from the fabric section, validated there (or found on the node at rank start)
    "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_IB_GID_INDEX",
    "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_ADDR_FAMILY",
}  # fmt: skip
SECRET_ENV = {"API_KEY", "SGLANG_API_KEY", "OPENAI_API_KEY", "VLLM_API_KEY", "HF_TOKEN"}


@rule("extra-args-not-managed")
def _extra_args(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    """extraArgs come last on the server's command line and win: refuse anything the engine's parser
    would read as a flag the program sets (aliases, unique prefixes, vLLM's `_` for `-`: flags.py)."""
    out = []
    for i, arg in enumerate(cfg.serving.extra_args):
        entry = flags.managed_entry(arg, cfg.engine)
        if entry is not None:
            out.append(Finding("extra-args-not-managed", f"serving.extraArgs[{i}]", arg,
                               f"{cfg.engine} reads it as {entry.flag}, which the program sets ({entry.setting})",
                               "remove it and set the matching field (the API key: the apiKey secret)"))  # fmt: skip
    return out


@rule("engine-version")
def _engine_version(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    """Every option on every rank's command line must exist in the declared engine release: releases
    rename and remove flags (SGLang 0.5.20 dropped --cuda-graph-max-bs), and a rank given an unknown or
    ambiguous flag exits at boot. Checked against the real parser's option table where one was dumped
    (declared/options), and against flags.HISTORY for any release."""
    engine, version = cfg.engine, cfg.engine_version
    profile = memoryplan.PROFILES.get(cfg.model.profile)
    if profile is None or profile.engine != engine:
        return []  # known-profile says why; the rank specs (their memory limits) need the profile's figures
    minimum = flags.MIN_VERSION[engine]
    if flags.version_key(version) < flags.version_key(minimum):
        return [Finding("engine-version", "engineVersion", version,
                        f"is older than {engine} {minimum}, the first release with the flags this program sets",
                        f"use an image with {engine} >= {minimum} and declare its version in engineVersion")]  # fmt: skip
    table = flags.load_options(engine, version)
    extra = {a: i for i, a in enumerate(cfg.serving.extra_args)}
    out, seen = [], set()
    for spec in plan.group_specs(cfg, stack or "check"):
        for program, argv in plan.rank_checks(cfg, spec):
            for token in flags.option_tokens(argv) if program == engine else ():
                if token in seen:
                    continue
                seen.add(token)
                field = f"serving.extraArgs[{extra[token]}]" if token in extra else "engineVersion"
                value = token if token in extra else version
                change = flags.history_problem(engine, token.split("=", 1)[0], version)
                if change is not None:
                    when = f"removed in {change.removed}" if change.removed else f"added in {change.added}"
                    out.append(Finding("engine-version", field, value,
                                       f"{token} is not a flag of {engine} {version} ({when}; {change.source or 'flags.HISTORY'})",
                                       f"write {change.replacement} instead" if token in extra
                                       else f"declare the image's real engine version; this program needs {change.replacement}"))  # fmt: skip
                    continue
                if table is None:
                    continue
                resolved, candidates = flags.resolve(token, table)
                if resolved is None:
                    why = f"ambiguous: could match {', '.join(candidates[:4])}" if candidates else "no such option"
                    out.append(Finding("engine-version", field, value,
                                       f"{token} is refused by {engine} {version}'s parser ({why})",
                                       "remove it or spell the option in full as this release names it"
                                       if token in extra else "declare the engine version the image carries"))  # fmt: skip
    if table is None:
        known = ", ".join(flags.known_versions(engine)) or "none"
        out.append(Finding("engine-version", "engineVersion", version,
                           f"no option table for {engine} {version} here (known: {known}), so only renamed flags "
                           "were checked at preview", "nothing to do: the image's own parser checks every rank's "
                           "argv at up, before the group starts (the rank<i>-argcheck steps)", level="warning"))  # fmt: skip
    return out


# Knobs that change how much memory a rank takes outside the memory plan (the plan sets the ones it
# accounts for; anything else here would make the plan's verdict meaningless).
MEMORY_ENV = {
    "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "NCCL_BUFFSIZE", "NCCL_LL_BUFFSIZE", "NCCL_LL128_BUFFSIZE",
    "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_NCHANNELS_PER_NET_PEER", "NCCL_PROTO", "NCCL_CUMEM_ENABLE",
    "NCCL_NVLS_ENABLE", "DSV41_CACHE_GIB", "DSV41_RESIDENT_SCALES", "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE",
    "VLLM_CPU_KVCACHE_SPACE", "RAY_memory_monitor_refresh_ms", "RAY_memory_usage_threshold",
}  # fmt: skip


@rule("extra-env-not-managed")
def _extra_env(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    out = []
    for key in cfg.serving.extra_env:
        if key in SECRET_ENV:
            out.append(Finding("extra-env-not-managed", f"serving.extraEnv.{key}", "<hidden>",
                               "secrets in extraEnv end up in plain text in state, labels and previews",
                               "remove it; the API key comes from `pulumi config set --secret deepseek-spark:apiKey`"))  # fmt: skip
        elif key == "OFFLOAD_MODE":
            continue  # no-ram-offload explains it
        elif key in MANAGED_ENV:
            out.append(Finding("extra-env-not-managed", f"serving.extraEnv.{key}", cfg.serving.extra_env[key],
                               "set by the program from the structured config (extraEnv would override it)",
                               "remove it from serving.extraEnv and set the matching field"))  # fmt: skip
        elif key in MEMORY_ENV:
            out.append(Finding("extra-env-not-managed", f"serving.extraEnv.{key}", cfg.serving.extra_env[key],
                               "changes memory use outside the memory plan", "remove it from serving.extraEnv"))  # fmt: skip
    return out


@rule("image-build-context-exists")
def _build_context(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    b = cfg.image_build
    if b is None:
        return []
    context = plan.PROJECT_ROOT / b.context
    if not context.is_dir():
        return [Finding("image-build-context-exists", "imageBuild.context", b.context,
                        "no such directory (a relative path starts at the project directory)",
                        "clone the recipe (its Dockerfile and adapter/) there, or point imageBuild.context at it")]  # fmt: skip
    if not (context / b.dockerfile).is_file():
        return [Finding("image-build-context-exists", "imageBuild.dockerfile", b.dockerfile,
                        f"not found in {b.context}", "name the Dockerfile inside imageBuild.context")]  # fmt: skip
    unreadable = []
    for rel in plan.context_files(context):
        try:
            with open(context / rel, "rb"):
                pass
        except OSError:
            unreadable.append(rel)
    if unreadable:
        return [Finding("image-build-context-exists", "imageBuild.context", b.context,
                        f"{len(unreadable)} file(s) the build would send cannot be read here: {unreadable[:5]}",
                        "make them readable, or list them in the context's .dockerignore")]  # fmt: skip
    size = sum((context / rel).stat().st_size for rel in plan.context_files(context))
    if size > imagebuild.MAX_CONTEXT_BYTES:
        return [Finding("image-build-context-exists", "imageBuild.context", b.context,
                        f"the build would send {size / 2**20:.1f} MiB to every node on its command's stdin (at most "
                        f"{imagebuild.MAX_CONTEXT_BYTES // 2**20} MiB: an overlay's Dockerfile and adapter)",
                        "list what the Dockerfile does not COPY in the context's .dockerignore")]  # fmt: skip
    return []


@rule("tp3-padding-warning")
def _tp3(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    if cfg.engine == "sglang" and cfg.serving.tp_size == 3:
        return [Finding("tp3-padding-warning", "serving.tpSize", 3,
                        "rank 2's attention shard is all padding (64 heads / 8 o-groups / 128 draft experts "
                        "do not divide by 3), so GPU use is uneven",
                        "expected at TP3; use 4 Sparks for an even split", level="warning")]  # fmt: skip
    return []


@rule("dev-image-warning")
def _image(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    if "@sha256:" not in cfg.image and ":dev" in cfg.image:
        return [Finding("dev-image-warning", "image", cfg.image,
                        "a development tag can move under you and then nodes run different builds",
                        "pin it by digest (image@sha256:...) for reproducible rollouts", level="warning")]  # fmt: skip
    return []


@rule("pinned-revision-warning")
def _pinned(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    rev = cfg.model.revision
    if cfg.model.source == "download" and not (len(rev) == 40 and all(c in "0123456789abcdef" for c in rev)):
        return [Finding("pinned-revision-warning", "model.revision", rev,
                        "a branch or tag can move: nodes that download at different times may hold different weights",
                        "pin the 40-character commit of the Hugging Face repo", level="warning")]  # fmt: skip
    return []
