"""restart: start a serving group over, as a whole: every rank replaced, workers first, the head last.

A tensor-parallel group is fail-stop: once a rank is down (it never started, exited, or was
removed), the others cannot serve either, and a refresh sees only what happens to be stopped now.
So the way back is the program's own group restart: `up` with the group's generation replaced
(`pulumi up --replace <its URN>`). Its delete-before-replace takes every rank down in one chain
(the head first) before the start gates run again and the new ranks start (workers, then the
head); readiness ends the `up`. Like `pulumi up`, it applies the stack file as it is: run it from
the reviewed checkout. (A pending-change guard like repair's cannot work here: the `up` that left a
rank down also left steps to finish, e.g. the readiness probe's replacement, which a preview shows.)

Without --yes: the preview of that `up` (exit 2). Exit: 0 restarted, 1 failed, 2 preview only.
"""

from __future__ import annotations

from typing import Callable, Optional, TextIO

from .automation import Diagnostics, changes, describe, failure, select_failure, workspace_stack
from .stack import DsparkError, Stack


def generation_urns(resources: list[dict], stack: Stack) -> list[str]:
    """The URN of the group generation `stack` names (its group's, or the stack's single group's)."""
    name = f"{stack.plan_name}-{stack.cfg.engine}-generation"
    return [r["urn"] for r in resources if r.get("urn", "").endswith(f"::{name}")]


def run(stack: Stack, out: TextIO, err: TextIO, yes: bool = False, policy_packs: Optional[list[str]] = None,
        select: Callable[[Stack], object] = workspace_stack) -> int:  # fmt: skip
    from pulumi import automation as auto

    try:
        st = select(stack)
        resources = st.export_stack().deployment.get("resources") or []
    except auto.CommandError as exc:
        raise select_failure(stack, exc) from None
    urns = generation_urns(resources, stack)
    what = f"group {stack.group}" if stack.group else "the serving group"
    if not urns:
        raise DsparkError(f"{stack.short}: {what} has no generation in the stack's state: nothing to restart "
                          f"(run `pulumi up --stack {stack.name}` first)")  # fmt: skip
    diagnostics = Diagnostics()
    opts = dict(policy_packs=policy_packs or None, color="never", on_event=diagnostics)
    try:
        if not yes:
            planned = changes(st.preview(replace=urns, **opts).change_summary)
            out.write(f"{stack.short}: restarting {what} would do: {describe(planned)}; run again with --yes\n")
            return 2
        out.write(f"{stack.short}: restarting {what} (`pulumi up --replace {urns[0]}`)\n")
        result = st.up(replace=urns, **opts)
    except auto.CommandError as exc:
        err.write(failure(stack, "restart", exc, diagnostics))
        return 1
    out.write(f"{stack.short}: restarted {what} ({describe(changes(result.summary.resource_changes or {}))})\n")
    return 0
