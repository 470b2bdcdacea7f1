"""The heal with stand-in ranks: the whole group, in the program's order, gates before any start, and an
attempt that fails says why."""

import threading

import pytest

from planning import guard as guard_plan
from programs.guard import heal
from programs.guard.decide import Fault, RankObs


class FakeRank:
    def __init__(self, rank, calls, state="exited", gate=(True, "ok"), dies_at_boot=False):
        self.rank, self.node, self.container = rank, f"spark{rank + 1}", f"c{rank}"
        self.calls, self.state, self.gate, self.dies_at_boot = calls, state, gate, dies_at_boot

    def observe(self):
        return RankObs(self.rank, self.node, self.state, 1 if self.state == "exited" else 0)

    def stop(self, grace):
        self.calls.append(("stop", self.rank))
        self.state = "exited"

    def start(self):
        self.calls.append(("start", self.rank))
        self.state = "exited" if self.dies_at_boot else "running"

    def gates(self):
        self.calls.append(("gates", self.rank))
        return self.gate

    def tail(self, lines):
        return ["Load weight begin.", "RuntimeError: CUDA error: an illegal memory access (key sk-key)", "bye"]


def fake_ready(url, key, model, prompt, expect, timeout, interval, log, ranks_down, **_):
    down = ranks_down()
    if down:
        log(f"readiness: a rank is down after 0s, the group cannot come up: {down}")
        return False
    return True


@pytest.fixture(autouse=True)
def no_http(monkeypatch):
    monkeypatch.setattr(heal.probe, "wait_ready", fake_ready)


def plan_for(engine: str, n: int = 3, **kw) -> heal.HealPlan:
    class Cfg:  # what guard_plan.orders reads
        pass

    cfg = Cfg()
    cfg.engine, cfg.nodes = engine, [None] * n
    start, stop = guard_plan.orders(cfg)
    return heal.HealPlan(engine, start, stop, "http://127.0.0.1:8888/v1", "m", "What is 19 + 23?", "42", 60, 1, **kw)


def run(ranks, hp, stop=None):
    steps, lines = [], []
    rec = heal.heal({r.rank: r for r in ranks}, hp, "sk-key", Fault("rank-exited", "rank 1 exited", 100.0), 1,
                    steps.append, stop or threading.Event(), lines.append)  # fmt: skip
    return rec, steps, lines


def test_sglang_heals_the_whole_group_head_down_first_workers_up_before_the_head():
    calls = []
    ranks = [FakeRank(0, calls, "running"), FakeRank(1, calls, "exited"), FakeRank(2, calls, "running")]
    rec, steps, _ = run(ranks, plan_for("sglang"))
    assert rec["result"] == "served" and rec["seconds_to_serve"] >= 0
    assert steps == ["stop", "gates", "start", "boot"]
    stops = [r for op, r in calls if op == "stop"]
    starts = [r for op, r in calls if op == "start"]
    assert stops == [0, 2] and starts == [1, 2, 0]  # the exited rank is not stopped again; the head starts last
    last_gate = max(i for i, c in enumerate(calls) if c[0] == "gates")
    assert last_gate < calls.index(("start", 1)), "every node's gates pass before any rank starts"


def test_vllm_starts_the_head_first_and_stops_it_last():
    calls = []
    ranks = [FakeRank(0, calls, "running"), FakeRank(1, calls, "running")]
    rec, _, _ = run(ranks, plan_for("vllm", 2))
    assert rec["result"] == "served"
    assert [c for c in calls if c[0] != "gates"] == [("stop", 1), ("stop", 0), ("start", 0), ("start", 1)]


def test_a_gate_that_refuses_ends_the_attempt_before_any_rank_starts():
    calls = []
    ranks = [FakeRank(0, calls), FakeRank(1, calls, gate=(False, "spark2: memory gate refused: 30 GiB free")),
             FakeRank(2, calls)]  # fmt: skip
    rec, steps, _ = run(ranks, plan_for("sglang"))
    assert rec["result"] == "failed" and "spark2: memory gate refused" in rec["why"]
    assert not [c for c in calls if c[0] == "start"] and "start" not in steps


def test_a_rank_that_dies_at_boot_fails_the_attempt_naming_it():
    calls = []
    ranks = [FakeRank(0, calls), FakeRank(1, calls), FakeRank(2, calls, dies_at_boot=True)]
    rec, _, _ = run(ranks, plan_for("sglang"))
    assert rec["result"] == "failed" and "rank 2 (spark3) exited with code 1 while the group booted" in rec["why"]
    assert "its log ends: RuntimeError: CUDA error: an illegal memory access (key [secret])" in rec["why"]
    assert "restarted_at" in rec and "serving_at" not in rec
    assert [r.state for r in ranks] == ["exited"] * 3, "a group that could not come up is left down, not half-started"
    assert calls[-2:] == [("stop", 0), ("stop", 1)]


def test_a_guard_being_stopped_leaves_the_heal_where_it_is():
    calls = []
    stop = threading.Event()
    ranks = [FakeRank(0, calls), FakeRank(1, calls)]
    stop.set()
    with pytest.raises(heal.Stopping):
        run(ranks, plan_for("sglang", 2), stop)
    assert calls == []


def test_behind_a_router_the_group_leaves_the_rotation_first_and_comes_back_last(monkeypatch):
    calls = []
    monkeypatch.setattr(heal.membership, "remove", lambda router, worker, *a, **k: calls.append(("out", worker)) or 0)
    monkeypatch.setattr(heal.membership, "add", lambda router, worker, *a, **k: calls.append(("in", worker)) or 0)
    ranks = [FakeRank(0, calls, "running"), FakeRank(1, calls)]
    rec, _, _ = run(ranks, plan_for("sglang", 2, router="http://r:8889", worker="http://h:8888"))
    assert rec["result"] == "served"
    assert calls[0] == ("out", "http://h:8888") and calls[-1] == ("in", "http://h:8888")


def test_node_gates_run_the_programs_on_the_host_and_report_the_refusal():
    seen = []

    class R:
        def __init__(self, rc, err=""):
            self.returncode, self.stdout, self.stderr = rc, "", err

    def runner(argv, input, **kw):
        seen.append((argv, input))
        return R(0) if "rails" in input else R(1, "memory gate spark2: FAIL 30000 MiB available, plan needs 100000\n")

    gates = heal.NodeGates("spark2", (("rails", "# rails\n", ("--node", "spark2")), ("memory", "# memgate", ())))
    ok, text = gates.run(runner)
    assert not ok and "spark2: memory gate refused: memory gate spark2: FAIL 30000 MiB available" in text
    assert seen[0][0][: len(heal.HOST)] == list(heal.HOST) and seen[0][0][-4:] == ["python3", "-", "--node", "spark2"]
