"""Host keys for remote commands, from the same known_hosts file the system ssh reads.

pulumi-command's ssh client reads no ~/.ssh files and, without `hostKey`, accepts any host key. The
docker provider (system ssh) checks `ssh.knownHostsFile`. So the program pins each node's key for
remote commands from that file: both paths then trust exactly the same keys. Hashed entries
(`HashKnownHosts yes`), `[host]:port` entries and comma lists are understood; `@revoked` and
`@cert-authority` lines are skipped. Pure: reads a local file, never a node.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

DEFAULT_FILE = "~/.ssh/known_hosts"
# The key pulumi-command will insist on (it restricts the handshake to the pinned key's type).
PREFERENCE = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")


def _names(host: str, port: int) -> list[str]:
    return [host] if port == 22 else [f"[{host}]:{port}"]


def _matches(pattern: str, names: list[str]) -> bool:
    if pattern.startswith("|1|"):  # hashed: |1|base64(salt)|base64(HMAC-SHA1(salt, name))
        try:
            _, _, salt, digest = pattern.split("|")
            salt_b, digest_b = base64.b64decode(salt), base64.b64decode(digest)
        except ValueError:
            return False
        return any(hmac.compare_digest(hmac.new(salt_b, n.encode(), hashlib.sha1).digest(), digest_b) for n in names)
    return any(n in pattern.split(",") for n in names)


def lookup(path: str | None, host: str, port: int = 22) -> str | None:
    """The node's host key as `<type> <base64>` (the preferred type when several), or None."""
    file = Path(path or DEFAULT_FILE).expanduser()
    try:
        lines = file.read_text().splitlines()
    except OSError:
        return None
    names = _names(host, port)
    found: dict[str, str] = {}
    for line in lines:
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith("#") or fields[0].startswith("@"):
            continue
        if _matches(fields[0], names) and fields[1] in PREFERENCE:
            found.setdefault(fields[1], f"{fields[1]} {fields[2]}")
    return next((found[t] for t in PREFERENCE if t in found), None)
