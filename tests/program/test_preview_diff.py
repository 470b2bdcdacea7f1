"""What a pull request's `pulumi preview --diff` will show, decided at mock level, so reviewers can
trust the PR comment: a serving change replaces exactly the rank containers (and re-runs the
readiness probe), changes nothing else, and the diff never shows a secret.

The program is run twice under mocks (baseline stack file, then the changed config) and the
registered inputs are compared with a small model of what the providers do with a changed input:

- docker Container and Volume: every input is ForceNew in the docker provider, so any change is a
  replacement. (This over-approximates a few updatable container fields; for the "nothing but the
  ranks is replaced" claims an over-approximation is the safe side.)
- docker RemoteImage: a new `name` replaces it; other changes update it in place.
- command Command (remote and local): only `triggers` force a replacement; any other change is an
  in-place update, which runs `update` or, when unset, `create` again.
- docker provider: configuration changes update the provider in place (none force a replacement).
- `replace_with=[X]` (engine option): replacing X replaces the resource too.
- property dependencies: an input that comes from a replaced resource is unknown at preview, so the
  dependent is replaced when the provider would replace it for a change of that input (the group
  generation's ID in every rank's labels and the readiness probe's triggers).
A resource type without a rule fails the test, so the model is extended when the program grows.
It decides *which* resources change, never in which order: the engine runs independent steps in
parallel chains, and the order is asserted only against the real engine (tests/e2e).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from harness import TEST_API_KEY, TEST_SSH_KEY, Recording, Registered, Secret, cluster_of, reveal, run_program

CONTAINER = "docker:index/container:Container"
VOLUME = "docker:index/volume:Volume"
IMAGE = "docker:index/remoteImage:RemoteImage"
REMOTE = "command:remote:Command"
LOCAL = "command:local:Command"
PROVIDER = "pulumi:providers:docker"
REVISION_LABEL = "deepseek-spark.group-revision"


@dataclass
class Step:
    op: str  # "same", "update", "replace", "create", "delete"
    resource: Registered
    before: Registered | None = None
    changed: list[str] = field(default_factory=list)  # top-level input keys that differ
    why: str = ""


def _op_for(r: Registered, changed: list[str]) -> tuple[str, str]:
    if not changed:
        return "same", ""
    if r.type in (CONTAINER, VOLUME):
        return "replace", f"{', '.join(changed)} changed (all inputs force a new {r.type.rsplit(':', 1)[-1]})"
    if r.type in (REMOTE, LOCAL):
        if "triggers" in changed:
            return "replace", "triggers changed"
        return "update", f"{', '.join(changed)} changed (in place: create runs again)"
    if r.type == IMAGE:
        return ("replace", "name changed") if "name" in changed else ("update", f"{', '.join(changed)} changed")
    if r.type == PROVIDER:
        return "update", f"{', '.join(changed)} changed (provider config, in place)"
    raise AssertionError(f"the preview model has no rule for {r.type}: add one before trusting the diff")


def plan_steps(before: Recording, after: Recording) -> dict[str, Step]:
    """URN -> what `pulumi preview` would do with that resource when going from `before` to `after`."""
    old = {r.urn: r for r in before.resources if r.custom}
    new = {r.urn: r for r in after.resources if r.custom}
    steps: dict[str, Step] = {}
    for urn, r in new.items():
        if urn not in old:
            steps[urn] = Step("create", r)
            continue
        changed = sorted(k for k in set(r.inputs) | set(old[urn].inputs) if r.inputs.get(k) != old[urn].inputs.get(k))
        op, why = _op_for(r, changed)
        steps[urn] = Step(op, r, old[urn], changed, why)
    for urn, r in old.items():
        if urn not in new:
            steps[urn] = Step("delete", r, r)
    grew = True
    while grew:  # replace_with, replaced providers and inputs from replaced resources propagate
        grew = False
        for step in steps.values():
            if step.op in ("replace", "create", "delete"):
                continue
            r = step.resource
            causes = [u for u in r.replace_with if steps.get(u) and steps[u].op == "replace"]
            for prop, urns in r.property_dependencies.items():
                if any(steps.get(u) and steps[u].op == "replace" for u in urns) and _op_for(r, [prop])[0] == "replace":
                    causes += [u for u in urns if steps.get(u) and steps[u].op == "replace"]
            if r.provider_urn and steps.get(r.provider_urn) and steps[r.provider_urn].op == "replace":
                causes.append(r.provider_urn)
            if causes:
                step.op, grew = "replace", True
                step.why = "replaced with: " + ", ".join(steps[u].resource.name for u in causes)
    return steps


def _flat(value: Any, path: str = "") -> dict[str, str]:
    """Input tree -> {path: shown value}; a secret shows as [secret], as `pulumi preview` shows it."""
    if isinstance(value, Secret):
        return {path: "[secret]"}
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{path}.{k}" if path else k))
        return out or {path: "{}"}
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(_flat(v, f"{path}[{i}]"))
        return out or {path: "[]"}
    return {path: repr(value)}


def node_of(r: Registered, rec: Recording) -> str:
    hosts = {n["host"]: n["name"] for n in rec.outputs["nodes"]}
    if r.provider_urn:
        return rec.by_urn(r.provider_urn).name.split("-")[1]
    conn = reveal(r.inputs.get("connection"))
    if isinstance(conn, dict):
        return hosts.get(conn.get("host"), "?")
    if r.type == PROVIDER:
        return r.name.split("-")[1]
    return "local"


def render(steps: dict[str, Step], after: Recording) -> str:
    """A `preview --diff`-like text: every changed resource, its node, why, and all its inputs
    (changed ones as old => new). Everything a reviewer reads in the PR comment, and more."""
    symbol = {"replace": "+-", "update": "~", "create": "+", "delete": "-"}
    lines = []
    for step in steps.values():
        if step.op == "same":
            continue
        r = step.resource
        lines.append(f"{symbol[step.op]} {r.type} {r.name} [node {node_of(r, after)}] {step.op}: {step.why}")
        new = _flat(r.inputs)
        old = _flat(step.before.inputs) if step.before else {}
        for path in sorted(set(new) | set(old)):
            if old.get(path) == new.get(path):
                lines.append(f"      {path}: {new[path]}")
            else:
                lines.append(f"    ~ {path}: {old.get(path, '<none>')} => {new.get(path, '<none>')}")
    return "\n".join(lines)


def by_op(steps: dict[str, Step], op: str) -> set[str]:
    return {s.resource.name for s in steps.values() if s.op == op}


def _label(r: Registered, key: str) -> str:
    return next(label["value"] for label in r.inputs["labels"] if label["label"] == key)


# ------------------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def baseline() -> Recording:
    return run_program("tp4")


def test_an_unchanged_config_previews_no_changes(baseline):
    again = run_program("tp4")
    steps = plan_steps(baseline, again)
    assert {s.op for s in steps.values()} == {"same"}
    # 4 x (docker provider, preflight, image, volume, compile cache, engram shard, argcheck, memory gate, rank,
    # guard archive, guard token file, guard, monitoring image build, monitoring image, node exporter, fence) +
    # export, api key file, image agreement, group generation, fabric gate, readiness, the guard's token
    assert len(steps) == len([r for r in baseline.resources if r.custom]) == 4 * 16 + 7


def test_the_model_catches_a_forced_replacement():
    """Guard against a vacuous model: a changed volume input replaces that volume, the rank that
    mounts it (its mount source is the volume's name) and the head (its labels hold that rank's ID)."""
    before, after = run_program("tp4"), run_program("tp4")
    vol = after.named("tp4-checkpoint-spark3")
    vol.inputs = dict(vol.inputs, driverOpts={**vol.inputs["driverOpts"], "o": "addr=10.0.0.9"})
    steps = plan_steps(before, after)
    # ... the readiness probe, whose triggers are the ranks' IDs, and every node's guard (its arguments hold them).
    assert by_op(steps, "replace") == {"tp4-checkpoint-spark3", "tp4-sglang-rank2", "tp4-sglang-rank0",
                                       "tp4-readiness-check", *GUARDS}  # fmt: skip
    cmd = after.named("tp4-spark2-preflight")
    cmd.inputs = dict(cmd.inputs, create="true\n")
    assert by_op(plan_steps(before, after), "update") == {"tp4-spark2-preflight"}


GUARDS = {f"tp4-guard-spark{i}" for i in range(1, 5)}  # replaced by every change of the group, before any rank
SERVING_CHANGES = {
    "maxRunningRequests": lambda c: c["serving"].update(maxRunningRequests=16),
    "extraEnv": lambda c: c["serving"]["extraEnv"].update(TORCH_NCCL_ASYNC_ERROR_HANDLING="1"),
}


@pytest.mark.parametrize("change", sorted(SERVING_CHANGES))
def test_a_serving_change_replaces_exactly_the_rank_containers(baseline, change):
    cluster = cluster_of("tp4")
    SERVING_CHANGES[change](cluster)
    after = run_program("tp4", cluster=cluster)
    steps = plan_steps(baseline, after)
    old_rev, new_rev = baseline.outputs["group_revision"], after.outputs["group_revision"]
    assert old_rev != new_rev

    ranks = {f"tp4-sglang-rank{i}" for i in range(4)}
    # The group generation's trigger is the revision: replaced, it takes every rank with it (their
    # labels hold its ID), and the readiness probe (its triggers are the ranks' IDs) runs again.
    # Each node's read-only preflight is triggered by the revision: every group (re)start is checked first.
    preflights = {f"tp4-spark{i}-preflight" for i in range(1, 5)}
    # the fabric gate (its trigger is the revision) measures the rails again before the new ranks start,
    # and each node's memory gate (its trigger is the generation's ID) checks MemAvailable again
    group = {"tp4-sglang-generation", "tp4-sglang-fabric-check", "tp4-readiness-check"}
    memory = {f"tp4-sglang-rank{i}-memory" for i in range(4)}
    # every node's image ID is read again (the agreement's trigger is the revision)
    assert by_op(steps, "replace") == ranks | group | preflights | memory | {"tp4-image-agree"} | GUARDS
    generation = next(s for s in steps.values() if s.resource.name == "tp4-sglang-generation")
    assert generation.changed == ["create", "triggers"] and generation.resource.inputs["triggers"][0] == new_rev
    readiness = next(s for s in steps.values() if s.resource.name == "tp4-readiness-check")
    assert readiness.changed == [] and set(readiness.why.split(": ")[1].split(", ")) == ranks
    # every rank's argv is checked again by the image's parser before the group restarts
    argchecks = {f"tp4-sglang-rank{i}-argcheck" for i in range(4)}
    assert by_op(steps, "update") == argchecks
    assert by_op(steps, "create") == set() and by_op(steps, "delete") == set()

    for step in steps.values():
        if step.resource.name in ranks:
            # why: every rank carries the new group revision, and the ranks go delete-before-replace
            assert _label(step.before, REVISION_LABEL) == old_rev and _label(step.resource, REVISION_LABEL) == new_rev
            assert "labels" in step.changed and step.resource.delete_before_replace
        elif step.resource.type in (VOLUME, IMAGE) or "engram" in step.resource.name or "export" in step.resource.name:
            assert step.op == "same", step.resource.name

    text = render(steps, after)
    nodes = {node_of(s.resource, after) for s in steps.values() if s.op != "same"}
    assert nodes == {"spark1", "spark2", "spark3", "spark4", "local"}
    for i in range(4):
        assert f"tp4-sglang-rank{i} [node spark{i + 1}] replace" in text
    assert f"{old_rev!r} => {new_rev!r}" in text  # the label that says why
    assert "[secret]" in text  # the probe's key is in the rendered inputs, masked
    assert TEST_API_KEY not in text and TEST_SSH_KEY not in text
    assert TEST_API_KEY[3:19] not in text


def test_a_rank_shown_with_a_plain_key_would_leak_into_the_diff(baseline):
    """The no-secret assertion can fail: a key put in plain text into a rank's env shows up."""
    cluster = cluster_of("tp4")
    cluster["serving"]["maxRunningRequests"] = 12
    after = run_program("tp4", cluster=cluster)
    rank0 = after.named("tp4-sglang-rank0")
    rank0.inputs = dict(rank0.inputs, envs=[*rank0.inputs["envs"], f"LEAK={TEST_API_KEY}"])
    assert TEST_API_KEY in render(plan_steps(baseline, after), after)


