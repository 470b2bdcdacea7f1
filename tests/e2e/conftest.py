"""Shared fixtures of the e2e tier: the simulated cluster and a timings report."""

import os
import subprocess

import pytest

from e2e.timings import TIMINGS


def engine_available() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def require_engine() -> None:
    if engine_available():
        return
    reason = "no docker engine: run `bash .ci/setup` (installs docker.io, starts dockerd, builds the sim images)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("e2e timings (seconds)")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{name:45s} {seconds:8.1f}")
