"""Pure planning: from a validated ClusterConfig to everything each node runs. No Pulumi here.

Everything a rank container runs with is computed once, as a RankSpec; the components only map
specs to resources. The group revision is a hash of all specs, so any change to what any rank runs
with changes the label on every rank, and Pulumi replaces the whole tensor-parallel group.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import fabric
from declared.cluster import ClusterConfig, NodeConfig
from programs import probe

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # relative imageBuild.context paths start here
GIB = 1024**3
GB = 1000**3

MODEL_MOUNT = "/models/DeepSeek-V4.1-Flash"
ENGRAM_MOUNT = "/engram"
API_KEY_MOUNT = "/run/secrets/dspark-api-key"
# Where the engines keep what they compile and tune at boot (FlashInfer, DeepGEMM, vLLM: ~/.cache; Triton and
# torch inductor are pointed there by CACHE_ENV): a volume per node, so a restart reuses it.
CACHE_MOUNT = "/root/.cache"
CACHE_ENV = {"TRITON_CACHE_DIR": f"{CACHE_MOUNT}/triton", "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_MOUNT}/torchinductor"}
ENGRAM_LAYERS = (1, 14)
REVISION_LABEL = "deepseek-spark.group-revision"


@dataclass(frozen=True)
class MemoryProfile:
    """Published memory figures of one checkpoint (seed 000, reference lineage section 9)."""

    description: str
    weights_gib_by_tp: dict[int, float]  # resident weights per rank, engram tables on NVMe
    draft_gib_by_tp: dict[int, float]  # DSpark draft model, only with speculative decoding on
    rank0_extra_gib: float
    kv_bytes_per_token: float  # per rank
    window_pool_gb: float  # fixed sliding-window pool
    cuda_graph_gb_at_bs16: float  # scaled linearly with max running requests (graphs captured up to it)
    nccl_default_gib: float
    nccl_tuned_gb: float
    max_context_by_tp: dict[int, int]
    engram_total_gib: float  # split evenly across ranks onto each node's NVMe
    min_mem_fraction_by_tp: dict[int, float] = field(default_factory=dict)  # measured floor (boot fails below)
    published_kv_pool_by_tp: dict[int, tuple[int, int]] = field(default_factory=dict)  # pool actually obtained
    engine: str = "sglang"


@dataclass(frozen=True)
class VllmProfile:
    """Published figures of the NVFP4 checkpoint served by vLLM (seed 004), per node."""

    description: str
    weights_gib_by_tp: dict[int, tuple[float, float]]  # (low, high): the seed gives a range
    kv_gib_at: tuple[int, float]  # (max_model_len, GiB): KV grows linearly with the context length
    runtime_gb: tuple[float, float]  # system and runtime overhead, (low, high)
    max_model_len: int
    engine: str = "vllm"


# The simulated cluster's figures (a tiny fake checkpoint): refused outside the sim stacks.
TEST_DOUBLE_PROFILES = {"sim-test-double", "sim-test-double-vllm"}
PROFILES: dict[str, MemoryProfile | VllmProfile] = {
    "deepseek-v4.1-flash-mxfp4": MemoryProfile(
        description="DeepSeek-V4.1-Flash, MXFP4 experts + FP8 dense, 476 GiB checkpoint (SGLang)",
        weights_gib_by_tp={2: 145.0, 3: 101.0, 4: 77.0},
        draft_gib_by_tp={4: 2.5},
        rank0_extra_gib=1.3,
        kv_bytes_per_token=1670.75,
        window_pool_gb=0.34,
        cuda_graph_gb_at_bs16=5.6,
        nccl_default_gib=4.7,
        nccl_tuned_gb=0.14,
        max_context_by_tp={3: 262144, 4: 1048576},
        engram_total_gib=189.0,
        min_mem_fraction_by_tp={3: 0.944},
        published_kv_pool_by_tp={4: (5_980_000, 6_490_000)},
    ),
    "sim-test-double": MemoryProfile(
        description="TEST DOUBLE: the simulator's tiny fake checkpoint (sim/), not a real model",
        weights_gib_by_tp={1: 4.0, 2: 2.0, 3: 1.0, 4: 1.0},
        draft_gib_by_tp={},
        rank0_extra_gib=0.1,
        kv_bytes_per_token=1670.75,
        window_pool_gb=0.34,
        cuda_graph_gb_at_bs16=5.6,
        nccl_default_gib=4.7,
        nccl_tuned_gb=0.14,
        max_context_by_tp={1: 262144, 2: 262144, 3: 262144, 4: 1048576},
        engram_total_gib=0.01,
    ),
    "deepseek-v4.1-flash-nvfp4": VllmProfile(
        description="nvidia/DeepSeek-V4.1-Flash-NVFP4: NVFP4 experts, MXFP4 engram tables (vLLM + Ray, seed 004)",
        weights_gib_by_tp={2: (79.0, 105.0)},
        kv_gib_at=(131072, 15.0),
        runtime_gb=(8.0, 12.0),
        max_model_len=1048576,
    ),
    "sim-test-double-vllm": VllmProfile(
        description="TEST DOUBLE: the simulator's tiny fake checkpoint served by vllm-sim, not a real model",
        weights_gib_by_tp={1: (2.0, 2.0), 2: (1.0, 1.0)},
        kv_gib_at=(131072, 15.0),
        runtime_gb=(8.0, 12.0),
        max_model_len=1048576,
    ),
}


# ---------------------------------------------------------------- memory plan


@dataclass(frozen=True)
class RankMemory:
    role: str  # "head" or "worker"
    static_pool_gib: float
    weights_gib: float
    draft_gib: float
    kv_gib: float
    window_gib: float
    static_used_gib: float
    outside_gib: float
    cuda_graphs_gib: float
    nccl_gib: float
    runtime_floor_gib: float
    outside_needed_gib: float

    @property
    def static_fits(self) -> bool:
        return self.static_used_gib <= self.static_pool_gib

    @property
    def outside_fits(self) -> bool:
        return self.outside_needed_gib <= self.outside_gib


@dataclass(frozen=True)
class MemoryPlan:
    profile: str
    unified_gib: float
    static_fraction: float  # sglang: memFractionStatic; vllm: gpuMemoryUtilization
    ranks: tuple[RankMemory, ...]  # head first, then a worker (all workers are alike)
    known: bool  # False when the profile has no figures for this TP size

    @property
    def fits(self) -> bool:
        return self.known and all(r.static_fits and r.outside_fits for r in self.ranks)

    def to_output(self) -> dict:
        return {
            "profile": self.profile,
            "unifiedGiB": self.unified_gib,
            "staticFraction": self.static_fraction,
            "fits": self.fits,
            "ranks": [
                {
                    "role": r.role,
                    "staticPoolGiB": round(r.static_pool_gib, 2),
                    "staticUsedGiB": round(r.static_used_gib, 2),
                    "weightsGiB": round(r.weights_gib + r.draft_gib, 2),
                    "kvGiB": round(r.kv_gib, 2),
                    "windowGiB": round(r.window_gib, 2),
                    "outsideGiB": round(r.outside_gib, 2),
                    "outsideNeededGiB": round(r.outside_needed_gib, 2),
                    "headroomGiB": round(
                        min(r.static_pool_gib - r.static_used_gib, r.outside_gib - r.outside_needed_gib), 2
                    ),
                }
                for r in self.ranks
            ],
        }

    def summary(self) -> str:
        lines = [f"memory plan ({self.profile}, {self.unified_gib} GiB per node, static fraction {self.static_fraction}):"]
        for r in self.ranks:
            inside = [("weights", r.weights_gib + r.draft_gib), ("KV", r.kv_gib), ("window", r.window_gib)]
            outside = [("CUDA graphs", r.cuda_graphs_gib), ("NCCL", r.nccl_gib), ("runtime", r.runtime_floor_gib)]
            lines.append(
                f"  {r.role}: static pool {r.static_pool_gib:.1f} GiB holds "
                + " + ".join(f"{k} {v:.2f}" for k, v in inside if v)
                + f" = {r.static_used_gib:.1f}; outside {r.outside_gib:.1f} GiB holds "
                + " + ".join(f"{k} {v:.2f}" for k, v in outside if v)
                + f" = {r.outside_needed_gib:.1f}"
            )
        return "\n".join(lines)


def memory_plan(cfg: ClusterConfig) -> MemoryPlan:
    if cfg.engine == "vllm":
        return vllm_memory_plan(cfg)
    prof = PROFILES[cfg.model.profile]
    s = cfg.serving
    tp = s.tp_size
    known = tp in prof.weights_gib_by_tp
    weights = prof.weights_gib_by_tp.get(tp, 0.0)
    draft = prof.draft_gib_by_tp.get(tp, 0.0) if s.spec_algo != "off" else 0.0
    kv = s.max_total_tokens * prof.kv_bytes_per_token / GIB
    window = prof.window_pool_gb * GB / GIB
    pool = s.mem_fraction_static * cfg.memory.unified_gib
    outside = cfg.memory.unified_gib - pool
    # Graphs are captured up to --cuda-graph-max-bs-decode, which is maxRunningRequests: planned at that size.
    graphs = prof.cuda_graph_gb_at_bs16 * s.max_running_requests / 16 * GB / GIB
    nccl = prof.nccl_tuned_gb * GB / GIB if cfg.fabric.tuned_buffers else prof.nccl_default_gib
    floor = cfg.memory.runtime_floor_gib
    ranks = []
    roles = ["head"] + (["worker"] if len(cfg.nodes) > 1 else [])
    for role in roles:
        w = weights + (prof.rank0_extra_gib if role == "head" else 0.0)
        ranks.append(
            RankMemory(
                role=role,
                static_pool_gib=pool,
                weights_gib=w,
                draft_gib=draft,
                kv_gib=kv,
                window_gib=window,
                static_used_gib=w + draft + kv + window,
                outside_gib=outside,
                cuda_graphs_gib=graphs,
                nccl_gib=nccl,
                runtime_floor_gib=floor,
                outside_needed_gib=graphs + nccl + floor,
            )
        )
    return MemoryPlan(cfg.model.profile, cfg.memory.unified_gib, s.mem_fraction_static, tuple(ranks), known)


def vllm_kv_gib(cfg: ClusterConfig, max_model_len: int | None = None) -> float:
    length, gib = PROFILES[cfg.model.profile].kv_gib_at
    return gib * (max_model_len or cfg.serving.max_model_len) / length


def vllm_memory_plan(cfg: ClusterConfig, weights: str = "low") -> MemoryPlan:
    """vLLM: --gpu-memory-utilization x unified memory must hold weights + KV (linear in maxModelLen);
    what is left must hold the runtime overhead (seed 004: 8-12 GB, the high end is planned for)."""
    prof = PROFILES[cfg.model.profile]
    s = cfg.serving
    known = s.tp_size in prof.weights_gib_by_tp
    low, high = prof.weights_gib_by_tp.get(s.tp_size, (0.0, 0.0))
    w = low if weights == "low" else high
    kv = vllm_kv_gib(cfg)
    pool = s.gpu_memory_utilization * cfg.memory.unified_gib
    runtime = prof.runtime_gb[1] * GB / GIB
    roles = ["head"] + (["worker"] if len(cfg.nodes) > 1 else [])
    ranks = tuple(
        RankMemory(role=role, static_pool_gib=pool, weights_gib=w, draft_gib=0.0, kv_gib=kv, window_gib=0.0,
                   static_used_gib=w + kv, outside_gib=cfg.memory.unified_gib - pool, cuda_graphs_gib=0.0,
                   nccl_gib=0.0, runtime_floor_gib=runtime, outside_needed_gib=runtime)
        for role in roles
    )  # fmt: skip
    return MemoryPlan(cfg.model.profile, cfg.memory.unified_gib, s.gpu_memory_utilization, ranks, known)


def boot_from_probe(stdout: str | None) -> dict | None:
    """What rank 0 obtained at boot, from the readiness probe's output (its `deepseek-spark boot:`
    line, programs/probe.py); None when the probe printed none (a router probe, an older probe)."""
    lines = [line for line in (stdout or "").splitlines() if line.startswith(probe.BOOT_PREFIX)]
    return json.loads(lines[-1][len(probe.BOOT_PREFIX):]) if lines else None


def expected_kv_tokens(cfg: ClusterConfig) -> int:
    """The KV pool rank 0 should report obtaining: SGLang, the pin (maxTotalTokens), but no more than
    the low end of what the profile says this TP layout obtains (SGLang clamps a larger pin); vLLM,
    one request of maxModelLen (the plan sizes its KV for that; vLLM gives the rest of its share too)."""
    if cfg.engine == "vllm":
        return cfg.serving.max_model_len
    published = PROFILES[cfg.model.profile].published_kv_pool_by_tp.get(cfg.serving.tp_size)
    return min(cfg.serving.max_total_tokens, published[0]) if published else cfg.serving.max_total_tokens


def max_tokens_that_fit(cfg: ClusterConfig) -> int:
    """Largest maxTotalTokens the head's static pool can pin (used in error messages)."""
    plan = memory_plan(cfg)
    head = plan.ranks[0]
    free = head.static_pool_gib - (head.weights_gib + head.draft_gib + head.window_gib)
    return max(0, int(free * GIB / PROFILES[cfg.model.profile].kv_bytes_per_token))


