"""programs/tunnel.py: an inner port reached through ssh, on a connection of its own."""

from __future__ import annotations

import io
import subprocess

import pytest

from programs import tunnel

SHARED = ["-o", "BatchMode=yes", "-o", "ControlMaster=auto", "-o", "ControlPath=/tmp/cm-%h", "-o", "ControlPersist=60"]


class Ended:
    """A stand-in for the ssh process: records its argv, has already exited (as a mux client does)."""

    argv: list[str] = []

    def __init__(self, argv, **_):
        Ended.argv = argv
        self.returncode = 0
        self.stderr = io.StringIO("")

    def poll(self):
        return 0

    def terminate(self):
        pass

    def wait(self, timeout=None):
        return 0


def first_value(argv: list[str], option: str) -> str:
    """What ssh uses for `option`: the first `-o option=value` it is given."""
    return next(a.split("=", 1)[1] for a in argv if a.startswith(option + "="))


def test_the_tunnel_never_rides_a_shared_master_whatever_the_stacks_ssh_options(monkeypatch):
    # A forward asked of a shared master lives in the master and the client exits at once (the demo's gateway
    # readiness saw "ended (0)"); ssh takes an option's first value, so ours must come before the stack's.
    monkeypatch.setattr(subprocess, "Popen", Ended)
    with pytest.raises(OSError, match=r"ssh tunnel to 10\.0\.0\.1:8000 through root@10\.0\.0\.1 ended \(0\)"):
        with tunnel.forward("root@10.0.0.1", 22, SHARED, "10.0.0.1", 8000):
            pass
    argv = Ended.argv
    assert first_value(argv, "ControlMaster") == "no" and first_value(argv, "ControlPath") == "none"
    assert first_value(argv, "ExitOnForwardFailure") == "yes" and "BatchMode=yes" in argv
    assert argv[argv.index("-L") + 1].endswith(":10.0.0.1:8000") and argv[-1] == "root@10.0.0.1"


def test_local_url_points_at_the_tunnels_end():
    assert tunnel.local_url("http://10.0.0.1:8000/v1", 4321) == "http://127.0.0.1:4321/v1"
