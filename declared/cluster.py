"""One serving group's config: the pydantic models of what `deepseek-spark:cluster` declares for a group
(nodes, model, imageBuild, serving with selfHeal, engram, fabric, share, ssh, readiness, memory, alerts),
`ClusterConfig` that holds them, `parse_cluster`, and `ConfigError` with the error lines every parser of
the stack config shares (`stack` builds the stack's own fields on these; `settings` reads them from Pulumi).

The models describe *shape* (types, ranges, unknown fields). The rules that relate fields to each
other and to the hardware (node count == TP, memory plan, OFFLOAD_MODE, ...) live in `rules.py` so
each one can be listed, tested and reported with its fix.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from .shapes import (
    _ENGINE_VERSION, _HCA_LIST, _HF_REPO, _HOST_KEY, _IFNAME_LIST, _IMAGE, _NAME, _REVISION, _ENV_KEY,
    check_host, check_options, check_path, check_printable, check_source, shape,
)  # fmt: skip

PROJECT = "deepseek-spark"
CLUSTER_KEY = "cluster"  # the stack config: `deepseek-spark:cluster` in Pulumi.<stack>.yaml


class ConfigError(Exception):
    """Bad stack configuration; the message names each field, its value and the fix."""


class _Strict(BaseModel):
    """Unknown fields are errors; YAML uses camelCase, Python uses snake_case."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


Host = Annotated[str, AfterValidator(check_host)]
Source = Annotated[str, AfterValidator(check_source)]
NodePath = Annotated[str, AfterValidator(check_path)]
Printable = Annotated[str, AfterValidator(check_printable)]
IfnameList = Annotated[str, AfterValidator(shape(_IFNAME_LIST, "a network interface name or comma list "
                                                  "(at most 15 characters each: letters, digits, _.-), e.g. enP7s7"))]
HcaList = Annotated[str, AfterValidator(shape(_HCA_LIST, "an RDMA device name or comma list (name[:port]), "
                                               "e.g. rocep1s0f0,rocep1s0f1"))]
HfRepo = Annotated[str, AfterValidator(shape(_HF_REPO, "a Hugging Face repo id owner/name, e.g. "
                                              "nvidia/DeepSeek-V4.1-Flash-NVFP4"))]
Revision = Annotated[str, AfterValidator(shape(_REVISION, "a revision (commit, tag or branch: letters, digits, "
                                                "_./-, at most 128)"))]
Name = Annotated[str, AfterValidator(shape(_NAME, "a name of letters, digits and _.:/- (at most 128)"))]
ImageRef = Annotated[str, AfterValidator(shape(_IMAGE, "a docker image reference [registry[:port]/]repo[:tag]"
                                                "[@sha256:<64 hex>], lowercase repository"))]
EngineVersion = Annotated[str, AfterValidator(shape(_ENGINE_VERSION, "an engine release like 0.5.23 or 0.31.0 "
                                                          "(digits and dots, optionally .postN)"))]
HostKey = Annotated[str, AfterValidator(shape(_HOST_KEY, "an ssh public host key '<type> <base64>' as in "
                                               "known_hosts without the host, e.g. 'ssh-ed25519 AAAA...'"))]
Options = Annotated[list[str], AfterValidator(check_options)]
EnvKey = Annotated[str, AfterValidator(shape(_ENV_KEY, "an environment variable name (letters, digits, _; "
                                              "not starting with a digit)"))]


