"""The guard as the operator sees it: `dspark status` says what it does and changes the advice accordingly
(never `pulumi up --refresh` while it heals), and `dspark guard pause|resume|status` work on fake nodes."""

from __future__ import annotations

import io
import json
import time

import harness
from declared.cluster import parse_cluster
from dspark.__main__ import main
from ops_fakes import FakeEndpoint, cluster_for, journal, outputs, state
from planning import guard as guard_plan
from planning import plan

STACK = "tp3"
CFG = parse_cluster(harness.group_of(STACK))
JOURNAL = guard_plan.directory(CFG, 0, STACK) + "/journal.json"
HEAD = "10.0.0.1"


def run(argv, **kw):
    out, err = io.StringIO(), io.StringIO()
    return main(argv, out=out, err=err, **kw), out.getvalue(), err.getvalue()


def status(tmp_path, fake, text=False):
    rev = plan.group_revision(plan.group_specs(CFG, STACK), plan.image_build_digest(CFG))
    with FakeEndpoint(health=200 if fake.nodes[HEAD].containers[f"{STACK}-rank0"].state["Running"] else 503) as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, rev)
        code, out, _ = run(["status", "--stack", STACK, "--outputs-file", outs, *([] if text else ["--json"])],
                           runner=fake)  # fmt: skip
    return code, (out if text else json.loads(out))


def fake_cluster(**journal_fields):
    rev = plan.group_revision(plan.group_specs(CFG, STACK), plan.image_build_digest(CFG))
    fake = cluster_for(CFG, STACK, rev, log="INFO The server is fired up and ready to roll!\n")
    if journal_fields:
        fake.nodes[HEAD].texts[JOURNAL] = journal(**journal_fields)
    return fake


def test_a_healthy_group_shows_its_guard_serving_on_every_node(tmp_path):
    code, doc = status(tmp_path, fake_cluster())
    g = doc["guard"]
    assert code == 0 and g["state"] == "serving" and g["leader"] == "spark1"
    assert g["containers"] == {"spark1": "running", "spark2": "running", "spark3": "running"}


def test_while_the_guard_heals_status_says_so_instead_of_advising_a_refresh_that_would_fight_it(tmp_path):
    fake = fake_cluster(state="healing", reason="attempt 1 of 3: rank 1 (spark2) exited with code 137",
                        healing={"attempt": 1, "step": "boot"})  # fmt: skip
    fake.nodes["10.0.0.2"].containers[f"{STACK}-rank1"].state = state("exited", 137)
    code, doc = status(tmp_path, fake)
    assert code == 2 and doc["verdict"] == "down"
    assert len(doc["fixes"]) == 1 and "bringing the group back by itself" in doc["fixes"][0]
    assert "guard pause" in doc["fixes"][0] and "pulumi up --refresh" not in " ".join(doc["fixes"])


def test_once_the_guard_gave_up_status_names_the_reason_and_the_way_back(tmp_path):
    why = "gave up after 3 attempt(s): rank 2 (spark3) exited with code 1 while the group booted"
    fake = fake_cluster(state="exhausted", reason=why)
    fake.nodes["10.0.0.3"].containers[f"{STACK}-rank2"].state = state("exited", 1)
    code, text = status(tmp_path, fake, text=True)
    assert code == 2 and f"the guard gave up: {why}" in text
    assert f"python -m dspark guard resume --stack {STACK}" in text and f"dspark restart --stack {STACK} --yes" in text


def test_a_guard_that_is_not_running_or_not_looking_degrades_a_healthy_group(tmp_path):
    fake = fake_cluster()
    fake.nodes["10.0.0.2"].containers[f"{STACK}-guard"].state = state("exited", 137)
    code, doc = status(tmp_path, fake)
    assert code == 1 and doc["verdict"] == "degraded" and any("exited on spark2" in p for p in doc["problems"])
    stale = fake_cluster(state="serving", reason="ok", heartbeat=time.time() - 600)
    code, doc = status(tmp_path, stale)
    assert code == 1 and doc["guard"]["state"] == "not looking"


def test_the_last_heals_are_shown_with_their_seconds_after_the_fault(tmp_path):
    heal = {"attempt": 1, "fault": "rank-exited", "detail": "rank 1 (spark2) exited with code 137", "fault_at": 1000.0,
            "detected_at": 1004.6, "restarted_at": 1005.9, "serving_at": 1006.9, "seconds_to_serve": 6.9,
            "result": "served"}  # fmt: skip
    code, text = status(tmp_path, fake_cluster(state="serving", reason="healed", heals=[heal]), text=True)
    assert code == 0 and "rank-exited attempt 1 served: detected +4.6 s, restarted +5.9 s, serving +6.9 s" in text


def test_pause_writes_the_marker_with_the_reason_as_data_and_resume_removes_it(tmp_path):
    fake = fake_cluster()
    reason = "switch firmware $(touch /tmp/x) `id`"
    code, out, _ = run(["guard", "pause", "--stack", STACK, "--reason", reason, "--for", "2h"], runner=fake)
    assert code == 0 and "paused" in out
    marker = json.loads(fake.nodes[HEAD].texts[guard_plan.directory(CFG, 0, STACK) + "/paused.json"])
    assert marker["reason"] == reason and 7100 < marker["until"] - marker["since"] <= 7200
    code, out, _ = run(["guard", "resume", "--stack", STACK], runner=fake)
    texts = fake.nodes[HEAD].texts
    assert code == 0 and guard_plan.directory(CFG, 0, STACK) + "/paused.json" not in texts
    assert guard_plan.directory(CFG, 0, STACK) + "/retry" in texts


def test_guard_status_exits_by_what_the_guard_does(tmp_path):
    assert run(["guard", "status", "--stack", STACK], runner=fake_cluster())[0] == 0
    assert run(["guard", "status", "--stack", STACK], runner=fake_cluster(state="paused", reason="x"))[0] == 1
    assert run(["guard", "status", "--stack", STACK], runner=fake_cluster(state="exhausted", reason="x"))[0] == 2
    fake = fake_cluster()
    del fake.nodes[HEAD].texts[JOURNAL]
    code, out, _ = run(["guard", "status", "--stack", STACK, "--json"], runner=fake)
    assert code == 2 and "no journal on spark1" in json.loads(out)["reason"]


def test_doctor_checks_the_guard_itself(tmp_path):
    fake = fake_cluster(state="exhausted", reason="gave up after 3 attempt(s): x")
    d2 = guard_plan.directory(CFG, 1, STACK)
    fake.nodes["10.0.0.2"].texts[f"{d2}/{guard_plan.TOKEN}"] = "644 65"  # readable by anyone on the node
    fake.nodes["10.0.0.3"].containers[f"{STACK}-guard"].state = state("exited", 0)
    fake.nodes["10.0.0.3"].texts[guard_plan.directory(CFG, 2, STACK) + "/" + guard_plan.ARCHIVE] = "0" * 16
    rev = plan.group_revision(plan.group_specs(CFG, STACK), plan.image_build_digest(CFG))
    with FakeEndpoint() as ep:
        code, out, _ = run(["doctor", "--stack", STACK, "--outputs-file", outputs(tmp_path / "o.json", ep.base_url, rev),
                            "--json"], runner=fake)  # fmt: skip
    found = {(f["node"], f["check"]) for f in json.loads(out)["findings"]}
    assert code == 1 and found == {("spark1", "guard-gave-up"), ("spark2", "guard-token"), ("spark3", "guard-stopped"),
                                   ("spark3", "guard-archive")}  # fmt: skip
