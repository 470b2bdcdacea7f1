"""The leader's decisions, pure: from what it sees (every rank's container, the head's /health, the
maintenance marker) and what it remembers (`Memory`, persisted in the journal) to what it does next.

A tensor-parallel group is fail-stop, so any rank down is the whole group down: the answer is always
the whole group restarted (`heal`), never one rank. What stops it from healing:
- `paused`: the maintenance marker is set (`dspark guard pause`);
- `blocked`: a rank's container is gone: only Pulumi creates containers (`pulumi up`);
- `waiting`: a node's guard does not answer (the node is down or still booting): its rank cannot start;
- `backoff`: the last attempt failed; the next one waits backoff x 2^(attempt-1) seconds;
- `exhausted`: max_attempts heals in one episode (a fault until the group has served stable_s
  seconds) did not keep the group serving: it stays down, with the reason, until someone acts.
The head answering nothing while every container runs is a hang once it lasts hang_s seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

UP = "running"
UNREACHABLE = "unreachable"
MISSING = "missing"

# what the guard says it is doing, one word each (the `state` label of dspark_guard_group_state)
STATES = ("serving", "unhealthy", "waiting", "healing", "backoff", "exhausted", "paused", "blocked", "starting")
# what kind of fault started a heal (the `fault` label of dspark_guard_heals_total)
FAULTS = ("oom-killed", "rank-exited", "never-started", "hung", "node-lost")


@dataclass(frozen=True)
class RankObs:
    """One rank's container as its node's docker reports it (or why it could not be asked)."""

    rank: int
    node: str
    state: str  # docker's status (running, exited, created, paused, dead, ...), or MISSING / UNREACHABLE
    exit_code: int = 0
    oom_killed: bool = False
    finished_at: Optional[float] = None
    detail: str = ""  # UNREACHABLE: what went wrong asking

    @property
    def up(self) -> bool:
        return self.state == UP

    def describe(self) -> str:
        where = f"rank {self.rank} ({self.node})"
        if self.state == UNREACHABLE:
            return f"{where}: its node's guard does not answer ({self.detail or 'no answer'})"
        if self.state == MISSING:
            return f"{where}: its container is gone"
        if self.state == "created":
            return f"{where} was created but never started"
        if self.state == "paused":
            return f"{where} is paused (docker pause)"
        oom = ", OOM-killed (its container's memory limit)" if self.oom_killed else ""
        # 255: docker found it running when it started (its node rebooted or lost power under it)
        lost = " (its node's docker restarted under it: a reboot or a power loss)" if self.exit_code == 255 else ""
        return f"{where} {self.state} with code {self.exit_code}{oom}{lost}"


@dataclass(frozen=True)
class Observation:
    now: float
    ranks: tuple[RankObs, ...]
    health: Optional[bool]  # the head's /health answered 200 (None: not asked)
    paused: Optional[str] = None  # the maintenance marker's reason; None: not paused
    answered: frozenset[str] = frozenset()  # nodes whose guard answered before, in this run of the leader


@dataclass(frozen=True)
class Settings:
    max_attempts: int = 3
    backoff_s: float = 30.0
    hang_s: float = 60.0
    stable_s: float = 600.0


@dataclass(frozen=True)
class Fault:
    kind: str  # one of FAULTS
    detail: str
    at: float  # when it happened, as far as the guard can tell (docker's FinishedAt, the first failed probe)


@dataclass
class Memory:
    """What the leader remembers across loops, guard restarts and reboots (the journal holds it)."""

    attempts: int = 0  # heals started in this episode
    next_try: float = 0.0  # no heal before this time (backoff)
    exhausted: Optional[str] = None  # why the guard gave up, until someone acts
    fault_since: Optional[float] = None  # the episode's first sight of a fault
    serving_since: Optional[float] = None
    unhealthy_since: Optional[float] = None  # every rank runs, the head's /health fails since
    lost: list[str] = field(default_factory=list)  # nodes whose guard stopped answering in this episode

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "Memory":
        known = {k: v for k, v in (doc or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class Decision:
    state: str  # one of STATES ("healing" when `fault` is set)
    reason: str
    fault: Optional[Fault] = None


def fault_of(down: list[RankObs], mem: Memory, now: float) -> Fault:
    """The fault the down ranks show: the first one down names it (an OOM kill before a plain exit)."""
    first = min(down, key=lambda r: (r.finished_at is None, r.finished_at or 0.0, r.rank))
    if any(r.oom_killed for r in down):
        first = next(r for r in down if r.oom_killed)
        kind = "oom-killed"
    elif mem.lost:
        kind = "node-lost"
    elif first.state == "created":
        kind = "never-started"
    elif first.state == "paused":
        kind = "hung"
    else:
        kind = "rank-exited"
    at = min((r.finished_at for r in down if r.finished_at), default=None) or mem.fault_since or now
    lost = f" after {', '.join(mem.lost)} stopped answering (node down or rebooted)" if mem.lost else ""
    ordered = sorted(down, key=lambda r: (r.finished_at is None, r.finished_at or 0.0, r.rank))  # first down first
    return Fault(kind, "; ".join(r.describe() for r in ordered) + lost, at)


def decide(obs: Observation, mem: Memory, s: Settings) -> Decision:
    """What to do now; updates `mem` (times seen, the end of an episode)."""
    if obs.paused is not None:
        return Decision("paused", f"paused for maintenance ({obs.paused}): nothing is restarted until "
                                  "`dspark guard resume`")  # fmt: skip
    missing = [r for r in obs.ranks if r.state == MISSING]
    if missing:
        return Decision("blocked", "; ".join(r.describe() for r in missing) + ": only Pulumi creates containers, "
                                   "the guard never does; run `pulumi up` to create the group again")  # fmt: skip
    unreachable = [r for r in obs.ranks if r.state == UNREACHABLE]
    down = [r for r in obs.ranks if not r.up and r.state != UNREACHABLE]
    if unreachable and not down and obs.health is True:  # the head answers: the group serves, a guard is away
        return Decision("serving", "the head answers; " + "; ".join(r.describe() for r in unreachable))
    for r in unreachable:  # lost: it answered, then stopped (not a guard that is still starting)
        if r.node in obs.answered and r.node not in mem.lost:
            mem.lost.append(r.node)
    hung = False
    if not down and not unreachable:
        if obs.health is False:
            mem.unhealthy_since = mem.unhealthy_since or obs.now
            hung = obs.now - mem.unhealthy_since >= s.hang_s
        else:
            mem.unhealthy_since = None
    if not down and not unreachable and not hung:
        if obs.health is False:
            since = obs.now - (mem.unhealthy_since or obs.now)
            return Decision("unhealthy", f"every rank runs; the head has not answered /health for {since:.0f} s "
                                         f"(a hang after {s.hang_s:.0f} s)")  # fmt: skip
        if mem.exhausted:  # someone brought it back (dspark restart, a manual start): start over
            mem.exhausted, mem.attempts, mem.next_try = None, 0, 0.0
        mem.serving_since = mem.serving_since or obs.now
        mem.fault_since, mem.lost = None, []  # a node that did not answer for a while, and nothing broke
        if mem.attempts and obs.now - mem.serving_since >= s.stable_s:
            mem.attempts, mem.lost = 0, []
        return Decision("serving", "every rank runs and the head answers")
    mem.serving_since = None
    mem.fault_since = mem.fault_since or obs.now
    if mem.exhausted:
        return Decision("exhausted", mem.exhausted)
    if unreachable:
        return Decision("waiting", "; ".join(r.describe() for r in unreachable)
                        + ": waiting for it (its rank cannot start before its node is back)")  # fmt: skip
    if hung:
        fault = Fault("hung", f"every rank runs but the head has not answered /health for "
                              f"{obs.now - mem.unhealthy_since:.0f} s", mem.unhealthy_since or obs.now)  # fmt: skip
    else:
        fault = fault_of(down, mem, obs.now)
    if mem.attempts >= s.max_attempts:
        mem.exhausted = (f"gave up after {mem.attempts} heal(s) in {obs.now - (mem.fault_since or obs.now):.0f} s: "
                         f"{fault.detail}")  # fmt: skip
        return Decision("exhausted", mem.exhausted)
    if obs.now < mem.next_try:
        return Decision("backoff", f"{fault.detail}; attempt {mem.attempts + 1} of {s.max_attempts} in "
                                   f"{mem.next_try - obs.now:.0f} s")  # fmt: skip
    return Decision("healing", fault.detail, fault)


def started(mem: Memory) -> int:
    """A heal starts: its attempt number."""
    mem.attempts += 1
    mem.unhealthy_since = None
    return mem.attempts


def failed(mem: Memory, s: Settings, now: float, why: str) -> None:
    """The heal failed: back off, or give up after the last attempt."""
    if mem.attempts >= s.max_attempts:
        mem.exhausted = f"gave up after {mem.attempts} attempt(s): {why}"
    else:
        mem.next_try = now + s.backoff_s * 2 ** (mem.attempts - 1)


def served(mem: Memory, now: float) -> None:
    """The heal brought the group back: serving since now (the episode ends once that lasts stable_s)."""
    mem.serving_since, mem.fault_since, mem.next_try, mem.unhealthy_since, mem.lost = now, None, 0.0, None, []
