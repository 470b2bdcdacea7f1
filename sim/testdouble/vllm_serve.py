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
4. HTTP on ``--host:--port`` (only once the executor is up, as vLLM): the routes vLLM's ``build_app`` registers
   for the generate task (``make_handler``: the OpenAI ``/v1`` routes, ``/health`` and ``/ping`` 200 with an
   empty body, ``/version``, ``/load``, ``/tokenize``, ``/detokenize``, SageMaker's ``/invocations``,
   ``/generative_scoring``, the elastic EP routes, FastAPI's docs; the development routes with
   ``VLLM_SERVER_DEV_MODE=1``), chat and completions shared with the SGLang double (``openai_api``), and
   ``/metrics`` (always, as vLLM: Prometheus text with the real vLLM families of ``metric_families.VLLM``,
   labelled ``model_name`` = the first served name and ``engine`` = "0": requests running (streams included)
   and waiting (0), tokens, time to first token, latencies, KV cache usage against the pool it logged). API
   keys: every ``--api-key``, else ``$VLLM_API_KEY``; when set, only paths starting with ``/v1``, ``/v2``,
   ``/inference`` or ``/cohere`` need ``Authorization: Bearer <key>`` (401 ``{"error": "Unauthorized"}``, before
   any routing), as vLLM's middleware: everything else, ``/invocations`` (a chat completion) included, is open.
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

import hashlib
import json
import os
import secrets
import signal
import sys
import threading
import time
from http import HTTPStatus
from http.server import ThreadingHTTPServer

from . import flags, metric_families, nccl, openai_api

__version__ = flags.version_of("vllm")  # the release it stands in for: 0.31.0+test-double
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


# ------------------------------------------------------------------------------------------ HTTP ----
# vllm/entrypoints/serve/middleware/authenticate.py (0.31.0 and 0.33.0): only these prefixes need the key
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


def api_tokens(args, env=None) -> list[str]:
    """The keys the API accepts, as init_entrypoints_middleware takes them: every ``--api-key`` (it takes
    precedence), else ``$VLLM_API_KEY``; empty ones dropped."""
    env = os.environ if env is None else env
    return [k for k in (args.api_key or [env.get("VLLM_API_KEY")]) if k]


def authorize(keys: list[str], method: str, path: str, header: str | None) -> int | None:
    """vLLM's AuthenticationMiddleware: OPTIONS and paths outside GUARDED_PREFIX pass; else ``Bearer <any key>``
    (scheme case-insensitive; sha256 digests compared in constant time) or 401."""
    if not keys or method == "OPTIONS" or not path.startswith(GUARDED_PREFIX):
        return None
    scheme, _, param = (header or "").partition(" ")
    if header and scheme.lower() == "bearer":
        digest = hashlib.sha256(param.encode()).digest()
        if any([secrets.compare_digest(digest, hashlib.sha256(k.encode()).digest()) for k in keys]):
            return None
    return 401


def dev_mode(env=None) -> bool:
    """``VLLM_SERVER_DEV_MODE`` as vllm.envs reads it (``bool(int(...))``): a value int() refuses stops the server."""
    value = (os.environ if env is None else env).get("VLLM_SERVER_DEV_MODE", "0")
    try:
        return bool(int(value))
    except ValueError:
        die(f"ValueError: invalid literal for int() with base 10: {value!r}")
    return False


class EngineState:
    """What the development endpoints change: paused (/pause, /resume) and asleep (/sleep, /wake_up). While
    either holds, a new generation waits, as the real engine's scheduler does not schedule it until resumed."""

    def __init__(self):
        self.cond = threading.Condition()
        self.paused = False
        self.asleep: set[str] = set()  # the tags still asleep (weights, kv_cache)

    def hold(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: not self.paused and not self.asleep)

    def set(self, paused: bool | None = None, asleep: set[str] | None = None) -> None:
        with self.cond:
            if paused is not None:
                self.paused = paused
            if asleep is not None:
                self.asleep = asleep
            self.cond.notify_all()


# 0.33.0 registers the scale-out routes even when they are off (the default, without --enable-scale-out), answering
# 403; 0.31.0 leaves them out (404). All are under a guarded prefix.
SCALE_OUT_ROUTES = ("/v1/chat/completions/render", "/v1/messages/render", "/v1/completions/render",
                    "/v1/responses/render", "/v1/chat/completions/derender", "/v1/completions/derender",
                    "/inference/v1/generate", "/inference/v1/abort_requests")


# 0.33.0's /is_scaling_elastic_ep without external elastic EP: the process-local state, idle
SCALING_IDLE_0_33 = {"is_scaling_elastic_ep": False, "phase": "idle", "epoch": None, "error": None,
                     "requested_data_parallel_size": None}