def test_a_new_worker_address_updates_the_export_in_place_and_replaces_the_group(baseline):
    cluster = cluster_of("tp4")
    cluster["nodes"][3]["fabricIp"] = "10.0.22.14"
    after = run_program("tp4", cluster=cluster)
    steps = plan_steps(baseline, after)
    preflights = {f"tp4-spark{i}-preflight" for i in range(1, 5)}  # re-checked before every group start
    group = {"tp4-sglang-generation", "tp4-sglang-fabric-check", "tp4-readiness-check"}
    group |= {f"tp4-sglang-rank{i}-memory" for i in range(4)} | {"tp4-image-agree"}
    assert by_op(steps, "replace") == {f"tp4-sglang-rank{i}" for i in range(4)} | group | preflights | GUARDS
    # the export's create changed, its triggers did not; rank 3's argcheck runs with its new HOST_IP; the other
    # nodes' fences let the new address in as a peer (spark4's own lists only its peers: unchanged)
    fences = {f"tp4-fence-spark{i}" for i in range(1, 4)}
    assert by_op(steps, "update") == {"tp4-checkpoint-export", "tp4-sglang-rank3-argcheck"} | fences
    assert all("10.0.22.14" in s.resource.inputs["stdin"] for s in steps.values() if s.resource.name in fences)
    export = next(s for s in steps.values() if s.resource.name == "tp4-checkpoint-export")
    assert export.changed == ["create"] and "10.0.22.14(ro," in export.resource.inputs["create"]
    assert not any(s.op != "same" for s in steps.values() if s.resource.type in (VOLUME, IMAGE))