class NodeConfig(_Strict):
    """One DGX Spark. Node 0 of the list is the head: rank 0, serves the API, exports the checkpoint."""

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$",
                      description="the node's name: its resources and containers carry it, router.node and "
                                  "gateway.node name it")  # fmt: skip
    host: Host = Field(description="management address used for ssh and the API: IPv4 or DNS name")
    fabric_ip: str = Field(description="data plane: this node's address on its cabled ConnectX-7 port (NCCL, "
                           "dist-init, Ray, NFS); the port's twin has an address of its own, found by preflight")
    link_ips: list[str] = Field(
        default_factory=list, description="more ConnectX-7 addresses of this node, one per further direct link "
        "(a triangle: the address on the link to the third node); nodes share a link when addresses share a subnet")
    ssh_user: str = Field(min_length=1, max_length=32, pattern=r"^[a-z_][a-z0-9_-]*$",
                          description="the user ssh logs in as (other than root, it needs passwordless sudo on "
                                      "the head for the NFS export: see the README)")  # fmt: skip
    ssh_port: int = Field(default=22, ge=1, le=65535, description="the node's ssh port")
    host_key: HostKey | None = Field(
        default=None,
        description="pinned ssh host key for remote commands, e.g. 'ssh-ed25519 AAAA...' (default: read from "
        "ssh.knownHostsFile)",
    )
    nfs_server_ip: str | None = Field(
        default=None, description="workers: the head's NFS address for this worker (default: the head's address on "
        "the link the two share)"
    )


class ModelConfig(_Strict):
    """The checkpoint every rank serves: where it is, its revision, its memory profile and where it comes from."""

    served_name: Name = Field(default="deepseek-v4.1-flash", description="the model name clients request "
                              "(--served-model-name); every group of a stack serves the same")  # fmt: skip
    checkpoint_dir: NodePath = Field(description="checkpoint on the head (nfs) or on every node (local, download)")
    revision: Revision = Field(description="checkpoint revision; repacks/re-downloads when it changes")
    expected_shards: int = Field(default=48, ge=1, le=100_000, description="safetensors files of the complete "
                                 "checkpoint: preflight, the download and the copy count them")  # fmt: skip
    profile: Name = Field(description="memory profile, see planning/memoryplan.py PROFILES (default per engine)")
    source: Literal["shared", "download"] = Field(
        default="shared", description="shared: already on disk; download: fetched per node from hfRepo at revision"
    )
    hf_repo: HfRepo | None = Field(default=None, description="Hugging Face repo for source: download")