def release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("+")[0].split(".")[:3] if x.isdigit())


def make_handler(args, names: list[str], keys: list[str], kv_tokens: int, env=None, version: str | None = None):
    """The HTTP API of ``vllm serve`` (the routes build_app registers for the generate task, 0.31.0/0.33.0):

    * guarded when a key is set (GUARDED_PREFIX): ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``;
    * open: ``/health`` (GET), ``/ping`` (GET, POST), ``/version``, ``/load``, ``/kv_event_sources``,
      ``/metrics`` (and any path under it, any method: the Prometheus mount), ``/tokenize``, ``/detokenize``,
      ``/invocations`` (SageMaker: a chat completion or a completion, by the body), ``/generative_scoring``,
      ``/scale_elastic_ep``, ``/is_scaling_elastic_ep``, and FastAPI's ``/openapi.json``, ``/docs``, ``/redoc``
      (unless ``--disable-fastapi-docs``);
    * with ``VLLM_SERVER_DEV_MODE=1``, open too: ``/pause``, ``/resume``, ``/is_paused``, ``/abort_requests``,
      ``/sleep``, ``/wake_up``, ``/is_sleeping``, ``/reset_prefix_cache``, ``/reset_mm_cache``,
      ``/reset_encoder_cache``, ``/server_info``.
    """
    env = os.environ if env is None else env
    ver = release(version or flags.VERSIONS["vllm"])
    state = EngineState()
    metrics = metric_families.EngineMetrics("vllm", names[0], kv_tokens)
    max_len = args.max_model_len or MODEL_MAX_LEN
    dp = int(getattr(args, "data_parallel_size", None) or 1)

    def unknown_model(h, req: dict) -> bool:
        model = req.get("model")
        if model is not None and model not in names:
            h.send_json(404, openai_api.error_body(f"The model `{model}` does not exist.", "NotFoundError", 404))
            return True
        return False

    def tokenize(h):
        req = h.json_body()
        if unknown_model(h, req):
            return None
        if isinstance(req.get("messages"), list):
            text = openai_api.message_text(req["messages"])
        elif isinstance(req.get("prompt"), str):
            text = req["prompt"]
        else:
            return h.send_json(400, openai_api.error_body("Field required: 'prompt' or 'messages'"))
        ids = openai_api.tokenize(text)
        h.send_json(200, {"count": len(ids), "max_model_len": max_len, "tokens": ids,
                          "token_strs": [openai_api.detokenize([i]) for i in ids] if req.get("return_token_strs")
                          else None})  # fmt: skip

    def detokenize(h):
        req = h.json_body()
        if unknown_model(h, req):
            return None
        ids = req.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
            return h.send_json(400, openai_api.error_body("tokens: a list of non-negative integers is required"))
        bad = [i for i in ids if i >= openai_api.VOCAB_SIZE]
        if bad:
            return h.send_json(400, openai_api.error_body(f"Token id {bad[0]} is out of vocabulary"))
        h.send_json(200, {"prompt": openai_api.detokenize(ids)})

    def invocations(h):
        """SageMaker's /invocations: the first request type the body validates as, ChatCompletionRequest
        (``messages``) then CompletionRequest (a non-empty ``prompt``), answered by its OpenAI handler."""
        req = h.json_body()
        if isinstance(req.get("messages"), list):
            return h.chat(req)
        if req.get("prompt") not in (None, "") or req.get("prompt_embeds"):
            return h.completion(req)
        h.send_json(400, openai_api.error_body("Cannot find suitable handler for request. Expected one of: "
                                               "['ChatCompletionRequest', 'CompletionRequest']"))

    def generative_scoring(h):
        """ServingGenerativeScoring's checks, then each item's score: the double's next-token distribution is
        uniform, so the first label's probability is 1/len(label_token_ids) (apply_softmax) or 1/vocab."""
        req = h.json_body()
        missing = [f for f in ("query", "items", "label_token_ids") if f not in req]
        if missing:
            return h.send_json(400, openai_api.error_body(f"Field required: {', '.join(missing)}"))
        if unknown_model(h, req):
            return None
        labels, items = req["label_token_ids"], req["items"]
        for t in labels:
            if not isinstance(t, int) or t < 0 or t >= openai_api.VOCAB_SIZE:
                return h.send_json(400, openai_api.error_body(
                    f"label_token_id {t} is out of vocabulary range [0, {openai_api.VOCAB_SIZE}). "
                    "Please provide valid token IDs."))
        if not labels:
            return h.send_json(400, openai_api.error_body("label_token_ids must contain at least one token ID."))
        if not items:
            return h.send_json(400, openai_api.error_body("items must contain at least one item."))
        score = 1 / len(labels) if req.get("apply_softmax", True) else 1 / openai_api.VOCAB_SIZE
        query = req["query"] if isinstance(req["query"], list) else openai_api.tokenize(str(req["query"]))
        prompt = sum(len(query) + len(i if isinstance(i, list) else openai_api.tokenize(str(i))) for i in items)
        h.send_json(200, {"id": "generative-scoring-sim-" + os.urandom(8).hex(), "object": "list",
                          "created": int(time.time()), "model": req.get("model") or names[0],
                          "data": [{"index": i, "object": "score", "score": score} for i in range(len(items))],
                          "usage": {"prompt_tokens": prompt, "total_tokens": prompt + len(items),
                                    "completion_tokens": len(items), "prompt_tokens_details": None}})

    def http_error(h, code: int, message: str):  # vLLM's http_exception_handler
        h.send_json(code, openai_api.error_body(message, HTTPStatus(code).phrase, code))

    def scale_elastic_ep(h):
        """The real route's checks; then the engine's: the same data parallel size is a no-op that reports
        success, another one fails as a client without elastic EP does (NotImplementedError -> "Scale failed")."""
        try:
            body = json.loads(h.body or b"{}")
        except ValueError:
            return http_error(h, 400, "Invalid JSON format")
        if not isinstance(body, dict):  # body.get raises: the exception handler's 500
            return h.send_json(500, openai_api.error_body(f"'{type(body).__name__}' object has no attribute 'get'",
                                                          "InternalServerError", 500))
        new, drain = body.get("new_data_parallel_size"), body.get("drain_timeout", 120)
        if new is None:
            return http_error(h, 400, "new_data_parallel_size is required")
        if not isinstance(new, int) or new <= 0:
            return http_error(h, 400, "new_data_parallel_size must be a positive integer")
        if not isinstance(drain, int) or drain <= 0:
            return http_error(h, 400, "drain_timeout must be a positive integer")
        if new == dp:
            log(f"Data parallel size is already {new}, skipping scale")
            return h.send_json(200, {"message": f"Scaled to {new} data parallel engines"})
        log("Scale failed: ")
        return http_error(h, 500, "Scale failed")

    routes = {
        "/health": {"GET": lambda h: h.send_empty(200)},
        "/ping": {"GET": lambda h: h.send_empty(200), "POST": lambda h: h.send_empty(200)},
        "/version": {"GET": lambda h: h.send_json(200, {"version": __version__})},
        "/load": {"GET": lambda h: h.send_json(200, {
            "server_load": metrics.running() if args.enable_server_load_tracking else 0})},
        "/kv_event_sources": {"GET": lambda h: h.send_json(200, {})},
        "/tokenize": {"POST": tokenize},
        "/detokenize": {"POST": detokenize},
        "/invocations": {"POST": invocations},
        "/generative_scoring": {"POST": generative_scoring},
        "/scale_elastic_ep": {"POST": scale_elastic_ep},
        "/is_scaling_elastic_ep": {"POST": lambda h: h.send_json(200, {"is_scaling_elastic_ep": False} if ver < (0, 33)
                                                                   else SCALING_IDLE_0_33)},
        **openai_api.openai_routes(),
    }
    if ver >= (0, 33) and not args.enable_scale_out:
        off = openai_api.error_body("Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to "
                                    "enable them.", "PermissionDeniedError", 403)
        routes.update({p: {"POST": lambda h: h.send_json(403, off)} for p in SCALE_OUT_ROUTES})
    if not args.disable_fastapi_docs:
        routes.update(openai_api.docs_routes())
    if dev_mode(env):
        log("SECURITY WARNING: Development endpoints are enabled! This should NOT be used in production!")
        routes.update(dev_routes(args, state, env))
    return openai_api.make_handler(openai_api.Api(
        engine="vllm", model_names=names, root=args.model, max_model_len=args.max_model_len,
        authorize=lambda method, path, header: authorize(keys, method, path, header),
        routes=routes, prefix_routes=[("/metrics", lambda h: h.metrics_text())], hold=state.hold,
        check_model=True, log=log, debug=args.uvicorn_log_level in ("debug", "trace"), metrics=metrics))


