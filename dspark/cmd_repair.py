"""repair: put back what drifted on the nodes, and nothing else (meant to run on a timer).

1. preview without refresh: the stack file must plan no change against what was last applied. A
   pending change (a merged config nobody applied yet) needs a reviewed `pulumi up`: exit 4,
   nothing touched.
2. preview with refresh: what differs between the state and the nodes (a rank stopped or removed,
   a guard, the router or the gateway stopped, ...). Nothing: exit 0.
3. with --yes, `up --refresh`: the program puts it back (a stopped rank restarts the whole group,
   as after `pulumi refresh` + `up`). Without --yes: exit 2, the drift listed.
Repair stands aside (exit 0, nothing touched) unless every group's guard (serving.selfHeal) reports `serving`:
while a guard heals, its refresh would see the ranks the guard stopped and its `up` would replace the group under
it; a guard `paused` means the owner holds the group for maintenance, `exhausted` that it waits for a person;
either way an `up` would restart a group nobody chose to restart. On a stack with groups it asks every group's
guard (or the one --group names). A guard that is not looking (no journal written lately: the guard itself is
gone) holds nothing, so repair goes on and its refresh sees the missing guard like any other drift.
What a refresh cannot see (a file changed inside a container, a key file's content) is not repaired.

It runs the project's program as `pulumi up` does (dspark/automation.py: the Automation API over the CLI in the
project folder, the language host and the project's virtualenv), with the same backend, secrets provider and
policy packs as a user's `pulumi up`; a failure names the resource and its error first.
Exit: 0 no drift or repaired, 1 repair failed, 2 drift found (no --yes), 4 a config change is pending.
"""

from __future__ import annotations

from typing import Callable, Optional, TextIO

from .automation import Diagnostics, changes, describe, failure, select_failure, workspace_stack
from .stack import Stack

GOES_ON = ("serving", "not looking")  # the guard states in which a repair may act (see above)


def holding(guards: dict[str, Optional[dict]]) -> list[str]:
    """The groups whose guard holds them (every state but serving and not looking), as `group (state: reason)`."""
    return [f"{name} ({g['state']}: {g.get('reason') or ''})" for name, g in guards.items()
            if g is not None and g.get("state") not in GOES_ON]  # fmt: skip


def run(stack: Stack, out: TextIO, err: TextIO, yes: bool = False, policy_packs: Optional[list[str]] = None,
        select: Callable[[Stack], object] = workspace_stack,
        guards: Optional[Callable[[], dict[str, Optional[dict]]]] = None) -> int:  # fmt: skip
    from pulumi import automation as auto

    held = holding(guards() if guards else {})
    if held:
        # A refresh would record the ranks a healing guard stopped, and `up` would restart a group its guard holds
        # (healing, paused for maintenance, given up and waiting for a person): stand aside; the next run looks again.
        out.write(f"{stack.short}: the guard holds {'; '.join(held)}: nothing repaired, nothing touched (the next "
                  "run looks again; `dspark guard resume` hands a paused group back)\n")  # fmt: skip
        return 0
    try:
        st = select(stack)
    except auto.CommandError as exc:
        raise select_failure(stack, exc) from None
    diagnostics = Diagnostics()
    opts = dict(policy_packs=policy_packs or None, color="never", on_event=diagnostics)
    try:
        pending = changes(st.preview(**opts).change_summary)
        if pending:
            out.write(f"{stack.short}: Pulumi.{stack.short}.yaml plans changes ({describe(pending)}) that were "
                      f"never applied; they need a reviewed `pulumi up --stack {stack.name}`, not a repair. "
                      "Nothing touched.\n")  # fmt: skip
            return 4
        drift = changes(st.preview(refresh=True, **opts).change_summary)
        if not drift:
            out.write(f"{stack.short}: no drift\n")
            return 0
        if not yes:
            out.write(f"{stack.short}: drift found ({describe(drift)}); run again with --yes to repair\n")
            return 2
        out.write(f"{stack.short}: drift found ({describe(drift)}); repairing with `up --refresh`\n")
        result = st.up(refresh=True, **opts)
    except auto.CommandError as exc:
        err.write(failure(stack, "repair", exc, diagnostics))
        return 1
    done = changes(result.summary.resource_changes or {})
    out.write(f"{stack.short}: repaired ({describe(done) or 'nothing changed'})\n")
    return 0