class SelfHealConfig(_Strict):
    """serving.selfHeal: the guard on every node of the group (programs/guard), which restarts the whole group,
    in the program's order and after its start gates, when a rank dies, a node reboots or the head hangs."""

    enabled: bool = Field(default=True, description="run the guard (false: a fault waits for `dspark restart`)")
    port: int = Field(default=9850, ge=1024, le=65535, description="the guard's port on every node: /metrics, "
                      "/status, and the signed requests between the group's guards")
    max_attempts: int = Field(default=3, ge=1, le=100, description="heals in one fault episode before the guard "
                              "gives up and the group stays down (an alert and `dspark status` say why)")
    backoff_seconds: int = Field(default=30, ge=1, le=3600, description="wait after a failed heal, doubled each time")
    hang_seconds: int = Field(default=60, ge=5, le=86400, description="the head answering nothing for this long "
                              "while every rank runs is a hang")
    stable_seconds: int = Field(default=600, ge=10, le=86400, description="serving this long ends a fault episode "
                                "(the attempts count from zero again)")
    interval_seconds: int = Field(default=5, ge=1, le=300, description="how often the guard looks")
    stop_grace_seconds: int = Field(default=10, ge=1, le=600, description="a rank's time to stop before it is killed")
    memory_mib: int = Field(default=256, ge=64, le=4096, alias="memoryMiB", description="the guard's container limit")

    @model_validator(mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        return {"enabled": value} if isinstance(value, bool) else value  # `selfHeal: false`


class ServingConfig(_Strict):
    """How the engine serves the model: the API port, the parallelism, the engine's memory and decoding
    settings, extra flags and env. A field of the other engine is refused (rule engine-fields)."""

    # Both engines.
    port: int = Field(ge=1024, le=65535, description="API port (default 8888 for sglang, 8000 for vllm)")
    tp_size: int = Field(ge=1, le=8, description="tensor-parallel size: one rank per node, so the number of nodes")
    max_running_requests: int | None = Field(default=None, ge=1, le=1024, description="sglang; vllm: --max-num-seqs")
    extra_args: list[Printable] = Field(default_factory=list, description="more engine flags, after the ones the "
                                        "program sets (never one of those: rule extra-args-not-managed)")
    extra_env: dict[EnvKey, Printable] = Field(default_factory=dict, description="more environment variables of "
                                               "every rank (never one the program sets: rule extra-env-not-managed)")
    generation: int = Field(default=0, ge=0, le=2**31, description="bump to restart the whole group (e.g. after a rank died)")
    nccl_debug: bool = Field(default=False, description="NCCL_DEBUG=INFO (INIT,NET) from the next restart: which "
                             "transport every rank's NCCL chose (dspark logs --nccl, dspark doctor)")
    self_heal: SelfHealConfig = Field(default_factory=SelfHealConfig, description="the guard (on by default)")
    # SGLang only (rules.py refuses them on vllm; the None ones are required on sglang).
    dist_port: int = Field(default=20000, ge=1024, le=65535, description="the head's rendezvous port on its "
                           "bootstrap address: SGLang's --dist-init-addr; vLLM uses it too with "
                           "distributedExecutorBackend mp (--master-port)")  # fmt: skip
    ep_size: int | None = Field(default=None, ge=1, le=8, description="expert-parallel size (--ep-size); it divides "
                                "tpSize")  # fmt: skip
    context_length: int | None = Field(default=None, ge=1, le=1 << 24, description="longest request in tokens, "
                                       "prompt and answer (--context-length)")  # fmt: skip
    max_total_tokens: int | None = Field(default=None, ge=1, le=1 << 30, description="the KV pool in tokens "
                                         "(--max-total-tokens), as the memory plan counts it")  # fmt: skip
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1, description="share of unified memory of the "
                                              "static pool: weights and KV pool (--mem-fraction-static)")  # fmt: skip
    chunked_prefill_size: int = Field(default=1024, ge=1, le=1 << 20, description="tokens per prefill chunk "
                                      "(--chunked-prefill-size)")  # fmt: skip
    spec_algo: Literal["DSPARK", "off"] = Field(default="DSPARK", description="speculative decoding: DSPARK (its "
                                                "draft weights are in the checkpoint) or off")  # fmt: skip
    dspark_block_size: int = Field(default=3, ge=1, le=16, description="DSPARK's draft block size "
                                   "(--speculative-dspark-block-size)")  # fmt: skip
    # Accepts "ram" on purpose so rules.py can refuse it with the seed's explanation.
    offload_mode: Literal["nvme", "ram"] = Field(
        default="nvme", description="OFFLOAD_MODE of the engram tables: nvme (ram is refused: host RAM is GPU memory "
        "on a Spark)")
    # vLLM only (rules.py refuses them on sglang).
    max_model_len: int = Field(default=131072, ge=1, le=1 << 24, description="the first thing to lower when memory is short")
    kv_cache_dtype: Name = Field(default="fp8_ds_mla", description="the KV cache's data type (--kv-cache-dtype)")
    gpu_memory_utilization: float = Field(default=0.85, gt=0, lt=1, description="share of unified memory vLLM may "
                                          "take for weights and KV cache (--gpu-memory-utilization)")  # fmt: skip
    ray_port: int = Field(default=6379, ge=1024, le=65535, description="the Ray head's port on the head node "
                          "(distributedExecutorBackend ray)")  # fmt: skip
    ray_ports: int = Field(default=6380, ge=1024, le=65436, description="the first of the 100 ports Ray's processes "
                           "take on every node (node manager, object manager, agents, workers), fenced to the group's "
                           "data plane")  # fmt: skip
    # ray: a Ray head + workers (the image must carry Ray); mp: vLLM's own multi-node launcher
    # (--nnodes/--node-rank/--master-addr, workers --headless), no Ray at all.
    distributed_executor_backend: Literal["ray", "mp"] = Field(
        default="ray", description="ray: a Ray head and workers (the image must carry Ray); mp: vLLM's own "
        "multi-node launcher (workers --headless), no Ray")


