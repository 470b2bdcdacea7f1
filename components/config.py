"""Stack configuration: the pydantic models of `deepseek-spark:cluster`, and the only module that
reads `pulumi.Config`.

The models describe *shape* (types, ranges, unknown fields). The rules that relate fields to each
other and to the hardware (node count == TP, memory plan, OFFLOAD_MODE, ...) live in `rules.py` so
each one can be listed, tested and reported with its fix.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

PROJECT = "deepseek-spark"
CLUSTER_KEY = "cluster"
API_KEY = "apiKey"
SSH_KEY = "sshPrivateKey"
HF_TOKEN = "hfToken"


class _Strict(BaseModel):
    """Unknown fields are errors; YAML uses camelCase, Python uses snake_case."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


def _absolute(value: str) -> str:
    if not posixpath.isabs(value):
        raise ValueError(f"must be an absolute path on the node, got {value!r}")
    return posixpath.normpath(value)


class NodeConfig(_Strict):
    """One DGX Spark. Node 0 of the list is the head: rank 0, serves the API, exports the checkpoint."""

    name: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
    host: str = Field(min_length=1, description="management address used for ssh and the API")
    fabric_ip: str = Field(description="ConnectX-7 fabric address (NCCL, dist-init, NFS)")
    ssh_user: str = Field(min_length=1, pattern=r"^[a-z_][a-z0-9_-]*$")
    ssh_port: int = Field(default=22, ge=1, le=65535)
    host_key: str | None = Field(
        default=None, description="pinned ssh host key for remote commands, e.g. 'ssh-ed25519 AAAA...'"
    )
    nfs_server_ip: str | None = Field(
        default=None, description="workers: the head's address on this worker's ConnectX link (default: head fabricIp)"
    )


class ModelConfig(_Strict):
    served_name: str = Field(default="deepseek-v4.1-flash", min_length=1)
    checkpoint_dir: str = Field(description="checkpoint on the head (nfs) or on every node (local, download)")
    revision: str = Field(min_length=1, description="checkpoint revision; repacks/re-downloads when it changes")
    expected_shards: int = Field(default=48, ge=1)
    profile: str = Field(description="memory profile, see plan.PROFILES (default per engine)")
    source: Literal["shared", "download"] = Field(
        default="shared", description="shared: already on disk; download: fetched per node from hfRepo at revision"
    )
    hf_repo: str | None = Field(default=None, description="Hugging Face repo for source: download")

    _abs = field_validator("checkpoint_dir")(_absolute)

    @field_validator("checkpoint_dir")
    @classmethod
    def _no_whitespace(cls, value: str) -> str:
        if any(c.isspace() for c in value):
            raise ValueError("must not contain whitespace (it is exported over NFS and mounted by docker)")
        return value


