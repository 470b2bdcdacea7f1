"""Stack configuration: the pydantic models of `deepseek-spark:cluster`, and the only module that
reads `pulumi.Config`.

The models describe *shape* (types, ranges, unknown fields). The rules that relate fields to each
other and to the hardware (node count == TP, memory plan, OFFLOAD_MODE, ...) live in `rules.py` so
each one can be listed, tested and reported with its fix.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from .shapes import (
    _ENGINE_VERSION, _HCA_LIST, _HF_REPO, _HOST_KEY, _IFNAME_LIST, _IMAGE, _NAME, _REVISION, _ENV_KEY, api_key_problem,
    check_host, check_options, check_path, check_printable, shape,
)  # fmt: skip

PROJECT = "deepseek-spark"
CLUSTER_KEY = "cluster"
API_KEY = "apiKey"
SSH_KEY = "sshPrivateKey"
HF_TOKEN = "hfToken"
MEMBER_KEYS = "memberKeys"  # optional secret map member -> key (else each member's key is generated)
ALERT_WEBHOOK = "alertWebhook"  # optional secret: where Alertmanager sends alerts (monitoring.server)


class _Strict(BaseModel):
    """Unknown fields are errors; YAML uses camelCase, Python uses snake_case."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


Host = Annotated[str, AfterValidator(check_host)]
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

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
    host: Host = Field(description="management address used for ssh and the API: IPv4 or DNS name")
    fabric_ip: str = Field(description="data plane: this node's address on its cabled ConnectX-7 port (NCCL, "
                           "dist-init, Ray, NFS); the port's twin has an address of its own, found by preflight")
    link_ips: list[str] = Field(
        default_factory=list, description="more ConnectX-7 addresses of this node, one per further direct link "
        "(a triangle: the address on the link to the third node); nodes share a link when addresses share a subnet")
    ssh_user: str = Field(min_length=1, max_length=32, pattern=r"^[a-z_][a-z0-9_-]*$")
    ssh_port: int = Field(default=22, ge=1, le=65535)
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
    served_name: Name = Field(default="deepseek-v4.1-flash")
    checkpoint_dir: NodePath = Field(description="checkpoint on the head (nfs) or on every node (local, download)")
    revision: Revision = Field(description="checkpoint revision; repacks/re-downloads when it changes")
    expected_shards: int = Field(default=48, ge=1, le=100_000)
    profile: Name = Field(description="memory profile, see plan.PROFILES (default per engine)")
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
    # Both engines.
    port: int = Field(ge=1024, le=65535, description="API port (default 8888 for sglang, 8000 for vllm)")
    tp_size: int = Field(ge=1, le=8)
    max_running_requests: int | None = Field(default=None, ge=1, le=1024, description="sglang; vllm: --max-num-seqs")
    extra_args: list[Printable] = Field(default_factory=list)
    extra_env: dict[EnvKey, Printable] = Field(default_factory=dict)
    generation: int = Field(default=0, ge=0, le=2**31, description="bump to restart the whole group (e.g. after a rank died)")
    nccl_debug: bool = Field(default=False, description="NCCL_DEBUG=INFO (INIT,NET) from the next restart: which "
                             "transport every rank's NCCL chose (dspark logs --nccl, dspark doctor)")
    self_heal: SelfHealConfig = Field(default_factory=SelfHealConfig, description="the guard (on by default)")
    # SGLang only (rules.py refuses them on vllm; the None ones are required on sglang).
    dist_port: int = Field(default=20000, ge=1024, le=65535)
    ep_size: int | None = Field(default=None, ge=1, le=8)
    context_length: int | None = Field(default=None, ge=1, le=1 << 24)
    max_total_tokens: int | None = Field(default=None, ge=1, le=1 << 30)
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    chunked_prefill_size: int = Field(default=1024, ge=1, le=1 << 20)
    spec_algo: Literal["DSPARK", "off"] = "DSPARK"
    dspark_block_size: int = Field(default=3, ge=1, le=16)
    # Accepts "ram" on purpose so rules.py can refuse it with the seed's explanation.
    offload_mode: Literal["nvme", "ram"] = "nvme"
    # vLLM only (rules.py refuses them on sglang).
    max_model_len: int = Field(default=131072, ge=1, le=1 << 24, description="the first thing to lower when memory is short")
    kv_cache_dtype: Name = "fp8_ds_mla"
    gpu_memory_utilization: float = Field(default=0.85, gt=0, lt=1)
    ray_port: int = Field(default=6379, ge=1024, le=65535)
    # ray: a Ray head + workers (the image must carry Ray); mp: vLLM's own multi-node launcher
    # (--nnodes/--node-rank/--master-addr, workers --headless), no Ray at all.
    distributed_executor_backend: Literal["ray", "mp"] = "ray"


