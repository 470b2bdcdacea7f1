"""Validation rules, checked at preview before any resource is registered.

Each rule is a function of the validated config that returns findings. An error finding names the
field, the bad value and the fix; warnings are printed and do not stop the run. `RULES` is the list
the program runs and the tests walk (every rule has a passing and a failing case).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from . import fabric, memoryplan, plan
from declared import flags
from declared.shapes import read_only_problem
from declared.config import LOCAL, SGLANG_ONLY, SGLANG_REQUIRED, VLLM_ONLY, ClusterConfig, StackConfig


@dataclass(frozen=True)
class Finding:
    rule: str
    field: str
    value: object
    problem: str
    fix: str
    level: str = "error"  # or "warning"

    def __str__(self) -> str:
        return f"cluster.{self.field} = {self.value!r}: {self.problem}; fix: {self.fix}"


Rule = Callable[[ClusterConfig, str], list[Finding]]  # (config, stack name) -> findings
RULES: list[tuple[str, Rule]] = []


def rule(name: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES.append((name, fn))
        return fn

    return register


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@rule("engine-fields")
def _engine_fields(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
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


@rule("node-count-equals-tp")
def _node_count(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    n, tp = len(cfg.nodes), cfg.serving.tp_size
    if n != tp:
        return [
            Finding("node-count-equals-tp", "serving.tpSize", tp,
                    f"{n} nodes are listed but each Spark runs exactly one rank",
                    f"set serving.tpSize to {n}, or list {tp} nodes")
        ]  # fmt: skip
    return []


@rule("unique-nodes")
def _unique(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    out = []
    for attr, label in (("name", "name"), ("host", "host"), ("fabric_ip", "fabricIp")):
        counts = Counter(getattr(n, attr) for n in cfg.nodes)
        for i, node in enumerate(cfg.nodes):
            value = getattr(node, attr)
            if counts[value] > 1:
                out.append(Finding("unique-nodes", f"nodes[{i}].{label}", value,
                                   f"{label} is used by {counts[value]} nodes", f"give every node its own {label}"))  # fmt: skip
    return out


@rule("fabric-ip-is-ipv4")
def _fabric_ip(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    out = []
    for i, node in enumerate(cfg.nodes):
        values = [("fabricIp", node.fabric_ip), ("nfsServerIp", node.nfs_server_ip),
                  *((f"linkIps[{k}]", ip) for k, ip in enumerate(node.link_ips))]  # fmt: skip
        if cfg.fabric.bootstrap == "management":
            values.append(("host", node.host))
        for label, value in values:
            if value is None:
                continue
            try:
                ip = ipaddress.IPv4Address(value)
                bad = ip.is_loopback or ip.is_unspecified or ip.is_multicast
            except ValueError:
                bad = True
            if bad:
                what = ("with fabric.bootstrap: management, dist-init, Ray and NCCL's bootstrap bind the host"
                        if label == "host" else "NCCL, dist-init and NFS use it")  # fmt: skip
                out.append(Finding("fabric-ip-is-ipv4", f"nodes[{i}].{label}", value,
                                   f"not a routable IPv4 address ({what})",
                                   "use the node's IPv4 address, e.g. 10.0.0.2"))  # fmt: skip
    return out


def _subnet(ip: str, prefix: int) -> str | None:
    try:
        return str(ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False))
    except ValueError:
        return None


@rule("fabric-planes")
def _planes(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    """The data plane is complete and apart from the control plane: every pair that exchanges NCCL
    traffic shares a ConnectX-7 link, one bootstrap address per node reaches every peer, and NFS
    uses a link the head and the worker share."""
    out, nodes, p = [], cfg.nodes, cfg.fabric.prefix_length
    n = len(nodes)
    if n < 2:
        return out
    need = [(i, (i + 1) % n) for i in range(n)] if cfg.topology == "ring" else \
        [(a, b) for a in range(n) for b in range(a + 1, n)]  # fmt: skip
    for a, b in sorted({tuple(sorted(x)) for x in need}):
        if fabric.link(cfg, a, b) is None:
            out.append(Finding("fabric-planes", f"nodes[{b}].fabricIp", nodes[b].fabric_ip,
                               f"{nodes[a].name} and {nodes[b].name} have no data-plane addresses in one /{p} subnet, so "
                               "NCCL traffic between them has no ConnectX-7 link",
                               f"give each its address on their link ({'linkIps' if cfg.topology == 'direct' else 'fabricIp'}), "
                               "or cable both to the RoCE switch"))  # fmt: skip
    subnets = {_subnet(x.fabric_ip, p) for x in nodes}
    if cfg.fabric.bootstrap == "fabric" and len(subnets) > 1:
        out.append(Finding("fabric-planes", "fabric.bootstrap", "fabric",
                           f"the fabricIps are on {len(subnets)} /{p} subnets ({', '.join(sorted(map(str, subnets)))}): "
                           "dist-init, Ray and NCCL's bootstrap need one address per node that every peer reaches",
                           "set fabric.bootstrap: management for a triangle or ring (bootstrap over the hosts, as the "
                           "reference does; NCCL still moves data over ConnectX-7), or put every fabricIp on one switch "
                           "subnet"))  # fmt: skip
    for i, node in enumerate(nodes):
        if node.host == node.fabric_ip:
            out.append(Finding("fabric-planes", f"nodes[{i}].fabricIp", node.fabric_ip,
                               "equals the node's host: control and data plane on one address. If that is the 10 GbE "
                               "management link, NCCL, dist-init and the checkpoint would cross it (preflight fails "
                               "when the address is not on ConnectX-7)",
                               "set fabricIp to the node's address on its cabled ConnectX-7 port", "warning"))  # fmt: skip
        if i and node.nfs_server_ip and cfg.share.mode == "nfs":
            lk = fabric.link(cfg, 0, i)
            if lk is None or lk.a_ip != node.nfs_server_ip:
                out.append(Finding("fabric-planes", f"nodes[{i}].nfsServerIp", node.nfs_server_ip,
                                   f"is not the head's address on its link with {node.name} (the export lists "
                                   f"{node.name}'s address on that link, so the mount would be refused)",
                                   f"remove it (default: {lk.a_ip if lk else 'the shared link'}) or use the head's "
                                   "fabricIp/linkIps address that shares a subnet with this worker"))  # fmt: skip
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


def is_sim_stack(stack: str) -> bool:
    """The simulated cluster's stacks (sim, sim-tp2, ...): the only ones that may plan with test doubles."""
    return stack == "sim" or stack.startswith("sim-")


