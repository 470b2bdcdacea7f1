"""The program's real resources replayed against the simulated cluster, then a real OpenAI client.

One scenario, in order (each test builds on the previous one's cluster state):
first replay -> chat through client_config -> no-op replay -> serving change replaces every rank ->
worker lost mid-replay, brought back, converges -> destroy in reverse order.
"""

import time
from pathlib import Path

import openai
import pytest

from e2e.conftest import CLUSTER, ask, containers_of, node_sh, openai_client, program
from e2e.replay import CONTAINER, ReplayError
from e2e.timings import TIMINGS
from harness import cluster_of
from sim import cluster as sim_cluster

pytestmark = pytest.mark.e2e
STACK = "sim"


def shard_mtimes() -> dict[str, str]:
    out = {}
    for node in ("spark1", "spark2", "spark3"):
        for line in node_sh(node, "stat -c '%n %Y.%y' /srv/engram/engram-*.bin").splitlines():
            name, mtime = line.split(" ", 1)
            out[f"{node}:{name}"] = mtime
    return out


def rank_containers() -> dict[str, str]:
    return containers_of(STACK)


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
    client, model = openai_client(rec)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}], max_tokens=32, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert "42" in text
    assert [m.id for m in client.models.list()] == [model]
    bad, _ = openai_client(rec, key="sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8)


def test_second_replay_changes_nothing(sim, replay, first):
    before_shards, before_ranks = shard_mtimes(), rank_containers()
    t0 = time.monotonic()
    steps = replay.up(program(sim, STACK))
    TIMINGS["replay sim: no-op up"] = time.monotonic() - t0
    assert [s.name for s in steps if s.op != "same"] == []
    assert shard_mtimes() == before_shards
    assert rank_containers() == before_ranks


def test_serving_change_replaces_every_rank_workers_first(sim, replay, first):
    before_shards, before_ranks = shard_mtimes(), rank_containers()
    rec = program(sim, STACK, maxRunningRequests=2)
    t0 = time.monotonic()
    steps = replay.up(rec)
    changed = {s.name: s.op for s in steps if s.op != "same"}
    assert changed == {
        "sim-sglang-rank0": "replace", "sim-sglang-rank1": "replace", "sim-sglang-rank2": "replace",
        "sim-readiness-check": "replace",
        "sim-spark1-preflight": "replace", "sim-spark2-preflight": "replace", "sim-spark3-preflight": "replace",
    }  # fmt: skip
    deletes = [s.name for s in steps if s.op == "delete"]
    assert deletes[0] == "sim-sglang-rank0", "the head goes first"
    creates = [s.name for s in steps if s.op == "replace" and s.type == CONTAINER]
    assert creates[-1] == "sim-sglang-rank0", "workers start before the head"
    after = rank_containers()
    assert set(after) == set(before_ranks) and not set(after.values()) & set(before_ranks.values())
    assert shard_mtimes() == before_shards
    assert "42" in ask(rec)
    TIMINGS["replay sim: serving change to answer"] = time.monotonic() - t0


def test_worker_lost_mid_replay_then_converges(sim, replay, first):
    before_shards = shard_mtimes()
    rec = program(sim, STACK, maxRunningRequests=3)

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