def test_a_checkpoint_revision_change_repacks_every_engram_shard_and_nothing_else_on_disk(baseline):
    cluster = cluster_of("tp4")
    cluster["model"]["revision"] = "0123456789abcdef0123456789abcdef01234567"
    after = run_program("tp4", cluster=cluster)
    steps = plan_steps(baseline, after)
    shards = {f"tp4-engram-spark{i}" for i in range(1, 5)}
    assert shards <= by_op(steps, "replace")
    for step in steps.values():
        if step.resource.name in shards:
            assert step.changed == ["create", "triggers"], step.changed  # the revision is both
            assert step.resource.inputs["triggers"][0] == cluster["model"]["revision"]
            assert step.resource.delete_before_replace and step.resource.retain_on_delete
        elif step.resource.type in (VOLUME, IMAGE, PROVIDER) or step.resource.name.endswith(("-export", "-api-key")):
            assert step.op == "same", step.resource.name
    assert TEST_API_KEY not in render(steps, after)


def test_a_checkpoint_revision_change_replaces_the_group_too(baseline):
    cluster = cluster_of("tp4")
    cluster["model"]["revision"] = "0123456789abcdef0123456789abcdef01234567"
    after = run_program("tp4", cluster=cluster)
    steps = plan_steps(baseline, after)
    assert after.outputs["group_revision"] != baseline.outputs["group_revision"]
    assert {f"tp4-sglang-rank{i}" for i in range(4)} | {"tp4-readiness-check"} <= by_op(steps, "replace")


