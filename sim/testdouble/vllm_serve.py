"""TEST DOUBLE of ``vllm serve MODEL [flags]`` (dspark-sim), stdlib only. This is NOT vLLM.

1. Flags: the real vLLM serve parser's option table (flags.py; unknown or ambiguous flags exit 2).
2. MODEL must be a directory holding a readable ``config.json``, else exit 1.
3. Executor: ``--distributed-executor-backend`` (default as vLLM: ``uni`` for tp 1, ``mp`` when tp fits
   the node's GPUs, else ``ray``; a simulated Spark has 1 GPU, or ``CUDA_VISIBLE_DEVICES``).
   ``ray``: REAL Ray (the PyPI wheel in the image): ``ray.init(address="auto")`` (``$RAY_ADDRESS`` /
   the local head; no cluster: exit 1), then the same checks as vLLM's ``initialize_ray_cluster`` on
   ``ray.nodes()`` / ``ray.cluster_resources()``: the alive nodes must offer >= tp GPUs and the current
   node (``$VLLM_HOST_IP``, else Ray's node IP) must be an alive node with a GPU; otherwise exit 1 with
   vLLM's error text. One ``{"GPU": 1}`` bundle per rank, the driver node's first (no placement group is
   created: nothing runs on the ranks).
4. HTTP on ``--host:--port`` (only once the executor is up, as vLLM): ``/health`` and ``/ping`` 200
   with an empty body, ``/version``, ``/v1/models``, ``/v1/chat/completions`` (shared with the SGLang
   double: ``openai_api``), ``/metrics`` (always, as vLLM: Prometheus text with
   the real vLLM families of ``metric_families.VLLM``, labelled ``model_name`` = the first served name and
   ``engine`` = "0": requests running (streams included) and waiting (0), tokens, time to first token,
   latencies, KV cache usage against the pool it logged). API key: ``--api-key`` or ``$VLLM_API_KEY``; when set, only paths starting
   with ``/v1`` need ``Authorization: Bearer <key>`` (401 ``{"error": "Unauthorized"}``), as in vLLM.
5. Ray executor: every ``DSPARK_VLLM_RAY_POLL_S`` (2 s) the double re-reads ``ray.nodes()``; if a
   node hosting a rank is no longer alive, or the head is unreachable, it logs which one and exits 1.
   ``import ray`` happens only for the ``ray`` backend (``uni``/``mp`` run without Ray installed).
6. NCCL (``nccl.rank_init``: torch's Gloo group, then the NCCL communicator, against the node's interfaces
   and /sys/class/infiniband) where vLLM's ranks create it, before the API serves: ``ray``: rank 0 in this
   process and one Ray task per other rank, pinned to its node (its env is that node's Ray worker
   container's, as a RayWorkerWrapper actor's is); ``mp`` across nodes: on every node once the group
   formed. A failing rank's NCCL lines are printed (Ray's ``(RayWorkerWrapper pid=, ip=)`` prefix for
   remote ranks) and the engine exits 1.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import ThreadingHTTPServer

from . import flags, metric_families, nccl, openai_api

__version__ = "0.11.0+test-double"
TAG = "vllm-sim test-double"
MODEL_MAX_LEN = 131072  # the fake checkpoint's context (what vLLM would read from its config)


def log(msg: str) -> None:
    openai_api.emit(TAG, msg)


def die(msg: str, code: int = 1) -> None:
    log(msg)
    sys.stdout.flush()
    os._exit(code)


def check_model(path: str) -> dict:
    if not os.path.isdir(path):
        die(f"ValueError: Invalid repository ID or local directory specified: '{path}'. "
            "(TEST DOUBLE: MODEL must be a local checkpoint directory; nothing is downloaded)")
    cfg = os.path.join(path, "config.json")
    try:
        with open(cfg) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        die(f"ValueError: No usable config.json in local directory '{path}': {e}")
    return {}


def local_gpu_count() -> int:
    """GPUs on this node as vLLM sees them: CUDA_VISIBLE_DEVICES if set, else one GB10 per Spark."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return len([d for d in cvd.split(",") if d.strip() and d.strip() != "-1"])
    return 1


