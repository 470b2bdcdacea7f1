"""The group's ranks as the leader reaches them, and the heal: the whole group restarted the way `pulumi
up` starts it, with the containers Pulumi created.

    out of rotation (behind a router) -> stop every rank (the order Pulumi deletes them) -> the start
    gates on every node (the rails found, the memory gate with its cache drop) -> start every rank
    (the order Pulumi creates them) -> serving (/health, then one answer) -> back in rotation

A step that fails ends the attempt with its reason; the leader backs off and tries again, or gives up
(decide.failed). Before each step the heal checks that it may go on (the guard is not being stopped).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from programs import membership, probe

from . import wire
from .decide import MISSING, UNREACHABLE, Fault, RankObs
from .dockerapi import Docker, DockerError

# The start gates run on the node itself (its python3, its /proc, its docker and sysctl), as the program's
# remote commands run them over ssh: the guard's container shares the host's PID namespace for this.
HOST = ("nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--")
GATE_TIMEOUT = 600  # the memory gate's sync can take minutes after a large write


def last_lines(text: str, n: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:] if line.strip())


@dataclass(frozen=True)
class NodeGates:
    """The start gates of one node: programs fed to the host's `python3 -` with their arguments."""

    node: str
    programs: tuple[tuple[str, str, tuple[str, ...]], ...]  # (name, program text, arguments)

    def run(self, runner=subprocess.run) -> tuple[bool, str]:
        for name, program, args in self.programs:
            try:
                r = runner([*HOST, "python3", "-", *args], input=program, capture_output=True, text=True,
                           timeout=GATE_TIMEOUT)  # fmt: skip
            except subprocess.TimeoutExpired:
                return False, f"{self.node}: {name} gate did not finish within {GATE_TIMEOUT} s"
            except OSError as exc:
                return False, f"{self.node}: {name} gate could not run on the node: {exc}"
            if r.returncode != 0:
                return False, f"{self.node}: {name} gate refused: {last_lines(r.stderr or r.stdout)}"
        return True, f"{self.node}: gates passed"


class Rank(Protocol):
    rank: int
    node: str
    container: str

    def observe(self) -> RankObs: ...
    def stop(self, grace: int) -> None: ...
    def start(self) -> None: ...
    def gates(self) -> tuple[bool, str]: ...
    def tail(self, lines: int) -> list[str]: ...


def observed(rank: int, node: str, docker: Docker, container: str) -> RankObs:
    c = docker.inspect(container)
    if c is None:
        return RankObs(rank, node, MISSING)
    return RankObs(rank, node, c.status, c.exit_code, c.oom_killed, c.finished_at)


@dataclass
class LocalRank:
    """The rank on the leader's own node: through its docker socket."""

    rank: int
    node: str
    container: str
    docker: Docker
    node_gates: NodeGates

    def observe(self) -> RankObs:
        try:
            return observed(self.rank, self.node, self.docker, self.container)
        except DockerError as exc:
            return RankObs(self.rank, self.node, UNREACHABLE, detail=str(exc))

    def stop(self, grace: int) -> None:
        self.docker.stop(self.container, grace)

    def start(self) -> None:
        self.docker.start(self.container)

    def gates(self) -> tuple[bool, str]:
        return self.node_gates.run()

    def tail(self, lines: int) -> list[str]:
        return self.docker.tail(self.container, lines)


