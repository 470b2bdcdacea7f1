"""The leader's journal: one JSON file in the guard's state directory on the head node (a host directory,
so it outlives the guard's container, a restart of it and a reboot). It holds what the leader remembers
(decide.Memory), the heal in progress (so a guard killed mid-heal starts it over once it is back instead
of leaving a half-restarted group), the last heals (fault, when, how long until serving), the last
decision and a heartbeat. `dspark status` and `dspark doctor` read it over ssh; the guard's /status
serves the same document. Written atomically (a temporary file renamed over it)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from .decide import Memory

FILE = "journal.json"
PAUSE_FILE = "paused.json"  # the maintenance marker (`dspark guard pause` writes it over ssh)
RETRY_FILE = "retry"  # `dspark guard resume`: after giving up, try again (the guard removes it)
KEEP = 20  # heals kept in the journal
VERSION = 1


class Journal:
    def __init__(self, directory: str, armed: list[str]):
        self.path = Path(directory) / FILE
        self.pause_path = Path(directory) / PAUSE_FILE
        self.retry_path = Path(directory) / RETRY_FILE
        self.armed = list(armed)  # the containers this run of the guard may start: Pulumi's, by ID
        self.memory = Memory()
        self.heals: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}  # "<fault>|<result>" -> heals (dspark_guard_heals_total), every group's
        self.healing: Optional[dict[str, Any]] = None  # the heal in progress: attempt, fault, step, since
        self.state, self.reason = "starting", "the guard just started"
        self.extra: dict[str, Any] = {}  # the last figures for /status: ranks, peers, services

    def load(self) -> None:
        """Read the journal; the memory and the heal in progress only when they are about these containers
        (a new group, after Pulumi replaced it, starts with a clean slate but keeps the history of heals)."""
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        self.heals = list(doc.get("heals") or [])[-KEEP:]
        self.counts = {str(k): int(v) for k, v in (doc.get("counts") or {}).items()}
        if doc.get("armed") == self.armed:
            self.memory = Memory.from_json(doc.get("memory") or {})
            self.healing = doc.get("healing")

    def paused(self) -> Optional[str]:
        """The maintenance marker's reason (and until when), None when not paused or when it expired."""
        try:
            doc = json.loads(self.pause_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return "a maintenance marker that cannot be read"
        until = doc.get("until")
        if until and time.time() > float(until):
            return None
        by = f" by {doc['by']}" if doc.get("by") else ""
        till = f" until {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(float(until)))}" if until else ""
        return f"{doc.get('reason') or 'no reason given'}{by}{till}"

    def retry_requested(self) -> bool:
        """An operator asked to try again (`dspark guard resume`): the request is taken (the file removed)."""
        try:
            self.retry_path.unlink()
        except FileNotFoundError:
            return False
        except OSError:
            return False
        return True

    def record(self, heal: dict[str, Any]) -> None:
        self.heals = [*self.heals, heal][-KEEP:]

    def document(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "armed": self.armed,
            "state": self.state,
            "reason": self.reason,
            "heartbeat": time.time(),
            "memory": self.memory.to_json(),
            "healing": self.healing,
            "heals": self.heals,
            "counts": self.counts,
            **self.extra,
        }

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".journal-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.document(), f, indent=1, sort_keys=True)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