def engram_shard_gib(cfg: ClusterConfig) -> float:
    return PROFILES[cfg.model.profile].engram_total_gib / cfg.serving.tp_size


def shard_files(rank: int, tp: int) -> list[str]:
    return [f"engram-l{layer}-r{rank}of{tp}.bin" for layer in ENGRAM_LAYERS]


# ---------------------------------------------------------------- ranks


def head(cfg: ClusterConfig) -> NodeConfig:
    return cfg.nodes[0]


def state_dir(cfg: ClusterConfig, user: str | None = None) -> str:
    """Where the API key file lives on the head (or on the node of `user`): root's /var/lib, or the
    ssh user's home (no sudo)."""
    if cfg.state_dir:
        return cfg.state_dir
    user = user or head(cfg).ssh_user
    return "/var/lib/deepseek-spark" if user == "root" else f"/home/{user}/.local/state/deepseek-spark"


def container_name(stack: str, rank: int) -> str:
    return f"{stack}-rank{rank}"


def compile_cache_prefix(stack: str) -> str:
    """The compile-cache volumes' name before the image key (components/caches.py adds it)."""
    return f"{stack}-compile-cache"


def checkpoint_volume_name(stack: str) -> str:
    return f"{stack}-checkpoint"


def api_key_path(cfg: ClusterConfig, stack: str) -> str:
    return f"{state_dir(cfg)}/{stack}/api-key"