def dev_routes(args, state: EngineState, env) -> dict:
    """The development routers (vllm/entrypoints/serve/dev: rlhf, sleep, cache, server_info), open."""
    def query(h, name: str, default: str) -> str:
        return (h.query.get(name) or [default])[0]

    def bad(h, message: str):  # a query value FastAPI refuses: vLLM's validation handler, 400
        h.send_json(400, openai_api.error_body(message))

    def pause(h):
        mode = query(h, "mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            return bad(h, f"mode: Input should be 'abort', 'wait' or 'keep', got {mode!r}")
        state.set(paused=True)
        h.send_json(200, {"status": "paused"})

    def resume(h):
        state.set(paused=False)
        h.send_json(200, {"status": "resumed"})

    def sleep(h):
        try:
            level = int(query(h, "level", "1"))
        except ValueError as e:
            return bad(h, str(e))
        state.set(asleep={"weights", "kv_cache"} if level >= 1 else {"kv_cache"})
        h.send_empty(200)

    def wake_up(h):
        tags = h.query.get("tags") or None
        state.set(asleep=set() if tags is None else state.asleep - set(tags))
        h.send_empty(200)

    def abort_requests(h):
        try:
            body = json.loads(h.body or b"{}")
        except ValueError:
            return h.send_json(400, openai_api.error_body("Invalid JSON format", "Bad Request", 400))
        ids = body.get("request_ids") if isinstance(body, dict) else None
        h.send_json(200, {"status": "aborted", "aborted": len(ids or [])})

    def server_info(h):
        fmt = query(h, "config_format", "text")
        if fmt not in ("text", "json"):
            return bad(h, f"config_format: Input should be 'text' or 'json', got {fmt!r}")
        config = {k: v if isinstance(v, (str, int, float, bool, type(None), list)) else str(v)
                  for k, v in sorted(vars(args).items()) if "key" not in k}
        text = ", ".join(f"{k}={v!r}" for k, v in config.items())
        h.send_json(200, {"vllm_config": config if fmt == "json" else text,
                          "vllm_env": {k: v for k, v in sorted(env.items())
                                       if k.startswith("VLLM_") and "KEY" not in k},
                          "system_env": {"os": sys.platform, "python_version": sys.version.split()[0],
                                         "vllm_version": __version__, "is_cuda_available": False}})

    empty = lambda h: h.send_empty(200)  # noqa: E731
    return {"/pause": {"POST": pause}, "/resume": {"POST": resume},
            "/is_paused": {"GET": lambda h: h.send_json(200, {"is_paused": state.paused})},
            "/abort_requests": {"POST": abort_requests},
            "/sleep": {"POST": sleep}, "/wake_up": {"POST": wake_up},
            "/is_sleeping": {"GET": lambda h: h.send_json(200, {"is_sleeping": bool(state.asleep)})},
            "/reset_prefix_cache": {"POST": lambda h: h.send_json(200, {"success": True})},
            "/reset_mm_cache": {"POST": empty}, "/reset_encoder_cache": {"POST": empty},
            "/server_info": {"GET": server_info}}


def http_api(argv: list[str], env=None, version: str | None = None):
    """The handler of the HTTP API ``vllm serve <argv>`` serves once its executor is up, without starting one
    (tests run it in-process with ``openai_api.serve_local``); ``env`` stands for the process environment,
    ``version`` for the release the double stands in for (DSPARK_SIM_VLLM_VERSION, 0.31.0 by default)."""
    args = flags.parse_args(argv, "vllm")
    args.model = args.model_tag or getattr(args, "model", None)
    args.max_model_len = flags.human_int(args.max_model_len) if args.max_model_len is not None else None
    names = args.served_model_name or [args.model]
    length = args.max_model_len or MODEL_MAX_LEN
    return make_handler(args, names, api_tokens(args, env), length * max(1, args.max_num_seqs or 1), env, version)


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
    tokens_kv = int(length * max(1, args.max_num_seqs or 1) * share)
    log(f"Available KV cache memory: {tokens_kv * 1024 / 2**30:.2f} GiB")
    log(f"GPU KV cache size: {tokens_kv:,} tokens, Maximum concurrency for {length:,} tokens per request: "
        f"{tokens_kv / length:.2f}x")

    keys = api_tokens(args)
    handler = make_handler(args, names, keys, tokens_kv)
    try:
        httpd = ThreadingHTTPServer((args.host, args.port), handler)
    except OSError as e:
        die(f"OSError: cannot bind {args.host}:{args.port}: {e}")
    httpd.daemon_threads = True
    if placement:
        every = float(os.environ.get("DSPARK_VLLM_RAY_POLL_S", "2"))
        threading.Thread(target=watch_ray, args=(placement, every), daemon=True).start()
    log(f"ready: serving OpenAI API for model {', '.join(names)} on http://{args.host}:{args.port} "
        f"(API key {'required on ' + ', '.join(GUARDED_PREFIX) if keys else 'not set'})")
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
