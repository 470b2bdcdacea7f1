"""Reading the stack config from Pulumi: `load()` (the only reader of `pulumi.Config`) validates
`deepseek-spark:cluster` (`stack.parse_stack`) and the secrets beside it (`SECRETS`: each key with the
`pulumi config set` command its messages and the configuration reference print), pins the nodes' host
keys and checks what the program needs where Pulumi runs (the docker engine of `router.node: local`,
the ssh agent, ssh's ControlPath directory).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cluster import CLUSTER_KEY, PLAIN_STRING, PROJECT, ClusterConfig, ConfigError
from .shapes import api_key_problem
from .stack import LOCAL, GatewayConfig, StackConfig, parse_stack

API_KEY = "apiKey"
SSH_KEY = "sshPrivateKey"
HF_TOKEN = "hfToken"
MEMBER_KEYS = "memberKeys"  # optional secret map member -> key (else each member's key is generated)
ALERT_WEBHOOK = "alertWebhook"  # optional secret: where Alertmanager sends alerts (monitoring.server)
FRONTDOOR_KEY = "frontDoorKey"  # the private key of the owner's certificate (frontDoor.certificate.source: own)


@dataclass(frozen=True)
class Secret:
    """A key of its own beside `deepseek-spark:cluster`, always stored as a Pulumi secret."""

    key: str
    needed: str  # "required" or "optional"
    about: str  # what it holds, for the configuration reference
    args: str  # what follows `pulumi config set --secret`: <stack> (and <member>) stand for the values

    def command(self, stack: str = "<stack>") -> str:
        """The command that sets it, for `stack` (the reference prints it for `<stack>`)."""
        return f"pulumi config set --secret {self.args}".replace("<stack>", stack)


SECRETS = (
    Secret(API_KEY, "required", "the key every request to the endpoint (the groups, the router) must carry",
           f'{PROJECT}:{API_KEY} "$(openssl rand -hex 32)" --stack <stack>'),
    Secret(SSH_KEY, "optional", "the nodes' ssh private key (default: ssh-agent)",
           f"{PROJECT}:{SSH_KEY} --stack <stack> < ~/.ssh/id_ed25519"),
    Secret(HF_TOKEN, "optional", "the Hugging Face token for `model.source: download`",
           f'{PROJECT}:{HF_TOKEN} --stack <stack> "$HF_TOKEN"'),
    Secret(MEMBER_KEYS, "optional", "member -> key for `gateway.members` (default: generated), `sk-` and 32 to 200 "
           "of `[A-Za-z0-9_-]`",
           f"--path '{PROJECT}:{MEMBER_KEYS}.<member>' \"sk-$(openssl rand -hex 32)\" --stack <stack>"),
    Secret(ALERT_WEBHOOK, "optional", "where Alertmanager sends alerts (`monitoring.server`)",
           f'{PROJECT}:{ALERT_WEBHOOK} --stack <stack> "https://hooks.slack.com/services/..."'),
    Secret(FRONTDOOR_KEY, "optional", "the private key (PEM) of the front door's certificate when it is the owner's "
           "(`frontDoor.certificate.source: own`)", f"{PROJECT}:{FRONTDOOR_KEY} --stack <stack> < server.key"),
)  # fmt: skip
SECRET = {s.key: s for s in SECRETS}

# router.node: local runs on the docker engine where Pulumi runs, here (pulumi-docker pings it when it
# configures, preview too)
LOCAL_DOCKER_SOCKET = "/var/run/docker.sock"


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
    front_door_key: Any = None  # pulumi.Output[str] (secret) from `frontDoorKey`, or None


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


SOCKET_PATH_MAX = 107  # sun_path's 108 bytes, the last a NUL
MASTER_SUFFIX = 17  # ssh binds its master at "<ControlPath>.<16 random characters>" first, then renames it


def control_path_problem(sc: StackConfig, home: str) -> str | None:
    """The longest socket ssh.connectionReuse makes where Pulumi runs (`home`: its $HOME) must fit a Unix socket's
    path, else ssh refuses every connection ("too long for Unix domain socket") and so does every docker call."""
    for entry in sc.groups:
        ssh = entry.cfg.ssh
        if not ssh.connection_reuse:
            continue
        hosts = [n.host for n in entry.cfg.nodes]
        tokens = {"%C": 40, "%h": max(map(len, hosts)), "%n": max(map(len, hosts)), "%p": 5, "%%": 1,
                  "%r": max(len(n.ssh_user) for n in entry.cfg.nodes), "%u": 32, "%l": 64, "%L": 64}  # fmt: skip
        path = ssh.control_path.replace("~", home, 1) if ssh.control_path.startswith("~") else ssh.control_path
        length = len(re.sub(r"%.", "", path)) + sum(n * path.count(t) for t, n in tokens.items())
        if length + MASTER_SUFFIX > SOCKET_PATH_MAX:
            return (f"cluster.ssh.controlPath = {ssh.control_path!r} makes sockets of up to {length} characters here "
                    f"(with HOME={home}), and ssh needs at most {SOCKET_PATH_MAX - MASTER_SUFFIX} for it: every ssh, "
                    "so every docker call, would fail with 'too long for Unix domain socket'; fix: a shorter "
                    "ssh.controlPath, e.g. ~/.ssh/dspark-%h-%p-%r")  # fmt: skip
    return None


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
    problem = control_path_problem(stack_config, os.path.expanduser("~"))
    if problem:
        raise ConfigError(problem)

    set_key = SECRET[API_KEY].command(stack)
    key = pulumi.runtime.get_config(f"{PROJECT}:{API_KEY}")
    if key is None:
        raise ConfigError(f"{PROJECT}:{API_KEY} is not set; the endpoint must require a key. Run:\n  {set_key}")
    problem = api_key_problem(key)
    if problem:
        raise ConfigError(f"{PROJECT}:{API_KEY} {problem}. Run:\n  {set_key}")
    if not pulumi.runtime.is_config_secret(f"{PROJECT}:{API_KEY}"):
        raise ConfigError(f"{PROJECT}:{API_KEY} is stored in plain text in the stack file. Run:\n  {set_key}")

    optional = {}
    for name in (SSH_KEY, HF_TOKEN, ALERT_WEBHOOK, FRONTDOOR_KEY):
        value = pulumi.runtime.get_config(f"{PROJECT}:{name}")
        if value is not None and not pulumi.runtime.is_config_secret(f"{PROJECT}:{name}"):
            raise ConfigError(f"{PROJECT}:{name} is stored in plain text. Run:\n  {SECRET[name].command(stack)}")
        optional[name] = pulumi.Output.secret(value) if value else None
    problem = agent_socket_problem(dict(os.environ))
    if problem:
        raise ConfigError(problem)
    fd = stack_config.front_door
    if fd.enabled and fd.certificate.source == "own" and optional[FRONTDOOR_KEY] is None:
        raise ConfigError(f"cluster.frontDoor.certificate.source is own but {PROJECT}:{FRONTDOOR_KEY} (its private "
                          f"key) is not set. Run:\n  {SECRET[FRONTDOOR_KEY].command(stack)}")  # fmt: skip
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
        front_door_key=optional[FRONTDOOR_KEY],
    )


MEMBER_KEY = re.compile(r"^sk-[A-Za-z0-9_-]{32,200}$")


def parse_member_keys(raw: str, secret: bool, gateway: GatewayConfig | None, stack: str) -> dict[str, str]:
    """`memberKeys`: keys chosen by the team instead of generated ones (a secret map member -> key). Every
    problem names the member and the fix; a key's value is never part of a message."""
    set_one = SECRET[MEMBER_KEYS].command(stack)
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
