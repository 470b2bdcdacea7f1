"""Fixtures for the simulator tests (tests/sim). Every test here is marked ``sim``.

Integration tests need a docker engine: with ``CI=true`` a missing engine FAILS them, otherwise
they are skipped with the reason. Cluster name/subnet: ``SIM_TEST_CLUSTER`` (default ``simtest``)
and ``SIM_TEST_SUBNET`` (default ``172.30.98.0/24``), so the demo cluster ``sim`` is left alone.
``SIM_TEST_KEEP=1`` keeps the cluster after the session (for debugging).
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_configure(config):
    config.addinivalue_line("markers", "sim: simulated DGX Spark cluster tests (tests/sim)")
    config.addinivalue_line("markers", "integration: needs a docker engine")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.sim)


@pytest.fixture(scope="session", autouse=True)
def _sigterm_runs_teardown():
    """pytest skips fixture teardown on SIGTERM; turn it into KeyboardInterrupt."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    old = signal.signal(signal.SIGTERM, handler)
    yield
    signal.signal(signal.SIGTERM, old)


@pytest.fixture(scope="session")
def docker_engine():
    from sim import backend
    ok, why = backend.engine_available()
    if not ok:
        msg = f"docker engine not available ({why}); run .ci/sim-setup"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return why


@pytest.fixture(scope="session")
def sim_cluster(docker_engine):
    from sim import cluster
    name = os.environ.get("SIM_TEST_CLUSTER", "simtest")
    subnet = os.environ.get("SIM_TEST_SUBNET", "172.30.98.0/24")
    keep = os.environ.get("SIM_TEST_KEEP") == "1"
    try:
        cluster.delete(name, log=lambda m: None)  # known starting state
        info = cluster.create(name, 3, subnet=subnet, log=print)
        yield info
    finally:
        if not keep:
            cluster.delete(name, log=print)