def ray_nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def resolve_backend(tp: int, backend: str | None, nnodes: int = 1) -> str:
    gpus = local_gpu_count() * nnodes  # mp across nodes: --nnodes of them
    if backend is None:
        backend = "uni" if tp == 1 else ("mp" if tp <= gpus else "ray")
    if backend in ("mp", "uni") and tp > gpus:
        die(f"ValueError: World size ({tp}) is larger than the number of available GPUs ({gpus}) in this node. "
            "If this is intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.\n"
            "- multiprocessing, set '--nnodes' appropriately.")
    if backend == "external_launcher":
        die("ValueError: --distributed-executor-backend external_launcher is not supported by the TEST DOUBLE")
    return backend


def place_on_ray(tp: int) -> list[dict]:
    """vLLM's ``initialize_ray_cluster`` checks; returns the node of each rank (driver's first)."""
    try:
        import ray
    except ImportError as e:
        die(f"ModuleNotFoundError: {e}; the ray backend needs Ray installed")
    try:
        ctx = ray.init(address="auto", ignore_reinit_error=True, logging_level="WARNING",
                       log_to_driver=False, configure_logging=False)
        alive = ray_nodes(ray)
        gpus_total = ray.cluster_resources().get("GPU", 0.0)
    except (ConnectionError, OSError, ValueError, RuntimeError) as e:
        die(f"ConnectionError: {e}")
    addr = ctx.address_info.get("gcs_address") or os.environ.get("RAY_ADDRESS", "?")
    summary = ", ".join(f"{n['NodeID'][:8]} {n['NodeManagerAddress']} GPU {n['Resources'].get('GPU', 0):g}"
                        for n in alive)
    log(f"Ray cluster at {addr}: {len(alive)} alive node(s): {summary}")
    total = gpus_total
    if tp > total:
        die("ValueError: The number of required GPUs exceeds the total number of available GPUs in the placement "
            f"group. (required {tp}, the Ray cluster at {addr} has {total:g} on {len(alive)} alive node(s))")
    current_ip = os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()
    here = [n for n in alive if n["NodeManagerAddress"] == current_ip]
    res = here[0]["Resources"] if here else {}
    if not here or res.get("GPU", 0.0) < 1:
        nid = here[0]["NodeID"] if here else None
        die(f"ValueError: Current node has no GPU available. current_node_resource={res}. vLLM engine cannot start "
            f"without GPU. Make sure you have at least 1 GPU available in a node current_node_id={nid} "
            f"current_ip={current_ip}.")
    placement: list[dict] = []
    for n in [here[0]] + [n for n in alive if n is not here[0]]:
        placement += [n] * int(n["Resources"].get("GPU", 0.0))
    if len(placement) < tp:
        die(f"ValueError: Cannot provide a placement group of placement_group_specs={[{'GPU': 1.0}] * tp} within "
            "the timeout. See `ray status` and `ray list nodes` to make sure the cluster has enough resources.")
    placement = placement[:tp]
    log("placement group ready: " + ", ".join(f"rank {r} on {n['NodeID'][:8]} ({n['NodeManagerAddress']})"
                                             for r, n in enumerate(placement)))
    return placement


def _nccl_rank(rank: int, nranks: int, nnodes: int) -> tuple[int, int, str]:
    """One rank's NCCL init, run as a Ray task on that rank's node: (exit code, pid, its output)."""
    import io

    buf = io.StringIO()
    rc = nccl.rank_init(rank, nranks, nnodes, log=lambda m: buf.write(m + "\n"), out=buf)
    return rc, os.getpid(), buf.getvalue()