class Peer:
    """Another node's guard, asked over the management network with signed requests (wire)."""

    def __init__(self, url: str, node: str, token: bytes, timeout: float = 10.0):
        self.url, self.node, self.token, self.timeout = url.rstrip("/"), node, token, timeout
        self.instance = ""

    def _post(self, action: str, timeout: float, **fields: Any) -> dict[str, Any]:
        body, sig, nonce = wire.request(self.token, self.node, self.instance, action, **fields)
        req = urllib.request.Request(self.url + "/v1/act", data=body, method="POST",
                                     headers={"Content-Type": "application/json", wire.HEADER: sig})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                data, answer_sig = resp.read(), resp.headers.get(wire.HEADER)
        except urllib.error.HTTPError as exc:
            raise wire.Refused(exc.code, exc.read().decode(errors="replace")[:300]) from None
        doc = wire.check_answer(self.token, nonce, data, answer_sig)
        self.instance = doc.get("instance") or self.instance
        if doc.get("error"):
            raise RuntimeError(f"{self.node}: {doc['error']}")
        return doc

    def call(self, action: str, timeout: Optional[float] = None, **fields: Any) -> dict[str, Any]:
        """One action; a guard that restarted since (409) is asked for its new instance first."""
        if action not in wire.READ_ONLY and not self.instance:
            self._post("state", self.timeout, **fields)
        try:
            return self._post(action, timeout or self.timeout, **fields)
        except wire.Refused as exc:
            if exc.status != 409:
                raise
            self._post("state", self.timeout, **fields)
            return self._post(action, timeout or self.timeout, **fields)


@dataclass
class RemoteRank:
    rank: int
    node: str
    container: str
    peer: Peer

    def observe(self) -> RankObs:
        try:
            doc = self.peer.call("state", container=self.container)["rank"]
        except (OSError, wire.Refused, RuntimeError, ValueError, KeyError) as exc:
            return RankObs(self.rank, self.node, UNREACHABLE, detail=f"{type(exc).__name__}: {exc}"[:200])
        return RankObs(self.rank, self.node, doc["state"], int(doc.get("exit_code") or 0),
                       bool(doc.get("oom_killed")), doc.get("finished_at"))  # fmt: skip

    def stop(self, grace: int) -> None:
        self.peer.call("stop", timeout=grace + 60, container=self.container, grace=grace)

    def start(self) -> None:
        self.peer.call("start", timeout=180, container=self.container)

    def tail(self, lines: int) -> list[str]:
        return [str(line) for line in self.peer.call("tail", container=self.container, lines=lines).get("lines", [])]

    def gates(self) -> tuple[bool, str]:
        try:
            doc = self.peer.call("gates", timeout=GATE_TIMEOUT + 60, container=self.container)
        except (OSError, wire.Refused, RuntimeError, ValueError) as exc:
            return False, f"{self.node}: gates not run: {exc}"
        return bool(doc.get("ok")), str(doc.get("output", ""))


@dataclass(frozen=True)
class HealPlan:
    """How the group starts, from the program's plan."""

    engine: str
    start_order: tuple[int, ...]  # the order Pulumi creates the ranks (SGLang: workers, then the head)
    stop_order: tuple[int, ...]  # the order Pulumi deletes them (SGLang: the head first)
    url: str  # the head's OpenAI base URL, as the guard on the head reaches it
    model: str
    prompt: str
    expect: str
    boot_timeout: float
    interval: float
    grace: int = 10  # seconds a rank gets to stop before it is killed (the group is broken already)
    router: Optional[str] = None  # behind a router: its URL, and the group's rank-0 URL as the router knows it
    worker: Optional[str] = None


class Stopping(Exception):
    """The guard is being stopped: leave the heal where it is (the journal says where)."""


ERROR_LINE = re.compile(r"error|exception|traceback|fatal|failed|killed|abort", re.I)


def last_error(r: Rank, key: str) -> str:
    """The last error-like line of a rank's log (the key redacted), or ""."""
    try:
        lines = r.tail(40)
    except (DockerError, OSError, wire.Refused, RuntimeError, ValueError):
        return ""
    found = next((line for line in reversed(lines) if ERROR_LINE.search(line)), "")
    return probe.redact(found.strip(), key)[:300]


def down_rank(ranks: list[Rank]) -> Optional[tuple[Rank, str]]:
    """The rank that stops the booting group from coming up (no longer running), and why; None when all run."""
    for r in ranks:
        obs = r.observe()
        if obs.state == UNREACHABLE:
            return r, obs.describe()
        if not obs.up:
            return r, obs.describe() + " while the group booted"
    return None