def volume_options(cfg: ClusterConfig, rank: int) -> dict[str, str]:
    """driver_opts of the checkpoint volume on node `rank`: a bind of the local copy (the head, or
    every node in local mode), or an NFSv4 mount of the head's read-only export."""
    ckpt = cfg.model.checkpoint_dir
    if rank == 0 or cfg.share.mode == "local":
        return {"type": "none", "o": "bind", "device": ckpt}
    server = fabric.nfs_link(cfg, rank)[0]  # the head's address on the link it shares with this worker
    return {"type": "nfs", "o": ",".join([f"addr={server}", *cfg.share.mount_options]), "device": f":{ckpt}"}


def nccl_env(cfg: ClusterConfig) -> dict[str, str]:
    f = cfg.fabric
    env = {
        "NCCL_NET": "IB",
        "NCCL_IB_DISABLE": "0",
        # the rails' RoCE v2 IPv4 GIDs, whatever their index (the entrypoint pins one when all rails agree)
        "NCCL_IB_ROCE_VERSION_NUM": "2",
        "NCCL_IB_ADDR_FAMILY": "AF_INET",
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_CROSS_NIC": "1",
        "NCCL_IB_MERGE_NICS": "0",
        "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
        "NCCL_CUMEM_ENABLE": "0",
        # serving.ncclDebug: INFO shows the devices and transport NCCL chose (`via NET/IB` or `NET/Socket`)
        "NCCL_DEBUG": "INFO" if cfg.serving.nccl_debug else "WARN",
        "NCCL_DEBUG_SUBSYS": "INIT,NET" if cfg.serving.nccl_debug else "INIT,ENV",
    }
    if f.tuned_buffers:  # pinned NCCL buffers: 4.7 GiB per node by default, ~0.14 GB with these
        env.update(
            NCCL_BUFFSIZE="1048576", NCCL_LL128_BUFFSIZE="262144", NCCL_PROTO="^LL128", NCCL_MAX_NCHANNELS="8"
        )
    if cfg.topology == "ring":  # 4 Sparks without a switch
        env.update(
            NCCL_ALGO="Ring",
            NCCL_IB_SUBNET_PREFIX_LEN="24",
            NCCL_MIN_NCHANNELS="4",
            NCCL_P2P_LEVEL="SYS",
        )
    # Pinned in the fabric section; otherwise the entrypoint finds them on the node at every start.
    if f.ib_hca:
        env["NCCL_IB_HCA"] = f.ib_hca
    if f.socket_ifname:
        env.update(NCCL_SOCKET_IFNAME=f.socket_ifname, GLOO_SOCKET_IFNAME=f.socket_ifname,
                   TP_SOCKET_IFNAME=f.socket_ifname)  # fmt: skip
    if f.gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(f.gid_index)
    return env