def nccl_on_ray(placement: list[dict]) -> None:
    """NCCL init of every rank: rank 0 here (the driver worker), the others as Ray tasks on their nodes."""
    tp = len(placement)
    if tp <= 1:
        return
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nnodes = len({n["NodeID"] for n in placement})
    task = ray.remote(_nccl_rank)
    futs = [(r, n, task.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
             .remote(r, tp, nnodes)) for r, n in enumerate(placement) if r > 0]
    rc0 = nccl.rank_init(0, tp, nnodes, log=log)
    failed = [0] if rc0 else []
    for r, n, fut in futs:
        try:
            rc, pid, out = ray.get(fut, timeout=float(os.environ.get("DSPARK_VLLM_NCCL_TIMEOUT_S", "120")))
        except Exception as e:  # noqa: BLE001 -- a rank that never ran is a failed rank
            log(f"RayWorkerError: rank {r} on {n['NodeManagerAddress']} did not start: {e}")
            failed.append(r)
            continue
        for line in out.splitlines():
            sys.stdout.write(f"(RayWorkerWrapper pid={pid}, ip={n['NodeManagerAddress']}) {line}\n")
        sys.stdout.flush()
        if rc:
            failed.append(r)
    if failed:
        die(f"RuntimeError: NCCL init failed on rank(s) {failed} (see above); engine dead, exiting")
    log(f"NCCL communicator ready on {tp} rank(s)")


def watch_ray(placement: list[dict], every: float) -> None:
    import ray

    ranks: dict[str, list[int]] = {}
    for r, n in enumerate(placement):
        ranks.setdefault(n["NodeID"], []).append(r)
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in placement}
    while True:
        time.sleep(every)
        try:
            by_id = {n["NodeID"]: n for n in ray.nodes()}
        except Exception as e:  # noqa: BLE001 -- any failure to reach the GCS: the engine is dead
            die(f"RayWorkerError: lost the Ray cluster ({e}); engine dead, exiting")
        lost = [nid for nid in ranks if not by_id.get(nid, {}).get("Alive")]
        if lost:
            alive = sum(1 for n in by_id.values() if n.get("Alive"))
            what = "; ".join(f"node {nid[:8]} ({ips[nid]}) hosting rank(s) {ranks[nid]}: "
                             f"{by_id.get(nid, {}).get('DeathReasonMessage') or 'not in the cluster'}"
                             for nid in lost)
            die(f"RayWorkerError: lost Ray node(s): {what}; {alive} alive node(s) < tensor-parallel-size "
                f"{len(placement)}; engine dead, exiting")


def join_mp(args, nnodes: int, node_rank: int) -> None:
    """vLLM's multi-node mp launcher: node 0 waits at --master-addr:--master-port until every
    --headless node joined, then serves; a headless node serves nothing and exits when node 0 goes
    (the group fails as a whole). Same rendezvous as the SGLang double (server.Group)."""
    from .server import Group

    if not args.master_addr or not args.master_port:
        die("ValueError: --nnodes > 1 needs --master-addr and --master-port", 2)
    if bool(node_rank) != bool(args.headless):
        die(f"ValueError: node rank {node_rank} {'must' if node_rank else 'must not'} run --headless "
            "(TEST DOUBLE: node 0 serves the API)", 2)
    group = Group("vllm", node_rank, nnodes)
    tp = max(int(args.tensor_parallel_size or 1), nnodes)
    if node_rank == 0:
        threading.Thread(target=group.serve_coordinator, args=(int(args.master_port),), daemon=True).start()
        group.formed.wait()
        if nccl.rank_init(0, tp, nnodes, log=log):
            die("RuntimeError: NCCL init failed (see above); engine dead, exiting")
        return
    group.join(args.master_addr, int(args.master_port), float(os.environ.get("DSPARK_VLLM_JOIN_S", "600")))
    group.formed.wait()
    if nccl.rank_init(node_rank, tp, nnodes, log=log):
        die("RuntimeError: NCCL init failed (see above); engine dead, exiting")
    log(f"headless node {node_rank}/{nnodes} running its engine rank(s); no API on this node")
    while True:
        time.sleep(3600)