SGLANG_ONLY = {
    "dist_port", "ep_size", "context_length", "max_total_tokens", "mem_fraction_static", "chunked_prefill_size",
    "spec_algo", "dspark_block_size", "offload_mode",
}  # fmt: skip
SGLANG_REQUIRED = ("ep_size", "context_length", "max_total_tokens", "mem_fraction_static", "max_running_requests")
VLLM_ONLY = {"max_model_len", "kv_cache_dtype", "gpu_memory_utilization", "ray_port", "distributed_executor_backend"}


class EngramConfig(_Strict):
    dir: NodePath = Field(description="NVMe directory on every node that holds this node's packed shard")
    retain: bool = Field(default=True, description="keep packed shards on destroy (packing costs ~10 min)")


class FabricConfig(_Strict):
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

    identity_file: Printable | None = None
    known_hosts_file: Printable | None = None
    strict_host_key_checking: bool = True
    connect_timeout: int = Field(default=15, ge=1, le=600)
    # sshd drops new connections past MaxStartups (default 10:30:100) while others still authenticate, and the
    # docker provider opens one ssh per docker connection without retrying (kreuzwerker/terraform-provider-docker
    # issue 262): one master connection per node (ControlMaster) carries them all as sessions.
    connection_reuse: bool = Field(default=True, description="the system ssh client shares one connection per node "
                                                             "(ControlMaster/ControlPersist)")  # fmt: skip
    control_path: Printable = Field(default="~/.ssh/dspark-%C", min_length=1, max_length=90,
                                    description="ssh ControlPath of the shared connections (its directory must exist)")
    control_persist_seconds: int = Field(default=60, ge=1, le=3600)
    # pulumi-command's dial: dialErrorLimit+1 attempts, 100 ms between the first two, x1.5 after each, at most 5 s
    # (about 11 s for 10), each TCP connect bounded by perDialTimeout; every error is retried.
    dial_error_limit: int = Field(default=10, ge=-1, le=1000, description="remote commands: failed dials before "
                                                                           "giving up (-1: no limit)")  # fmt: skip
    per_dial_timeout: int = Field(default=15, ge=0, le=600, description="remote commands: seconds per TCP connect (0: none)")


class ReadinessConfig(_Strict):
    timeout_seconds: int = Field(default=1800, ge=1, le=86400, description="sized for a 12-13 minute boot")
    interval_seconds: int = Field(default=10, ge=1, le=3600)
    prompt: Printable = Field(default="What is 19 + 23?", min_length=1, max_length=2000)
    expect: Printable = Field(default="42", min_length=1, max_length=200, description="text the answer must contain")
    # What rank 0 reports it obtained (its boot log) against the plan: below this share of the KV pool
    # the plan expects, `up` fails (kvShortfall: fail) or warns (warn). 0 turns the check off.
    min_kv_share: float = Field(default=0.9, ge=0, le=1)
    kv_shortfall: Literal["fail", "warn"] = "fail"


class MemoryConfig(_Strict):
    # A DGX Spark has 128 GB of unified memory, of which the OS shows ~121.7 GiB to CUDA.
    unified_gib: float = Field(default=121.7, gt=16, le=128, alias="unifiedGiB", description="unified memory per Spark")
    runtime_floor_gib: float = Field(default=3.0, ge=0, le=64, alias="runtimeFloorGiB",
                                     description="kept free outside the static pool")  # fmt: skip
    host_reserve_gib: float = Field(default=1.5, ge=0.5, le=64, alias="hostReserveGiB",
                                    description="kept for sshd, dockerd and the OS: no rank container may use it")  # fmt: skip
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
    dockerfile: Printable = "Dockerfile"
    args: dict[EnvKey, Printable] = Field(default_factory=dict)
    platform: Annotated[str, AfterValidator(shape(re.compile(r"^[a-z0-9]+/[a-z0-9_]+(?:/[a-z0-9]+)?$"),
                                                   "a platform os/arch[/variant], e.g. linux/arm64"))] | None = Field(
        default="linux/arm64", description="DGX Spark is aarch64")  # fmt: skip