SGLANG_ONLY = {
    "dist_port", "ep_size", "context_length", "max_total_tokens", "mem_fraction_static", "chunked_prefill_size",
    "spec_algo", "dspark_block_size", "offload_mode",
}  # fmt: skip
SGLANG_REQUIRED = ("ep_size", "context_length", "max_total_tokens", "mem_fraction_static", "max_running_requests")
VLLM_ONLY = {"max_model_len", "kv_cache_dtype", "gpu_memory_utilization", "ray_port", "ray_ports",
             "distributed_executor_backend"}


class EngramConfig(_Strict):
    """SGLang only: the checkpoint's engram tables, packed per rank into shards on each node's NVMe."""

    dir: NodePath = Field(description="NVMe directory on every node that holds this node's packed shard")
    retain: bool = Field(default=True, description="keep packed shards on destroy (packing costs ~10 min)")


class FabricConfig(_Strict):
    """The data plane between the nodes' ConnectX-7 ports: what NCCL uses (found on each node at every rank
    start unless pinned here) and the checks of the links before a group starts."""

    ib_hca: HcaList | None = Field(
        default=None, description="pin NCCL_IB_HCA; unset = every RoCE device of the ConnectX-7 port that holds "
        "fabricIp (both twins), found on each node at every rank start")
    socket_ifname: IfnameList | None = Field(
        default=None, description="pin NCCL/GLOO/TP_SOCKET_IFNAME; unset = the interface holding the node's "
        "bootstrap address, found at every rank start")
    bootstrap: Literal["fabric", "management"] = Field(
        default="fabric", description="the plane of dist-init, Ray and the socket interfaces: fabric (fabricIp), or "
        "management (host) where no data-plane address reaches every peer (a triangle)")
    prefix_length: int = Field(default=24, ge=8, le=30, description="subnet size that pairs link addresses")
    link_speed_mbps: int = Field(default=200000, ge=1, le=10_000_000, description="every rail's negotiated speed")
    mtu: int = Field(default=9000, ge=1280, le=9216, description="every rail's MTU; peers must pass no-fragment pings")
    bandwidth_gate: bool = Field(default=True, description="ib_write_bw between linked nodes before a group starts")
    min_bandwidth_gbps: float = Field(default=175.0, ge=0, le=1600, description="floor per node pair, all rails "
                                      "together (NVIDIA's cluster gate: 175 Gb/s)")
    gid_index: int | None = Field(
        default=None, ge=0, le=255, description="pin NCCL_IB_GID_INDEX; unset = the rails' RoCE v2 IPv4 GID, looked "
        "up from sysfs at every rank start"
    )
    tuned_buffers: bool = Field(default=True, description="NCCL buffer knobs that cut 4.7 GiB to 0.14 GB")


class ShareConfig(_Strict):
    """How every rank gets the checkpoint: the head exports it to the workers over NFS, or every node holds
    its own copy."""

    mode: Literal["nfs", "local"] = Field(
        default="nfs", description="nfs: head exports to workers; local: every node holds its own copy"
    )
    export_options: Options = Field(
        default_factory=lambda: ["ro", "sync", "no_subtree_check", "no_root_squash", "insecure"],
        description="exports(5) options of the checkpoint export, one per item",
    )
    mount_options: Options = Field(
        default_factory=lambda: ["nfsvers=4.2", "ro", "nconnect=8", "rsize=1048576", "wsize=1048576", "hard", "timeo=600"],
        description="nfs(5) mount options of the workers' checkpoint volume, one per item",
    )


