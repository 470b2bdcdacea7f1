"""Engine vllm (tp2's layout) replayed on 2 simulated nodes with the vllm-sim test double.

first replay -> chat, streaming, 401 on /v1 with a wrong key, /health open -> no-op replay ->
serving change replaces both containers (head created first, worker deleted first) -> destroy.
"""

import time
import urllib.request

import openai
import pytest

from e2e.conftest import ask, containers_of, node_sh, openai_client, program
from e2e.replay import CONTAINER
from e2e.timings import TIMINGS

pytestmark = pytest.mark.e2e
STACK = "sim-tp2"
SIM_NODES = 2  # tp2's layout: a 2-node simulated cluster
NODES = ("spark1", "spark2")


def test_first_replay_serves_through_ray(first):
    rec, steps, answer = first
    assert {s.op for s in steps} == {"create"}
    assert "42" in answer
    assert sorted(containers_of(STACK, NODES)) == ["sim-tp2-rank0", "sim-tp2-rank1"]
    assert "2/2 nodes alive" in node_sh("spark1", "docker logs sim-tp2-rank0 2>&1")
    assert not [s for s in steps if "engram" in s.name]


def test_streaming_auth_on_v1_only(first):
    rec = first[0]
    client, model = openai_client(rec)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}], max_tokens=32, stream=True
    )
    assert "42" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    bad, _ = openai_client(rec, key="sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    health = rec.outputs["endpoint"].removesuffix("/v1") + "/health"
    with urllib.request.urlopen(health, timeout=10) as resp:  # vLLM leaves /health unauthenticated
        assert resp.status == 200


def test_second_replay_changes_nothing(sim, replay, first):
    before = containers_of(STACK, NODES)
    steps = replay.up(program(sim, STACK))
    assert [s.name for s in steps if s.op != "same"] == []
    assert containers_of(STACK, NODES) == before


def test_serving_change_replaces_the_group_head_first(sim, replay, first):
    before = containers_of(STACK, NODES)
    rec = program(sim, STACK, maxModelLen=65536)
    t0 = time.monotonic()
    steps = replay.up(rec)
    changed = {s.name: s.op for s in steps if s.op != "same"}
    assert changed == {"sim-tp2-vllm-rank0": "replace", "sim-tp2-vllm-rank1": "replace",
                       "sim-tp2-readiness-check": "replace", "sim-tp2-spark1-preflight": "replace",
                       "sim-tp2-spark2-preflight": "replace"}  # fmt: skip
    deletes = [s.name for s in steps if s.op == "delete"]
    assert deletes == ["sim-tp2-vllm-rank1", "sim-tp2-vllm-rank0"], "the Ray worker goes before its head"
    creates = [s.name for s in steps if s.op == "replace" and s.type == CONTAINER]
    assert creates == ["sim-tp2-vllm-rank0", "sim-tp2-vllm-rank1"], "the Ray head starts first"
    after = containers_of(STACK, NODES)
    assert set(after) == set(before) and not set(after.values()) & set(before.values())
    assert "42" in ask(rec)
    TIMINGS["replay sim-tp2: serving change to answer"] = time.monotonic() - t0


def test_destroy_keeps_the_checkpoint(sim, replay, first):
    steps = replay.destroy()
    names = [s.name for s in steps]
    assert names.index("sim-tp2-vllm-rank1") < names.index("sim-tp2-vllm-rank0")
    assert containers_of(STACK, NODES) == {}
    for node in ("spark1", "spark2"):
        assert "sim-tp2-checkpoint" not in node_sh(node, "docker volume ls --format '{{.Name}}'")
        assert node_sh(node, "ls /srv/models/DS4.1 | grep -c safetensors").strip() == "4"