class ServingConfig(_Strict):
    # Both engines.
    port: int = Field(ge=1, le=65535, description="API port (default 8888 for sglang, 8000 for vllm)")
    tp_size: int = Field(ge=1)
    max_running_requests: int | None = Field(default=None, ge=1, description="sglang; vllm: --max-num-seqs")
    extra_args: list[str] = Field(default_factory=list)
    extra_env: dict[str, str] = Field(default_factory=dict)
    generation: int = Field(default=0, ge=0, description="bump to restart the whole group (e.g. after a rank died)")
    # SGLang only (rules.py refuses them on vllm; the None ones are required on sglang).
    dist_port: int = Field(default=20000, ge=1, le=65535)
    ep_size: int | None = Field(default=None, ge=1)
    context_length: int | None = Field(default=None, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    chunked_prefill_size: int = Field(default=1024, ge=1)
    spec_algo: Literal["DSPARK", "off"] = "DSPARK"
    dspark_block_size: int = Field(default=3, ge=1)
    # Accepts "ram" on purpose so rules.py can refuse it with the seed's explanation.
    offload_mode: Literal["nvme", "ram"] = "nvme"
    # vLLM only (rules.py refuses them on sglang).
    max_model_len: int = Field(default=131072, ge=1, description="the first thing to lower when memory is short")
    kv_cache_dtype: str = "fp8_ds_mla"
    gpu_memory_utilization: float = Field(default=0.85, gt=0, lt=1)
    ray_port: int = Field(default=6379, ge=1, le=65535)
    distributed_executor_backend: Literal["ray"] = "ray"


SGLANG_ONLY = {
    "dist_port", "ep_size", "context_length", "max_total_tokens", "mem_fraction_static", "chunked_prefill_size",
    "spec_algo", "dspark_block_size", "offload_mode",
}  # fmt: skip
SGLANG_REQUIRED = ("ep_size", "context_length", "max_total_tokens", "mem_fraction_static", "max_running_requests")
VLLM_ONLY = {"max_model_len", "kv_cache_dtype", "gpu_memory_utilization", "ray_port", "distributed_executor_backend"}


class EngramConfig(_Strict):
    dir: str = Field(description="NVMe directory on every node that holds this node's packed shard")
    retain: bool = Field(default=True, description="keep packed shards on destroy (packing costs ~10 min)")

    _abs = field_validator("dir")(_absolute)


class FabricConfig(_Strict):
    socket_ifname: str = Field(default="enP7s7", description="NCCL/GLOO bootstrap interface")
    ib_hca: str = Field(default="rocep1s0f0,rocep1s0f1", description="NCCL_IB_HCA: both RoCE twins")
    iface: str = Field(default="enp1s0f1np1", description="ConnectX-7 netdev checked by preflight")
    link_speed_mbps: int = Field(default=200000, ge=1)
    gid_index: int | None = Field(
        default=None, ge=0, description="pin NCCL_IB_GID_INDEX; unset = looked up from sysfs at rank start"
    )
    tuned_buffers: bool = Field(default=True, description="NCCL buffer knobs that cut 4.7 GiB to 0.14 GB")


class ShareConfig(_Strict):
    mode: Literal["nfs", "local"] = Field(
        default="nfs", description="nfs: head exports to workers; local: every node holds its own copy"
    )
    export_options: str = "ro,sync,no_subtree_check,no_root_squash,insecure"
    mount_options: str = "nfsvers=4.2,ro,nconnect=8,rsize=1048576,wsize=1048576,hard,timeo=600"


class SshConfig(_Strict):
    """Options for the docker provider, which shells out to the system `ssh` client."""

    identity_file: str | None = None
    known_hosts_file: str | None = None
    strict_host_key_checking: bool = True
    connect_timeout: int = Field(default=15, ge=1)


class ReadinessConfig(_Strict):
    timeout_seconds: int = Field(default=1800, ge=1, description="sized for a 12-13 minute boot")
    interval_seconds: int = Field(default=10, ge=1)
    prompt: str = "What is 19 + 23?"
    expect: str = "42"


class MemoryConfig(_Strict):
    unified_gib: float = Field(default=121.7, gt=0, description="unified memory per Spark")
    runtime_floor_gib: float = Field(default=3.0, ge=0, description="kept free outside the static pool")


class ImageBuildConfig(_Strict):
    """Build `image` on every node from a local context (the recipe's overlay on the base image,
    like the reference's `start.sh build`) instead of pulling it. The context is uploaded from
    where Pulumi runs to each node's engine; nothing is pushed to a registry."""

    context: str = Field(min_length=1, description="directory with the Dockerfile, relative to the project")
    dockerfile: str = "Dockerfile"
    args: dict[str, str] = Field(default_factory=dict)
    platform: str | None = Field(default="linux/arm64", description="DGX Spark is aarch64")


class ClusterConfig(_Strict):
    engine: Literal["sglang", "vllm"] = "sglang"
    topology: Literal["switch", "direct", "ring"] = "switch"
    nodes: list[NodeConfig] = Field(min_length=1)
    model: ModelConfig
    image: str = Field(min_length=1, description="engine image (default per engine)")
    image_timeout_minutes: int = Field(default=60, ge=1)
    image_build: ImageBuildConfig | None = Field(default=None, description="build `image` on each node")
    serving: ServingConfig
    engram: EngramConfig | None = Field(default=None, description="sglang only: packed engram shards on NVMe")
    fabric: FabricConfig = FabricConfig()
    share: ShareConfig = ShareConfig()
    ssh: SshConfig = SshConfig()
    readiness: ReadinessConfig = ReadinessConfig()
    memory: MemoryConfig = MemoryConfig()
    state_dir: str | None = Field(
        default=None, description="head dir for the API key file (default: /var/lib for root, else ~/.local/state)"
    )

    @field_validator("state_dir")
    @classmethod
    def _state_abs(cls, value: str | None) -> str | None:
        return None if value is None else _absolute(value)

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
        for section in ("serving", "model"):
            if isinstance(data.get(section), dict):
                data[section] = {**defaults.get(section, {}), **data[section]}
        return data


ENGINE_DEFAULTS: dict[str, dict[str, Any]] = {
    "sglang": {
        "image": "lmsysorg/sglang:dev-dsv41",
        "serving": {"port": 8888},
        "model": {"profile": "deepseek-v4.1-flash-mxfp4"},
    },
    "vllm": {
        "image": "vllm/vllm-openai:v0.31.0",
        "serving": {"port": 8000},
        "model": {"profile": "deepseek-v4.1-flash-nvfp4"},
    },
}


class ConfigError(Exception):
    """Bad stack configuration; the message names each field, its value and the fix."""


def _loc(loc: tuple[Any, ...]) -> str:
    out = "cluster"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def parse_cluster(raw: Any) -> ClusterConfig:
    """Validate the structured value of `deepseek-spark:cluster`; every problem in one message."""
    if raw is None:
        raise ConfigError(
            f"{PROJECT}:{CLUSTER_KEY} is not set: copy the `config:` block of Pulumi.tp4.yaml into your stack file"
        )
    try:
        return ClusterConfig.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = _loc(err["loc"])
            if err["type"] == "extra_forbidden":
                lines.append(f"{where}: unknown field; remove it or check its spelling (fields are camelCase)")
            elif err["type"] == "missing":
                lines.append(f"{where}: required field is missing; add it to the stack config")
            else:
                lines.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError("invalid stack config:\n  " + "\n  ".join(lines)) from None


@dataclass(frozen=True)
class Settings:
    """Everything the program reads from the stack: validated cluster config plus secrets."""

    stack: str
    cluster: ClusterConfig
    api_key: Any  # pulumi.Output[str], always secret
    ssh_private_key: Any  # pulumi.Output[str] (secret) or None: ssh-agent is used then
    hf_token: Any = None  # pulumi.Output[str] (secret) or None: for model.source: download


WEAK_KEYS = {"", "none", "off", "dummy", "0"}


def load() -> Settings:
    """Read and validate the stack config. Raises ConfigError before any resource is registered."""
    import pulumi  # imported here so config models stay usable without the Pulumi runtime

    stack = pulumi.get_stack()
    raw = pulumi.runtime.get_config(f"{PROJECT}:{CLUSTER_KEY}")
    cluster = parse_cluster(json.loads(raw) if raw is not None else None)

    set_key = f'pulumi config set --secret {PROJECT}:{API_KEY} "$(openssl rand -hex 32)" --stack {stack}'
    key = pulumi.runtime.get_config(f"{PROJECT}:{API_KEY}")
    if key is None:
        raise ConfigError(f"{PROJECT}:{API_KEY} is not set; the endpoint must require a key. Run:\n  {set_key}")
    if key.strip().lower() in WEAK_KEYS:
        raise ConfigError(
            f"{PROJECT}:{API_KEY} is {key.strip()!r}, which SGLang recipes treat as 'no authentication'. Run:\n  {set_key}"
        )
    if any(c.isspace() or ord(c) < 32 for c in key):
        raise ConfigError(f"{PROJECT}:{API_KEY} contains whitespace or control characters (a trailing newline?). Run:\n  {set_key}")
    if not pulumi.runtime.is_config_secret(f"{PROJECT}:{API_KEY}"):
        raise ConfigError(f"{PROJECT}:{API_KEY} is stored in plain text in the stack file. Run:\n  {set_key}")

    optional = {}
    for name, example in ((SSH_KEY, "< ~/.ssh/id_ed25519"), (HF_TOKEN, '"$HF_TOKEN"')):
        value = pulumi.runtime.get_config(f"{PROJECT}:{name}")
        if value is not None and not pulumi.runtime.is_config_secret(f"{PROJECT}:{name}"):
            raise ConfigError(
                f"{PROJECT}:{name} is stored in plain text. Run:\n"
                f"  pulumi config set --secret {PROJECT}:{name} --stack {stack} {example}"
            )
        optional[name] = pulumi.Output.secret(value) if value else None
    return Settings(
        stack=stack,
        cluster=cluster,
        api_key=pulumi.Output.secret(key),
        ssh_private_key=optional[SSH_KEY],
        hf_token=optional[HF_TOKEN],
    )
