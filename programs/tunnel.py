"""An inner port of a node, reached through ssh from where Pulumi runs (or an operator's machine): the fence lets
only the stack's own parts reach the engine behind a router or gateway, Prometheus, a guard (planning/exposure.py),
and an operator comes in through ssh like everything else of theirs. Standard library only.

    with forward("root@10.0.0.1", 22, ssh_opts, "10.0.0.1", 8888) as port:
        urlopen(f"http://127.0.0.1:{port}/health")
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.parse
from typing import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def forward(target: str, ssh_port: int, ssh_opts: list[str], host: str, port: int,
            wait: float = 20.0) -> Iterator[int]:  # fmt: skip
    """`ssh -N -L 127.0.0.1:<local>:<host>:<port> target` (a connection of its own, no shared master), for the
    length of the block; yields the local port once it accepts connections. OSError when the tunnel cannot open."""
    local = free_port()
    # first: ssh takes the first value it is given for an option, and ssh_opts may name a shared master
    opts = ["-o", "ControlMaster=no", "-o", "ControlPath=none", "-o", "ExitOnForwardFailure=yes", *ssh_opts]
    argv = ["ssh", *opts, "-N", "-L", f"127.0.0.1:{local}:{host}:{port}", "-p", str(ssh_port), target]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + wait
        while True:
            if proc.poll() is not None:
                raise OSError(f"ssh tunnel to {host}:{port} through {target} ended ({proc.returncode}): "
                              f"{(proc.stderr.read() or '').strip()[-300:]}")  # fmt: skip
            try:
                socket.create_connection(("127.0.0.1", local), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise OSError(f"ssh tunnel to {host}:{port} through {target} did not open in {wait:.0f}s") from None
                time.sleep(0.1)
        yield local
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


def local_url(url: str, port: int) -> str:
    """`url` with its host and port replaced by the tunnel's local end."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))
