"""The leader's decisions over sequences of observations: faults, waiting, hangs, backoff, giving up."""

from programs.guard import decide
from programs.guard.decide import Memory, Observation, RankObs, Settings

S = Settings(max_attempts=3, backoff_s=30, hang_s=60, stable_s=600)
NODES = ("spark1", "spark2", "spark3")


def ranks(**states) -> tuple[RankObs, ...]:
    """Every rank running, but those given: rank1=("exited", 137, False, 990.0) or rank2="unreachable"."""
    out = []
    for i, node in enumerate(NODES):
        st = states.get(f"rank{i}", "running")
        if isinstance(st, tuple):
            state, code, oom, at = st
            out.append(RankObs(i, node, state, code, oom, at))
        else:
            out.append(RankObs(i, node, st))
    return tuple(out)


def obs(now, health=True, paused=None, **states) -> Observation:
    rs = ranks(**states)
    return Observation(now, rs, health if all(r.up for r in rs) else None, paused, frozenset(NODES))


def test_a_serving_group_is_left_alone():
    mem = Memory()
    d = decide.decide(obs(1000), mem, S)
    assert d.state == "serving" and d.fault is None and mem.serving_since == 1000


def test_a_rank_that_exited_heals_the_whole_group_dated_from_its_exit():
    mem = Memory()
    d = decide.decide(obs(1000, rank1=("exited", 137, False, 990.5)), mem, S)
    assert d.state == "healing" and d.fault.kind == "rank-exited" and d.fault.at == 990.5
    assert "rank 1 (spark2) exited with code 137" in d.fault.detail


def test_an_oom_kill_names_itself_even_when_another_rank_went_first():
    d = decide.decide(obs(1000, rank0=("exited", 1, False, 985.0), rank2=("exited", 137, True, 990.0)), Memory(), S)
    assert d.fault.kind == "oom-killed" and d.fault.at == 985.0 and "OOM-killed" in d.fault.detail


def test_a_rank_left_created_never_started():
    d = decide.decide(obs(1000, rank1=("created", 0, False, None)), Memory(), S)
    assert d.fault.kind == "never-started" and d.fault.at == 1000


def test_a_node_that_does_not_answer_is_waited_for_then_the_group_heals_as_a_lost_node():
    mem = Memory()
    d = decide.decide(obs(1000, rank1="unreachable", rank0=("exited", 1, False, 995.0)), mem, S)
    assert d.state == "waiting" and d.fault is None and "spark2" in d.reason
    d = decide.decide(obs(1030, rank1=("exited", 0, False, 994.0), rank0=("exited", 1, False, 995.0)), mem, S)
    assert d.state == "healing" and d.fault.kind == "node-lost" and d.fault.at == 994.0
    assert "spark2 stopped answering" in d.fault.detail


def test_a_guard_away_while_the_head_answers_is_no_fault():
    mem = Memory()
    away = Observation(1000, ranks(rank2="unreachable"), True, None, frozenset(NODES))
    d = decide.decide(away, mem, S)
    assert d.state == "serving" and "spark3" in d.reason and mem.lost == [] and mem.fault_since is None


def test_a_guard_that_never_answered_yet_is_no_lost_node():
    mem = Memory()
    first = Observation(1000, ranks(rank1="unreachable", rank0=("exited", 255, False, 990.0)), None, None, frozenset())
    assert decide.decide(first, mem, S).state == "waiting" and mem.lost == []
    d = decide.decide(obs(1010, rank1=("exited", 255, False, 990.0), rank0=("exited", 255, False, 990.0)), mem, S)
    assert d.fault.kind == "rank-exited" and "a reboot or a power loss" in d.fault.detail


def test_a_container_that_is_gone_blocks_the_guard_it_never_recreates():
    d = decide.decide(obs(1000, rank2="missing"), Memory(), S)
    assert d.state == "blocked" and d.fault is None and "pulumi up" in d.reason


def test_paused_for_maintenance_nothing_happens_whatever_the_group_does():
    d = decide.decide(obs(1000, paused="switch firmware by ops", rank1=("exited", 1, False, 999.0)), Memory(), S)
    assert d.state == "paused" and d.fault is None and "switch firmware" in d.reason


def test_a_head_that_stops_answering_is_a_hang_only_after_hang_seconds():
    mem = Memory()
    assert decide.decide(obs(1000, health=False), mem, S).state == "unhealthy"
    assert decide.decide(obs(1059, health=False), mem, S).state == "unhealthy"
    d = decide.decide(obs(1060, health=False), mem, S)
    assert d.state == "healing" and d.fault.kind == "hung" and d.fault.at == 1000
    mem2 = Memory()
    decide.decide(obs(1000, health=False), mem2, S)
    decide.decide(obs(1030, health=True), mem2, S)  # it answered again: the clock starts over
    assert decide.decide(obs(1070, health=False), mem2, S).state == "unhealthy"


def test_a_failed_heal_backs_off_doubling_then_the_guard_gives_up_and_says_why():
    mem = Memory()
    down = {"rank1": ("exited", 1, False, 999.0)}
    waits = []
    now = 1000.0
    for attempt in (1, 2, 3):
        d = decide.decide(obs(now, **down), mem, S)
        assert d.state == "healing", d
        assert decide.started(mem) == attempt
        decide.failed(mem, S, now, "rank 1 (spark2) exited with code 1 while the group booted")
        if attempt < 3:
            assert decide.decide(obs(now + 1, **down), mem, S).state == "backoff"
            waits.append(mem.next_try - now)
            now = mem.next_try
    assert waits == [30, 60]
    d = decide.decide(obs(now + 500, **down), mem, S)
    assert d.state == "exhausted" and "gave up after 3 attempt(s)" in d.reason and "while the group booted" in d.reason
    assert decide.decide(obs(now + 5000, **down), mem, S).state == "exhausted"  # stays down, no more attempts


def test_heals_that_serve_only_briefly_are_bounded_too():
    mem = Memory()
    now = 1000.0
    for _ in range(3):
        d = decide.decide(obs(now, rank2=("exited", 1, False, now - 1)), mem, S)
        assert d.state == "healing"
        decide.started(mem)
        decide.served(mem, now + 20)
        assert decide.decide(obs(now + 30), mem, S).state == "serving"
        now += 100  # crashes again well within stable_s
    d = decide.decide(obs(now, rank2=("exited", 1, False, now - 1)), mem, S)
    assert d.state == "exhausted" and "3 heal(s)" in d.reason


def test_serving_for_stable_seconds_ends_the_episode():
    mem = Memory()
    decide.decide(obs(1000, rank2=("exited", 1, False, 999.0)), mem, S)
    decide.started(mem)
    decide.served(mem, 1020)
    decide.decide(obs(1020 + S.stable_s), mem, S)
    assert mem.attempts == 0


def test_a_group_someone_brought_back_after_the_guard_gave_up_is_guarded_again():
    mem = Memory(attempts=3, exhausted="gave up after 3 attempt(s): x")
    assert decide.decide(obs(1000), mem, S).state == "serving"
    assert mem.exhausted is None and mem.attempts == 0
    assert decide.decide(obs(1100, rank1=("exited", 1, False, 1099.0)), mem, S).state == "healing"


def test_memory_round_trips_through_the_journal():
    mem = Memory(attempts=2, next_try=5.0, exhausted=None, lost=["spark3"])
    assert Memory.from_json(mem.to_json() | {"unknown": 1}) == mem
