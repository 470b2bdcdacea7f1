"""The guard's plan: one archive that runs on its own, arguments that carry the rank containers' IDs, the
program's orders, and the commands that put it on a node."""

import base64
import json
import subprocess
import sys
import zipfile

import pytest
import yaml

from declared.stack import parse_stack
from harness import ROOT
from planning import guard as guard_plan
from planning import stackplan


def cluster_plan(stack: str, **serving):
    raw = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]["deepseek-spark:cluster"]
    raw["serving"].update(serving)
    return stackplan.build_stack(parse_stack(raw), stack)


def test_the_archive_is_the_same_bytes_every_time_and_holds_what_the_guard_imports():
    assert guard_plan.archive() == guard_plan.ARCHIVE_BYTES
    names = zipfile.ZipFile(__import__("io").BytesIO(guard_plan.ARCHIVE_BYTES)).namelist()
    assert names[0] == "__main__.py" and "programs/guard/main.py" in names and "programs/memgate.py" in names
    assert base64.b64decode(guard_plan.ARCHIVE_B64) == guard_plan.ARCHIVE_BYTES


def test_the_archive_runs_with_nothing_of_the_project_around_it(tmp_path):
    archive = tmp_path / "guard.pyz"
    archive.write_bytes(guard_plan.ARCHIVE_BYTES)
    r = subprocess.run([sys.executable, "-I", str(archive), "--help"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and "--role" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-I", str(archive), "--stack", "s"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2 and "required" in r.stderr


def test_the_bundle_command_writes_the_archive_byte_for_byte(tmp_path):
    target = tmp_path / "state" / "guard" / "g" / guard_plan.ARCHIVE
    r = subprocess.run(["sh", "-c", guard_plan.bundle_write(str(target))], input=guard_plan.ARCHIVE_B64,
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() == guard_plan.ARCHIVE_BYTES and oct(target.stat().st_mode & 0o777) == "0o644"
    (target.parent / "journal.json").write_text("{}")
    subprocess.run(["sh", "-c", guard_plan.bundle_delete(str(target.parent))], check=True)
    assert not target.parent.exists()


@pytest.mark.parametrize("stack,starts,stops", [("sim", [1, 2, 0], [0, 1, 2]), ("tp4", [1, 2, 3, 0], [0, 1, 2, 3]),
                                                ("sim-tp2", [0, 1], [1, 0])])  # fmt: skip
def test_the_guard_heals_in_the_order_pulumi_creates_and_deletes_the_ranks(stack, starts, stops):
    gp = cluster_plan(stack).groups[0].guard
    assert gp.heal["start_order"] == starts and gp.heal["stop_order"] == stops


def test_each_guard_gets_its_ranks_id_and_the_leader_every_peers():
    gp = cluster_plan("sim").groups[0].guard
    ids = {0: "id-head", 1: "id-w1", 2: "id-w2"}
    follower = gp.args(1, ids)
    assert follower[follower.index("--container") + 1] == "id-w1" and "--leader" not in follower
    assert follower[follower.index("--role") + 1] == "follower"
    gates = json.loads(follower[follower.index("--gates") + 1])
    assert [g[0] for g in gates] == ["rails", "memory"] and "--need-mib" in gates[1][2]
    leader = gp.args(0, ids)
    doc = json.loads(leader[leader.index("--leader") + 1])
    assert [(p["rank"], p["container"], p["url"]) for p in doc["peers"]] == [
        (1, "id-w1", "http://172.30.99.12:9850"), (2, "id-w2", "http://172.30.99.13:9850")]  # fmt: skip
    # the engine binds the head's management address (planning/exposure.engine_bind), not loopback
    assert doc["heal"]["url"] == "http://172.30.99.11:8888/v1" and doc["heal"]["router"] is None
    assert doc["settings"]["max_attempts"] == gp.settings["max_attempts"]


def test_behind_the_router_each_groups_leader_knows_the_router_and_its_own_worker_url():
    cp = cluster_plan("sim-x2")
    a, b = (g.guard for g in cp.groups)
    assert a.heal["router"] == b.heal["router"] == cp.router.url
    assert (a.heal["worker"], b.heal["worker"]) == tuple(m.worker for m in cp.members)


def test_self_heal_off_plans_no_guard():
    assert cluster_plan("sim", selfHeal=False).groups[0].guard is None
    assert cluster_plan("sim", selfHeal={"enabled": False}).groups[0].guard is None


def test_the_guard_mounts_its_directory_the_docker_socket_and_on_the_head_the_key_read_only():
    gp = cluster_plan("sim").groups[0].guard
    head, worker = gp.nodes[0], gp.nodes[1]
    assert {m.target for m in worker.mounts} == {guard_plan.STATE_MOUNT, guard_plan.DOCKER_SOCKET}
    key = next(m for m in head.mounts if m.target == "/run/secrets/dspark-api-key")
    assert key.read_only and key.source.endswith("/sim/api-key")
    assert head.dir == "/var/lib/deepseek-spark/guard/sim"


def test_a_router_where_pulumi_runs_is_no_address_for_the_guard_unless_router_address_says_one():
    raw = yaml.safe_load((ROOT / "Pulumi.sim-x2.yaml").read_text())["config"]["deepseek-spark:cluster"]
    raw["router"]["node"] = "local"
    cp = stackplan.build_stack(parse_stack(raw), "sim-x2")
    assert all(g.guard.heal["router"] is None and g.guard.heal["worker"] is None for g in cp.groups)
    raw["router"]["address"] = "172.30.99.1"
    cp = stackplan.build_stack(parse_stack(raw), "sim-x2")
    assert all(g.guard.heal["router"] == "http://172.30.99.1:8889" for g in cp.groups)
