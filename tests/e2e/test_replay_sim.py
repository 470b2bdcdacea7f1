"""The program's real resources replayed against the simulated cluster, then a real OpenAI client.

One scenario, in order (each test builds on the previous one's cluster state):
first replay -> chat through client_config -> no-op replay -> serving change replaces every rank ->
worker lost mid-replay, brought back, converges -> destroy in reverse order.
"""

import time
from pathlib import Path

import openai
import pytest

from e2e.conftest import require_engine
from e2e.timings import TIMINGS
from e2e.replay import CONTAINER, Replay, ReplayError
from harness import ROOT, Secret, cluster_of, run_program
from sim import adaptations as sim_adaptations
from sim import cluster as sim_cluster

pytestmark = pytest.mark.e2e
CLUSTER = "sim"  # Pulumi.sim.yaml points at this cluster's ssh key and known_hosts


def node_sh(node: str, cmd: str) -> str:
    import subprocess

    out = subprocess.run(["docker", "exec", f"{CLUSTER}-{node}", "sh", "-c", cmd], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def shard_mtimes() -> dict[str, str]:
    out = {}
    for node in ("spark1", "spark2", "spark3"):
        for line in node_sh(node, "stat -c '%n %Y.%y' /srv/engram/engram-*.bin").splitlines():
            name, mtime = line.split(" ", 1)
            out[f"{node}:{name}"] = mtime
    return out


def rank_containers() -> dict[str, str]:
    """rank container name -> container id, over all nodes."""
    out = {}
    for node in ("spark1", "spark2", "spark3"):
        for line in node_sh(node, "docker ps -a --filter label=deepseek-spark.stack=sim --format '{{.Names}} {{.ID}}'").splitlines():
            name, cid = line.split()
            out[name] = cid
    return out


@pytest.fixture(scope="module")
def sim():
    require_engine()
    t0 = time.monotonic()
    try:
        sim_cluster.delete(CLUSTER, log=lambda m: None)
        sim_cluster.create(CLUSTER, nodes=3)
        TIMINGS["sim create (images cached)"] = time.monotonic() - t0
        yield sim_cluster.ssh_info(CLUSTER)
    finally:
        sim_cluster.delete(CLUSTER, log=lambda m: None)


@pytest.fixture(scope="module")
def replay(sim, tmp_path_factory):
    print(sim_adaptations.describe())
    return Replay(
        state_file=tmp_path_factory.mktemp("replay") / "state.json",
        node_names={n["host"]: n["name"] for n in cluster_of("sim")["nodes"]},
        cwd=ROOT,
    )


def program(sim, **serving):
    raw = cluster_of("sim")
    raw["serving"].update(serving)
    key = Path(sim.private_key).expanduser().read_text()
    return run_program("sim", cluster=raw, ssh_key=key)


def client_from_outputs(rec, key=None):
    cc = rec.outputs["client_config"]
    assert isinstance(cc, Secret)
    cc = cc.value
    return openai.OpenAI(base_url=cc["base_url"], api_key=key or cc["api_key"], max_retries=0, timeout=30), cc["model"]


def ask(rec):
    client, model = client_from_outputs(rec)
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}], max_tokens=32
    )
    return resp.choices[0].message.content


@pytest.fixture(scope="module")
def first(sim, replay):
    rec = program(sim)
    t0 = time.monotonic()
    steps = replay.up(rec)
    answer = ask(rec)
    TIMINGS["replay: first up to first answer"] = time.monotonic() - t0
    return rec, steps, answer


def test_stack_file_points_at_the_sim_key(sim):
    ssh = cluster_of("sim")["ssh"]
    assert Path(ssh["identityFile"]).expanduser() == Path(sim.private_key).expanduser()
    assert Path(ssh["knownHostsFile"]).expanduser() == Path(sim.known_hosts)


def test_first_replay_creates_everything_and_answers(first):
    rec, steps, answer = first
    assert {s.op for s in steps} == {"create"}
    assert len(steps) == len([r for r in rec.resources if r.custom])
    assert "42" in answer
    assert sorted(rank_containers()) == ["sim-rank0", "sim-rank1", "sim-rank2"]
    assert len(shard_mtimes()) == 6  # 2 layers x 3 ranks, each on its own node


