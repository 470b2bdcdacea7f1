"""The guards' signed requests: only the group's token, this node, this run of the guard, now, once."""

import json

import pytest

from programs.guard import wire

TOKEN = b"0123456789abcdef" * 4


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def verifier(clock):
    return wire.Verifier(TOKEN, "spark2", "inst-1", clock=clock)


def req(clock, action="stop", to="spark2", instance="inst-1", token=TOKEN, **fields):
    return wire.request(token, to, instance, action, clock=clock, container="c2", **fields)


def refused(verifier, body, sig) -> wire.Refused:
    with pytest.raises(wire.Refused) as exc:
        verifier.check(body, sig)
    return exc.value


def test_a_request_signed_with_the_token_for_this_node_and_run_is_accepted(verifier, clock):
    body, sig, nonce = req(clock)
    doc = verifier.check(body, sig)
    assert doc["action"] == "stop" and doc["container"] == "c2" and doc["nonce"] == nonce


def test_a_forged_or_altered_request_is_refused(verifier, clock):
    body, sig, _ = req(clock, token=b"another-token" * 4)
    assert refused(verifier, body, sig).status == 401
    body, sig, _ = req(clock)
    altered = body.replace(b'"c2"', b'"c9"')
    assert refused(verifier, altered, sig).status == 401
    assert refused(verifier, body, None).status == 401


def test_a_replayed_request_is_refused(verifier, clock):
    body, sig, _ = req(clock)
    verifier.check(body, sig)
    clock.t += 5
    assert "replayed" in refused(verifier, body, sig).reason


def test_a_stale_or_future_request_is_refused(verifier, clock):
    body, sig, _ = req(clock)
    clock.t += wire.WINDOW_S + 1
    assert refused(verifier, body, sig).status == 401
    clock.t -= 2 * (wire.WINDOW_S + 1)
    assert "clock" in refused(verifier, body, sig).reason


def test_a_request_for_another_node_is_refused(verifier, clock):
    body, sig, _ = req(clock, to="spark3")
    assert refused(verifier, body, sig).status == 403


def test_an_action_for_an_earlier_run_of_the_guard_is_refused_but_its_state_may_be_read(verifier, clock):
    body, sig, _ = req(clock, instance="inst-0")
    assert refused(verifier, body, sig).status == 409
    body, sig, _ = req(clock, action="state", instance="")
    assert verifier.check(body, sig)["action"] == "state"


def test_only_the_protocols_actions_exist(verifier, clock):
    with pytest.raises(ValueError):
        req(clock, action="exec")
    doc = {"to": "spark2", "instance": "inst-1", "action": "exec", "ts": clock(), "nonce": "n", "container": "c2"}
    body = wire.encode(doc)
    assert refused(verifier, body, wire.signature(TOKEN, body)).status == 403


def test_answers_are_signed_and_bound_to_their_request():
    body, sig = wire.answer(TOKEN, "nonce-1", {"rank": {"state": "running"}})
    assert wire.check_answer(TOKEN, "nonce-1", body, sig)["rank"]["state"] == "running"
    with pytest.raises(wire.Refused):
        wire.check_answer(TOKEN, "nonce-2", body, sig)  # an answer to another request
    forged = json.dumps({"re": "nonce-1", "rank": {"state": "exited"}}).encode()
    with pytest.raises(wire.Refused):
        wire.check_answer(TOKEN, "nonce-1", forged, wire.signature(b"x" * 64, forged))
