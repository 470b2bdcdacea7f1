"""The team gateway's plan (pure): LiteLLM's proxy and its PostgreSQL on one node, in front of the stack's
endpoint (the router's, or the one group's). Members' keys live in the gateway's database, not in any
rank or router: the engines and the router keep the stack's one internal key (`apiKey`), which only the
gateway sends upstream.

On the node, under `<stateDir>/<stack>-gateway/`:
- `etc/`: LiteLLM's config.yaml, the hooks (programs/gateway/*.py) and the two start scripts, mounted
  read-only at /etc/dspark-gateway in both containers;
- `secrets.env` (0600): the admin (master) key, the metrics key, the internal key and the database
  password, mounted read-only at /run/dspark-gateway/secrets.env; nothing secret is in a container's
  environment, argv or labels;
- the database lives on the docker volume `<stack>-gateway-db` (kept on destroy unless keepData: false).

Why LiteLLM: it is the gateway the Spark owners' launcher (sparkrun) ships and the one vLLM points to for
per-user keys; its proxy speaks the OpenAI API, enforces a key's model list and rpm/tpm limits, and exports
Prometheus metrics per key. Its own virtual keys need Prisma, which cannot fetch its engine here (field
notes), so keys are checked by its custom-auth hook against our table instead (programs/gateway).
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from declared.stack import GatewayConfig, MemberConfig
from .commands import secret_file_create, secret_file_delete
from .nodeplan import NodePlan

q = shlex.quote

PROGRAMS = Path(__file__).parent.parent / "programs" / "gateway"
FILES = ("dspark_gateway.py", "gateway_hooks.py", "gateway_admin.py", "start-gateway", "start-db")
ETC = "/etc/dspark-gateway"  # in both containers
SECRETS = "/run/dspark-gateway/secrets.env"
DB_DATA = "/var/lib/postgresql/data"
ADMIN = f"python3 {ETC}/gateway_admin.py"
HEALTH_PATH = "/health/readiness"  # LiteLLM's unauthenticated readiness route (its /health needs a key)
# Where Pulumi runs: a new random key (sk- + 43 url-safe characters), printed once into the state as a secret.
KEY_GENERATE = "python3 -c 'import secrets; print(\"sk-\" + secrets.token_urlsafe(32))'"
PASSWORD_GENERATE = "python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"


@dataclass(frozen=True)
class MemberKeyPlan:
    """One member: their key's record in the gateway's database (added, updated in place, revoked)."""

    name: str
    add: str  # the key on stdin; prints the key's sha256
    revoke: str
    rotation: int


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    command: tuple[str, ...]
    mounts: tuple[tuple[str, str, str, bool], ...]  # (target, source, type, read-only)
    memory_mib: int  # the container's limit (memory = memory_swap: no swap)


@dataclass(frozen=True)
class GatewayPlan:
    stack: str
    node: NodePlan  # where both containers run (its docker provider and ssh connection)
    image: str
    url: str  # http://host:port: what clients reach
    upstream: str  # the stack's internal endpoint (router or group), ends in /v1
    model: str
    directory: str  # on the node
    files: dict[str, str]  # name -> content, written to `<directory>/etc`
    files_write: str
    files_delete: str
    secrets_path: str
    secrets_create: str
    secrets_delete: str
    volume: str
    keep_data: bool
    database_port: int
    database: ContainerPlan
    gateway: ContainerPlan
    members: tuple[MemberKeyPlan, ...]
    readiness: str  # probe command through the gateway (the admin key in its environment)
    readiness_timeout_minutes: int
    metrics: str  # host:port

    @property
    def endpoint(self) -> str:
        return self.url + "/v1"

    @property
    def files_digest(self) -> str:
        """What the containers were started with: a change restarts them (their label holds it)."""
        return files_digest(self.files)


def litellm_config(gw: GatewayConfig, model: str, upstream: str) -> dict:
    """LiteLLM's config.yaml: the one served model, routed upstream with the internal key; every key
    checked by our hook; model lists and limits enforced by LiteLLM; usage to Prometheus and our table."""
    return {
        "model_list": [{
            "model_name": model,
            "litellm_params": {
                "model": f"openai/{model}",
                "api_base": upstream,
                "api_key": "os.environ/DSPARK_UPSTREAM_KEY",
                "timeout": gw.request_timeout_seconds,
            },
        }],
        "general_settings": {
            "master_key": "os.environ/LITELLM_MASTER_KEY",
            "custom_auth": "dspark_gateway.user_api_key_auth",
            # the key's model list (MemberConfig.models) is enforced by LiteLLM's own checks
            "custom_auth_run_common_checks": True,
        },
        "litellm_settings": {
            "callbacks": ["prometheus", "dspark_gateway.usage_logger"],
            "enable_post_custom_auth_checks": True,
            "drop_params": False,
        },
    }  # fmt: skip


def files_digest(files: dict[str, str]) -> str:
    """A short digest of files by name and content: a container labelled with it is restarted when one changes."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}\0{files[name]}\0".encode())
    return h.hexdigest()[:16]


