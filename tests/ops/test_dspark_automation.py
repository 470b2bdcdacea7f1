"""`dspark repair` and `dspark restart` (the Automation API over the CLI) against fake Automation API stacks and
fake guards: what each runs, in which order, and when it stands aside."""
from __future__ import annotations

import io

import pytest

from ops_fakes import ROOT


# ------------------------------------------------------------------------------------------ repair


class FakeAutoStack:
    """The Automation API stack as cmd_repair uses it: previews answer from `plans`, in order."""

    def __init__(self, plans: list[dict], up_changes: dict | None = None):
        self.plans = list(plans)
        self.calls: list[tuple[str, dict]] = []
        self.up_changes = up_changes or {}

    def preview(self, **kw):
        self.calls.append(("preview", kw))
        from types import SimpleNamespace

        return SimpleNamespace(change_summary=self.plans.pop(0))

    def up(self, **kw):
        self.calls.append(("up", kw))
        from types import SimpleNamespace

        return SimpleNamespace(summary=SimpleNamespace(resource_changes=self.up_changes))


def repair(plans, yes=True, up_changes=None):
    from dspark import cmd_repair
    from dspark.stack import load

    fake = FakeAutoStack(plans, up_changes)
    out, err = io.StringIO(), io.StringIO()
    code = cmd_repair.run(load("tp4", ROOT), out, err, yes=yes, policy_packs=["policy"],
                          select=lambda s: fake)  # fmt: skip
    return code, out.getvalue(), fake.calls


@pytest.mark.parametrize("state", ["healing", "backoff", "waiting", "unhealthy", "exhausted", "paused", "blocked",
                                   "starting"])  # fmt: skip
def test_repair_stands_aside_whenever_the_guard_holds_the_group(state):
    # paused: the owner's maintenance; exhausted: waiting for a person; healing: the guard's own restart. An `up`
    # in any of them restarts a group nobody chose to restart.
    from dspark import cmd_repair
    from dspark.stack import load

    st, out, err = FakeAutoStack([{"same": 30}, {"same": 22, "replace": 8}]), io.StringIO(), io.StringIO()
    code = cmd_repair.run(load("tp4", ROOT), out, err, yes=True, select=lambda s: st,
                          guards=lambda: {"tp4": {"state": state, "reason": "why"}})  # fmt: skip
    assert code == 0 and f"the guard holds tp4 ({state}: why): nothing repaired" in out.getvalue() and st.calls == []


@pytest.mark.parametrize("state", ["serving", "not looking"])
def test_repair_goes_on_when_the_guard_serves_or_is_itself_gone(state):
    from dspark import cmd_repair
    from dspark.stack import load

    st, out, err = FakeAutoStack([{"same": 30}, {"same": 22, "replace": 8}]), io.StringIO(), io.StringIO()
    code = cmd_repair.run(load("tp4", ROOT), out, err, yes=True, select=lambda s: st,
                          guards=lambda: {"tp4": {"state": state, "reason": ""}, "b": None})  # fmt: skip
    assert code == 0 and [c for c, _ in st.calls] == ["preview", "preview", "up"]


def test_repair_of_a_groups_stack_asks_every_groups_guard_and_needs_no_group(monkeypatch):
    # the drift workflow runs `dspark repair --stack tp4x2 --yes`: it used to exit asking for --group
    from dspark import __main__ as cli, cmd_guard

    asked = []

    def collect(stack, nodes):
        asked.append(stack.group)
        return {"state": "paused" if stack.group == "b" else "serving", "reason": "maintenance"}

    monkeypatch.setattr(cmd_guard, "collect", collect)
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["repair", "--stack", "tp4x2", "--yes", "--project-dir", str(ROOT)], out=out, err=err)
    assert code == 0, err.getvalue()
    assert asked == ["a", "b"] and "the guard holds b (paused: maintenance)" in out.getvalue()


def test_repair_refuses_a_config_change_nobody_applied():
    code, out, calls = repair([{"same": 30, "replace": 8}])
    assert code == 4 and "never applied" in out and "pulumi up --stack tp4" in out
    assert [c for c, _ in calls] == ["preview"] and "refresh" not in calls[0][1]


def test_repair_without_drift_changes_nothing():
    code, out, calls = repair([{"same": 30}, {"same": 30, "refresh": 30}])
    assert code == 0 and "no drift" in out
    assert [c for c, _ in calls] == ["preview", "preview"] and calls[1][1]["refresh"] is True