class ClusterConfig(_Strict):
    engine: Literal["sglang", "vllm"] = "sglang"
    topology: Literal["switch", "direct", "ring"] = "switch"
    nodes: list[NodeConfig] = Field(min_length=1)
    model: ModelConfig
    image: ImageRef = Field(description="engine image (default per engine)")
    engine_version: EngineVersion = Field(
        description="the engine version inside `image` (default per engine): command lines are built and checked for it"
    )
    image_timeout_minutes: int = Field(default=60, ge=1, le=1440)
    image_build: ImageBuildConfig | None = Field(default=None, description="build `image` on each node")
    serving: ServingConfig
    engram: EngramConfig | None = Field(default=None, description="sglang only: packed engram shards on NVMe")
    fabric: FabricConfig = FabricConfig()
    share: ShareConfig = ShareConfig()
    ssh: SshConfig = SshConfig()
    readiness: ReadinessConfig = ReadinessConfig()
    memory: MemoryConfig = MemoryConfig()
    alerts: AlertsConfig = AlertsConfig()
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


ROUTER_POLICIES = ("round_robin", "cache_aware", "power_of_two", "random")
LOCAL = "local"  # router.node: the docker engine where Pulumi runs
LOCAL_DOCKER_SOCKET = "/var/run/docker.sock"  # that engine (pulumi-docker pings it when it configures, preview too)


class RouterConfig(_Strict):
    """The SGLang router (`sglang-router`, PyPI) in front of several groups: one endpoint, the API key
    enforced there, groups taken out of rotation while they restart (scripts/router.sh of the reference)."""

    node: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")] = Field(
        description="name of the node (of any group) that runs the router container, or `local`: the docker "
        "engine where Pulumi runs"
    )
    address: Host | None = Field(
        default=None, description="where clients reach the router (default: its node's host; 127.0.0.1 when local)"
    )
    port: int = Field(default=8889, ge=1024, le=65535, description="the stack's endpoint port on that node")
    metrics_port: int = Field(default=29000, ge=1024, le=65535, description="the router's Prometheus port")
    policy: Literal[ROUTER_POLICIES] = Field(  # type: ignore[valid-type]
        default="round_robin", description="round_robin: cache_aware piles shared prefixes onto one group"
    )
    image: ImageRef | None = Field(
        default=None, description="image with sglang_router (default: the SGLang image of the router node's group)"
    )
    request_timeout_seconds: int = Field(default=1800, ge=1, le=86400)
    drain_timeout_seconds: int = Field(
        default=600, ge=0, le=86400, description="longest wait for a group's requests to finish before it restarts"
    )
    # The container's memory limit (no swap), counted in its node's budget. sglang-router is a Rust proxy that
    # buffers a request body of up to 512 MiB (--max-payload-size): 1 GiB holds one of those and its own use.
    memory_mib: int = Field(default=1024, ge=256, le=16384, alias="memoryMiB", description="the router's container")


GATEWAY_IMAGE = "deepseek-spark-gateway:litellm-1.110.2"  # built from programs/gateway/Dockerfile
MEMBER_NAME = r"^[a-z0-9]([a-z0-9._-]{0,30}[a-z0-9])?$"
# What the gateway's hook calls the admin's and Prometheus's keys in usage rows and metrics: no member's name.
RESERVED_MEMBERS = ("admin", "metrics")


