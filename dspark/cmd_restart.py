"""restart: start a serving group over, as a whole: every rank replaced, workers first, the head last.

A tensor-parallel group is fail-stop: once a rank is down (it never started, exited, or was
removed), the others cannot serve either, and a refresh sees only what happens to be stopped now.
So the way back is the program's own group restart: `up` with the group's generation replaced
(`pulumi up --replace <its URN>`). Its delete-before-replace takes every rank down in one chain
(the head first) before the start gates run again and the new ranks start (workers, then the
head); readiness ends the `up`. Nothing else changes: no config change is applied by a restart
that the stack file does not already hold (a pending one is refused, as repair does).

Without --yes: the preview of that `up` (exit 2). Exit: 0 restarted, 1 failed, 2 preview only,
4 a config change is pending.
"""

from __future__ import annotations

from typing import Callable, Optional, TextIO

from .cmd_repair import _describe, changes, workspace_stack
from .stack import DsparkError, Stack


def generation_urns(resources: list[dict], stack: Stack) -> list[str]:
    """The URN of the group generation `stack` names (its group's, or the stack's single group's)."""
    name = f"{stack.plan_name}-{stack.cfg.engine}-generation"
    return [r["urn"] for r in resources if r.get("urn", "").endswith(f"::{name}")]


def pending_config(summary: dict, resources: list[dict]) -> dict[str, int]:
    """What a plain preview plans beyond what a failed `up` left to finish: a resource the state holds with init
    errors (a container created but never started) gets an update step on every `up` until one succeeds, and
    resources that were never created are creates; neither is a config change nobody applied."""
    found = changes(summary)
    unfinished = sum(1 for r in resources if r.get("initErrors"))
    if unfinished and "update" in found:
        found["update"] -= min(unfinished, found["update"])
    found.pop("create", None)  # the restart creates what a failed `up` did not get to
    return {op: n for op, n in found.items() if n}


def run(stack: Stack, out: TextIO, err: TextIO, yes: bool = False, policy_packs: Optional[list[str]] = None,
        select: Callable[[Stack], object] = workspace_stack) -> int:  # fmt: skip
    from pulumi import automation as auto

    try:
        st = select(stack)
        resources = st.export_stack().deployment.get("resources") or []
    except auto.CommandError as exc:
        raise DsparkError(f"cannot select stack {stack.name}: {str(exc).strip().splitlines()[-1]}") from None
    urns = generation_urns(resources, stack)
    what = f"group {stack.group}" if stack.group else "the serving group"
    if not urns:
        raise DsparkError(f"{stack.short}: {what} has no generation in the stack's state: nothing to restart "
                          f"(run `pulumi up --stack {stack.name}` first)")  # fmt: skip
    opts = dict(policy_packs=policy_packs or None, color="never")
    try:
        pending = pending_config(st.preview(**opts).change_summary, resources)
        if pending:
            out.write(f"{stack.short}: Pulumi.{stack.short}.yaml plans changes ({_describe(pending)}) that were "
                      f"never applied; apply them with a reviewed `pulumi up --stack {stack.name}` (it restarts "
                      "the group if they need it). Nothing touched.\n")  # fmt: skip
            return 4
        if not yes:
            planned = changes(st.preview(replace=urns, **opts).change_summary)
            out.write(f"{stack.short}: restarting {what} would do: {_describe(planned)}; run again with --yes\n")
            return 2
        out.write(f"{stack.short}: restarting {what} (`pulumi up --replace {urns[0]}`)\n")
        result = st.up(replace=urns, **opts)
    except auto.CommandError as exc:
        tail = "\n".join(str(exc).strip().splitlines()[-20:])
        err.write(f"{stack.short}: restart failed:\n{tail}\n")
        return 1
    out.write(f"{stack.short}: restarted {what} ({_describe(changes(result.summary.resource_changes or {}))})\n")
    return 0