def test_repair_reports_drift_and_repairs_only_with_yes():
    code, out, calls = repair([{"same": 30}, {"same": 22, "replace": 8}], yes=False)
    assert code == 2 and "8 to replace" in out and "--yes" in out and "up" not in [c for c, _ in calls]
    code, out, calls = repair([{"same": 30}, {"same": 22, "replace": 8}], up_changes={"same": 22, "replace": 8})
    assert code == 0 and "repaired (8 to replace)" in out
    assert calls[-1][0] == "up" and calls[-1][1]["refresh"] is True
    assert all(kw["policy_packs"] == ["policy"] and callable(kw["on_event"]) for _, kw in calls)


# ------------------------------------------------------------------------------------------ restart


class FakeRestartStack(FakeAutoStack):
    def __init__(self, plans, resources, up_changes=None):
        super().__init__(plans, up_changes)
        self.resources = resources

    def export_stack(self):
        from types import SimpleNamespace

        return SimpleNamespace(deployment={"resources": self.resources})


GEN = "urn:pulumi:tp4::deepseek-spark::deepseek-spark:index:Deployment$command:local:Command::tp4-sglang-generation"
RANK1 = "urn:pulumi:tp4::deepseek-spark::deepseek-spark:index:Deployment$docker:index/container:Container::tp4-sglang-rank1"


def restart(plans, resources, yes=True, up_changes=None):
    from dspark import cmd_restart
    from dspark.stack import load

    fake = FakeRestartStack(plans, resources, up_changes)
    out, err = io.StringIO(), io.StringIO()
    code = cmd_restart.run(load("tp4", ROOT), out, err, yes=yes, select=lambda s: fake)
    return code, out.getvalue(), fake.calls


def test_restart_replaces_the_groups_generation_and_shows_the_preview_without_yes():
    """The restart is `up --replace <the group's generation>`; without --yes only its preview."""
    resources = [{"urn": GEN}, {"urn": RANK1, "initErrors": ["creating ...: Unable to start container"]}]
    code, out, calls = restart([], resources, up_changes={"replace": 6})
    assert code == 0 and f"--replace {GEN}" in out and "restarted the serving group (6 to replace)" in out
    assert without_events(calls) == [("up", {"replace": [GEN], "policy_packs": None, "color": "never"})]
    code, out, calls = restart([{"same": 34, "replace": 6}], resources, yes=False)
    assert code == 2 and "would do: 6 to replace" in out and without_events(calls) == [
        ("preview", {"replace": [GEN], "policy_packs": None, "color": "never"})]


def without_events(calls):
    """The calls' options but the event callback (every run passes one: the failure's diagnostics)."""
    return [(op, {k: v for k, v in kw.items() if k != "on_event"}) for op, kw in calls]


class FailingStack(FakeRestartStack):
    """An `up` that fails as the engine reports it: error diagnostics (a resource's, then the update's) as events,
    then the Automation API's CommandError, whose text ends with the CLI's last lines."""

    def up(self, **kw):
        from pulumi import automation as auto
        from pulumi.automation._cmd import CommandResult
        from pulumi.automation.events import DiagnosticEvent, EngineEvent

        for urn, message in ((RANK1, "error: creating container: Unable to start container: nvidia-container-cli: "
                                     "requirement error: unsatisfied condition: cuda>=13.1\n  (the node's driver)"),
                             ("", "error: update failed")):  # fmt: skip
            kw["on_event"](EngineEvent(1, 0, diagnostic_event=DiagnosticEvent(message, "never", "error", urn=urn or None)))
        raise auto.CommandError(CommandResult(
            "\n".join(f"output line {i}" for i in range(60)) + "\nResources:\n    33 unchanged\n", "error: update failed", 255))


def test_a_failed_restart_names_the_failing_resource_and_its_error_first():
    from dspark import cmd_restart
    from dspark.stack import load

    out, err = io.StringIO(), io.StringIO()
    code = cmd_restart.run(load("tp4", ROOT), out, err, yes=True, select=lambda s: FailingStack([], [{"urn": GEN}]))
    lines = err.getvalue().splitlines()
    assert code == 1 and lines[0] == "tp4: restart failed:"
    assert lines[1] == "  tp4-sglang-rank1 (docker:index/container:Container):"
    assert "unsatisfied condition: cuda>=13.1" in lines[2] and lines[3].strip() == "(the node's driver)"
    assert lines[4].strip() == "error: update failed"  # the engine's own, after the resource's
    assert "output line 0" not in err.getvalue()  # then only the end of what the engine printed


def test_restart_of_a_stack_never_brought_up_says_so():
    from dspark.stack import DsparkError

    with pytest.raises(DsparkError, match="has no generation in the stack's state"):
        restart([], [{"urn": RANK1}])
