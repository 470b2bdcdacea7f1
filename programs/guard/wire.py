"""Signed requests between the guards of one group (stdlib only).

The leader asks a node's guard to report, stop or start that node's rank or to run its start gates. A
request is a JSON document signed with the group's token (HMAC-SHA256 over its exact bytes). The guard
that receives it acts only when the signature is the token's, the request is addressed to this node
(`to`) and, for anything but a report, to this run of the guard (`instance`, random at every start, so
a request recorded before a restart is worthless after it), its timestamp is within WINDOW_S of the
node's clock, and its nonce was not seen before (kept for the window). Answers are signed too, bound
to the request's nonce (`re`), so a forged guard cannot make the leader believe a rank died.

The token never travels: it is a file on every node of the group (0600, written by the program over
ssh, mounted read-only into the guard), generated where Pulumi runs and kept in its state as a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from typing import Any, Callable

WINDOW_S = 30.0  # how far a request's clock may be from the receiver's (the nodes keep NTP time)
HEADER = "X-Dspark-Guard-Signature"
ACTIONS = ("state", "tail", "stop", "start", "gates")  # what one guard may ask another: nothing else
READ_ONLY = ("state", "tail")


class Refused(Exception):
    """A request (or an answer) that must not be acted on; `status` is the HTTP status to answer."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status}: {reason}")
        self.status = status
        self.reason = reason


def signature(token: bytes, body: bytes) -> str:
    return hmac.new(token, body, hashlib.sha256).hexdigest()


def encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def request(token: bytes, to: str, instance: str, action: str, clock: Callable[[], float] = time.time,
            **fields: Any) -> tuple[bytes, str, str]:  # fmt: skip
    """(body, its signature, its nonce) of one request to the guard of node `to`."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    nonce = secrets.token_hex(16)
    body = encode({"to": to, "instance": instance, "action": action, "ts": clock(), "nonce": nonce, **fields})
    return body, signature(token, body), nonce


def answer(token: bytes, nonce: str, payload: dict[str, Any]) -> tuple[bytes, str]:
    """A signed answer to the request whose nonce was `nonce`."""
    body = encode({"re": nonce, **payload})
    return body, signature(token, body)


def check_answer(token: bytes, nonce: str, body: bytes, sig: str | None) -> dict[str, Any]:
    """The answer's document, once its signature is the token's and it answers request `nonce`."""
    if not sig or not hmac.compare_digest(signature(token, body), sig):
        raise Refused(502, "the answer is not signed with the group's token")
    doc = json.loads(body)
    if doc.get("re") != nonce:
        raise Refused(502, "the answer is not for this request")
    return doc


class Verifier:
    """Checks the requests addressed to this node's guard (one per guard run)."""

    def __init__(self, token: bytes, node: str, instance: str, clock: Callable[[], float] = time.time,
                 window: float = WINDOW_S):  # fmt: skip
        self.token, self.node, self.instance = token, node, instance
        self.clock, self.window = clock, window
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def check(self, body: bytes, sig: str | None) -> dict[str, Any]:
        """The request's document, or Refused saying why it must not be acted on."""
        if not sig or not hmac.compare_digest(signature(self.token, body), sig):
            raise Refused(401, "not signed with the group's token")
        try:
            doc = json.loads(body)
            ts, nonce, action = float(doc["ts"]), str(doc["nonce"]), str(doc["action"])
        except (ValueError, KeyError, TypeError):
            raise Refused(400, "not a guard request") from None
        if doc.get("to") != self.node:
            raise Refused(403, f"addressed to {doc.get('to')!r}, not to {self.node!r}")
        if action not in ACTIONS:
            raise Refused(403, f"no such action: {action!r}")
        if action not in READ_ONLY and doc.get("instance") != self.instance:
            raise Refused(409, "addressed to an earlier run of this guard (it restarted): ask for its state again")
        now = self.clock()
        if abs(now - ts) > self.window:
            raise Refused(401, f"timestamp {now - ts:+.0f} s from this node's clock (more than {self.window:.0f} s)")
        with self._lock:
            for old in [n for n, t in self._seen.items() if now - t > 2 * self.window]:
                del self._seen[old]
            if nonce in self._seen:
                raise Refused(401, "replayed (this nonce was already used)")
            self._seen[nonce] = now
        return doc