def test_streaming_and_auth_through_client_config(first):
    rec = first[0]
    client, model = client_from_outputs(rec)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}], max_tokens=32, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert "42" in text
    assert [m.id for m in client.models.list()] == [model]
    bad, _ = client_from_outputs(rec, key="sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8)


def test_second_replay_changes_nothing(sim, replay, first):
    before_shards, before_ranks = shard_mtimes(), rank_containers()
    t0 = time.monotonic()
    steps = replay.up(program(sim))
    TIMINGS["replay: no-op up"] = time.monotonic() - t0
    assert [s.name for s in steps if s.op != "same"] == []
    assert shard_mtimes() == before_shards
    assert rank_containers() == before_ranks


def test_serving_change_replaces_every_rank_workers_first(sim, replay, first):
    before_shards, before_ranks = shard_mtimes(), rank_containers()
    rec = program(sim, maxRunningRequests=2)
    t0 = time.monotonic()
    steps = replay.up(rec)
    changed = {s.name: s.op for s in steps if s.op != "same"}
    assert changed == {
        "sim-sglang-rank0": "replace", "sim-sglang-rank1": "replace", "sim-sglang-rank2": "replace",
        "sim-readiness-check": "replace",
    }  # fmt: skip
    deletes = [s.name for s in steps if s.op == "delete"]
    assert deletes[0] == "sim-sglang-rank0", "the head goes first"
    creates = [s.name for s in steps if s.op == "replace" and s.type == CONTAINER]
    assert creates[-1] == "sim-sglang-rank0", "workers start before the head"
    after = rank_containers()
    assert set(after) == set(before_ranks) and not set(after.values()) & set(before_ranks.values())
    assert shard_mtimes() == before_shards
    assert "42" in ask(rec)
    TIMINGS["replay: serving change to answer"] = time.monotonic() - t0


def test_worker_lost_mid_replay_then_converges(sim, replay, first):
    before_shards = shard_mtimes()
    rec = program(sim, maxRunningRequests=3)

    def lose_spark2(step):
        if step.op == "replace" and step.name == "sim-sglang-rank1":
            sim_cluster.stop_node(CLUSTER, "spark2", log=lambda m: None)

    replay.before_step = lose_spark2
    try:
        with pytest.raises(ReplayError) as err:
            replay.up(rec)
    finally:
        replay.before_step = None
    assert "spark2" in str(err.value)

    sim_cluster.start_node(CLUSTER, "spark2", log=lambda m: None)
    steps = replay.up(rec)
    created = {s.name for s in steps if s.op in ("create", "replace")}
    assert {"sim-sglang-rank0", "sim-sglang-rank1", "sim-sglang-rank2"} <= created
    assert not [s for s in steps if "engram" in s.name and s.op != "same"]
    assert shard_mtimes() == before_shards, "nothing lost, nothing re-packed"
    assert "42" in ask(rec)


def test_destroy_in_reverse_order_keeps_checkpoint_and_shards(sim, replay, first):
    shards = shard_mtimes()
    steps = replay.destroy()
    names = [s.name for s in steps]
    assert names.index("sim-sglang-rank0") < min(names.index("sim-sglang-rank1"), names.index("sim-sglang-rank2"))
    assert names.index("sim-sglang-rank1") < names.index("sim-checkpoint-spark2")
    assert {s.name for s in steps if "retained" in s.detail} == {"sim-engram-spark1", "sim-engram-spark2",
                                                                 "sim-engram-spark3"}  # fmt: skip
    assert rank_containers() == {}
    for node in ("spark1", "spark2", "spark3"):
        assert "sim-checkpoint" not in node_sh(node, "docker volume ls --format '{{.Name}}'")
        assert node_sh(node, "ls /srv/models/DS4.1 | grep -c safetensors").strip() == "4"
    assert node_sh("spark1", "ls /var/lib/deepseek-spark/sim/ 2>/dev/null | wc -l").strip() == "0"
    assert shard_mtimes() == shards
