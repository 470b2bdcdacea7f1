"""__main__.py under Pulumi mocks for a stack with the team gateway (sim-team; tp4x2 behind its router):
what a member change touches, where keys go (only secret inputs), the gateway's containers, the outputs."""

import copy

import pytest

from harness import TEST_API_KEY, Secret, cluster_of, plain_strings, reveal, run_program

CONTAINER = "docker:index/container:Container"
REMOTE = "command:remote:Command"
LOCAL = "command:local:Command"
ALICE, BOB = "sk-alice-" + "a" * 40, "sk-bob-" + "b" * 40
CAROL, DAVE = "sk-carol-" + "g" * 40, "sk-dave-" + "h" * 40
ADMIN, METRICS, DBPW = "sk-admin-" + "c" * 40, "sk-metrics-" + "d" * 40, "dbpassword" + "e" * 20
STDOUT = {"sim-team-gateway-key-alice": ALICE + "\n", "sim-team-gateway-key-bob": BOB + "\n",
          "sim-team-gateway-key-carol": CAROL + "\n", "sim-team-gateway-key-dave": DAVE + "\n",
          "sim-team-gateway-admin-key": ADMIN + "\n", "sim-team-gateway-metrics-key": METRICS + "\n",
          "sim-team-gateway-db-password": DBPW + "\n"}  # fmt: skip


MEMBERS = cluster_of("sim-team")["gateway"]["members"]  # alice, bob (rpmLimit), carol (tokenBudget), dave


def team(bob=None):
    """sim-team with bob's entry replaced by `bob` (None: bob removed), everyone else as in the stack file."""
    cluster = cluster_of("sim-team")
    cluster["gateway"]["members"] = [m if m["name"] != "bob" else bob for m in MEMBERS if m["name"] != "bob" or bob]
    return cluster


@pytest.fixture(scope="module")
def rec():
    return run_program("sim-team", command_stdout=STDOUT)


def test_no_key_appears_in_any_plain_input_or_output(rec):
    for r in rec.resources:
        for s in plain_strings(r.inputs):
            for key in (ALICE, BOB, CAROL, DAVE, ADMIN, METRICS, DBPW, TEST_API_KEY):
                assert key not in s, f"{r.name} carries a key in a plain input"
    for name, value in rec.outputs.items():
        for s in plain_strings(value):
            assert not any(k in s for k in (ALICE, BOB, CAROL, DAVE, ADMIN, METRICS, DBPW)), name


def test_a_members_key_reaches_only_their_registration_on_stdin(rec):
    add = rec.named("sim-team-gateway-member-alice")
    assert add.inputs["stdin"] == Secret(ALICE)
    assert add.plain["create"] == add.plain["update"]  # a scope change updates the record in place
    assert add.plain["delete"].endswith("revoke --member alice\n") and add.delete_before_replace
    holders = [r.name for r in rec.resources if ALICE in str(reveal(r.inputs))]
    assert holders == ["sim-team-gateway-member-alice"]


def test_no_rank_or_engine_resource_knows_the_gateway_or_a_member(rec):
    for r in rec.of_type(CONTAINER):
        if "gateway" in r.name or "monitoring" in r.name:  # (Prometheus reads the gateway with its metrics key)
            continue
        text = str(reveal(r.inputs))
        assert ADMIN not in text and "gateway" not in text


def test_the_gateway_containers_mount_their_files_read_only_and_carry_no_environment(rec):
    for name in ("sim-team-gateway-container", "sim-team-gateway-db"):
        c = rec.named(name)
        assert "envs" not in c.plain and c.plain["networkMode"] == "host" and c.delete_before_replace
        mounts = {m["target"]: m for m in c.plain["mounts"]}
        assert mounts["/etc/dspark-gateway"]["readOnly"] and mounts["/run/dspark-gateway/secrets.env"]["readOnly"]
    db = {m["target"]: m for m in rec.named("sim-team-gateway-db").plain["mounts"]}
    assert db["/var/lib/postgresql/data"]["source"] == "sim-team-gateway-db"
    assert rec.named("sim-team-gateway-db-data").retain_on_delete  # keepData defaults to true


def test_keep_data_false_lets_destroy_delete_the_database_volume():
    cluster = cluster_of("sim-team")
    cluster["gateway"]["keepData"] = False
    assert not run_program("sim-team", cluster).named("sim-team-gateway-db-data").retain_on_delete


def comparable(rec, skip):
    return {r.name: (r.inputs, sorted(r.dependencies)) for r in rec.resources if not any(s in r.name for s in skip)}


def test_revoking_a_member_changes_only_that_members_resources(rec):
    revoked = run_program("sim-team", team(None), command_stdout=STDOUT)
    before, after = comparable(rec, ["-bob"]), comparable(revoked, ["-bob"])
    # the outputs' member_configs differ; every registered resource but bob's is exactly as before
    assert before == after
    assert not [r for r in revoked.resources if "bob" in r.name]
    assert [r.name for r in rec.resources if "bob" in r.name] == ["sim-team-gateway-key-bob", "sim-team-gateway-member-bob"]


