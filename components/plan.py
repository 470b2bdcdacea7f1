"""Pure planning: from a validated ClusterConfig to everything each node runs. No Pulumi here.

Everything a rank container runs with is computed once, as a RankSpec; the components only map
specs to resources. The group revision is a hash of all specs, so any change to what any rank runs
with changes the label on every rank, and Pulumi replaces the whole tensor-parallel group.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import asdict, dataclass, field

from .config import ClusterConfig, NodeConfig

GIB = 1024**3
GB = 1000**3

MODEL_MOUNT = "/models/DeepSeek-V4.1-Flash"
ENGRAM_MOUNT = "/engram"
API_KEY_MOUNT = "/run/secrets/dspark-api-key"
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
    test_double: bool = False


PROFILES: dict[str, MemoryProfile] = {
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
        test_double=True,
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
    mem_fraction_static: float
    ranks: tuple[RankMemory, ...]  # head first, then a worker (all workers are alike)
    known: bool  # False when the profile has no figures for this TP size

    @property
    def fits(self) -> bool:
        return self.known and all(r.static_fits and r.outside_fits for r in self.ranks)

    def to_output(self) -> dict:
        return {
            "profile": self.profile,
            "unifiedGiB": self.unified_gib,
            "memFractionStatic": self.mem_fraction_static,
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
        lines = [f"memory plan ({self.profile}, {self.unified_gib} GiB per node, static {self.mem_fraction_static}):"]
        for r in self.ranks:
            lines.append(
                f"  {r.role}: static pool {r.static_pool_gib:.1f} GiB holds weights {r.weights_gib + r.draft_gib:.1f}"
                f" + KV {r.kv_gib:.1f} + window {r.window_gib:.2f} = {r.static_used_gib:.1f};"
                f" outside {r.outside_gib:.1f} GiB holds CUDA graphs {r.cuda_graphs_gib:.1f}"
                f" + NCCL {r.nccl_gib:.2f} + runtime floor {r.runtime_floor_gib:.1f} = {r.outside_needed_gib:.1f}"
            )
        return "\n".join(lines)


def memory_plan(cfg: ClusterConfig) -> MemoryPlan:
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
    graphs = prof.cuda_graph_gb_at_bs16 * min(s.max_running_requests, 16) / 16 * GB / GIB
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


def container_name(stack: str, rank: int) -> str:
    return f"{stack}-rank{rank}"


def checkpoint_volume_name(stack: str) -> str:
    return f"{stack}-checkpoint"


def api_key_path(cfg: ClusterConfig, stack: str) -> str:
    return f"{cfg.state_dir}/{stack}/api-key"


def nccl_env(cfg: ClusterConfig) -> dict[str, str]:
    f = cfg.fabric
    env = {
        "NCCL_NET": "IB",
        "NCCL_IB_DISABLE": "0",
        "NCCL_IB_HCA": f.ib_hca,
        "NCCL_SOCKET_IFNAME": f.socket_ifname,
        "GLOO_SOCKET_IFNAME": f.socket_ifname,
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_CROSS_NIC": "1",
        "NCCL_IB_MERGE_NICS": "0",
        "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
        "NCCL_CUMEM_ENABLE": "0",
        "NCCL_DEBUG": "WARN",
        "NCCL_DEBUG_SUBSYS": "INIT,ENV",
    }
    if f.tuned_buffers:  # pinned NCCL buffers: 4.7 GiB per node by default, ~0.14 GB with these
        env.update(
            NCCL_BUFFSIZE="1048576", NCCL_LL128_BUFFSIZE="262144", NCCL_PROTO="^LL128", NCCL_MAX_NCHANNELS="8"
        )
    if cfg.topology == "ring":  # 4 Sparks without a switch
        env.update(
            NCCL_ALGO="Ring",
            NCCL_SKIP_TREE_CONNECT="1",
            NCCL_IB_SUBNET_PREFIX_LEN="24",
            NCCL_MIN_NCHANNELS="4",
            NCCL_P2P_LEVEL="SYS",
        )
    if f.gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(f.gid_index)
    return env


def rank_env(cfg: ClusterConfig, rank: int) -> dict[str, str]:
    s = cfg.serving
    node = cfg.nodes[rank]
    env = {
        **nccl_env(cfg),
        "OFFLOAD_MODE": s.offload_mode,
        "DSV41_PACKED_DIR": ENGRAM_MOUNT,
        "DSV41_SOURCE": MODEL_MOUNT,
        "DSV41_MAX_NEW_TOKENS": "32768",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",  # True produces NaN logits
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "0",
        "HOST_IP": node.fabric_ip,
        # Which checkpoint the ranks were started on: a new revision re-packs the engram shards,
        # so it must also restart the whole group (it is part of the group revision).
        "DSPARK_CHECKPOINT_REVISION": cfg.model.revision,
        "NODE_RANK": str(rank),
        "NNODES": str(len(cfg.nodes)),
        "TP_SIZE": str(s.tp_size),
        "EP_SIZE": str(s.ep_size),
    }
    env.update(s.extra_env)
    return dict(sorted(env.items()))


def sglang_args(cfg: ClusterConfig, rank: int) -> list[str]:
    s = cfg.serving
    args = [
        "--model-path", MODEL_MOUNT,
        "--served-model-name", cfg.model.served_name,
        "--trust-remote-code",
        "--tp", str(s.tp_size),
        "--ep-size", str(s.ep_size),
        "--nnodes", str(len(cfg.nodes)),
        "--node-rank", str(rank),
        "--dist-init-addr", f"{head(cfg).fabric_ip}:{s.dist_port}",
        "--host", "0.0.0.0",
        "--port", str(s.port),
        "--context-length", str(s.context_length),
        "--max-total-tokens", str(s.max_total_tokens),
        "--max-running-requests", str(s.max_running_requests),
        "--cuda-graph-max-bs", str(s.max_running_requests),
        "--mem-fraction-static", f"{s.mem_fraction_static:g}",
        "--chunked-prefill-size", str(s.chunked_prefill_size),
        "--tool-call-parser", "deepseekv41",
        "--reasoning-parser", "deepseek-v41",
    ]  # fmt: skip
    if s.spec_algo != "off":
        args += ["--speculative-algorithm", s.spec_algo, "--speculative-dspark-block-size", str(s.dspark_block_size)]
    return args + list(s.extra_args)


def launch_wrapper(key_file: str = API_KEY_MOUNT, sysfs: str = "/sys/class/infiniband") -> str:
    """The rank entrypoint script, run by /bin/sh in the container with the launcher flags as "$@".

    - The API key is read from a mounted 0600 file (rank 0 only), so it is never part of a Pulumi
      input, a docker label or `docker inspect` args.
    - NCCL_IB_GID_INDEX, unless pinned, is looked up from sysfs at every start (it moves between
      reboots): the RoCE v2 GID ending in the IPv4-mapped HOST_IP; 3 when none matches.
    """
    return (
        r"""set -eu
