"""The replay engine's own rules (no cluster needed): strictness, diff semantics, ordering."""

from dataclasses import replace

import pytest

from e2e.replay import CONTAINER, LOCAL, REMOTE, Replay, ReplayError
from harness import ROOT, run_program


@pytest.fixture(scope="module")
def rec():
    return run_program("sim")


def test_an_input_the_replay_does_not_understand_fails(rec, tmp_path):
    res = next(r for r in rec.resources if r.type == CONTAINER)
    bad = replace(rec, resources=[replace(res, inputs={**res.inputs, "privileged": True})])
    with pytest.raises(ReplayError, match=r"inputs the replay does not understand: \['privileged'\]"):
        Replay(state_file=tmp_path / "s.json").up(bad)


def test_an_unknown_resource_type_fails(rec, tmp_path):
    res = next(r for r in rec.resources if r.type == CONTAINER)
    bad = replace(rec, resources=[replace(res, type="docker:index/network:Network")])
    with pytest.raises(ReplayError, match="does not know resource type"):
        Replay(state_file=tmp_path / "s.json").up(bad)


@pytest.mark.parametrize(
    "kind,old,new,op",
    [
        (CONTAINER, {"a": 1}, {"a": 2}, "replace"),
        (REMOTE, {"create": "x", "triggers": [1]}, {"create": "y", "triggers": [1]}, "update"),
        (REMOTE, {"create": "x", "triggers": [1]}, {"create": "x", "triggers": [2]}, "replace"),
        (LOCAL, {"create": "x"}, {"create": "x"}, "same"),
    ],
)
def test_diff_follows_the_providers(kind, old, new, op):
    assert Replay._diff(kind, old, new) == op


def test_order_puts_workers_before_head_and_is_deterministic(rec, tmp_path):
    replay = Replay(state_file=tmp_path / "s.json", cwd=ROOT)
    entries = {r.urn: replay._entry(r) for r in rec.resources if r.custom}
    order = [entries[u]["name"] for u in Replay._order(entries)]
    assert order == [entries[u]["name"] for u in Replay._order(dict(reversed(list(entries.items()))))]
    assert order.index("sim-sglang-rank0") > max(order.index("sim-sglang-rank1"), order.index("sim-sglang-rank2"))
    assert order.index("sim-readiness-check") == len(order) - 1


def test_a_changed_build_context_is_a_rebuild_like_the_provider(rec, tmp_path):
    (image,) = [r for r in rec.resources if r.name == "sim-image-spark1"]
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\n")
    image = replace(image, inputs={**image.inputs, "build": {**image.inputs["build"], "context": "ctx",
                                                              "dockerfile": "ctx/Dockerfile"}})  # fmt: skip
    replay = Replay(state_file=tmp_path / "s.json", cwd=tmp_path)
    before = replay._entry(image)
    (ctx / "Dockerfile").write_text("FROM scratch\nLABEL changed=1\n")
    after = replay._entry(image)
    assert before["inputs"] == after["inputs"] and before["contextDigest"] != after["contextDigest"]