def plane_env(cfg: ClusterConfig, rank: int) -> dict[str, str]:
    """Which addresses the rank's entrypoint starts from (programs/rails.py) and what the engines bind:
    the data plane, or the management plane with fabric.bootstrap: management."""
    boot, node = fabric.bootstrap_ip(cfg, rank), cfg.nodes[rank]
    env = {"DSPARK_FABRIC_IP": node.fabric_ip, "DSPARK_BOOTSTRAP_IP": boot, "HOST_IP": boot}
    if node.link_ips:  # a triangle's second link: its port's twins are rails too
        env["DSPARK_LINK_IPS"] = ",".join(node.link_ips)
    return env


# Read only by the DeepSeek-V4.1 adapter in the image (/opt/dsv41), not by SGLang itself: the
# conformance tier checks every other SGLANG_* name against sglang's own env table.
ADAPTER_ENV = frozenset({"SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE", "SGLANG_DSV41_REASONING_EFFORT"})


def rank_env(cfg: ClusterConfig, rank: int) -> dict[str, str]:
    s = cfg.serving
    env = {
        **nccl_env(cfg),
        **plane_env(cfg, rank),
        "SGLANG_HOST_IP": fabric.bootstrap_ip(cfg, rank),  # SGLang's own address lookup would pick any NIC
        "OFFLOAD_MODE": s.offload_mode,
        "DSV41_PACKED_DIR": ENGRAM_MOUNT,
        "DSV41_SOURCE": MODEL_MOUNT,
        "DSV41_MAX_NEW_TOKENS": "32768",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",  # True produces NaN logits
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "0",
        # Which checkpoint the ranks were started on: a new revision re-packs the engram shards,
        # so it must also restart the whole group (it is part of the group revision).
        "DSPARK_CHECKPOINT_REVISION": cfg.model.revision,
        "NODE_RANK": str(rank),
        "NNODES": str(len(cfg.nodes)),
        "TP_SIZE": str(s.tp_size),
        "EP_SIZE": str(s.ep_size),
        # The DSV4.1 adapter's knobs, as every reference profile sets them (lineage section 1).
        "DSV41_CACHE_GIB": "0",  # the image's default (16 GiB per rank) is not in the memory plan
        "DSV41_CACHE_WAYS": "4",
        "DSV41_IO_THREADS": "96",
        "DSV41_RESIDENT_SCALES": "0",
        "DSV41_STATS_SECONDS": "60",
        "DSV41_MXFP8_BACKEND": "b12x",
        "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE": "0",
        "SGLANG_DSV41_REASONING_EFFORT": "75",
        "DSV41_TP_PAD": "1" if s.tp_size == 3 else "0",  # TP3 pads rank 2's attention shard
        "DSV41_SERIAL_WEIGHT_LOAD": "1" if s.tp_size == 4 else "0",
        **CACHE_ENV,
    }
    env.update(s.extra_env)
    return dict(sorted(env.items()))


