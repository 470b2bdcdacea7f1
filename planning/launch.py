"""How each rank is launched: the engines' command lines (SGLang's, vLLM's, Ray's), the environment the ranks
run with, and the entrypoint script that wraps them (the fabric step, the API key from its file). Pure: no
Pulumi, no node; planning/plan.py puts them into each rank's RankSpec.
"""

from __future__ import annotations

import shlex

from . import exposure, fabric
from declared.cluster import ClusterConfig

# Where the rank container sees what its command line names (plan.rank_specs mounts them there).
MODEL_MOUNT = "/models/DeepSeek-V4.1-Flash"
ENGRAM_MOUNT = "/engram"
API_KEY_MOUNT = "/run/secrets/dspark-api-key"
# Where the engines keep what they compile and tune at boot (FlashInfer, DeepGEMM, vLLM: ~/.cache; Triton and
# torch inductor are pointed there by CACHE_ENV): a volume per node, so a restart reuses it.
CACHE_MOUNT = "/root/.cache"
CACHE_ENV = {"TRITON_CACHE_DIR": f"{CACHE_MOUNT}/triton", "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_MOUNT}/torchinductor"}

OOM_SCORE_ADJ = 500  # the rank, not sshd or dockerd, is the kernel's first choice when the node runs out


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
        "--host", exposure.engine_bind(cfg, rank),
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


def ray_ports_args(cfg: ClusterConfig) -> list[str]:
    """Ray's processes on a node pinned to serving.rayPorts (exposure.ray_ports: what the fence lets the group's
    peers reach), its dashboard, where the image has one, on loopback."""
    p = exposure.ray_ports(cfg)
    return ["--node-manager-port", str(p["node-manager"]), "--object-manager-port", str(p["object-manager"]),
            "--runtime-env-agent-port", str(p["runtime-env-agent"]), "--metrics-export-port", str(p["metrics-export"]),
            "--min-worker-port", str(p["min-worker"]), "--max-worker-port", str(p["max-worker"]),
            "--dashboard-host", exposure.LOOPBACK]  # fmt: skip


def ray_head_args(cfg: ClusterConfig, port: str, ip: str) -> list[str]:
    """`ray start` on the vLLM head (the script passes "$RAY_PORT" "$VLLM_HOST_IP"; the argument check
    passes the values)."""
    return ["start", "--head", "--port", port, "--node-ip-address", ip, "--num-gpus", "1", "--disable-usage-stats",
            *ray_ports_args(cfg)]


def vllm_head_run(cfg: ClusterConfig) -> str:
    """The vLLM head's script: start the Ray head, wait until every node's Ray worker has joined, then serve."""
    return "ray " + " ".join(ray_head_args(cfg, '"$RAY_PORT"', '"$VLLM_HOST_IP"')) + VLLM_HEAD_GATE


VLLM_HEAD_GATE = r"""
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


# ---------------------------------------------------------------- vLLM


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


def vllm_serve_args(cfg: ClusterConfig, rank: int = 0) -> list[str]:
    s = cfg.serving
    args = [
        "serve", MODEL_MOUNT,
        "--served-model-name", cfg.model.served_name,
        "--tensor-parallel-size", str(s.tp_size),
        "--distributed-executor-backend", s.distributed_executor_backend,
        "--kv-cache-dtype", s.kv_cache_dtype,
        "--max-model-len", str(s.max_model_len),
        "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}",
        "--host", exposure.engine_bind(cfg, rank),
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