class SshConfig(_Strict):
    """How Pulumi reaches the nodes: the system `ssh` client (the docker provider, the probes) and
    pulumi-command's own ssh client (remote commands)."""

    identity_file: Printable | None = Field(default=None, description="the system ssh client's private key file "
                                            "(-i; unset: ssh's own defaults and the agent)")  # fmt: skip
    known_hosts_file: Printable | None = Field(
        default=None, description="the known_hosts file the system ssh checks and remote commands pin host keys "
        "from (unset: ~/.ssh/known_hosts)")
    strict_host_key_checking: bool = Field(default=True, description="true: a node's host key must be known; false: "
                                           "ssh accepts a new one and remote commands leave it unverified")  # fmt: skip
    connect_timeout: int = Field(default=15, ge=1, le=600, description="the system ssh client's connect timeout, in "
                                 "seconds (ConnectTimeout)")  # fmt: skip
    # sshd drops new connections past MaxStartups (default 10:30:100) while others still authenticate, and the
    # docker provider opens one ssh per docker connection without retrying (kreuzwerker/terraform-provider-docker
    # issue 262): one master connection per node (ControlMaster) carries them all as sessions.
    connection_reuse: bool = Field(default=True, description="the system ssh client shares one connection per node "
                                                             "(ControlMaster/ControlPersist)")  # fmt: skip
    control_path: Printable = Field(default="~/.ssh/dspark-%C", min_length=1, max_length=90,
                                    description="ssh ControlPath of the shared connections (its directory must exist)")
    control_persist_seconds: int = Field(default=60, ge=1, le=3600, description="how long a shared connection "
                                         "stays open after its last session, in seconds (ControlPersist)")  # fmt: skip
    # pulumi-command's dial: dialErrorLimit+1 attempts, 100 ms between the first two, x1.5 after each, at most 5 s
    # (about 11 s for 10), each TCP connect bounded by perDialTimeout; every error is retried.
    dial_error_limit: int = Field(default=10, ge=-1, le=1000, description="remote commands: failed dials before "
                                                                           "giving up (-1: no limit)")  # fmt: skip
    per_dial_timeout: int = Field(default=15, ge=0, le=600, description="remote commands: seconds per TCP connect (0: none)")


class ReadinessConfig(_Strict):
    """When a group counts as ready (for `up`, and for the guard after a heal): rank 0's /health answers,
    then one chat completion's answer contains `expect`; and the KV pool rank 0 reports against the plan's."""

    timeout_seconds: int = Field(default=1800, ge=1, le=86400, description="sized for a 12-13 minute boot")
    interval_seconds: int = Field(default=10, ge=1, le=3600, description="seconds between the probe's tries")
    prompt: Printable = Field(default="What is 19 + 23?", min_length=1, max_length=2000,
                              description="the chat prompt of the probe's one completion")  # fmt: skip
    expect: Printable = Field(default="42", min_length=1, max_length=200, description="text the answer must contain")
    # What rank 0 reports it obtained (its boot log) against the plan: below this share of the KV pool
    # the plan expects, `up` fails (kvShortfall: fail) or warns (warn). 0 turns the check off.
    min_kv_share: float = Field(default=0.9, ge=0, le=1, description="share of the plan's KV pool rank 0 must "
                                "report at boot (0: no check); below it, kvShortfall says what happens")  # fmt: skip
    kv_shortfall: Literal["fail", "warn"] = Field(default="fail", description="a KV pool below minKvShare fails `up`, "
                                                  "or only warns")  # fmt: skip


class MemoryConfig(_Strict):
    """A DGX Spark's unified memory as the memory plan counts it, and the memory gate before a group starts."""

    # A DGX Spark has 128 GB of unified memory, of which the OS shows ~121.7 GiB to CUDA.
    unified_gib: float = Field(default=121.7, gt=16, le=128, alias="unifiedGiB", description="unified memory per Spark")
    runtime_floor_gib: float = Field(default=3.0, ge=0, le=64, alias="runtimeFloorGiB",
                                     description="kept free outside the static pool")  # fmt: skip
    host_reserve_gib: float = Field(default=1.5, ge=0.5, le=64, alias="hostReserveGiB",
                                    description="kept for sshd, dockerd and the OS: no rank container may use it")  # fmt: skip
    side_reserve_gib: float = Field(default=4.0, ge=0, le=64, alias="sideReserveGiB",
                                    description="kept on every node for the stack's side containers (router, gateway "
                                    "and its database, Prometheus, Alertmanager, node exporter): their limits come "
                                    "out of it, so adding or resizing one never changes a rank's limit (nor restarts "
                                    "the group); a change of this field does")  # fmt: skip
    drop_caches: bool = Field(default=True, alias="dropCaches",
                              description="before a group starts, sync and drop each node's page cache (needs root or "
                                          "the sudo rule of the README); the memory gate checks MemAvailable after it")  # fmt: skip
    memory_gate: bool = Field(default=True, alias="memoryGate",
                              description="before a group starts, fail when a node's MemAvailable is below its rank's need")  # fmt: skip


