"""What the self-healing scenarios share: the guard leader's /status, waiting for what it says, a client asking
until it is answered, and one fault timed from outside (HEALS: printed at the end of the session)."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Callable

from e2e.timings import HEALS, TIMINGS

BOOT_S = 20.0  # the sim's boot: a node ~5 s, a group ~5-15 s (a Spark's takes 12-13 minutes)
BOUND_S = BOOT_S + 60  # the endpoint answers again within the sim's boot time + 60 s


def guard_status(leader: str) -> dict:
    with urllib.request.urlopen(leader + "/status", timeout=5) as resp:
        return json.load(resp)


def wait_guard(leader: str, pred: Callable[[dict], bool], timeout: float = 120, what: str = "") -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = guard_status(leader)
            if pred(last):
                return last
        except OSError as exc:
            last = {"error": str(exc)}
        time.sleep(0.5)
    raise AssertionError(f"the guard did not {what} within {timeout:.0f}s; last: {json.dumps(last)[:2000]}")


def answering(ask: Callable[[], str], deadline: float, expect: str = "42") -> float:
    """Ask until an answer comes (each try bounded by the client's timeout); when it did."""
    last = None
    while time.time() < deadline:
        try:
            if expect in ask():
                return time.time()
        except Exception as exc:  # connection refused, 503, a timeout: not back yet
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"no answer within the bound: {last!r}")


def quick_ask(env: dict[str, str]) -> str:
    """One question with a short timeout: a request to a hung head must not hide the heal behind its wait."""
    import openai

    client = openai.OpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0, timeout=5)
    resp = client.chat.completions.create(model=env["OPENAI_MODEL"], max_tokens=32,
                                          messages=[{"role": "user", "content": "What is 19 + 23?"}])  # fmt: skip
    return resp.choices[0].message.content or ""


def timed_heal(label: str, leader: str, fault: Callable[[], None], ask: Callable[[], str],
               kinds: tuple[str, ...]) -> dict:  # fmt: skip
    """Break the group with `fault`, run no command, and time its way back: the guard's marks and a client's
    first answer, in seconds after the fault. Returns the guard's record of the heal."""
    before = len(guard_status(leader)["heals"])
    t0 = time.time()
    fault()
    t_answer = answering(ask, t0 + BOUND_S)
    doc = wait_guard(leader, lambda s: len(s["heals"]) > before and s["state"] == "serving", what="record the heal")
    h = doc["heals"][-1]
    assert h["result"] == "served" and h["fault"] in kinds, h
    marks = {"detected": h["detected_at"] - t0, "restarted": h["restarted_at"] - t0, "serving": h["serving_at"] - t0,
             "answering": t_answer - t0}  # fmt: skip
    HEALS[label] = marks
    TIMINGS[f"heal: {label}, fault to answering"] = marks["answering"]
    assert marks["answering"] <= BOUND_S, marks
    return h