def test_a_scope_change_updates_the_record_and_a_rotation_makes_a_new_key(rec):
    scoped = run_program("sim-team", team({"name": "bob", "rpmLimit": 5}), command_stdout=STDOUT)
    assert "--rpm 5" in scoped.named("sim-team-gateway-member-bob").plain["update"]
    assert comparable(rec, ["member-bob"]) == comparable(scoped, ["member-bob"])
    rotated = run_program("sim-team", team({"name": "bob", "rpmLimit": 6000, "rotation": 1}), command_stdout=STDOUT)
    assert rotated.named("sim-team-gateway-key-bob").plain["triggers"] == [1]
    assert rec.named("sim-team-gateway-key-bob").plain["triggers"] == [0]


def test_each_members_limits_reach_their_record_and_nothing_else(rec):
    assert rec.named("sim-team-gateway-member-carol").plain["update"].endswith(
        "add --member carol --token-budget 60 --budget-period day\n")
    assert rec.named("sim-team-gateway-member-dave").plain["update"].endswith("add --member dave --rpm 2\n")
    assert rec.named("sim-team-gateway-member-alice").plain["update"].endswith("add --member alice\n")


def test_configured_member_keys_replace_the_generated_ones():
    mine = "sk-chosen-" + "f" * 40
    r = run_program("sim-team", secrets={"memberKeys": '{"alice": "%s"}' % mine}, command_stdout=STDOUT)
    assert r.named("sim-team-gateway-member-alice").inputs["stdin"] == Secret(mine)
    assert not [x for x in r.resources if x.name == "sim-team-gateway-key-alice"]


def test_outputs_point_clients_at_the_gateway_each_member_with_their_own_key(rec):
    o = rec.outputs
    assert o["endpoint"] == "http://172.30.99.11:4000/v1"
    configs = o["member_configs"]
    assert isinstance(configs, Secret)
    assert {n: c["api_key"] for n, c in configs.value.items()} == {"alice": ALICE, "bob": BOB, "carol": CAROL,
                                                                   "dave": DAVE}
    assert all(c["base_url"] == o["endpoint"] for c in configs.value.values())
    assert o["admin_config"].value["api_key"] == ADMIN  # the admin's, named as such, apart from the members'
    assert "client_config" not in o  # nothing a client could take for its own hands out the master key
    gw = reveal(o["gateway"])
    assert gw["members"] == ["alice", "bob", "carol", "dave"] and gw["upstream"] == "http://172.30.99.11:8000/v1"
    job = next(j for j in o["prometheus"]["scrape_configs"] if j["job_name"] == "sim-team-gateway")
    assert job["static_configs"][0]["targets"] == ["172.30.99.11:4000"] and job["authorization"]["type"] == "Bearer"


def test_the_gateway_waits_for_the_upstream_and_its_readiness_holds_the_admin_key_only_in_env(rec):
    check = rec.named("sim-team-gateway-readiness-check")
    assert check.inputs["environment"]["DSPARK_API_KEY"] == Secret(ADMIN)
    upstream = rec.named("sim-team-readiness-check").urn
    assert upstream in check.dependencies


def test_behind_the_router_the_gateway_runs_on_the_routers_node():
    cluster = copy.deepcopy(cluster_of("tp4x2"))
    cluster["gateway"] = {"members": [{"name": "alice"}]}
    r = run_program("tp4x2", cluster)
    gw = reveal(r.outputs["gateway"])
    router_node = cluster["router"]["node"]
    assert gw["node"] == router_node and gw["upstream"] == reveal(r.outputs["router"])["endpoint"]


def test_tp3_with_the_gateway_on_the_head_keeps_its_ranks_limit_and_both_reserves():
    """The gateway's two come out of memory.sideReserveGiB: rank 0 keeps the limit it has without them (its
    revision does not change), and the host reserve stays with the OS."""
    cluster = cluster_of("tp3")
    cluster["gateway"] = {}
    after = run_program("tp3", cluster=cluster)
    limits = {r.inputs["name"]: r.inputs["memory"] for r in after.of_type(CONTAINER)}
    budget_mib = int(121.7 * 1024) - 1536  # memory.hostReserveGiB 1.5 stays with the OS
    assert limits["tp3-gateway"] == 1024 and limits["tp3-gateway-db"] == 512 and limits["tp3-guard"] == 256
    assert limits["tp3-node-exporter"] == 64
    assert limits["tp3-rank0"] == limits["tp3-rank1"] == limits["tp3-rank2"] == budget_mib - 4096 - 256
    before = run_program("tp3")
    assert {r.inputs["name"]: r.inputs["memory"] for r in before.of_type(CONTAINER)}["tp3-rank0"] == limits["tp3-rank0"]
    log = next(m for _, m in after.logs if m.startswith("memory budget per node"))
    assert (f"tp3-rank0 {limits['tp3-rank0']:,} (needs 110,815) + tp3-gateway 1,024 + tp3-gateway-db 512 + "
            f"tp3-node-exporter 64 + tp3-guard 256 = {budget_mib - 4096 + 1024 + 512 + 64:,}") in log


def test_every_generated_credential_keeps_its_value_on_any_change_but_a_replace(rec):
    # a generator whose command changes must not revoke the team's keys: its update re-prints the kept value
    from components.keys import KEEP
    generators = [r for r in rec.of_type(LOCAL) if r.name in STDOUT or r.name.endswith("-token")]
    assert {r.name for r in generators} >= set(STDOUT)
    for r in generators:
        assert r.plain["update"] == KEEP and r.plain.get("addPreviousOutputInEnv") is not False, r.name
