"""The stack through the Pulumi Automation API, as `repair` and `restart` drive it: the project's own program run
the CLI's way (a local program: the CLI in the project folder starts the Python language host, which runs
__main__.py in the project's virtualenv), and a failure told by the engine's own diagnostics first: the resource
that failed and its error lines, then the rest of what the engine said.

The Automation API runs the CLI as a child process of this one. A Ctrl-C in a terminal reaches the whole
foreground process group, the CLI too: it cancels the update cleanly and unlocks the stack while this process
waits for it (the Automation API reads the CLI's output to its end before it raises).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Any

from .stack import DsparkError, Stack

IGNORED = {"same", "refresh", "read"}  # steps that change nothing on a node


def changes(summary: dict) -> dict[str, int]:
    """{operation: count} of a preview's change summary, without the steps that change nothing."""
    return {str(op): int(n) for op, n in (summary or {}).items() if str(op) not in IGNORED and n}


def describe(found: dict[str, int]) -> str:
    return ", ".join(f"{n} to {op}" for op, n in sorted(found.items()))


def failure_tail(exc: Exception, lines: int = 20) -> str:
    """The last lines of a failed Automation API command (the CLI's own error is at the end)."""
    return "\n".join(str(exc).strip().splitlines()[-lines:])


def select_failure(stack: Stack, exc: Exception) -> DsparkError:
    return DsparkError(f"cannot select stack {stack.name}: {failure_tail(exc, 1)}")


def _name(urn: str) -> tuple[str, str]:
    """(resource name, type) of a URN (`urn:pulumi:s::p::parent$type::name`)."""
    head, _, name = urn.rpartition("::")
    return name, head.rpartition("::")[2].rpartition("$")[2]


@dataclass
class Diagnostics:
    """The engine's error diagnostics of one run (its events: pass as `on_event`), resource by resource."""

    errors: list[tuple[str, str]] = field(default_factory=list)  # (urn or "", message)

    def __call__(self, event: Any) -> None:
        d = getattr(event, "diagnostic_event", None)
        if d is not None and d.severity == "error" and (d.message or "").strip():
            self.errors.append((d.urn or "", d.message.strip()))

    def report(self) -> list[str]:
        """The failing resources first (name, type, their error lines), then the engine's own errors."""
        lines = []
        for urn, message in sorted(self.errors, key=lambda e: not e[0]):
            if urn:
                name, kind = _name(urn)
                lines.append(f"  {name} ({kind}):")
            lines += [f"    {line}" for line in message.splitlines() if line.strip()]
        return lines


def failure(stack: Stack, what: str, exc: Exception, diagnostics: Diagnostics) -> str:
    """What a failed run says: the engine's diagnostics first, then the last lines of its output."""
    report = diagnostics.report()
    text = f"{stack.short}: {what} failed"
    if report:
        text += ":\n" + "\n".join(report) + "\n  the engine's last lines:\n"
    else:
        text += "; the engine's last lines:\n"
    return text + "\n".join(f"    {line}" for line in failure_tail(exc).splitlines()) + "\n"


def workspace_stack(stack: Stack):
    """The stack through the Automation API with the project's program run as the CLI runs it (no inline
    program): `pulumi` from PATH, else the one .ci/setup built."""
    from pulumi import automation as auto

    from . import engine

    command = None
    if shutil.which("pulumi") is None:
        try:
            command = auto.PulumiCommand(root=str(engine.engine_dir().parent))
        except engine.EngineMissing as exc:
            raise DsparkError(f"no `pulumi` on PATH and {exc}") from None
    ws = auto.LocalWorkspace(work_dir=str(stack.project_dir), pulumi_command=command)
    return auto.Stack.select(stack.name, ws)
