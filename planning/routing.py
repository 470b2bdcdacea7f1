"""The router in front of several serving groups, as data and command strings (pure, no Pulumi).

- The router is `sglang-router` (the SGLang project's router, PyPI; the SGLang image ships it), run
  like the reference's scripts/router.sh: host network, `--policy round_robin`, a Prometheus port,
  `--request-timeout-secs 1800`. It starts with every group's rank-0 URL as a worker, so a restarted
  router (restart: unless-stopped) serves every group again on its own; `--api-key` makes it refuse
  requests without the stack's key, and it passes the same key on to the groups, which keep
  requiring it. The same router serves vLLM groups: it proxies OpenAI-compatible workers and only
  needs their /health (what vLLM's production stack router or LiteLLM would add, a second key
  store and a second config language, buys nothing here).
- A group's membership is a local command (where Pulumi runs, like readiness): `add` puts the
  group's rank 0 back into rotation once it answered, `remove` takes it out and waits for the
  requests it is still serving to finish (the engine's own /metrics gauges) before its ranks stop.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from . import commands, launch
from declared.stack import RouterConfig

q = shlex.quote

ROUTER_VERSION = "0.3.2"  # the version the reference measured round_robin against cache_aware with
MAX_PAYLOAD = 536870912  # router.sh: long contexts fit in one request


@dataclass(frozen=True)
class RouterSpec:
    container_name: str
    image: str
    entrypoint: list[str]
    args: list[str]
    key_file: str  # on the router's node, mounted read-only at launch.API_KEY_MOUNT
    labels: dict[str, str]
    memory_mib: int  # the container's limit (memory = memory_swap: no swap), counted in its node's budget
    network_mode: str = "host"
    # Stateless and started with every group as a worker: let docker bring it back after a crash or reboot.
    restart: str = "unless-stopped"


def worker_url(host: str, port: int) -> str:
    """A group's rank-0 URL as the router (and where Pulumi runs) reach it."""
    return f"http://{host}:{port}"


def router_args(r: RouterConfig, workers: list[str], host: str) -> list[str]:
    """`host`: the address the router's API and metrics listen on (its node's management address; where Pulumi
    runs, 127.0.0.1 or router.address: planning/exposure.py)."""
    return [
        "--host", host,
        "--port", str(r.port),
        "--policy", r.policy,
        "--prometheus-host", host,
        "--prometheus-port", str(r.metrics_port),
        "--request-timeout-secs", str(r.request_timeout_seconds),
        "--max-payload-size", str(MAX_PAYLOAD),
        "--worker-urls", *workers,
    ]  # fmt: skip


def launch_script(key_file: str = launch.API_KEY_MOUNT) -> str:
    """The router's entrypoint: its flags as "$@", the key read from the mounted 0600 file (never an
    argument of the container, a label or `docker inspect`)."""
    return f'set -eu\nexec python3 -m sglang_router.launch_router "$@" --api-key "$(cat {q(key_file)})"\n'


def container_name(stack: str) -> str:
    return f"{stack}-router"


def router_spec(r: RouterConfig, stack: str, image: str, key_file: str, workers: list[str], host: str) -> RouterSpec:
    return RouterSpec(
        container_name=container_name(stack),
        image=image,
        entrypoint=["/bin/sh", "-c", launch_script(), "sglang-router"],
        args=router_args(r, workers, host),
        key_file=key_file,
        labels={"deepseek-spark.stack": stack, "deepseek-spark.role": "router"},
        memory_mib=r.memory_mib,
    )


def member_add(router: str, worker: str, timeout: int) -> str:
    """Local command: put `worker` into the router's rotation and wait until the router calls it healthy."""
    return " ".join([
        "python3 -m programs.membership add",
        f"--router {q(router)}", f"--worker {q(worker)}", f"--key-env {commands.READINESS_KEY_ENV}", f"--timeout {int(timeout)}",
    ])  # fmt: skip


def member_remove(router: str, worker: str, engine: str, drain_timeout: int) -> str:
    """Local command: take `worker` out of rotation, then wait (at most `drain_timeout` s) until the
    requests it still serves have finished."""
    return " ".join([
        "python3 -m programs.membership remove",
        f"--router {q(router)}", f"--worker {q(worker)}", f"--key-env {commands.READINESS_KEY_ENV}",
        f"--engine {q(engine)}", f"--drain-timeout {int(drain_timeout)}",
    ])  # fmt: skip