def sglang_args(cfg: ClusterConfig, rank: int) -> list[str]:
    """Every rank serves Prometheus /metrics (--enable-metrics): the stack's Prometheus scrapes the leader,
    and a router's drain reads its running and queued request gauges before the group restarts."""
    s = cfg.serving
    args = [
        "--model-path", MODEL_MOUNT,
        "--served-model-name", cfg.model.served_name,
        "--trust-remote-code",
        "--load-format", "safetensors",
        "--tp", str(s.tp_size),
        "--ep-size", str(s.ep_size),
        "--nnodes", str(len(cfg.nodes)),
        "--node-rank", str(rank),
        "--dist-init-addr", f"{fabric.bootstrap_ip(cfg, 0)}:{s.dist_port}",
        "--host", "0.0.0.0",
        "--port", str(s.port),
        "--context-length", str(s.context_length),
        "--max-total-tokens", str(s.max_total_tokens),
        "--max-running-requests", str(s.max_running_requests),
        # graphs captured up to the batch the plan counts; the flag's name is 0.5.15+ (rule engine-version)
        "--cuda-graph-max-bs-decode", str(s.max_running_requests),
        "--mem-fraction-static", f"{s.mem_fraction_static:g}",
        "--chunked-prefill-size", str(s.chunked_prefill_size),
        "--random-seed", "0",
        "--enable-decoder-swa-bounded-replay",
        "--tool-call-parser", "deepseekv41",
        "--reasoning-parser", "deepseek-v41",
    ]  # fmt: skip
    if s.spec_algo != "off":
        args += ["--speculative-algorithm", s.spec_algo, "--speculative-dspark-block-size", str(s.dspark_block_size)]
    if "--enable-metrics" not in s.extra_args:
        args.append("--enable-metrics")
    return args + list(s.extra_args)


def rails_env(sysfs: str = "/sys/class/infiniband") -> str:
    """The entrypoint's fabric step: programs/rails.py finds this node's rails (both twins of the port
    holding DSPARK_FABRIC_IP), their RoCE v2 GID and the socket interface of DSPARK_BOOTSTRAP_IP, and
    exports what the fabric section does not pin; a fabric NCCL cannot use stops the rank here."""
    run = fabric.heredoc(["--fabric-ip", "__FABRIC__", "--bootstrap-ip", "__BOOT__",
                          *(["--sysfs", sysfs] if sysfs != "/sys/class/infiniband" else []), "--format", "env"])
    run = run.replace("'__FABRIC__'", '"$DSPARK_FABRIC_IP"').replace("__FABRIC__", '"$DSPARK_FABRIC_IP"')
    run = run.replace("'__BOOT__'", '"$DSPARK_BOOTSTRAP_IP"').replace("__BOOT__", '"$DSPARK_BOOTSTRAP_IP"')
    return (f"fabric_env=$({run}\n) || {{ echo \"deepseek-spark: rank ${{NODE_RANK:-?}}: the fabric is not usable "
            f"(above); not starting\" >&2; exit 1; }}\neval \"$fabric_env\"\n"
            'echo "deepseek-spark: rank ${NODE_RANK:-?} NCCL_IB_HCA=${NCCL_IB_HCA:-} '
            'NCCL_IB_GID_INDEX=${NCCL_IB_GID_INDEX:-auto} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-}"\n')


def ray_head_args(port: str, ip: str) -> list[str]:
    """`ray start` on the vLLM head (the script passes "$RAY_PORT" "$VLLM_HOST_IP"; the argument check
    passes the values)."""
    return ["start", "--head", "--port", port, "--node-ip-address", ip, "--num-gpus", "1", "--disable-usage-stats"]


# vLLM head: start the Ray head, wait until every node's Ray worker has joined, then serve.
VLLM_HEAD_RUN = "ray " + " ".join(ray_head_args('"$RAY_PORT"', '"$VLLM_HOST_IP"')) + r"""
python3 - <<'GATE'
import os, sys, time
import ray
want = int(os.environ["DSPARK_RAY_NODES"])
deadline = time.time() + int(os.environ.get("DSPARK_RAY_WAIT", "900"))
ray.init(address=os.environ["RAY_ADDRESS"])
while True:
    alive = [n for n in ray.nodes() if n.get("Alive")]
    if len(alive) >= want:
        print(f"deepseek-spark: ray has {len(alive)}/{want} nodes alive", flush=True)
        break
    if time.time() > deadline:
        print(f"deepseek-spark: only {len(alive)}/{want} ray nodes joined; check the workers", flush=True)
        sys.exit(1)
    time.sleep(2)
ray.shutdown()
GATE
exec vllm "$@"
"""


def launch_wrapper(
    run: str = 'exec python3 -m sglang.launch_server "$@"',
    key: str | None = "arg",
    key_file: str = API_KEY_MOUNT,
    sysfs: str = "/sys/class/infiniband",
) -> str:
    """A rank entrypoint script, run by /bin/sh in the container with the engine's flags as "$@".

    - The fabric (rails_env): NCCL_IB_HCA (both twins), NCCL_IB_GID_INDEX (it moves between reboots)
      and the socket interfaces, unless pinned, are found on the node at every start; a rail without
      a RoCE v2 IPv4 GID or a fabric IP off ConnectX-7 stops the rank with the reason.
    - The API key is read from a mounted 0600 file (head only), so it is never part of a Pulumi
      input, a docker label or `docker inspect` args: `key="arg"` appends `--api-key <key>`
      (SGLang), `key="env:NAME"` exports it as NAME (vLLM reads VLLM_API_KEY), None ignores it.
    """
    script = (f"set -eu\n# the rank, not sshd or dockerd, is what the kernel kills first when the node runs out\n"
              f"echo {OOM_SCORE_ADJ} > /proc/self/oom_score_adj 2>/dev/null || "
              "echo 'deepseek-spark: could not raise oom_score_adj' >&2\n" + rails_env(sysfs))
    quoted = shlex.quote(key_file)
    if key == "arg":
        script += f'if [ -r {quoted} ]; then\n  set -- "$@" --api-key "$(cat {quoted})"\nfi\n'
    elif key and key.startswith("env:"):
        script += f'if [ -r {quoted} ]; then\n  export {key[4:]}="$(cat {quoted})"\nfi\n'
    return script + run + ("" if run.endswith("\n") else "\n")


