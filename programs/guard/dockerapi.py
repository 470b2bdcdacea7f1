"""The node's docker engine, through its unix socket (stdlib only): what the guard reads and does to the
containers Pulumi created. Nothing here creates, removes or changes a container's configuration."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional
from urllib.parse import quote

SOCKET = "/var/run/docker.sock"


class DockerError(RuntimeError):
    pass


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def epoch(stamp: Optional[str]) -> Optional[float]:
    """Docker's RFC 3339 timestamps (nanoseconds, `Z`) as seconds; None for docker's zero time."""
    if not stamp or stamp.startswith("0001-"):
        return None
    head, _, frac = stamp.rstrip("Z").partition(".")
    try:
        base = datetime.fromisoformat(head + "+00:00").timestamp()
    except ValueError:
        return None
    digits = "".join(c for c in frac if c.isdigit())[:6]
    return base + (int(digits) / 10 ** len(digits) if digits else 0.0)


def demux(data: bytes) -> bytes:
    """A container log without a TTY comes as frames: 1 byte stream, 3 zero bytes, a 4-byte big-endian length."""
    out, i = bytearray(), 0
    while i + 8 <= len(data) and data[i] in (0, 1, 2) and data[i + 1:i + 4] == b"\0\0\0":
        size = int.from_bytes(data[i + 4:i + 8], "big")
        out += data[i + 8:i + 8 + size]
        i += 8 + size
    return bytes(out) if i else data  # a TTY container's log is the raw bytes


@dataclass(frozen=True)
class Container:
    """What the guard needs of `docker inspect`."""

    id: str
    name: str
    status: str  # created, running, paused, restarting, removing, exited, dead
    exit_code: int
    oom_killed: bool
    error: str
    started_at: Optional[float]
    finished_at: Optional[float]
    labels: dict[str, str]

    @classmethod
    def from_inspect(cls, doc: dict[str, Any]) -> "Container":
        st = doc.get("State") or {}
        return cls(
            id=doc.get("Id", ""),
            name=(doc.get("Name") or "").lstrip("/"),
            status=st.get("Status", "unknown"),
            exit_code=int(st.get("ExitCode") or 0),
            oom_killed=bool(st.get("OOMKilled")),
            error=st.get("Error") or "",
            started_at=epoch(st.get("StartedAt")),
            finished_at=epoch(st.get("FinishedAt")),
            labels=dict((doc.get("Config") or {}).get("Labels") or {}),
        )


class Docker:
    def __init__(self, socket_path: str = SOCKET, timeout: float = 30.0):
        self.socket_path, self.timeout = socket_path, timeout

    def _call(self, method: str, path: str, timeout: Optional[float] = None) -> tuple[int, bytes]:
        conn = _UnixConnection(self.socket_path, timeout or self.timeout)
        try:
            conn.request(method, path, headers={"Host": "docker"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        except OSError as exc:
            raise DockerError(f"docker engine at {self.socket_path}: {exc}") from None
        finally:
            conn.close()

    @staticmethod
    def _message(data: bytes) -> str:
        try:
            return json.loads(data).get("message", "") or data.decode(errors="replace")
        except ValueError:
            return data.decode(errors="replace").strip()

    def inspect(self, ref: str) -> Optional[Container]:
        """The container named or identified `ref`; None when the engine has no such container."""
        status, data = self._call("GET", f"/containers/{quote(ref, safe='')}/json")
        if status == 404:
            return None
        if status != 200:
            raise DockerError(f"inspect {ref}: HTTP {status}: {self._message(data)}")
        return Container.from_inspect(json.loads(data))

    def start(self, ref: str) -> None:
        """Start a created or stopped container (304: it runs already)."""
        status, data = self._call("POST", f"/containers/{quote(ref, safe='')}/start", timeout=120)
        if status not in (204, 304):
            raise DockerError(f"start {ref}: HTTP {status}: {self._message(data)}")

    def tail(self, ref: str, lines: int = 20) -> list[str]:
        """The last lines of a container's log (stdout and stderr, docker's stream frames taken apart)."""
        status, data = self._call("GET", f"/containers/{quote(ref, safe='')}/logs?stdout=1&stderr=1&tail={int(lines)}")
        if status != 200:
            raise DockerError(f"logs {ref}: HTTP {status}: {self._message(data)}")
        return demux(data).decode(errors="replace").splitlines()

    def stop(self, ref: str, grace: int) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (304: it is stopped already)."""
        status, data = self._call("POST", f"/containers/{quote(ref, safe='')}/stop?t={int(grace)}", timeout=grace + 60)
        if status not in (204, 304):
            raise DockerError(f"stop {ref}: HTTP {status}: {self._message(data)}")