def files_write(directory: str, files: dict[str, str], sudo: str = "") -> str:
    """Write each file under `directory` verbatim (a quoted heredoc: nothing in it is expanded), each one
    to a temporary name first and then moved into place."""
    lines = ["set -eu", f"{sudo}mkdir -p {q(directory)}"]
    for name in sorted(files):
        content = files[name] if files[name].endswith("\n") else files[name] + "\n"
        mark = "DSPARK_" + hashlib.sha256(content.encode()).hexdigest()[:20].upper()
        path = f"{directory}/{name}"
        mode = "755" if name.startswith("start-") else "644"
        lines += [
            f"{sudo}sh -c 'cat > \"$1\"' sh {q(path + '.tmp')} <<'{mark}'",
            content.rstrip("\n"),
            mark,
            f"{sudo}chmod {mode} {q(path + '.tmp')}",
            f"{sudo}mv -f {q(path + '.tmp')} {q(path)}",
        ]
    return "\n".join(lines) + "\n"


def member_add(container: str, m: MemberConfig) -> str:
    """Remote command (create and update): register the key on stdin for member `m`, print its sha256."""
    args = [f"--member {q(m.name)}"]
    if m.models:
        args.append(f"--models {q(','.join(m.models))}")
    if m.rpm_limit is not None:
        args.append(f"--rpm {m.rpm_limit}")
    if m.tpm_limit is not None:
        args.append(f"--tpm {m.tpm_limit}")
    if m.token_budget is not None:
        args.append(f"--token-budget {m.token_budget} --budget-period {q(m.budget_period)}")
    return f"docker exec -i {q(container)} {ADMIN} add {' '.join(args)}\n"


def member_revoke(container: str, member: str) -> str:
    """Remote command (delete): revoke every key of `member`; the usage rows stay. By name, not by the key's
    hash the add step printed: pulumi-command hands that to delete as PULUMI_COMMAND_STDOUT through ssh's
    Setenv, which sshd drops unless its AcceptEnv names it (DGX OS accepts LANG and LC_* only)."""
    return f"docker exec {q(container)} {ADMIN} revoke --member {q(member)}\n"


def admin_query(container: str, what: str) -> str:
    """Remote command (dspark status): gateway_admin.py's `keys` or `usage` JSON, one try at the database."""
    assert what in ("keys", "usage"), what
    return f"docker exec {q(container)} {ADMIN} --wait 0 {what}"


def secrets_env(admin_key: str, metrics_key: str, upstream_key: str, db_password: str, db_port: int) -> str:
    """The secrets file's text (computed inside an apply: it is a secret)."""
    values = {"LITELLM_MASTER_KEY": admin_key, "DSPARK_METRICS_KEY": metrics_key,
              "DSPARK_UPSTREAM_KEY": upstream_key, "DSPARK_DB_PASSWORD": db_password, "DSPARK_DB_PORT": str(db_port)}
    return "".join(f"{k}={q(v)}\n" for k, v in values.items())


def build(
    gw: GatewayConfig, stack: str, node: NodePlan, state_dir: str, sudo: str, model: str, upstream: str,
    readiness: str, readiness_timeout_minutes: int,
) -> GatewayPlan:
    """The gateway on `node`, files under `state_dir`, in front of `upstream`."""
    host = node.host
    name = container_name(stack)
    directory = f"{state_dir}/{name}"
    etc = f"{directory}/etc"
    secrets_path = f"{directory}/secrets.env"
    files = {f: (PROGRAMS / f).read_text() for f in FILES}
    files["config.yaml"] = "# written by deepseek-spark (planning/gateway.py); changes are overwritten\n" + yaml.safe_dump(
        litellm_config(gw, model, upstream), sort_keys=False
    )
    shared = ((ETC, etc, "bind", True), (SECRETS, secrets_path, "bind", True))
    url = f"http://{gw.address or host}:{gw.port}"
    return GatewayPlan(
        stack=stack,
        node=node,
        image=gw.image,
        url=url,
        upstream=upstream,
        model=model,
        directory=directory,
        files=files,
        files_write=files_write(etc, files, sudo),
        files_delete=f"{sudo}rm -rf {q(etc)}\n",
        secrets_path=secrets_path,
        secrets_create=secret_file_create(secrets_path, sudo),
        secrets_delete=secret_file_delete(secrets_path, sudo),
        volume=f"{name}-db",
        keep_data=gw.keep_data,
        database_port=gw.database_port,
        database=ContainerPlan(database_name(stack), ("sh", f"{ETC}/start-db", str(gw.database_port)),
                               ((DB_DATA, f"{name}-db", "volume", False), *shared), gw.database_memory_mib),
        # LiteLLM on its node's management address, where the clients reach it (planning/exposure.py)
        gateway=ContainerPlan(name, ("sh", f"{ETC}/start-gateway", node.host, str(gw.port)), shared, gw.memory_mib),
        members=tuple(MemberKeyPlan(m.name, member_add(name, m), member_revoke(name, m.name), m.rotation) for m in gw.members),
        readiness=readiness,
        readiness_timeout_minutes=readiness_timeout_minutes,
        metrics=f"{gw.address or host}:{gw.port}",
    )


def container_name(stack: str) -> str:
    """LiteLLM's container (also the name of the gateway's directory on the node)."""
    return f"{stack}-gateway"


def database_name(stack: str) -> str:
    return f"{stack}-gateway-db"


def default_node(gw: GatewayConfig, router_node: Optional[str], head: str) -> str:
    """Where the gateway runs: `gateway.node`, else beside the router (on a node), else on the head."""
    return gw.node or (router_node if router_node and router_node != "local" else head)