def stop_all(order: list[Rank], grace: int) -> None:
    """After a failed start: every rank down (a half-started group holds memory and answers 503)."""
    for r in order:
        try:
            if r.observe().state in ("running", "paused", "restarting"):
                r.stop(grace)
        except (DockerError, OSError, wire.Refused, RuntimeError):
            pass


def heal(ranks: dict[int, Rank], hp: HealPlan, key: str, fault: Fault, attempt: int,
         progress: Callable[[str], None], stop: threading.Event, log: Callable[[str], None],
         clock: Callable[[], float] = time.time) -> dict[str, Any]:  # fmt: skip
    """One attempt; returns its record (result "served" or "failed" with why)."""
    rec: dict[str, Any] = {"attempt": attempt, "fault": fault.kind, "detail": fault.detail,
                           "fault_at": fault.at, "detected_at": clock()}  # fmt: skip

    def step(name: str) -> None:
        if stop.is_set():
            raise Stopping(name)
        progress(name)
        log(f"heal attempt {attempt}: {name}")

    def fail(why: str) -> dict[str, Any]:
        log(f"heal attempt {attempt} failed: {why}")
        return {**rec, "result": "failed", "why": why, "ended_at": clock()}

    order = [ranks[i] for i in hp.stop_order]
    if hp.router and hp.worker:
        step("out of rotation")
        membership.remove(hp.router, hp.worker, key, hp.engine, drain_timeout=0)
    step("stop")
    grace = 1 if fault.kind == "hung" else hp.grace  # a stopped process never sees SIGTERM: kill it
    for r in order:
        try:
            if r.observe().state in ("running", "paused", "restarting"):
                r.stop(grace)
        except (DockerError, OSError, wire.Refused, RuntimeError) as exc:
            return fail(f"rank {r.rank} ({r.node}) could not be stopped: {exc}")
    step("gates")
    with ThreadPoolExecutor(max_workers=len(ranks)) as pool:
        results = list(pool.map(lambda r: r.gates(), [ranks[i] for i in sorted(ranks)]))
    refused = [text for ok, text in results if not ok]
    if refused:
        return fail("; ".join(refused))
    step("start")
    for i in hp.start_order:
        try:
            ranks[i].start()
        except (DockerError, OSError, wire.Refused, RuntimeError) as exc:
            return fail(f"rank {i} ({ranks[i].node}) could not be started: {exc}")
    rec["restarted_at"] = clock()
    step("boot")
    lines: list[str] = []
    down: list[tuple[Rank, str]] = []

    def why_down() -> Optional[str]:
        if stop.is_set():
            return "the guard is stopping"
        found = down_rank(list(ranks.values()))
        if found:
            down.append(found)
        return found[1] if found else None

    ok = probe.wait_ready(hp.url, key, hp.model, hp.prompt, hp.expect, hp.boot_timeout, hp.interval,
                          log=lines.append, ranks_down=why_down)  # fmt: skip
    if stop.is_set():
        raise Stopping("boot")
    if not ok:
        stop_all(order, hp.grace)
        if down:
            r, why = down[-1]
            tail = last_error(r, key)
            return fail(why + (f"; its log ends: {tail}" if tail else ""))
        return fail(probe.redact(lines[-1] if lines else "not serving", key))
    rec["serving_at"] = clock()
    if hp.router and hp.worker:
        step("back in rotation")
        if membership.add(hp.router, hp.worker, key, hp.boot_timeout) != 0:
            log("heal: the router did not take the group back; it serves, its router health checks will")
    rec["seconds_to_serve"] = round(rec["serving_at"] - fault.at, 1)
    log(f"heal attempt {attempt}: serving again, {rec['seconds_to_serve']} s after the fault")
    return {**rec, "result": "served", "ended_at": clock()}


def state_doc(obs: RankObs) -> dict[str, Any]:
    return {"state": obs.state, "exit_code": obs.exit_code, "oom_killed": obs.oom_killed,
            "finished_at": obs.finished_at}  # fmt: skip


def dumps(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, default=str)
