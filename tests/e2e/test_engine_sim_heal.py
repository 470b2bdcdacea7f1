"""Self-healing on the `sim` stack (SGLang, 3 nodes) through the real Pulumi engine: the group comes back by
itself after each fault, with no Pulumi or dspark process running while it heals, and the state stays true.

test_engine_sim leaves its stack up; this module breaks it in every way the guard must answer, then hands it to
test_engine_sim_dspark: a rank SIGKILLed, one node rebooted, every node losing power at once, the head hung
(SIGSTOP, its container still running), a rank that dies at every boot (bounded attempts, then down with the
reason), the guard itself killed in the middle of a heal, an `up` that changes the group while the guard heals,
and a pause for maintenance. For each fault: the times from the fault to the guard's detection, the group
restarted, serving again and a client's first answer (HEALS, printed at the end), within the sim's boot time
+ 60 s; afterwards `pulumi preview` shows no change and `pulumi refresh` finds no drift.
"""

import json
import time
import urllib.request
from types import SimpleNamespace

import pytest

from e2e.conftest import (
    CLUSTER, ask, at, client_env, container_events, containers_of, dspark, first_event, guards_of, node_sh,
    resources_summary,
)  # fmt: skip
from e2e import healing
from e2e.healing import BOUND_S
from e2e.timings import TIMINGS
from sim import cluster as sim_cluster
from sim import faults as sim_faults

pytestmark = pytest.mark.e2e
STACK = "sim"
USES_PREVIOUS_STACK = True  # test_engine_sim's cluster and stack
SHARE_WITH_NEXT = True  # test_engine_sim_dspark goes on with them
NODES = ("spark1", "spark2", "spark3")
RANKS = ("sim-rank0", "sim-rank1", "sim-rank2")
LEADER = at("http://172.30.99.11:9850")


def guard_status() -> dict:
    return healing.guard_status(LEADER)


def wait_guard(pred, timeout: float = 120, what: str = "") -> dict:
    return healing.wait_guard(LEADER, pred, timeout, what)


@pytest.fixture(scope="module")
def up(project, tmp_path_factory):
    project.up().check()
    env = client_env(project, tmp_path_factory.mktemp("client"))
    wait_guard(lambda s: s["state"] == "serving", what="serve")
    return SimpleNamespace(env=env)


def fresh_episode(project) -> None:
    """Each fault here starts an episode of its own: the heals of the tests before it are within stableSeconds,
    and a fourth would be past maxAttempts (test_a_rank_that_dies_at_every_boot... shows that)."""
    assert dspark(project, "guard", "resume")[0] == 0
    wait_guard(lambda s: s["memory"]["attempts"] == 0 and s["state"] == "serving", what="start a new episode")


def heal(project, up, label: str, fault, kinds: tuple[str, ...]) -> dict:
    fresh_episode(project)
    ranks = containers_of(STACK)
    h = healing.timed_heal(label, LEADER, fault, lambda: healing.quick_ask(up.env), kinds)
    assert containers_of(STACK) == ranks, "the guard started the containers Pulumi created: same IDs"
    return h


def no_change_no_drift(project) -> None:
    preview = project.preview(policy_pack=False).check()
    assert "to create" not in preview.text and "to replace" not in preview.text and "to update" not in preview.text
    assert "unchanged" in resources_summary(preview.text), resources_summary(preview.text)
    refresh = project.refresh().check()
    summary = resources_summary(refresh.text)
    assert "unchanged" in summary and not any(w in summary for w in ("updated", "deleted")), summary