@dataclass(frozen=True)
class Mount:
    target: str
    source: str
    type: str  # "volume" or "bind"
    read_only: bool


@dataclass(frozen=True)
class RankSpec:
    """Everything one rank container runs with; hashed into the group revision."""

    rank: int
    node: str
    container_name: str
    image: str
    entrypoint: list[str]
    args: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    checkpoint: dict[str, str]  # how the checkpoint volume is mounted on this node (a change restarts the group)
    generation: int  # serving.generation: bump it to restart the whole group on purpose
    ulimits: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {"memlock": (-1, -1), "stack": (67108864, 67108864), "nofile": (1048576, 1048576)}
    )
    devices: list[str] = field(default_factory=lambda: ["/dev/infiniband"])
    # the container's memory limit (memory = memory_swap: no swap): what the node's budget gives the rank
    # (planning/budget.py, rank_memory_mib)
    memory_mib: int | None = None
    capabilities: list[str] = field(default_factory=lambda: ["IPC_LOCK"])
    network_mode: str = "host"
    ipc_mode: str = "host"
    gpus: str = "all"
    restart: str = "no"

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


OOM_SCORE_ADJ = 500  # the rank, not sshd or dockerd, is the kernel's first choice when the node runs out


def node_budget_mib(cfg: ClusterConfig) -> int:
    """What the containers of a node of this group may take together: its unified memory less
    memory.hostReserveGiB (sshd, dockerd, the OS), rounded so that the reserve is never less."""
    return int(cfg.memory.unified_gib * 1024) - math.ceil(cfg.memory.host_reserve_gib * 1024)


def _need_gib(cfg: ClusterConfig, rank: int) -> float:
    r = memory_plan(cfg).ranks[0 if rank == 0 else -1]
    need = r.static_used_gib + r.outside_needed_gib
    return max(need, r.static_pool_gib) if cfg.engine == "vllm" else need


def rank_need_mib(cfg: ClusterConfig, rank: int) -> int:
    """What must be available on the rank's node when it starts (the memory gate): everything the memory
    plan places there, the static pool's contents and what it needs outside it (CUDA graphs, NCCL, the
    runtime floor). vLLM also refuses to start with less free than gpuMemoryUtilization x unified memory."""
    return int(_need_gib(cfg, rank) * 1024)


def guard_memory_mib(cfg: ClusterConfig) -> int:
    """The group's own guard on each of its nodes (serving.selfHeal): its container's limit, or 0 when off."""
    return cfg.serving.self_heal.memory_mib if cfg.serving.self_heal.enabled else 0


def rank_memory_mib(cfg: ClusterConfig, rank: int, others_mib: int = 0) -> int:
    """The rank container's memory limit: its static pool and what it needs outside it (never less than
    its need, rank_need_mib) plus the runtime floor as headroom, but no more than the node's budget
    (node_budget_mib) leaves once the group's guard there and the node's other containers have their limits
    (`others_mib`: the stack's router and gateway, from planning/budget.py). A runaway rank is then killed by
    its cgroup instead of wedging the node; a limit below the need is refused at preview (node-memory-budget)."""
    r = memory_plan(cfg).ranks[0 if rank == 0 else -1]
    want = max(_need_gib(cfg, rank), r.static_pool_gib + r.outside_needed_gib) + cfg.memory.runtime_floor_gib
    return min(int(want * 1024), node_budget_mib(cfg) - guard_memory_mib(cfg) - others_mib)


def rank_specs(cfg: ClusterConfig, stack: str, limits: list[int] | None = None) -> list[RankSpec]:
    """`limits`: each rank's memory limit from the stack's budget (planning/budget.py); default: the group
    alone on its nodes."""
    specs = []
    for rank, node in enumerate(cfg.nodes):
        mounts = [
            Mount(MODEL_MOUNT, checkpoint_volume_name(stack), "volume", True),
            Mount(ENGRAM_MOUNT, cfg.engram.dir, "bind", False),
            Mount(CACHE_MOUNT, compile_cache_prefix(stack), "volume", False),
        ]
        if rank == 0:
            mounts.append(Mount(API_KEY_MOUNT, api_key_path(cfg, stack), "bind", True))
        specs.append(
            RankSpec(
                rank=rank,
                node=node.name,
                container_name=container_name(stack, rank),
                image=cfg.image,
                entrypoint=["/bin/sh", "-c", launch_wrapper(), "sglang-launch"],
                args=sglang_args(cfg, rank),
                env=rank_env(cfg, rank),
                mounts=mounts,
                checkpoint=volume_options(cfg, rank),
                generation=cfg.serving.generation,
                memory_mib=limits[rank] if limits else rank_memory_mib(cfg, rank),
            )
        )
    return specs


