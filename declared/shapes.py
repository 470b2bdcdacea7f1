"""Shapes of the values that reach a shell, an exports line, a URL, a server flag or an HTTP header.

Plain functions and patterns, no pydantic, no Pulumi: `cluster.py` builds the stack config's field
types from them and the policy pack (policy/guardrails.py) imports the same ones, so the program
and the pack cannot disagree on exports, paths or secrets. Each check raises ValueError (or
returns a problem) saying what is allowed, so a refusal names the value and the fix.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DNS_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
_HOSTNAME = re.compile(rf"^{_DNS_LABEL}(?:\.{_DNS_LABEL})*$")
_NETDEV = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}"  # Linux IFNAMSIZ: at most 15 characters
_IFNAME_LIST = re.compile(rf"^[=^]?{_NETDEV}(?:,{_NETDEV})*$")  # NCCL_SOCKET_IFNAME: list, ^ = exclude, = = exact
_HCA_LIST = re.compile(rf"^[=^]?{_NETDEV}(?::[0-9]{{1,2}})?(?:,{_NETDEV}(?::[0-9]{{1,2}})?)*$")  # NCCL_IB_HCA
_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")  # served model name, kv cache dtype, profile
_ENGINE_VERSION = re.compile(r"^\d{1,4}(\.\d{1,4}){1,3}(\.post\d{1,3})?$")
_IMAGE = re.compile(
    r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]{1,5})?/)?"  # registry[:port]/
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"  # repository path
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"  # :tag, @digest
)
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OPTION = re.compile(r"^[a-z0-9_]+(?:=[A-Za-z0-9_.:/@+-]+)?$")  # one NFS export/mount option
_HOST_KEY = re.compile(r"^(?:ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)) [A-Za-z0-9+/]+={0,3}$")
# Where a checkpoint, a state dir or engram shards must never go: writing ~400 GiB there, exporting
# it over NFS or mounting it into containers breaks the node.
SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root", "/run",
               "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/home", "/mnt", "/media", "/snap",
               "/usr/local", "/var/lib", "/var/log", "/var/run", "/var/tmp"}  # fmt: skip
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr")


def check_host(value: str) -> str:
    """A node's management address: an IPv4 address or a DNS name; no port, user, brackets or spaces."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        ip = None
    if ip is not None and ip.version == 6:
        raise ValueError("IPv6 addresses are not supported (ssh, docker and the endpoint URL need one form); "
                         "use the node's IPv4 address or a DNS name")  # fmt: skip
    if ip is None and (not _HOSTNAME.fullmatch(value) or value.replace(".", "").isdigit()):
        raise ValueError("not an IPv4 address or a DNS name (no port, user@, brackets or spaces: set nodes[].sshPort "
                         "and nodes[].sshUser for those), e.g. 10.0.0.1 or spark1.lan")  # fmt: skip
    return value


def check_source(value: str) -> str:
    """Who may reach a port: an IPv4 address or network in CIDR form (0.0.0.0/0: anywhere), written normalized."""
    try:
        net = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError("not an IPv4 address or network, e.g. 10.20.0.0/16, 192.0.2.7 or 0.0.0.0/0 (anywhere)") from None
    if net.version != 4:
        raise ValueError("IPv6 sources are not supported: the fence's sets are IPv4 (0.0.0.0/0 also opens IPv6)")
    return str(net)


def check_path(value: str) -> str:
    """An absolute, normalized node path without whitespace or control characters, outside system dirs."""
    if _CONTROL.search(value) or any(c.isspace() for c in value):
        raise ValueError("must not contain whitespace or control characters (it is exported over NFS, "
                         "mounted by docker and passed to shell commands)")  # fmt: skip
    if not posixpath.isabs(value):
        raise ValueError("must be an absolute path on the node")
    path = posixpath.normpath(value)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if path in SYSTEM_DIRS or any(path == t or path.startswith(t + "/") for t in SYSTEM_TREES):
        raise ValueError("is a system directory (or inside one): use a directory of its own, "
                         "e.g. /srv/models/DeepSeek-V4.1-Flash or /data/engram")  # fmt: skip
    return path


def check_options(value: list[str]) -> list[str]:
    """NFS export or mount options: one option per list item, `name` or `name=value`."""
    for opt in value:
        if not _OPTION.fullmatch(opt):
            raise ValueError(f"option {opt!r} is not `name` or `name=value` (letters, digits, _.:/@+-): "
                             "one option per list item, no commas, spaces, parentheses or newlines")  # fmt: skip
    return value


def check_printable(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters (newlines, tabs, NUL)")
    return value



def shape(pattern: re.Pattern[str], what: str):
    """A check that `value` matches `pattern` entirely; the error says it is not `what`."""

    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"not {what}")
        return value

    return check


def read_only_problem(options: list[str]) -> str | None:
    """Why these NFS export or mount options do not make a read-only share, or None."""
    if "ro" not in options:
        return "the checkpoint share must be read-only: 'ro' is missing (a worker must never write the checkpoint)"
    if "rw" in options:
        return "'rw' makes the checkpoint share writable"
    return None


# Values that SGLang recipes, proxies or habit treat as "no authentication".
WEAK_KEYS = {"", "none", "null", "nil", "empty", "off", "false", "no", "dummy", "test", "changeme", "password",
             "secret", "sk-", "sk-xxx", "token", "key", "apikey", "api-key", "0", "1"}  # fmt: skip
MIN_KEY_LENGTH = 16


def api_key_problem(key: str) -> str | None:
    """Why `key` cannot protect the endpoint, or None (the policy pack applies the same check)."""
    if key.strip().lower() in WEAK_KEYS:
        return f"is {key.strip()!r}, which SGLang recipes and proxies treat as 'no authentication'"
    if not key.isascii() or any(not c.isprintable() or c.isspace() for c in key):
        return ("must be printable ASCII without spaces (a trailing newline? a non-ASCII character cannot travel "
                "in an HTTP header, so every request would fail)")  # fmt: skip
    if key.startswith("-"):
        return "must not start with '-' (SGLang would read it as a flag: rank 0 fails to parse its arguments)"
    if len(key) < MIN_KEY_LENGTH:
        return f"is {len(key)} characters; use at least {MIN_KEY_LENGTH} (e.g. 64 hex characters)"
    return None