@rule("known-profile")
def _profile(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    names = sorted(n for n, p in memoryplan.PROFILES.items() if p.engine == cfg.engine and n not in memoryplan.TEST_DOUBLE_PROFILES)
    prof = memoryplan.PROFILES.get(cfg.model.profile)
    if prof is None or prof.engine != cfg.engine:
        return [Finding("known-profile", "model.profile", cfg.model.profile,
                        f"no memory profile of that name for engine {cfg.engine}", f"use one of {names}")]  # fmt: skip
    if cfg.model.profile in memoryplan.TEST_DOUBLE_PROFILES and not is_sim_stack(stack):
        return [Finding("known-profile", "model.profile", cfg.model.profile,
                        f"the test double's memory figures (a tiny fake checkpoint) on stack {stack!r}: the memory "
                        "plan would approve anything", f"use one of {names}")]  # fmt: skip
    return []


@rule("memory-plan-fits")
def _memory(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    if _profile(cfg, stack):
        return []  # reported by known-profile
    if cfg.engine == "vllm":
        return _vllm_memory(cfg)
    prof = memoryplan.PROFILES[cfg.model.profile]
    mp = memoryplan.memory_plan(cfg)
    s = cfg.serving
    if not mp.known:
        return [Finding("memory-plan-fits", "serving.tpSize", s.tp_size,
                        f"profile {cfg.model.profile} has no published memory figures for TP={s.tp_size}",
                        f"use a TP size with figures: {sorted(prof.weights_gib_by_tp)}")]  # fmt: skip
    out = []
    head = mp.ranks[0]
    unified = cfg.memory.unified_gib
    floor = prof.min_mem_fraction_by_tp.get(s.tp_size)
    if floor is not None and s.mem_fraction_static < floor:
        out.append(Finding("memory-plan-fits", "serving.memFractionStatic", s.mem_fraction_static,
                           f"TP={s.tp_size} has been measured to need at least {floor} (below it the weights leave "
                           "no KV budget at boot)", f"set serving.memFractionStatic to {floor} or more"))  # fmt: skip
    if head.weights_gib + head.draft_gib >= unified:
        return [Finding("memory-plan-fits", "serving.tpSize", s.tp_size,
                        f"resident weights per rank are {head.weights_gib + head.draft_gib:.1f} GiB at TP={s.tp_size}, "
                        f"more than a Spark's {unified} GiB",
                        "SGLang needs 3+ Sparks for this checkpoint: list 3 or 4 nodes")]  # fmt: skip
    if not head.static_fits:
        limit = memoryplan.max_tokens_that_fit(cfg)
        out.append(Finding("memory-plan-fits", "serving.maxTotalTokens", s.max_total_tokens,
                           f"the head's static pool ({s.mem_fraction_static:g} x {unified} = {head.static_pool_gib:.1f} GiB) "
                           f"cannot hold weights {head.weights_gib + head.draft_gib:.1f} + KV {head.kv_gib:.1f} + "
                           f"window {head.window_gib:.2f} = {head.static_used_gib:.1f} GiB",
                           f"lower serving.maxTotalTokens to at most {limit}, or raise serving.memFractionStatic "
                           f"if the outside budget allows"))  # fmt: skip
    if not head.outside_fits:
        max_frac = (unified - head.outside_needed_gib) / unified
        out.append(Finding("memory-plan-fits", "serving.memFractionStatic", s.mem_fraction_static,
                           f"leaves {head.outside_gib:.1f} GiB outside the static pool but CUDA graphs "
                           f"{head.cuda_graphs_gib:.1f} + NCCL {head.nccl_gib:.2f} + runtime floor "
                           f"{head.runtime_floor_gib:.1f} need {head.outside_needed_gib:.1f} GiB (a head OOM hangs every rank)",
                           f"lower serving.memFractionStatic to at most {max_frac:.3f} or lower "
                           f"serving.maxRunningRequests; never raise them to fix a full KV pool"))  # fmt: skip
    return out


def _vllm_memory(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    prof = memoryplan.PROFILES[cfg.model.profile]
    s = cfg.serving
    mp = memoryplan.vllm_memory_plan(cfg)
    if not mp.known:
        return [Finding("memory-plan-fits", "serving.tpSize", s.tp_size,
                        f"profile {cfg.model.profile} has published figures for TP={sorted(prof.weights_gib_by_tp)} only",
                        f"serve this checkpoint on {min(prof.weights_gib_by_tp)} Sparks, or SGLang on 3-4")]  # fmt: skip
    r = mp.ranks[0]
    out = []
    if not r.static_fits:
        fit = max(0, int((r.static_pool_gib - r.weights_gib) / memoryplan.vllm_kv_gib(cfg, 1)))
        out.append(Finding("memory-plan-fits", "serving.maxModelLen", s.max_model_len,
                           f"gpuMemoryUtilization {s.gpu_memory_utilization:g} x {cfg.memory.unified_gib} = "
                           f"{r.static_pool_gib:.1f} GiB cannot hold weights {r.weights_gib:.0f} + KV {r.kv_gib:.1f} GiB",
                           f"lower serving.maxModelLen first (131072 -> 65536 or 32768; at most {fit} fits)"))  # fmt: skip
    if not r.outside_fits:
        out.append(Finding("memory-plan-fits", "serving.gpuMemoryUtilization", s.gpu_memory_utilization,
                           f"leaves {r.outside_gib:.1f} GiB for the runtime, which needs up to {r.outside_needed_gib:.1f} GiB",
                           f"lower serving.gpuMemoryUtilization to at most "
                           f"{(cfg.memory.unified_gib - r.outside_needed_gib) / cfg.memory.unified_gib:.2f}"))  # fmt: skip
    return out


@rule("context-length-supported")
def _context(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    prof = memoryplan.PROFILES.get(cfg.model.profile)
    s = cfg.serving
    out = []
    if cfg.engine == "vllm":
        if prof is not None and prof.engine == "vllm" and s.max_model_len > prof.max_model_len:
            out.append(Finding("context-length-supported", "serving.maxModelLen", s.max_model_len,
                               f"more than the {prof.max_model_len} tokens verified for this checkpoint",
                               f"set serving.maxModelLen to {prof.max_model_len} or less"))  # fmt: skip
        return out
    limit = prof.max_context_by_tp.get(s.tp_size) if prof and prof.engine == "sglang" else None
    if limit is not None and s.context_length > limit:
        out.append(Finding("context-length-supported", "serving.contextLength", s.context_length,
                           f"TP={s.tp_size} supports at most {limit} tokens of context",
                           f"set serving.contextLength to {limit} or less (1M needs 4 Sparks)"))  # fmt: skip
    if s.context_length > s.max_total_tokens:
        out.append(Finding("context-length-supported", "serving.contextLength", s.context_length,
                           f"one request of this length cannot fit the KV pool of {s.max_total_tokens} tokens",
                           "lower serving.contextLength to at most serving.maxTotalTokens"))  # fmt: skip
    return out


@rule("topology-fits-node-count")
def _topology(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    n = len(cfg.nodes)
    if cfg.topology == "direct" and n > 3:
        return [Finding("topology-fits-node-count", "topology", "direct",
                        f"{n} Sparks cannot all be cabled to each other (a triangle is the largest direct mesh)",
                        "use topology: switch (RoCE switch) or topology: ring (NCCL ring mode, 4 nodes)")]  # fmt: skip
    if cfg.topology == "ring" and n != 4:
        return [Finding("topology-fits-node-count", "topology", "ring",
                        f"NCCL ring mode is for exactly 4 Sparks, {n} are listed",
                        "use topology: direct for 2-3 nodes, or switch")]  # fmt: skip
    return []


@rule("nfs-share-read-only")
def _nfs_ro(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    out = []
    for field, opts, fix in (
        ("share.exportOptions", cfg.share.export_options, "[ro, sync, no_subtree_check, no_root_squash, insecure]"),
        ("share.mountOptions", cfg.share.mount_options, "keep ro: [nfsvers=4.2, ro, nconnect=8, hard, timeo=600]"),
    ):
        problem = read_only_problem(opts)
        if problem:
            out.append(Finding("nfs-share-read-only", field, opts, problem, fix))
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


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


@rule("paths-apart-from-checkpoint")
def _paths(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    """stateDir (the API key file) and engram.dir never inside or above checkpointDir: inside, they are
    exported over NFS and mounted into every rank; above, the checkpoint sits inside them."""
    ckpt = cfg.model.checkpoint_dir
    out = []
    for field, path in (("stateDir", plan.state_dir(cfg)), ("engram.dir", cfg.engram.dir if cfg.engram else None)):
        if path is None:
            continue
        if _within(path, ckpt) or _within(ckpt, path):
            where = "inside" if _within(path, ckpt) else "above"
            out.append(Finding("paths-apart-from-checkpoint", field, path,
                               f"is {where} model.checkpointDir {ckpt!r}, which is shared with every rank (and over NFS)",
                               "use a directory outside the checkpoint tree, e.g. /var/lib/deepseek-spark or /data/engram"))  # fmt: skip
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


@rule("kv-pin-clamp-warning")
def _kv_clamp(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    prof = memoryplan.PROFILES.get(cfg.model.profile)
    if cfg.engine != "sglang" or prof is None or prof.engine != "sglang":
        return []
    published = prof.published_kv_pool_by_tp.get(cfg.serving.tp_size)
    if published is None or cfg.serving.max_total_tokens <= published[1]:
        return []
    return [Finding("kv-pin-clamp-warning", "serving.maxTotalTokens", cfg.serving.max_total_tokens,
                    f"at TP={cfg.serving.tp_size} the pool actually obtained was {published[0]:,}-{published[1]:,} tokens; "
                    "SGLang silently clamps a larger pin", "after up, the `boot` output shows the pool rank 0 obtained "
                    "(the readiness check expects at least minKvShare of the clamped figure)",
                    level="warning")]  # fmt: skip


@rule("ring-needs-nccl-overlay-warning")
def _ring(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    if cfg.topology != "ring":
        return []
    return [Finding("ring-needs-nccl-overlay-warning", "topology", "ring",
                    "switchless ring mode sets NCCL_ALGO=Ring and the ring env, but the reference also needs an "
                    "NCCL build with SWITCHLESS_RING_ONLY inside the image",
                    "use an image that ships that NCCL, or a RoCE switch (topology: switch)", level="warning")]  # fmt: skip


@rule("vllm-weights-range-warning")
def _vllm_high(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    prof = memoryplan.PROFILES.get(cfg.model.profile)
    if cfg.engine != "vllm" or prof is None or prof.engine != "vllm" or not memoryplan.vllm_memory_plan(cfg).fits:
        return []
    high = memoryplan.vllm_memory_plan(cfg, weights="high").ranks[0]
    if high.static_fits:
        return []
    return [Finding("vllm-weights-range-warning", "serving.maxModelLen", cfg.serving.max_model_len,
                    f"fits with the low end of the published weights ({memoryplan.vllm_memory_plan(cfg).ranks[0].weights_gib:.0f} "
                    f"GiB/node) but not with the high end ({high.weights_gib:.0f} GiB: weights + KV {high.static_used_gib:.0f} "
                    f"> {high.static_pool_gib:.0f} GiB)",
                    "if vLLM fails with CUDA out of memory, lower serving.maxModelLen to 65536 or 32768 first",
                    level="warning")]  # fmt: skip


@rule("pinned-revision-warning")
def _pinned(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    rev = cfg.model.revision
    if cfg.model.source == "download" and not (len(rev) == 40 and all(c in "0123456789abcdef" for c in rev)):
        return [Finding("pinned-revision-warning", "model.revision", rev,
                        "a branch or tag can move: nodes that download at different times may hold different weights",
                        "pin the 40-character commit of the Hugging Face repo", level="warning")]  # fmt: skip
    return []


def check(cfg: ClusterConfig, stack: str = "") -> tuple[list[Finding], list[Finding]]:
    """Run every rule for `stack`; returns (errors, warnings). Missing or foreign engine fields are
    reported alone: the other rules assume each engine's fields are there."""
    findings = _engine_fields(cfg, stack)
    if not findings:
        findings = [f for _, fn in RULES for f in fn(cfg, stack)]
    return [f for f in findings if f.level == "error"], [f for f in findings if f.level == "warning"]


# ----------------------------------------------------------------- the stack: groups and the router
StackRule = Callable[[StackConfig, str], list[Finding]]
STACK_RULES: list[tuple[str, StackRule]] = []


def stack_rule(name: str) -> Callable[[StackRule], StackRule]:
    def register(fn: StackRule) -> StackRule:
        STACK_RULES.append((name, fn))
        return fn

    return register


def _where(sc: StackConfig, i: int) -> str:
    name = sc.groups[i].name
    return "" if name is None else f"groups[{i}]({name})."


@stack_rule("node-in-one-group")
def _one_group(sc: StackConfig, stack: str = "") -> list[Finding]:
    out = []
    for attr, label in (("name", "name"), ("host", "host"), ("fabric_ip", "fabricIp")):
        owners: dict[str, int] = {}
        for i, entry in enumerate(sc.groups):
            for j, node in enumerate(entry.cfg.nodes):
                value = getattr(node, attr)
                if value in owners and owners[value] != i:
                    out.append(Finding("node-in-one-group", f"{_where(sc, i)}nodes[{j}].{label}", value,
                                       f"is also a node of group {sc.groups[owners[value]].name!r}: a Spark runs one "
                                       "rank of one group", "give each group its own nodes"))  # fmt: skip
                owners.setdefault(value, i)
    return out


@stack_rule("one-served-model")
def _one_model(sc: StackConfig, stack: str = "") -> list[Finding]:
    first = sc.groups[0].cfg.model.served_name
    return [Finding("one-served-model", f"{_where(sc, i)}model.servedName", e.cfg.model.served_name,
                    f"differs from group {sc.groups[0].name!r}'s {first!r}: the router sends any request to any group",
                    "serve the same model name in every group")
            for i, e in enumerate(sc.groups) if e.cfg.model.served_name != first]  # fmt: skip


def router_group(sc: StackConfig) -> tuple[int, int] | None:
    """(group index, node index) of the router's node, None when no group has it."""
    if sc.router is None:
        return None
    for i, entry in enumerate(sc.groups):
        for j, node in enumerate(entry.cfg.nodes):
            if node.name == sc.router.node:
                return i, j
    return None


@stack_rule("router-node")
def _router_node(sc: StackConfig, stack: str = "") -> list[Finding]:
    if sc.router is not None and sc.router.node == LOCAL and router_group(sc) is not None:
        return [Finding("router-node", "router.node", LOCAL, "names where Pulumi runs, and a node is named local too",
                        "rename that node")]  # fmt: skip
    if sc.router is None or sc.router.node == LOCAL or router_group(sc) is not None:
        return []
    names = [n.name for e in sc.groups for n in e.cfg.nodes]
    return [Finding("router-node", "router.node", sc.router.node, "is not a node of any group",
                    f"use one of {', '.join(names)}")]  # fmt: skip


def node_ports(cfg: ClusterConfig, node) -> dict[int, str]:
    """The ports a node of group `cfg` already uses: ssh, Ray's dashboard, the group's serving ports."""
    engine_port = ("distPort", cfg.serving.dist_port) if cfg.engine == "sglang" else ("rayPort", cfg.serving.ray_port)
    taken = {22: "ssh", RAY_DASHBOARD_PORT: "Ray's dashboard", node.ssh_port: "the node's sshPort",
             cfg.serving.port: "the group's serving.port", engine_port[1]: f"the group's serving.{engine_port[0]}"}
    if cfg.serving.self_heal.enabled:
        taken[cfg.serving.self_heal.port] = "the group's guard (serving.selfHeal.port)"
    return taken


@stack_rule("router-port-free")
def _router_ports(sc: StackConfig, stack: str = "") -> list[Finding]:
    where = router_group(sc)
    if sc.router is None or (where is None and sc.router.node != LOCAL):
        return []
    r, taken, on = sc.router, {}, ""  # where Pulumi runs: no port of ours is known there
    if where is not None:
        cfg = sc.groups[where[0]].cfg
        node = cfg.nodes[where[1]]
        taken = node_ports(cfg, node)
        on = f" on {node.name}"
    fix = f"use the reference's router ports: port 8889, metricsPort 29000{' (free' + on + ')' if on else ''}"
    return _ports_free("router-port-free", "router", (("port", r.port), ("metricsPort", r.metrics_port)), taken, on, fix)


@stack_rule("router-image")
def _router_image(sc: StackConfig, stack: str = "") -> list[Finding]:
    where = router_group(sc) or ((0, 0) if sc.router is not None and sc.router.node == LOCAL else None)
    if sc.router is None or where is None or sc.router.image is not None:
        return []
    cfg = sc.groups[where[0]].cfg
    if cfg.engine == "sglang" and cfg.image_build is None:
        return []
    problem = (f"the router takes its image from group {sc.groups[where[0]].name or stack!r}, which runs vLLM: no "
               "sglang_router there" if cfg.engine == "vllm"
               else f"the router takes its image from group {sc.groups[where[0]].name or stack!r}, whose image is "
                    "built on the nodes (imageBuild), which the router does not wait for")  # fmt: skip
    return [Finding("router-image", "router.image", None, problem,
                    "set router.image to an image with sglang-router 0.3.2 that the node has or can pull, e.g. the "
                    "SGLang image lmsysorg/sglang:dev-dsv41")]  # fmt: skip


def gateway_where(sc: StackConfig) -> tuple[int, int] | None:
    """(group index, node index) of the gateway's node; None without a gateway or for an unknown node."""
    if sc.gateway is None:
        return None
    from .gateway import default_node

    name = default_node(sc.gateway, sc.router.node if sc.router else None, sc.groups[0].cfg.nodes[0].name)
    return next(((i, j) for i, e in enumerate(sc.groups) for j, n in enumerate(e.cfg.nodes) if n.name == name), None)


@stack_rule("gateway-node")
def _gateway_node(sc: StackConfig, stack: str = "") -> list[Finding]:
    gw = sc.gateway
    if gw is None:
        return []
    names = [n.name for e in sc.groups for n in e.cfg.nodes]
    if gw.node == LOCAL:
        return [Finding("gateway-node", "gateway.node", LOCAL, "the gateway runs on a node (its database's volume "
                        "must outlive the machine Pulumi runs on)", f"use one of {', '.join(names)}")]  # fmt: skip
    if gateway_where(sc) is None:
        return [Finding("gateway-node", "gateway.node", gw.node, "is not a node of any group",
                        f"use one of {', '.join(names)}")]  # fmt: skip
    if sc.router is None and len(sc.groups) > 1:
        return [Finding("gateway-node", "gateway", "...", "several groups need the router in front of them for the "
                        "gateway to have one upstream", "add a `router:` block")]  # fmt: skip
    return []


@stack_rule("gateway-port-free")
def _gateway_ports(sc: StackConfig, stack: str = "") -> list[Finding]:
    where = gateway_where(sc)
    if where is None:
        return []
    gw, cfg = sc.gateway, sc.groups[where[0]].cfg
    node = cfg.nodes[where[1]]
    taken = node_ports(cfg, node)
    if sc.router is not None and sc.router.node == node.name:
        taken.update({sc.router.port: "router.port", sc.router.metrics_port: "router.metricsPort"})
    fix = f"pick free ports on {node.name}: the defaults are port 4000, databasePort 5433"
    ports = (("port", gw.port), ("databasePort", gw.database_port))
    return _ports_free("gateway-port-free", "gateway", ports, taken, f" on {node.name}", fix)


def _ports_free(rule: str, section: str, ports: tuple[tuple[str, int], tuple[str, int]], taken: dict[int, str],
                on: str, fix: str) -> list[Finding]:  # fmt: skip
    """A finding for each of the two ports another service on the node holds, and one when they are equal."""
    out = [Finding(rule, f"{section}.{label}", port, f"is {taken[port]}{on}", fix) for label, port in ports if port in taken]
    (first, a), (second, b) = ports
    if a == b:
        out.append(Finding(rule, f"{section}.{second}", b, f"equals {section}.{first}", fix))
    return out


@stack_rule("gateway-member-models")
def _gateway_models(sc: StackConfig, stack: str = "") -> list[Finding]:
    if sc.gateway is None:
        return []
    served = sc.groups[0].cfg.model.served_name
    return [Finding("gateway-member-models", f"gateway.members[{i}].models", m.models,
                    f"names a model this stack does not serve (it serves {served!r}), so the key could call nothing",
                    f"use [{served}], or leave models out (every served model)")
            for i, m in enumerate(sc.gateway.members) if m.models and served not in m.models]  # fmt: skip


def check_stack(sc: StackConfig, stack: str = "") -> tuple[list[Finding], list[Finding]]:
    """Every group's rules (findings named by group) and the stack's own; returns (errors, warnings)."""
    findings: list[Finding] = []
    for i, entry in enumerate(sc.groups):
        errors, warnings = check(entry.cfg, entry.plan_name(stack))
        findings += [dataclasses.replace(f, field=_where(sc, i) + f.field) for f in errors + warnings]
    findings += [f for _, fn in STACK_RULES for f in fn(sc, stack)]
    return [f for f in findings if f.level == "error"], [f for f in findings if f.level == "warning"]


# Rules kept in modules of their own (each registers itself with rule/stack_rule when imported): the memory
# budget of every node (budget_rules.py), the data-plane addresses (link_rules.py) and the monitoring's node
# and ports (monitoring_rules.py).
from . import budget_rules, link_rules, monitoring_rules  # noqa: E402,F401
