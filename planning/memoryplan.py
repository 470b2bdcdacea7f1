"""The memory plan: what each rank of a group holds in a Spark's unified memory, from the published figures of
its checkpoint (PROFILES), and what that leaves of each node's budget. Pure: no Pulumi, no node.

The static pool (SGLang's memFractionStatic, vLLM's gpuMemoryUtilization of unified memory) holds the weights, the
KV pool and the window; outside it, the CUDA graphs, NCCL's buffers and the runtime floor. `memory_plan` says
whether both fit; `rank_need_mib` is what the memory gate wants free before a rank starts, `rank_memory_mib` the
rank container's limit within its node's budget (planning/budget.py places the stack's other containers).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from declared.cluster import ClusterConfig
from programs import probe

GIB = 1024**3
GB = 1000**3


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
    checkpoint_gib: float = 0.0  # the checkpoint on disk: what a download or a copy needs free (0: not checked)
    engine: str = "sglang"


@dataclass(frozen=True)
class VllmProfile:
    """Published figures of the NVFP4 checkpoint served by vLLM (seed 004), per node."""

    description: str
    weights_gib_by_tp: dict[int, tuple[float, float]]  # (low, high): the seed gives a range
    kv_gib_at: tuple[int, float]  # (max_model_len, GiB): KV grows linearly with the context length
    runtime_gb: tuple[float, float]  # system and runtime overhead, (low, high)
    max_model_len: int
    checkpoint_gib: float = 0.0  # the checkpoint on disk: what a download or a copy needs free (0: not checked)
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
        checkpoint_gib=476.0,
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
        checkpoint_gib=400.0,  # seed 004: "下载总量约 400 GiB"
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


# ---------------------------------------------------------------- a rank's share of its node


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


def side_reserve_mib(cfg: ClusterConfig) -> int:
    """memory.sideReserveGiB: what every node keeps for the stack's side containers (planning/budget.py)."""
    return math.ceil(cfg.memory.side_reserve_gib * 1024)


def rank_memory_mib(cfg: ClusterConfig, rank: int) -> int:
    """The rank container's memory limit: its static pool and what it needs outside it (never less than
    its need, rank_need_mib) plus the runtime floor as headroom, but no more than the node's budget
    (node_budget_mib) leaves once the group's guard and the side reserve (memory.sideReserveGiB) are kept. The
    side containers the stack places on the node come out of that reserve, never out of the rank's limit: adding a
    gateway or Prometheus leaves the limit, and so the group's revision, as it was. A runaway rank is then killed by
    its cgroup instead of wedging the node; a limit below the need is refused at preview (node-memory-budget)."""
    r = memory_plan(cfg).ranks[0 if rank == 0 else -1]
    want = max(_need_gib(cfg, rank), r.static_pool_gib + r.outside_needed_gib) + cfg.memory.runtime_floor_gib
    return min(int(want * 1024), node_budget_mib(cfg) - guard_memory_mib(cfg) - side_reserve_mib(cfg))