def test_every_node_runs_a_guard_and_the_leader_serves_its_figures(up, project):
    guards = guards_of(STACK)
    assert set(guards) == set(NODES)
    for node in NODES:
        policy = node_sh(node, "docker inspect -f '{{.HostConfig.RestartPolicy.Name}}' sim-guard").strip()
        assert policy == "unless-stopped"
    with urllib.request.urlopen(LEADER + "/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert 'dspark_guard_group_state{stack="sim",group="sim",state="serving"} 1' in metrics
    assert 'dspark_guard_rank_up{stack="sim",group="sim",rank="2",node="spark3"} 1' in metrics
    assert project.api_key not in metrics + json.dumps(guard_status())
    code, out = dspark(project, "status", "--json")
    assert code == 0 and json.loads(out)["guard"]["state"] == "serving", out


def test_a_rank_sigkilled_heals_the_whole_group(up, project):
    h = heal(project, up, "a rank SIGKILLed", lambda: node_sh("spark2", "docker kill -s KILL sim-rank1"),
             ("rank-exited",))  # fmt: skip
    assert "rank 1 (spark2) exited with code 137" in h["detail"]
    no_change_no_drift(project)


def test_one_node_restarted_heals(up, project):
    def reboot():
        sim_cluster.stop_node(CLUSTER, "spark3", log=lambda m: None)
        sim_cluster.start_node(CLUSTER, "spark3", log=lambda m: None)

    heal(project, up, "one node restarted", reboot, ("node-lost", "rank-exited"))
    no_change_no_drift(project)


def test_every_node_losing_power_at_once_heals(up, project):
    def power_cut():
        sim_faults.power_cut(CLUSTER, log=lambda m: None)
        time.sleep(2)
        sim_faults.power_on(CLUSTER, log=lambda m: None)

    h = heal(project, up, "all nodes power-cut", power_cut, ("rank-exited", "node-lost"))
    assert "a reboot or a power loss" in h["detail"], h
    for node in ("spark1", "spark2", "spark3"):  # each node's own boot: the fence came before docker, and so
        boot = node_sh(node, "cat /var/log/sim-boot.log").splitlines()  # before any container of ours
        last = max(i for i, line in enumerate(boot) if line.endswith("started deepseek-spark-fence-sim.service "
                                                                     "before docker.service"))  # fmt: skip
        assert boot[last + 1:last + 2] and boot[last + 1].endswith("starting docker.service"), boot[-4:]
        assert float(boot[last].split()[0]) <= float(boot[last + 1].split()[0])
        assert "policy drop" in node_sh(node, "nft list table inet dspark_sim")
    no_change_no_drift(project)


def test_a_hung_head_heals(up, project):
    h = heal(project, up, "the head hung (SIGSTOP)", lambda: node_sh("spark1", "docker kill -s STOP sim-rank0"),
             ("hung", "rank-exited"))  # fmt: skip
    TIMINGS["heal: the head hung, detected as"] = 1.0 if h["fault"] == "hung" else 0.0
    no_change_no_drift(project)


def test_a_rank_that_dies_at_every_boot_stops_after_the_attempts_and_says_why(up, project):
    fresh_episode(project)
    t0 = time.time()
    sim_faults.crash_at_boot(CLUSTER, "spark3", log=lambda m: None)
    try:
        node_sh("spark3", "docker kill -s KILL sim-rank2")
        doc = wait_guard(lambda s: s["state"] == "exhausted", timeout=180, what="give up")
        TIMINGS["heal: a rank dying at every boot, to giving up"] = time.time() - t0
        events = container_events(t0, time.time() + 1, nodes=("spark3",))
        starts = [e for e in events if e.action == "start" and e.name == "sim-rank2"]
        assert len(starts) == 3, f"at most maxAttempts (3) starts of the crashing rank: {starts}"
        assert "illegal memory access" in doc["reason"] and "rank 2 (spark3)" in doc["reason"], doc["reason"]
        code, out = dspark(project, "status")
        assert code == 2 and "the guard gave up" in out and "illegal memory access" in out, out
        assert "python -m dspark guard resume --stack sim" in out
        time.sleep(10)  # given up means given up: nothing starts again
        later = container_events(t0, time.time() + 1, nodes=("spark3",))
        assert len([e for e in later if e.action == "start" and e.name == "sim-rank2"]) == 3
        assert all(node_sh(n, f"docker inspect -f '{{{{.State.Status}}}}' {r}").strip() == "exited"
                   for n, r in zip(NODES, RANKS)), "a group that cannot come up is left down, not half-started"
    finally:
        sim_faults.crash_at_boot(CLUSTER, "spark3", None, log=lambda m: None)
    t1 = time.time()
    code, out = dspark(project, "guard", "resume")
    assert code == 0, out
    healing.answering(lambda: healing.quick_ask(up.env), t1 + BOUND_S)
    wait_guard(lambda s: s["state"] == "serving", what="serve after resume")


def test_a_guard_killed_mid_heal_finishes_the_heal_once_docker_restarts_it(up, project):
    fresh_episode(project)
    before = len(guard_status()["heals"])
    t0 = time.time()
    node_sh("spark2", "docker kill -s KILL sim-rank1")
    doc = wait_guard(lambda s: (s.get("healing") or {}).get("step") in ("gates", "start", "boot"), what="heal")
    node_sh("spark1", "pkill -9 -f '[g]uard.pyz'")  # its process dies; docker's restart policy brings it back
    doc = wait_guard(lambda s: len(s["heals"]) > before and s["state"] == "serving", what="finish the heal")
    TIMINGS["heal: the guard killed mid-heal, fault to serving"] = doc["heals"][-1]["serving_at"] - t0
    assert "started over" in doc["heals"][-1]["detail"], doc["heals"][-1]
    assert [node_sh(n, f"docker inspect -f '{{{{.State.Status}}}}' {r}").strip() for n, r in zip(NODES, RANKS)] \
        == ["running"] * 3
    assert "42" in ask(up.env)


def test_an_up_that_changes_the_group_while_the_guard_heals_converges_as_before(up, project):
    """The engine deletes the guards before any rank (their arguments hold the ranks' IDs), so the `up`'s own
    order holds: every old rank gone before any new one starts, the head down first and up last."""
    fresh_episode(project)
    before = containers_of(STACK)
    project.set_config("cluster.serving.generation", "100")  # a group restart on purpose
    node_sh("spark3", "docker kill -s KILL sim-rank2")
    wait_guard(lambda s: s["state"] == "healing", what="start healing")
    t0 = time.time()
    project.up().check()
    events = container_events(t0 - 1, time.time() + 1)
    destroys = {n: first_event(events, "destroy", n).t for n in RANKS}
    starts = {n: first_event(events, "start", n, after="create").t for n in RANKS}
    assert max(destroys.values()) < min(starts.values()), "a new rank started before an old one was gone"
    assert min(destroys, key=destroys.get) == "sim-rank0" and max(starts, key=starts.get) == "sim-rank0"
    guard_gone = max(e.t for e in events if e.action == "destroy" and e.name == "sim-guard")
    assert guard_gone < min(destroys.values()), "every guard is gone before the first rank goes"
    assert not set(containers_of(STACK).values()) & set(before.values())
    assert "42" in ask(up.env)
    head = containers_of(STACK, ("spark1",))["sim-rank0"]
    wait_guard(lambda s: s["state"] == "serving" and s["armed"][0].startswith(head), what="guard the new group")


def test_paused_for_maintenance_the_guard_leaves_a_stopped_rank_alone_until_resumed(up, project, alert_sink):
    """Paused, nothing heals: the group-down alert reaches the webhook (Alertmanager's, the REAL one the stack runs)
    within 60 s, naming the head and the command; resumed, the guard heals and the alert resolves."""
    code, out = dspark(project, "guard", "pause", "--reason", "swapping spark2's cable")
    assert code == 0, out
    wait_guard(lambda s: s["state"] == "paused", what="pause")
    t0 = time.time()
    node_sh("spark2", "docker stop sim-rank1 >/dev/null")
    down = alert_sink.wait(lambda r: r.status == "firing" and r.labels.get("alertname") == "DsparkGroupDown", t0, 60,
                           "group-down alert")  # fmt: skip
    TIMINGS["alert: group down (guard paused), to the webhook"] = down.at - t0
    assert (down.labels["group"], down.labels["node"], down.labels["rank"]) == ("sim", "spark1", "0")
    assert "python -m dspark status --stack sim" in down.annotations["summary"], down.annotations
    assert node_sh("spark2", "docker inspect -f '{{.State.Status}}' sim-rank1").strip() == "exited"
    code, out = dspark(project, "status")
    assert code == 2 and "the guard is paused for maintenance (swapping spark2's cable" in out, out
    assert "python -m dspark guard resume --stack sim" in out
    t0 = time.time()
    code, out = dspark(project, "guard", "resume")
    assert code == 0, out
    healing.answering(lambda: healing.quick_ask(up.env), t0 + BOUND_S)
    wait_guard(lambda s: s["state"] == "serving", what="serve")
    back = alert_sink.wait(lambda r: r.status == "resolved" and r.labels.get("alertname") == "DsparkGroupDown",
                           down.at, 90, "the group-down alert resolved")  # fmt: skip
    TIMINGS["alert: group down resolved, after the resume"] = back.at - t0