def serve(args) -> int:
    args.model = args.model_tag or getattr(args, "model", None)  # as ServeSubcommand.cmd does
    if not args.model:
        die("ValueError: vllm serve needs MODEL (positional)", 2)
    # the real parser's human-readable int (``128k``): a custom type the option table leaves as text
    args.max_model_len = flags.human_int(args.max_model_len) if args.max_model_len is not None else None
    tp = args.tensor_parallel_size
    if tp < 1:
        die(f"ValueError: tensor_parallel_size must be >= 1, got {tp}")
    names = args.served_model_name or [args.model]
    log(f"TEST DOUBLE vllm serve {args.model} (served as {', '.join(names)}) tp {tp} "
        f"backend {args.distributed_executor_backend or 'auto'} kv-cache-dtype {args.kv_cache_dtype} "
        f"max-model-len {args.max_model_len}")
    check_model(args.model)
    nnodes, node_rank = int(args.nnodes or 1), int(args.node_rank or 0)
    backend = resolve_backend(tp, args.distributed_executor_backend, nnodes)
    placement = place_on_ray(tp) if backend == "ray" else []
    if placement:
        nccl_on_ray(placement)
    if backend == "mp" and nnodes > 1:
        join_mp(args, nnodes, node_rank)
    log(f"executor {backend} ready: {tp} rank(s)")
    # what real vLLM logs once it sized its KV cache (gpu_worker.py, kv_cache_utils.py), with the
    # double's memory model: room for max-num-seqs requests of max-model-len, times DSPARK_SIM_KV_SHARE
    share = float(os.environ.get("DSPARK_SIM_KV_SHARE", "1") or 1)
    length = args.max_model_len or MODEL_MAX_LEN  # without --max-model-len, vLLM takes the model's
    tokens = int(length * max(1, args.max_num_seqs or 1) * share)
    log(f"Available KV cache memory: {tokens * 1024 / 2**30:.2f} GiB")
    log(f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for {length:,} tokens per request: "
        f"{tokens / length:.2f}x")

    def pre_route(h, method: str, path: str) -> bool:
        if path in ("/health", "/ping") and method in ("GET", "POST"):
            h.send_empty(200)
        elif path == "/version" and method == "GET":
            h.send_json(200, {"version": __version__})
        else:
            return False
        return True

    keys = list(args.api_key or []) or ([os.environ["VLLM_API_KEY"]] if os.environ.get("VLLM_API_KEY") else [])
    api_key = keys[0] if keys else None
    handler = openai_api.make_handler(openai_api.Api(
        engine="vllm", model_names=names, root=args.model, max_model_len=args.max_model_len, api_key=api_key,
        guarded=lambda path: path.startswith("/v1"), pre_route=pre_route, check_model=True, log=log,
        debug=args.uvicorn_log_level in ("debug", "trace"),
        metrics=metric_families.EngineMetrics("vllm", names[0], tokens)))
    try:
        httpd = ThreadingHTTPServer((args.host, args.port), handler)
    except OSError as e:
        die(f"OSError: cannot bind {args.host}:{args.port}: {e}")
    httpd.daemon_threads = True
    if placement:
        every = float(os.environ.get("DSPARK_VLLM_RAY_POLL_S", "2"))
        threading.Thread(target=watch_ray, args=(placement, every), daemon=True).start()
    log(f"ready: serving OpenAI API for model {', '.join(names)} on http://{args.host}:{args.port} "
        f"(API key {'required on /v1' if api_key else 'not set'})")
    httpd.serve_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = flags.build_vllm_cli(__version__).parse_args(argv[:1] + flags.normalize_vllm_argv(argv[1:]))
    signal.signal(signal.SIGTERM, lambda *_: die("SIGTERM received, shutting down", 0))
    crash = os.environ.get("DSPARK_SIM_CRASH_AT_BOOT", "")
    if crash:  # TEST DOUBLE fault (python -m sim crash-at-boot NODE): dies while it loads, at every start
        time.sleep(0.5)
        die(f"Traceback (most recent call last): {crash}")
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