class MemberConfig(_Strict):
    """A team member: their own key (a Pulumi secret), scoped to the served model, revocable alone."""

    name: Annotated[str, Field(pattern=MEMBER_NAME)] = Field(
        description="1-32 lowercase letters, digits or ._- (it names the member's resources, metrics and usage)"
    )
    models: list[Name] = Field(default_factory=list, description="served models this key may call (default: all)")
    rpm_limit: int | None = Field(default=None, ge=1, le=1_000_000, description="requests per minute (LiteLLM enforces it)")
    tpm_limit: int | None = Field(default=None, ge=1, le=10**9, description="tokens per minute (LiteLLM enforces it)")
    # A budget in tokens, not dollars: the model runs on the team's own Sparks, so LiteLLM's USD budgets (its
    # price table, its Prisma-backed spend) have nothing to count; the gateway's hook counts the usage table.
    token_budget: int | None = Field(
        default=None, ge=1, le=10**12,
        description="prompt + completion tokens per budgetPeriod; beyond it the gateway answers 429 until the period ends",
    )
    budget_period: Literal["day", "week", "month"] = Field(
        default="month", description="the budget's period, in UTC (a week starts on Monday)"
    )
    rotation: int = Field(default=0, ge=0, le=10**6, description="raise it to issue the member a new generated key")

    @model_validator(mode="after")
    def _period_needs_budget(self) -> "MemberConfig":
        if self.name in RESERVED_MEMBERS:
            raise ValueError(f"name: {self.name!r} is what the gateway calls its own {self.name} key in usage and "
                             "metrics; fix: give the member another name")  # fmt: skip
        if "budget_period" in self.model_fields_set and self.token_budget is None:
            raise ValueError(f"budgetPeriod: {self.budget_period!r} without tokenBudget limits nothing; "
                             "fix: set tokenBudget (tokens per period) or remove budgetPeriod")  # fmt: skip
        return self


class GatewayConfig(_Strict):
    """The team gateway (LiteLLM's proxy, PostgreSQL beside it) in front of the stack's endpoint: a key per
    member, revocable without restarting a group, and usage per member."""

    node: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")] | None = Field(
        default=None, description="the node that runs the gateway (default: the router's node, else the head)"
    )
    address: Host | None = Field(default=None, description="where clients reach the gateway (default: its node's host)")
    port: int = Field(default=4000, ge=1024, le=65535, description="the stack's endpoint port: the only one a client needs")
    database_port: int = Field(default=5433, ge=1024, le=65535, description="PostgreSQL's port on 127.0.0.1 of that node")
    image: ImageRef = Field(default=GATEWAY_IMAGE, description="built on the node from programs/gateway/Dockerfile")
    keep_data: bool = Field(default=True, description="destroy keeps the database volume (keys and usage records)")
    # The containers' memory limits (no swap): on a Spark the rank's unified memory is what they would take.
    memory_mib: int = Field(default=1024, ge=512, le=16384, alias="memoryMiB", description="LiteLLM's container")
    database_memory_mib: int = Field(default=512, ge=128, le=16384, alias="databaseMemoryMiB",
                                     description="PostgreSQL's container")  # fmt: skip
    request_timeout_seconds: int = Field(default=1800, ge=1, le=86400)
    members: list[MemberConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_members(self) -> "GatewayConfig":
        names = [m.name for m in self.members]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"members: {', '.join(dup)} listed twice; every member needs their own name")
        return self


MONITORING_IMAGE = "deepseek-spark-monitoring:bookworm"  # built from programs/monitoring/Dockerfile (Debian's packages)


class NodeExporterConfig(_Strict):
    """Debian's prometheus-node-exporter on every node: its memory (MemAvailable, the page cache) and more."""

    enabled: bool = Field(default=True, description="run it on every node (the memory alerts read it)")
    port: int = Field(default=9100, ge=1024, le=65535, description="its port on every node's host network")
    memory_mib: int = Field(default=64, ge=32, le=1024, alias="memoryMiB", description="its container's limit")


class MonitoringServerConfig(_Strict):
    """Prometheus and Alertmanager on one node, for a team that has none: they scrape every target of the
    `prometheus` output, evaluate the `alert_rules` and send alerts to `alertWebhook` (a Pulumi secret)."""

    node: Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")] | None = Field(
        default=None, description="the node that runs them (default: the router's node, else the head)"
    )
    prometheus_port: int = Field(default=9090, ge=1024, le=65535)
    alertmanager_port: int = Field(default=9093, ge=1024, le=65535)
    scrape_interval_seconds: int = Field(default=15, ge=1, le=3600)
    evaluation_interval_seconds: int = Field(default=15, ge=1, le=3600)
    group_wait_seconds: int = Field(default=30, ge=0, le=3600, description="Alertmanager's wait before a new alert")
    group_interval_seconds: int = Field(default=60, ge=1, le=86400,
                                        description="Alertmanager's wait before what changed in a group (a resolution too)")
    retention: Annotated[str, Field(pattern=r"^[0-9]+[hdwy]$")] = Field(default="15d", description="the TSDB's")
    keep_data: bool = Field(default=True, description="destroy keeps the TSDB volume")
    memory_mib: int = Field(default=1024, ge=256, le=16384, alias="memoryMiB", description="Prometheus's container")
    alertmanager_memory_mib: int = Field(default=128, ge=64, le=4096, alias="alertmanagerMemoryMiB")