def vllm_env(cfg: ClusterConfig, rank: int) -> dict[str, str]:
    s = cfg.serving
    env = {
        **nccl_env(cfg),
        **plane_env(cfg, rank),
        "VLLM_HOST_IP": fabric.bootstrap_ip(cfg, rank),  # Ray and vLLM bind this address, not the first NIC's
        "DSPARK_CHECKPOINT_REVISION": cfg.model.revision,
        "NODE_RANK": str(rank),
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
        **CACHE_ENV,
    }
    if s.distributed_executor_backend == "ray":
        env.update({
            "RAY_memory_monitor_refresh_ms": "0",  # unified memory: Ray's OOM killer would kill the engine
            "RAY_ADDRESS": f"{fabric.bootstrap_ip(cfg, 0)}:{s.ray_port}",
            "RAY_PORT": str(s.ray_port),
            "DSPARK_RAY_NODES": str(len(cfg.nodes)),
        })
    env.update(s.extra_env)
    return dict(sorted(env.items()))


def vllm_serve_args(cfg: ClusterConfig) -> list[str]:
    s = cfg.serving
    args = [
        "serve", MODEL_MOUNT,
        "--served-model-name", cfg.model.served_name,
        "--tensor-parallel-size", str(s.tp_size),
        "--distributed-executor-backend", s.distributed_executor_backend,
        "--kv-cache-dtype", s.kv_cache_dtype,
        "--max-model-len", str(s.max_model_len),
        "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}",
        "--host", "0.0.0.0",
        "--port", str(s.port),
    ]  # fmt: skip
    if s.max_running_requests:
        args += ["--max-num-seqs", str(s.max_running_requests)]
    return args + list(s.extra_args)


# A Ray worker joins only once the head's GCS answers (bounded by DSPARK_RAY_WAIT, 900 s): a head that
# is still starting is not a failed group. Once joined, `ray start --block` exits when the cluster is
# lost, and the rank stops with it (a group fails as a whole).
RAY_WORKER_RUN = r"""python3 - <<'WAIT'
import os, socket, sys, time
host, port = os.environ["RAY_ADDRESS"].rsplit(":", 1)
deadline = time.time() + int(os.environ.get("DSPARK_RAY_WAIT", "900"))
tries = 0
while True:
    tries += 1
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        break
    except OSError as e:
        if time.time() > deadline:
            print(f"deepseek-spark: the Ray head {host}:{port} did not answer in time ({tries} tries: {e})", flush=True)
            sys.exit(1)
        if tries == 1 or tries % 10 == 0:
            print(f"deepseek-spark: waiting for the Ray head {host}:{port} ({e})", flush=True)
        time.sleep(2)
WAIT
exec "$@"
"""


def vllm_mp_args(cfg: ClusterConfig, rank: int) -> list[str]:
    """vLLM's own multi-node launcher (distributedExecutorBackend: mp, no Ray): every node runs `vllm
    serve` with the same flags; node 0 serves the API, the others run --headless."""
    s = cfg.serving
    args = ["--nnodes", str(len(cfg.nodes)), "--node-rank", str(rank),
            "--master-addr", fabric.bootstrap_ip(cfg, 0), "--master-port", str(s.dist_port)]  # fmt: skip
    return args + (["--headless"] if rank else [])


def vllm_specs(cfg: ClusterConfig, stack: str, limits: list[int] | None = None) -> list[RankSpec]:
    """backend ray: node 0 runs a Ray head + `vllm serve` once every Ray worker joined, other nodes a Ray
    worker. backend mp: every node runs `vllm serve`, node 0 with the API, the others --headless."""
    mp = cfg.serving.distributed_executor_backend == "mp"
    specs = []
    for rank, node in enumerate(cfg.nodes):
        mounts = [Mount(MODEL_MOUNT, checkpoint_volume_name(stack), "volume", True),
                  Mount(CACHE_MOUNT, compile_cache_prefix(stack), "volume", False)]
        if rank == 0:
            mounts.append(Mount(API_KEY_MOUNT, api_key_path(cfg, stack), "bind", True))
        if mp:
            run, key, role = 'exec vllm "$@"', ("env:VLLM_API_KEY" if rank == 0 else None), "vllm-node"
            args = vllm_serve_args(cfg) + vllm_mp_args(cfg, rank)
        elif rank == 0:
            run, key, role = VLLM_HEAD_RUN, "env:VLLM_API_KEY", "vllm-head"
            args = vllm_serve_args(cfg)
        else:
            run, key, role = RAY_WORKER_RUN, None, "ray-worker"
            args = ["ray", "start", "--block", "--address", f"{fabric.bootstrap_ip(cfg, 0)}:{cfg.serving.ray_port}",
                    "--node-ip-address", fabric.bootstrap_ip(cfg, rank), "--num-gpus", "1",
                    "--disable-usage-stats"]  # fmt: skip
        specs.append(
            RankSpec(rank=rank, node=node.name, container_name=container_name(stack, rank), image=cfg.image,
                     entrypoint=["/bin/sh", "-c", launch_wrapper(run, key=key), role], args=args,
                     env=vllm_env(cfg, rank), mounts=mounts, checkpoint=volume_options(cfg, rank),
                     generation=cfg.serving.generation,
                     memory_mib=limits[rank] if limits else rank_memory_mib(cfg, rank))
        )  # fmt: skip
    return specs