def _group_restart(group: str) -> set[str]:
    """What restarting one group of tp4x2 replaces: its ranks, generation, fabric gate, readiness, router
    membership, each node's preflight and memory gate, and the image agreement."""
    nodes = range(1, 5) if group == "a" else range(5, 9)
    return ({f"tp4x2-{group}-sglang-rank{i}" for i in range(4)} | {f"tp4x2-{group}-spark{n}-preflight" for n in nodes}
            | {f"tp4x2-{group}-sglang-generation", f"tp4x2-{group}-readiness-check", f"tp4x2-{group}-router-member",
               f"tp4x2-{group}-sglang-fabric-check"} | {f"tp4x2-{group}-sglang-rank{i}-memory" for i in range(4)}
            | {f"tp4x2-{group}-image-agree"} | {f"tp4x2-{group}-guard-spark{n}" for n in nodes})  # fmt: skip


def test_a_change_to_one_group_of_tp4x2_leaves_the_other_group_and_the_router_alone():
    before = run_program("tp4x2")
    cluster = cluster_of("tp4x2")
    cluster["groups"][1]["serving"] = {"maxRunningRequests": 4}
    steps = plan_steps(before, run_program("tp4x2", cluster=cluster))
    # The router's own probe re-runs: its triggers are the memberships' IDs.
    assert by_op(steps, "replace") == _group_restart("b") | {"tp4x2-router-readiness-check"}
    # only group b's ranks' command lines are checked again
    argchecks = {f"tp4x2-b-sglang-rank{i}-argcheck" for i in range(4)}
    assert by_op(steps, "update") == argchecks and by_op(steps, "create") == set() and by_op(steps, "delete") == set()


def test_a_shared_serving_change_of_tp4x2_restarts_both_groups_never_the_router():
    before = run_program("tp4x2")
    cluster = cluster_of("tp4x2")
    cluster["serving"]["maxRunningRequests"] = 4
    steps = plan_steps(before, run_program("tp4x2", cluster=cluster))
    assert by_op(steps, "replace") == _group_restart("a") | _group_restart("b") | {"tp4x2-router-readiness-check"}
    assert next(s for s in steps.values() if s.resource.name == "tp4x2-router-container").op == "same"