class MonitoringConfig(_Strict):
    image: ImageRef = Field(default=MONITORING_IMAGE, description="built on the nodes from programs/monitoring/Dockerfile")
    node_exporter: NodeExporterConfig = Field(default_factory=NodeExporterConfig)
    server: MonitoringServerConfig | None = Field(default=None, description="Prometheus and Alertmanager (off)")


@dataclass(frozen=True)
class GroupEntry:
    """One serving group: a name (None for a stack without `groups`) and its full config."""

    name: str | None
    cfg: ClusterConfig

    def plan_name(self, stack: str) -> str:
        """What the program names this group's resources, containers and files after."""
        return stack if self.name is None else f"{stack}-{self.name}"


@dataclass(frozen=True)
class StackConfig:
    """The whole stack: one or more groups, and the router in front of them (None: no router)."""

    groups: tuple[GroupEntry, ...]
    router: RouterConfig | None = None
    gateway: GatewayConfig | None = None
    monitoring: MonitoringConfig = MonitoringConfig()

    @property
    def single(self) -> ClusterConfig | None:
        """The config of a stack written without `groups` (today's stacks); None otherwise."""
        return self.groups[0].cfg if len(self.groups) == 1 and self.groups[0].name is None else None


class ConfigError(Exception):
    """Bad stack configuration; the message names each field, its value and the fix."""


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
        raise ConfigError("invalid stack config:\n  " + "\n  ".join(_errors(exc))) from None


# Fields that existed once: the error says what replaced them.
REMOVED = {
    ("fabric", "iface"): "was removed: preflight checks every rail of the ConnectX-7 port that holds each node's "
    "fabricIp (found from sysfs); remove it (pin the RoCE devices with fabric.ibHca if you must)",
}


def _errors(exc: ValidationError, root: str = "cluster") -> list[str]:
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


GROUP_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?$")
GROUP_FIELDS = ("engine", "nodes", "model", "image", "engineVersion", "imageBuild", "imageTimeoutMinutes", "serving", "engram",
                "fabric", "share", "readiness", "memory", "alerts", "topology", "stateDir")  # fmt: skip