class AlertsConfig(_Strict):
    """What the alert rules (planning/alerts.py: the `alert_rules` output, `dspark.clients --format prometheus-rules`)
    hold this group to; the other thresholds come from the plan (KV pool, memory floor, fabric floor)."""

    ttft_seconds: float = Field(default=10.0, gt=0, le=3600, description="p95 time to first token over 5 minutes "
                                "above this, for 10 minutes, fires DsparkTimeToFirstTokenHigh (raise it for long prompts)")


class ImageBuildConfig(_Strict):
    """Build `image` on every node from a local context (the recipe's overlay on the base image,
    like the reference's `start.sh build`) instead of pulling it. The context is uploaded from
    where Pulumi runs to each node's engine; nothing is pushed to a registry."""

    context: Printable = Field(min_length=1, description="directory with the Dockerfile, relative to the project")
    dockerfile: Printable = Field(default="Dockerfile", description="the Dockerfile's path inside context")
    args: dict[EnvKey, Printable] = Field(default_factory=dict, description="build arguments (--build-arg)")
    platform: Annotated[str, AfterValidator(shape(re.compile(r"^[a-z0-9]+/[a-z0-9_]+(?:/[a-z0-9]+)?$"),
                                                   "a platform os/arch[/variant], e.g. linux/arm64"))] | None = Field(
        default="linux/arm64", description="DGX Spark is aarch64")  # fmt: skip


class ClusterConfig(_Strict):
    """One serving group: its nodes and what they serve, how. The value of `deepseek-spark:cluster` for a
    stack without `groups`; with `groups`, each group's fields over the shared ones."""

    engine: Literal["sglang", "vllm"] = Field(default="sglang", description="the serving engine; it fills its own "
                                              "defaults of image, engineVersion, serving.port and model.profile")
    topology: Literal["switch", "direct", "ring"] = Field(
        default="switch", description="how the ConnectX-7 ports are cabled: a switch, direct (2-3 nodes, e.g. a "
        "triangle) or ring (4 nodes without a switch: NCCL's ring settings)")
    nodes: list[NodeConfig] = Field(min_length=1, description="the group's DGX Sparks, one rank each; the first is "
                                    "the head")  # fmt: skip
    model: ModelConfig = Field(description="the checkpoint: where it is, its revision, its memory profile")
    image: ImageRef = Field(description="engine image (default per engine)")
    engine_version: EngineVersion = Field(
        description="the engine version inside `image` (default per engine): command lines are built and checked for it"
    )
    image_timeout_minutes: int = Field(default=60, ge=1, le=1440, description="the longest a node may take to "
                                       "pull or build `image`, in minutes")  # fmt: skip
    image_build: ImageBuildConfig | None = Field(default=None, description="build `image` on each node")
    serving: ServingConfig = Field(description="how the engine serves: port, parallelism, memory, extra flags")
    engram: EngramConfig | None = Field(default=None, description="sglang only: packed engram shards on NVMe")
    fabric: FabricConfig = Field(default=FabricConfig(), description="the data plane: NCCL's devices and "
                                 "interfaces, the link checks before a group starts")  # fmt: skip
    share: ShareConfig = Field(default=ShareConfig(), description="how the workers get the checkpoint: NFS from "
                               "the head, or a copy on every node")  # fmt: skip
    ssh: SshConfig = Field(default=SshConfig(), description="how Pulumi reaches the nodes over ssh")
    readiness: ReadinessConfig = Field(default=ReadinessConfig(), description="when the group counts as ready: "
                                       "health, one answer, the KV pool")  # fmt: skip
    memory: MemoryConfig = Field(default=MemoryConfig(), description="unified memory as the memory plan counts it, "
                                 "and the memory gate")  # fmt: skip
    alerts: AlertsConfig = Field(default=AlertsConfig(), description="what the alert rules hold the group to")
    state_dir: NodePath | None = Field(
        default=None, description="head dir for the API key file (default: /var/lib for root, else ~/.local/state)"
    )

    @model_validator(mode="before")
    @classmethod
    def _engine_defaults(cls, data: Any) -> Any:
        """Fill what differs by engine (image, port, memory profile) before validation."""
        if not isinstance(data, dict):
            return data
        engine = data.get("engine", "sglang")
        defaults = ENGINE_DEFAULTS.get(engine if isinstance(engine, str) else "", {})
        data = dict(data)
        data.setdefault("image", defaults.get("image"))
        data.setdefault("engineVersion", defaults.get("engineVersion"))
        for section in ("serving", "model"):
            if isinstance(data.get(section), dict):
                data[section] = {**defaults.get(section, {}), **data[section]}
        return data