def rank_checks(cfg: ClusterConfig, spec: RankSpec) -> list[tuple[str, list[str]]]:
    """What the image's own parsers check for one rank before the group starts: (engine, argv) pairs,
    the exact argv the rank's entrypoint hands to each program (programs/argcheck.py), less the
    head's `--api-key <key>` that its wrapper appends from the key file (no key on a command line)."""
    if cfg.engine == "sglang":
        return [("sglang", spec.args)]
    if spec.args[:1] == ["ray"]:  # a Ray worker
        return [("ray", spec.args[1:])]
    checks = [("vllm", spec.args)]
    if cfg.serving.distributed_executor_backend == "ray":
        checks.insert(0, ("ray", ray_head_args(str(cfg.serving.ray_port), fabric.bootstrap_ip(cfg, spec.rank))))
    return checks


def group_specs(cfg: ClusterConfig, stack: str, limits: list[int] | None = None) -> list[RankSpec]:
    """`limits`: as rank_specs. Both engines serve /metrics (vLLM always; SGLang with --enable-metrics)."""
    return vllm_specs(cfg, stack, limits) if cfg.engine == "vllm" else rank_specs(cfg, stack, limits)


def _ignore_regex(pattern: str) -> re.Pattern[str]:
    """One .dockerignore pattern as Docker matches it (Go filepath.Match, plus `**` for any depth)."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/" also matches no directory at all
                i += 1
                out += "(?:.*/)?"
            else:
                out += ".*"
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c) or (c if c in "[]-^" else re.escape(c))
        i += 1
    return re.compile(out + r"\Z")


def dockerignore(context: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """The context's .dockerignore as (exclude?, regex) rules, in file order (the last match wins)."""
    path = context / ".dockerignore"
    rules = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        line = posixpath.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((exclude, _ignore_regex(line)))
    return rules


def context_files(context: Path) -> list[str]:
    """The files `docker build` sends for `context`: everything but what .dockerignore excludes (a
    pattern that matches a directory excludes what is under it; `!` patterns re-include)."""
    rules = dockerignore(context)
    kept = []
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        parts = rel.split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        excluded = False
        for exclude, regex in rules:
            if any(regex.match(c) for c in candidates):
                excluded = exclude
        if not excluded:
            kept.append(rel)
    return kept


def build_context_digest(context: Path, dockerfile: str, args: dict[str, str] | None = None,
                         platform: str | None = None) -> str:  # fmt: skip
    """Hash of what a build of `context` depends on, as pulumi-docker's Image hashes it: every file
    the build would send (names, modes, contents; .dockerignore honoured, so an ignored file changes
    nothing), the Dockerfile, the build args and the platform. A change rebuilds the image on every
    node and, through the group revision, restarts the whole group."""
    h = hashlib.sha256()
    for rel in context_files(context):
        path = context / rel
        h.update(f"{rel}\0{path.stat().st_mode & 0o777:o}\0".encode())
        h.update(path.read_bytes())
    h.update(dockerfile.encode())
    h.update(json.dumps({"args": dict(sorted((args or {}).items())), "platform": platform}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def image_build_digest(cfg: ClusterConfig) -> str:
    """"" when the image is pulled; the build's digest (context, args, platform) when it is built on the nodes."""
    b = cfg.image_build
    if b is None:
        return ""
    return build_context_digest(PROJECT_ROOT / b.context, b.dockerfile, b.args, b.platform)


_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?\s*$", re.I | re.M)
_ARG = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?\s*$", re.M)


def base_images(dockerfile_text: str, args: dict[str, str] | None = None) -> list[str]:
    """The images a Dockerfile builds FROM (registry refs, not earlier stages), `${ARG}`s resolved from
    the build args and the ARG defaults before the first FROM."""
    values = {m.group(1): m.group(2) or "" for m in _ARG.finditer(dockerfile_text.split("FROM", 1)[0])}
    values.update(args or {})
    refs, stages = [], set()
    for m in _FROM.finditer(dockerfile_text):
        ref = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda v: values.get(v.group(1), ""), m.group(1))
        if ref.lower() not in stages and ref != "scratch" and ref not in refs:
            refs.append(ref)
        if m.group(2):
            stages.add(m.group(2).lower())
    return refs


def image_identity_refs(cfg: ClusterConfig) -> list[str]:
    """What must be the same image on every node of a group: the pulled image itself, or, for an image built
    on each node (whose IDs always differ: a build records its time), the base images it is built FROM."""
    b = cfg.image_build
    if b is None:
        return [cfg.image]
    return base_images((PROJECT_ROOT / b.context / b.dockerfile).read_text(), b.args) or [cfg.image]


def group_revision(specs: list[RankSpec], image_build: str = "") -> str:
    """Short hash of everything any rank runs with (and the overlay build's digest, when the image is
    built on the nodes). Deterministic: sorted keys, no timestamps."""
    blob = json.dumps([asdict(s) for s in specs], sort_keys=True, separators=(",", ":")) + image_build
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def endpoint(cfg: ClusterConfig) -> str:
    return f"http://{head(cfg).host}:{cfg.serving.port}/v1"