def _merge(base: dict, override: dict) -> dict:
    """A group's config: the shared top-level fields with the group's own on top (mappings merged
    one level deep, so `serving: {tpSize: 2}` keeps the shared serving settings)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def parse_stack(raw: Any) -> StackConfig:
    """Validate `deepseek-spark:cluster` with optional `groups` and `router`; every problem in one
    message, each naming its field. Without `groups` the value is one group, exactly as before."""
    if not isinstance(raw, dict) or not {"groups", "router", "gateway", "monitoring"} & set(raw):
        return StackConfig((GroupEntry(None, parse_cluster(raw)),))
    base = {k: v for k, v in raw.items() if k not in ("groups", "router", "gateway", "monitoring")}
    problems: list[str] = []
    router = gateway = None
    monitoring = MonitoringConfig()
    if raw.get("monitoring") is not None:
        try:
            monitoring = MonitoringConfig.model_validate(raw["monitoring"])
        except ValidationError as exc:
            problems += _errors(exc, "cluster.monitoring")
    if raw.get("router") is not None:
        try:
            router = RouterConfig.model_validate(raw["router"])
        except ValidationError as exc:
            problems += _errors(exc, "cluster.router")
    if raw.get("gateway") is not None:
        try:
            gateway = GatewayConfig.model_validate(raw["gateway"])
        except ValidationError as exc:
            problems += _errors(exc, "cluster.gateway")
    groups_raw = raw.get("groups")
    if groups_raw is None:
        groups_raw = [None]  # a router in front of the one group the top level describes
    if not isinstance(groups_raw, list) or not groups_raw:
        problems.append("cluster.groups: must be a list of groups, each `{name: a, nodes: [...]}` plus what differs")
        raise ConfigError("invalid stack config:\n  " + "\n  ".join(problems))
    if "groups" in raw and "nodes" in base:
        problems.append("cluster.nodes: with `groups` every node belongs to a group; move the nodes into "
                        "cluster.groups[i].nodes")  # fmt: skip
    entries: list[GroupEntry] = []
    for i, g in enumerate(groups_raw):
        where = f"cluster.groups[{i}]"
        if g is None:
            try:
                entries.append(GroupEntry(None, parse_cluster(base)))
            except ConfigError as exc:
                problems.append(str(exc).removeprefix("invalid stack config:\n  "))
            continue
        if not isinstance(g, dict):
            problems.append(f"{where}: must be a mapping with `name` and `nodes`")
            continue
        name = g.get("name")
        if not isinstance(name, str) or not GROUP_NAME.match(name):
            problems.append(f"{where}.name: {name!r} must be 1-16 lowercase letters, digits or '-', e.g. a or tp4-b "
                            "(it becomes part of container and resource names)")  # fmt: skip
            continue
        unknown = sorted(set(g) - {"name", *GROUP_FIELDS})
        for key in unknown:
            problems.append(f"{where}.{key}: not a per-group field; set it at the top level of cluster (per-group "
                            f"fields: {', '.join(GROUP_FIELDS)})")  # fmt: skip
        if unknown:
            continue
        try:
            cfg = ClusterConfig.model_validate(_merge(base, {k: v for k, v in g.items() if k != "name"}))
        except ValidationError as exc:
            problems += _errors(exc, f"{where}({name})")
            continue
        entries.append(GroupEntry(name, cfg))
    names = [e.name for e in entries if e.name]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"cluster.groups: the name {dup!r} is used twice; every group needs its own name")
    if problems:
        raise ConfigError("invalid stack config:\n  " + "\n  ".join(problems))
    return StackConfig(tuple(entries), router, gateway, monitoring)


@dataclass(frozen=True)
class Settings:
    """Everything the program reads from the stack: validated cluster config plus secrets."""

    stack: str
    config: StackConfig  # the groups (one for a stack without `groups`) and the router
    api_key: Any  # pulumi.Output[str], always secret
    ssh_private_key: Any  # pulumi.Output[str] (secret) or None: ssh-agent is used then
    hf_token: Any = None  # pulumi.Output[str] (secret) or None: for model.source: download
    host_keys: tuple[tuple[str | None, ...], ...] = ()  # per group, per node: pinned for remote commands
    warnings: tuple[str, ...] = ()  # about where Pulumi runs (not the config): shown at preview
    member_keys: Any = None  # {member: pulumi.Output[str] (secret)} from `memberKeys`; others are generated
    alert_webhook: Any = None  # pulumi.Output[str] (secret) from `alertWebhook`, or None


def host_keys(cluster: ClusterConfig) -> tuple[tuple[str | None, ...], list[str]]:
    """Each node's host key for remote commands: `hostKey`, else the one ssh.knownHostsFile holds
    for it (the docker provider's system ssh trusts that file). With strict host key checking a node
    with neither is an error (the returned messages); otherwise it is left unverified."""
    from . import hostkeys

    keys, problems = [], []
    known = cluster.ssh.known_hosts_file or hostkeys.DEFAULT_FILE
    for i, node in enumerate(cluster.nodes):
        key = node.host_key or hostkeys.lookup(known, node.host, node.ssh_port)
        if key is None and cluster.ssh.strict_host_key_checking:
            problems.append(
                f"cluster.nodes[{i}].hostKey: no host key for {node.host} (port {node.ssh_port}) in {known}, and "
                "remote commands must verify the node; fix: check the node's key fingerprint, then add it with "
                f"`ssh-keyscan -p {node.ssh_port} {node.host} >> {known}` (or set nodes[{i}].hostKey)"
            )
        elif key is not None and key.startswith("ssh-rsa "):
            where = f"nodes[{i}].hostKey" if node.host_key else f"{known}, which holds only an RSA key for it,"
            problems.append(
                f"cluster.nodes[{i}].hostKey: {node.host} would be pinned to an RSA host key ({where}); pulumi-command's "
                "ssh client then signs with ssh-rsa (SHA-1) only, which OpenSSH 8.8 and later refuse, so every remote "
                f"command would fail; fix: pin the node's ed25519 or ECDSA key: `ssh-keyscan -t ed25519 -p "
                f"{node.ssh_port} {node.host} >> {known}` (check its fingerprint first), or set nodes[{i}].hostKey to it"
            )
        keys.append(key)
    return tuple(keys), problems


def local_router_problem(sc: StackConfig, socket_path: str | None = None) -> None:
    """router.node: local needs a docker engine where Pulumi runs, at preview already: pulumi-docker pings a
    unix:// host when its provider is configured, so without one even `pulumi preview` fails, with a
    message that does not say why. Say it here, naming the field and both fixes."""
    import stat

    path = socket_path or LOCAL_DOCKER_SOCKET
    if sc.router is None or sc.router.node != LOCAL:
        return
    try:
        ok = stat.S_ISSOCK(Path(path).stat().st_mode)
    except OSError:
        ok = False
    if not ok:
        raise ConfigError(f"router.node: local runs the router on the docker engine where Pulumi runs, and there is "
                          f"none at {path} (pulumi-docker connects to it at preview too); fix: start docker here "
                          "(`sudo systemctl start docker`), or put the router on a node: router.node: <a node's name>")


def agent_socket_problem(environ: dict[str, str]) -> str | None:
    """pulumi-command dials SSH_AUTH_SOCK (when set and non-empty) while it builds every remote command's ssh
    config, before the node, and fails the command when nothing answers there, even with a private key
    (remote/connection.go SSHConfig, connection_unix.go). A stale socket (a closed session's agent) would fail
    every remote command of `up`; say so at preview instead. None when the socket answers or is not set."""
    import socket

    path = environ.get("SSH_AUTH_SOCK", "")
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2)
    try:
        sock.connect(path)
        return None
    except OSError as exc:
        why = exc.strerror or str(exc)
    finally:
        sock.close()
    return (f"SSH_AUTH_SOCK is {path}, and no ssh agent answers there ({why.lower()}): pulumi-command dials it "
            "before every remote command and fails them all, even with a private key; fix: start the agent again "
            "(`eval \"$(ssh-agent)\" && ssh-add`), or run Pulumi without it: `env -u SSH_AUTH_SOCK pulumi up`")


def control_path_warning(sc: StackConfig) -> str | None:
    """ssh.connectionReuse needs its ControlPath's directory where Pulumi runs: without it ssh warns and opens
    a connection per docker call, which sshd's MaxStartups may drop. Only a warning: everything still works."""
    for entry in sc.groups:
        ssh = entry.cfg.ssh
        if ssh.connection_reuse and not Path(ssh.control_path).expanduser().parent.is_dir():
            where = ssh.control_path.rsplit("/", 1)[0]
            return (f"cluster.ssh.controlPath = {ssh.control_path!r}: its directory {where} does not exist here, so the "
                    f"docker provider's ssh opens a new connection per docker call (sshd's MaxStartups may drop some "
                    f"when many run at once); fix: `mkdir -m 700 -p {where}`, or set ssh.controlPath")
    return None


def load() -> Settings:
    """Read and validate the stack config. Raises ConfigError before any resource is registered."""
    import pulumi  # imported here so config models stay usable without the Pulumi runtime

    stack = pulumi.get_stack()
    raw = pulumi.runtime.get_config(f"{PROJECT}:{CLUSTER_KEY}")
    try:
        value = json.loads(raw) if raw is not None else None
    except ValueError:  # `pulumi config set deepseek-spark:cluster '<text>'` stores text, not JSON
        raise ConfigError(PLAIN_STRING) from None
    stack_config = parse_stack(value)
    keys, problems = [], []
    for entry in stack_config.groups:
        group_keys, group_problems = host_keys(entry.cfg)
        keys.append(group_keys)
        problems += [p if entry.name is None else f"[group {entry.name}] {p}" for p in group_problems]
    if problems:
        raise ConfigError("remote commands cannot verify these nodes:\n  " + "\n  ".join(problems))
    local_router_problem(stack_config)

    set_key = f'pulumi config set --secret {PROJECT}:{API_KEY} "$(openssl rand -hex 32)" --stack {stack}'
    key = pulumi.runtime.get_config(f"{PROJECT}:{API_KEY}")
    if key is None:
        raise ConfigError(f"{PROJECT}:{API_KEY} is not set; the endpoint must require a key. Run:\n  {set_key}")
    problem = api_key_problem(key)
    if problem:
        raise ConfigError(f"{PROJECT}:{API_KEY} {problem}. Run:\n  {set_key}")
    if not pulumi.runtime.is_config_secret(f"{PROJECT}:{API_KEY}"):
        raise ConfigError(f"{PROJECT}:{API_KEY} is stored in plain text in the stack file. Run:\n  {set_key}")

    optional = {}
    for name, example in ((SSH_KEY, "< ~/.ssh/id_ed25519"), (HF_TOKEN, '"$HF_TOKEN"'),
                          (ALERT_WEBHOOK, '"https://hooks.slack.com/services/..."')):
        value = pulumi.runtime.get_config(f"{PROJECT}:{name}")
        if value is not None and not pulumi.runtime.is_config_secret(f"{PROJECT}:{name}"):
            raise ConfigError(
                f"{PROJECT}:{name} is stored in plain text. Run:\n"
                f"  pulumi config set --secret {PROJECT}:{name} --stack {stack} {example}"
            )
        optional[name] = pulumi.Output.secret(value) if value else None
    problem = agent_socket_problem(dict(os.environ))
    if problem:
        raise ConfigError(problem)
    member_keys = {}
    raw_keys = pulumi.runtime.get_config(f"{PROJECT}:{MEMBER_KEYS}")
    if raw_keys is not None:
        keys_map = parse_member_keys(raw_keys, pulumi.runtime.is_config_secret(f"{PROJECT}:{MEMBER_KEYS}"),
                                     stack_config.gateway, stack)  # fmt: skip
        member_keys = {m: pulumi.Output.secret(k) for m, k in keys_map.items()}
    return Settings(
        stack=stack,
        config=stack_config,
        api_key=pulumi.Output.secret(key),
        ssh_private_key=optional[SSH_KEY],
        hf_token=optional[HF_TOKEN],
        host_keys=tuple(keys),
        warnings=tuple(w for w in [control_path_warning(stack_config)] if w),
        member_keys=member_keys,
        alert_webhook=optional[ALERT_WEBHOOK],
    )


MEMBER_KEY = re.compile(r"^sk-[A-Za-z0-9_-]{32,200}$")


def parse_member_keys(raw: str, secret: bool, gateway: GatewayConfig | None, stack: str) -> dict[str, str]:
    """`memberKeys`: keys chosen by the team instead of generated ones (a secret map member -> key). Every
    problem names the member and the fix; a key's value is never part of a message."""
    set_one = f"pulumi config set --secret --path '{PROJECT}:{MEMBER_KEYS}.<member>' \"sk-$(openssl rand -hex 32)\" --stack {stack}"
    if not secret:
        raise ConfigError(f"{PROJECT}:{MEMBER_KEYS} is stored in plain text in the stack file; set each key as a "
                          f"secret:\n  {set_one}")  # fmt: skip
    try:
        keys = json.loads(raw)
    except ValueError:
        keys = None
    if not isinstance(keys, dict):
        raise ConfigError(f"{PROJECT}:{MEMBER_KEYS} must be a map of member name to key; set it with:\n  {set_one}")
    members = {m.name for m in gateway.members} if gateway else set()
    problems = []
    for name, key in sorted(keys.items()):
        if name not in members:
            problems.append(f"{PROJECT}:{MEMBER_KEYS}.{name}: no such member in cluster.gateway.members; add the "
                            "member there, or remove the key")  # fmt: skip
        elif not isinstance(key, str) or not MEMBER_KEY.match(key):
            problems.append(f"{PROJECT}:{MEMBER_KEYS}.{name}: must be sk- followed by 32 to 200 of [A-Za-z0-9_-] "
                            f"(LiteLLM logs only sk- keys hashed); fix:\n    {set_one.replace('<member>', name)}")
    if problems:
        raise ConfigError("member keys:\n  " + "\n  ".join(problems))
    return keys