ENGINE_DEFAULTS: dict[str, dict[str, Any]] = {
    "sglang": {
        "image": "lmsysorg/sglang:dev-dsv41",
        "engineVersion": "0.5.23",
        "serving": {"port": 8888},
        "model": {"profile": "deepseek-v4.1-flash-mxfp4"},
    },
    "vllm": {
        "image": "vllm/vllm-openai:v0.31.0",
        "engineVersion": "0.31.0",
        "serving": {"port": 8000},
        "model": {"profile": "deepseek-v4.1-flash-nvfp4"},
    },
}


def _loc(loc: tuple[Any, ...], root: str = "cluster") -> str:
    out = root
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


PLAIN_STRING = (
    f"{PROJECT}:{CLUSTER_KEY} is a plain string, not a structured value; fix: write it as a YAML mapping under "
    f"`config:` in Pulumi.<stack>.yaml (copy the block of Pulumi.tp4.yaml), or set single fields with "
    f"`pulumi config set --path {PROJECT}:{CLUSTER_KEY}.<field> <value>`"
)


def parse_cluster(raw: Any) -> ClusterConfig:
    """Validate the structured value of `deepseek-spark:cluster`; every problem in one message."""
    if raw is None:
        raise ConfigError(
            f"{PROJECT}:{CLUSTER_KEY} is not set: copy the `config:` block of Pulumi.tp4.yaml into your stack file"
        )
    if isinstance(raw, str):
        raise ConfigError(PLAIN_STRING)
    try:
        return ClusterConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("invalid stack config:\n  " + "\n  ".join(error_lines(exc))) from None


# Fields that existed once: the error says what replaced them.
REMOVED = {
    ("fabric", "iface"): "was removed: preflight checks every rail of the ConnectX-7 port that holds each node's "
    "fabricIp (found from sysfs); remove it (pin the RoCE devices with fabric.ibHca if you must)",
}


def error_lines(exc: ValidationError, root: str = "cluster") -> list[str]:
    """One line per problem: the field's path, what is wrong and what to do."""
    lines = []
    for err in exc.errors():
        where = _loc(err["loc"], root)
        if err["type"] == "extra_forbidden" and tuple(err["loc"][-2:]) in REMOVED:
            lines.append(f"{where}: {REMOVED[tuple(err['loc'][-2:])]}")
        elif err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown field; remove it or check its spelling (fields are camelCase)")
        elif err["type"] == "missing":
            lines.append(f"{where}: required field is missing; add it to the stack config")
        else:
            lines.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    return lines

