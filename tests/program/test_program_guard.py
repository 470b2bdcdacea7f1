"""The guard in the resource graph (mocks): one per node of every group, after the group answered, its
arguments from the ranks' IDs (so any change of the group replaces it first), a restart policy, its token a
secret that reaches the nodes on stdin only, and nothing at all with serving.selfHeal off."""

import json

import pytest

from harness import Secret, cluster_of, labels_of, run_program

REMOTE = "command:remote:Command"


@pytest.fixture(scope="module", params=["tp3", "tp4", "tp2", "sim-x2"])
def stack(request):
    return request.param


@pytest.fixture(scope="module")
def rec(stack):
    return run_program(stack)


def test_every_node_of_every_group_has_one_guard_on_its_own_engine(rec):
    ranks, guards = rec.ranks(), rec.containers("guard")
    assert len(guards) == len(ranks)
    by_provider = {r.provider_urn: r for r in ranks}
    for g in guards:
        rank = by_provider[g.provider_urn]  # the same node's docker provider as one rank
        assert g.inputs["name"] == labels_of(rank)["deepseek-spark.stack"] + "-guard"
        assert g.inputs["image"] == rank.inputs["image"]  # the node's serving image: python3 is there


def test_the_guard_comes_back_by_itself_and_runs_on_the_host_it_heals(rec):
    for g in rec.containers("guard"):
        i = g.plain
        assert i["restart"] == "unless-stopped" and i["mustRun"] is True
        assert i["networkMode"] == "host" and i["pidMode"] == "host" and i["privileged"] is True
        assert i["memory"] == i["memorySwap"] == 256
        mounts = {m["target"]: m for m in i["mounts"]}
        assert mounts["/var/run/docker.sock"]["type"] == "bind"
        assert mounts["/state"]["source"].endswith("/guard/" + labels_of(g)["deepseek-spark.stack"])
        assert g.delete_before_replace


def test_the_guard_starts_after_the_group_answered_and_depends_on_every_ranks_id(rec):
    ranks = {r.urn for r in rec.ranks()}
    for g in rec.containers("guard"):
        group = labels_of(g)["deepseek-spark.stack"]
        mine = {r.urn for r in rec.ranks() if labels_of(r)["deepseek-spark.stack"] == group}
        assert set(g.property_dependencies["labels"]) == mine, "a label holds every rank's ID"
        # the ranks' IDs, and on the leader the group's last bandwidth gate (its --fabric, served as metrics)
        gate = {r.urn for r in rec.resources if r.name == f"{group}-sglang-fabric-check" or r.name == f"{group}-vllm-fabric-check"}
        assert set(g.property_dependencies["command"]) <= mine | gate and g.plain["command"][0] == "/state/guard.pyz"
        assert mine <= ranks
        ready = [d for d in g.dependencies if d.endswith(("-readiness-check", "-router-member"))]
        assert ready, g.dependencies


def test_the_leader_alone_carries_the_peers_and_reads_the_key_from_the_heads_file(rec):
    for g in rec.containers("guard"):
        argv = g.plain["command"]
        role = argv[argv.index("--role") + 1]
        assert ("--leader" in argv) == (role == "leader") == ("--fabric" in argv)  # the gate's pairs: the leader's
        key_mount = [m for m in g.plain["mounts"] if m["target"] == "/run/secrets/dspark-api-key"]
        assert bool(key_mount) == (role == "leader") and all(m["readOnly"] for m in key_mount)


def test_the_token_is_a_secret_written_on_stdin_never_in_a_command_or_the_guards_inputs(rec):
    tokens = [r for r in rec.resources if r.type == REMOTE and r.name.endswith("-token") and "-guard-" in r.name]
    assert len(tokens) == len(rec.ranks())
    for t in tokens:
        assert isinstance(t.inputs["stdin"], Secret) and t.inputs["logging"] == "none" and t.delete_before_replace
        assert "stdin" not in json.dumps(t.inputs["create"])
    generated = [r for r in rec.resources if r.name.endswith("-guard-token")]
    assert generated and all(r.inputs["logging"] == "none" for r in generated)  # made where Pulumi runs, unprinted
    for g in rec.containers("guard"):
        assert "Secret(" not in repr(g.inputs), "no secret is an input of the guard's container (it reads files)"


def test_self_heal_off_leaves_no_guard_anywhere():
    cluster = cluster_of("tp4")
    cluster["serving"]["selfHeal"] = False
    rec = run_program("tp4", cluster=cluster)
    assert rec.containers("guard") == [] and not [r for r in rec.resources if "-guard" in r.name]
    assert len(rec.ranks()) == 4


def test_the_guards_command_names_its_own_rank_container(rec):
    for g in rec.containers("guard"):
        argv = g.plain["command"]
        node = argv[argv.index("--node") + 1]
        rank = next(r for r in rec.ranks() if r.provider_urn == g.provider_urn)
        assert labels_of(g)["deepseek-spark.node"] == node
        assert argv[argv.index("--container") + 1] == rank.name + "-id"  # the mocks' ID of that rank
