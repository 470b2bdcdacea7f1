"""Shared fixtures of the e2e tier: the simulated cluster, a replay per test module, timings."""

import os
import subprocess
import time
from pathlib import Path

import pytest

from e2e.replay import Replay
from e2e.timings import TIMINGS
from harness import ROOT, Secret, cluster_of, run_program

CLUSTER = "sim"  # Pulumi.sim.yaml and Pulumi.sim-tp2.yaml point at this cluster's ssh key and known_hosts


def engine_available() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def require_engine() -> None:
    if engine_available():
        return
    reason = "no docker engine: run `bash .ci/setup` (installs docker.io, starts dockerd, builds the sim images)"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def sim(request):
    """A fresh simulated cluster (SIM_NODES of the test module, default 3), deleted afterwards."""
    require_engine()
    from sim import cluster as sim_cluster

    t0 = time.monotonic()
    try:
        sim_cluster.delete(CLUSTER, log=lambda m: None)
        sim_cluster.create(CLUSTER, nodes=getattr(request.module, "SIM_NODES", 3))
        TIMINGS.setdefault("sim create (images cached)", time.monotonic() - t0)
        yield sim_cluster.ssh_info(CLUSTER)
    finally:
        sim_cluster.delete(CLUSTER, log=lambda m: None)


@pytest.fixture(scope="module")
def replay_for(tmp_path_factory):
    """replay_for(stack) -> a Replay with its own state file, naming nodes in its messages."""

    def make(stack: str) -> Replay:
        return Replay(
            state_file=tmp_path_factory.mktemp(f"replay-{stack}") / "state.json",
            node_names={n["host"]: n["name"] for n in cluster_of(stack)["nodes"]},
            cwd=ROOT,
        )

    return make


@pytest.fixture(scope="module")
def replay(replay_for, request):
    """The Replay of the test module's STACK."""
    return replay_for(request.module.STACK)


@pytest.fixture(scope="module")
def first(sim, replay, request):
    """The scenario's first `up` of the module's STACK and one answer, timed as `first up to first answer`."""
    return first_up(sim, replay, request.module.STACK, f"replay {request.module.STACK}: first up to first answer")


def program(sim, stack: str, **serving):
    """Register `stack` (with serving overrides) under mocks, with the sim cluster's ssh key."""
    raw = cluster_of(stack)
    raw["serving"].update(serving)
    return run_program(stack, cluster=raw, ssh_key=Path(sim.private_key).read_text())


def first_up(sim, replay: Replay, stack: str, label: str):
    """The scenario's first `up` and one answer through client_config; times it as `label`."""
    rec = program(sim, stack)
    t0 = time.monotonic()
    steps = replay.up(rec)
    answer = ask(rec)
    TIMINGS[label] = time.monotonic() - t0
    return rec, steps, answer


def node_sh(node: str, cmd: str) -> str:
    out = subprocess.run(["docker", "exec", f"{CLUSTER}-{node}", "sh", "-c", cmd], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def containers_of(stack: str, nodes=("spark1", "spark2", "spark3")) -> dict[str, str]:
    """This stack's containers on the nodes: name -> id."""
    out = {}
    for node in nodes:
        fmt = "'{{.Names}} {{.ID}}'"
        for line in node_sh(node, f"docker ps -a --filter label=deepseek-spark.stack={stack} --format {fmt}").splitlines():
            name, cid = line.split()
            out[name] = cid
    return out


def openai_client(rec, key=None):
    import openai

    cc = rec.outputs["client_config"]
    assert isinstance(cc, Secret), "client_config must be a secret output"
    cc = cc.value
    return openai.OpenAI(base_url=cc["base_url"], api_key=key or cc["api_key"], max_retries=0, timeout=30), cc["model"]


def ask(rec, key=None) -> str:
    client, model = openai_client(rec, key)
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}], max_tokens=32
    )
    return resp.choices[0].message.content


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:  # the simulated cluster ran: say what it did not exercise, and how long things took
        from sim import adaptations

        terminalreporter.section("e2e: simulated cluster")
        terminalreporter.write_line(adaptations.describe())
        terminalreporter.section("e2e timings (seconds)")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{name:45s} {seconds:8.1f}")