if [ -z "${NCCL_IB_GID_INDEX:-}" ]; then
  want=$(printf '%s' "${HOST_IP:-}" | awk -F. 'NF==4{printf "%02x%02x:%02x%02x", $1, $2, $3, $4}')
  gid=""
  for hca in $(printf '%s' "${NCCL_IB_HCA:-}" | tr ',' ' '); do
    for f in __SYSFS__/"$hca"/ports/1/gids/*; do
      [ -r "$f" ] || continue
      i=${f##*/}
      t=$(cat __SYSFS__/"$hca"/ports/1/gid_attrs/types/"$i" 2>/dev/null || true)
      case "$t" in *"v2"*) ;; *) continue ;; esac
      case "$(cat "$f")" in *"ffff:$want") gid=$i; break 2 ;; esac
    done
  done
  export NCCL_IB_GID_INDEX="${gid:-3}"
fi
echo "deepseek-spark: rank ${NODE_RANK:-?} NCCL_IB_GID_INDEX=$NCCL_IB_GID_INDEX"
if [ -r __KEY__ ]; then
  set -- "$@" --api-key "$(cat __KEY__)"
fi
exec python3 -m sglang.launch_server "$@"
"""
        .replace("__SYSFS__", shlex.quote(sysfs))
        .replace("__KEY__", shlex.quote(key_file))
    )


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
    ulimits: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {"memlock": (-1, -1), "stack": (67108864, 67108864), "nofile": (1048576, 1048576)}
    )
    devices: list[str] = field(default_factory=lambda: ["/dev/infiniband"])
    capabilities: list[str] = field(default_factory=lambda: ["IPC_LOCK"])
    network_mode: str = "host"
    ipc_mode: str = "host"
    gpus: str = "all"
    restart: str = "no"

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


def rank_specs(cfg: ClusterConfig, stack: str) -> list[RankSpec]:
    specs = []
    for rank, node in enumerate(cfg.nodes):
        mounts = [
            Mount(MODEL_MOUNT, checkpoint_volume_name(stack), "volume", True),
            Mount(ENGRAM_MOUNT, cfg.engram.dir, "bind", False),
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
            )
        )
    return specs


def group_revision(specs: list[RankSpec]) -> str:
    """Short hash of everything any rank runs with. Deterministic: sorted keys, no timestamps."""
    blob = json.dumps([asdict(s) for s in specs], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def endpoint(cfg: ClusterConfig) -> str:
    return f"http://{head(cfg).host}:{cfg.serving.port}/v1"
