"""The SGLang stack `sim` through the real Pulumi engine on a 3-node simulated cluster.

One scenario, in order (each test builds on the cluster and stack the previous one left):
preview -> up and answers through `python -m dspark.clients` -> no-op up -> serving change
(group down head first, before any new rank starts) -> an argv the image's parser refuses fails `up`
at the check step, the running group untouched -> a node with another image is refused, the group
untouched -> a KV pool below the plan fails `up` (or warns), memory held on a node fails the memory gate
-> refresh after a rank killed at its memory limit and one removed (the guard paused), then `up` restarts the whole group
-> key rotation and
a new stateDir -> a node stopped mid-`up`, then `up` converges; test_engine_sim_dspark goes on with the
same stack (the operator CLI) and ends it (destroy keeps the checkpoint, no key in any output).
Orders are read from the nodes' docker event timestamps, never from the engine's output order.
"""

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest

from e2e.conftest import (
    CLUSTER, ask, at, client_env, container_events, containers_of, dspark, first_event, node_sh, openai_client,
    resources_summary, shard_mtimes,
)  # fmt: skip
from declared.stack import parse_stack
from dspark import dashboard
from e2e import exposure, observing
from e2e.timings import TIMINGS
from planning import launch, stackplan
from programs import bootlog
from sim import cluster as sim_cluster
from sim import faults as sim_faults
from sim import grpctrace
from sim import images as sim_images

pytestmark = pytest.mark.e2e
STACK = "sim"
SHARE_WITH_NEXT = True  # test_engine_sim_dspark goes on with this cluster and stack, and destroys it
NODES = ("spark1", "spark2", "spark3")
RANKS = ("sim-rank0", "sim-rank1", "sim-rank2")
HEAD = "sim-rank0"


def timed_up(project, label: str, expect_ok: bool = True):
    """`up`, its wall time recorded as `label`, and the container events of the nodes meanwhile."""
    t0 = time.time()
    run = project.timed(label, project.up())
    if expect_ok:
        run.check()
    return run, container_events(t0 - 1, time.time() + 1)


def assert_group_restarted_head_first(events, old_ids: dict[str, str]) -> None:
    """Every old rank destroyed before any new rank started; the head destroyed first, started last."""
    destroys = {n: first_event(events, "destroy", n).t for n in RANKS}
    starts = {n: first_event(events, "start", n).t for n in RANKS}
    assert max(destroys.values()) < min(starts.values()), f"a new rank started before an old one was gone: {events}"
    assert min(destroys, key=destroys.get) == HEAD, "the head goes down first"
    assert max(starts, key=starts.get) == HEAD, "the head starts last"
    assert not set(containers_of(STACK).values()) & set(old_ids.values())


@pytest.fixture(scope="module")
def first(project, tmp_path_factory):
    preview = project.timed("sim: preview --diff (policy pack)", project.preview())
    t0 = time.monotonic()
    up = project.up().check()
    env = client_env(project, tmp_path_factory.mktemp("client"))
    answer = ask(env)
    TIMINGS["sim: first up to first answer"] = time.monotonic() - t0
    return SimpleNamespace(preview=preview, up=up, env=env, answer=answer)


def test_preview_shows_every_node_the_policy_pack_and_no_secret(first, project, sim):
    text = first.preview.check().text
    assert "to create" in resources_summary(text) and "to delete" not in resources_summary(text)
    for node in NODES:
        assert f"sim-{node}-preflight" in text and f"sim-engram-{node}" in text and f"sim-image-{node}" in text
    for rank in range(3):
        assert f"sim-sglang-rank{rank}" in text
    assert "deepseek-spark-guardrails" in text  # the pack ran, as in a pull request's preview
    assert project.api_key not in text
    assert sim.private_key and open(sim.private_key).read().splitlines()[1] not in text


def test_the_policy_pack_blocks_a_preview_it_refuses(first, project, tmp_path):
    """The pack runs inside the real preview and stops it: here its config claims the engram dir holds a
    checkpoint, which the shard packer writes to."""
    policy_config = tmp_path / "policy-config.json"
    policy_config.write_text('{"checkpoint-never-deleted": {"checkpointDirs": ["/srv/engram"]}}')
    run = project.preview(policy_config=policy_config)
    assert run.code != 0, run.text[-3000:]
    assert "checkpoint-never-deleted" in run.text and "mandatory" in run.text.lower()


def test_first_up_answers_through_the_client_config(first, project):
    assert "42" in first.answer
    assert sorted(containers_of(STACK)) == list(RANKS)
    assert len(shard_mtimes()) == 6  # 2 layers x 3 ranks, each on its own node
    client, model = openai_client(first.env)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}], max_tokens=32, stream=True
    )
    assert "42" in "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert [m.id for m in client.models.list()] == [model]
    bad, _ = openai_client(first.env, key="sk-wrong-key-0123456789")
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert project.api_key not in first.up.text


def test_up_exports_what_rank0_obtained(first, project):
    """The `boot` output: the pool, DSPARK and context rank 0 logged, next to what the plan expected."""
    boot = project.outputs()["boot"]["sim"]
    assert boot["kvTokens"] == boot["expectedKvTokens"] == 750_000 and boot["shortfall"] is None
    assert boot["speculative"] == "DSPARK" and boot["contextLength"] == 262_144
    # (the probe's own line reaches the up log only where the command provider streams its output:
    # the real one does, the sim's double does not; sim/adaptations.py)


def test_second_up_changes_nothing(first, project):
    before_ranks, before_shards = containers_of(STACK), shard_mtimes()
    run = project.timed("sim: no-op up", project.up()).check()
    summary = resources_summary(run.text)
    assert "unchanged" in summary
    assert not any(word in summary for word in ("created", "updated", "replaced", "deleted")), summary
    assert containers_of(STACK) == before_ranks and shard_mtimes() == before_shards


def test_from_outside_only_ssh_and_the_endpoint_answer_and_the_fence_is_what_the_plan_says(first, project):
    """A host on the management network that belongs to no stack: ssh on every node and the endpoint on the head,
    nothing else; no anonymous chat; Alertmanager (loopback) cannot even be reached for a silence. On every node
    the live table is the one the fence confirmed, its boot unit enabled before docker."""
    from sim import outsider

    outputs = project.outputs()
    exposure.check_closed(CLUSTER, STACK, outputs)
    silence = '{"matchers": [{"name": "alertname", "value": ".*", "isRegex": true}], "startsAt": "2026-01-01T00:00:00Z", ' \
              '"endsAt": "2030-01-01T00:00:00Z", "createdBy": "outsider", "comment": "quiet"}'
    status, _ = outsider.http(CLUSTER, "POST", at("http://172.30.99.11:9093/api/v2/silences"), silence,
                              {"Content-Type": "application/json"})  # fmt: skip
    assert status == 0, status  # nothing answers: Alertmanager is on spark1's loopback, and the fence drops the rest
    for node in NODES:
        live = node_sh(node, "nft list table inet dspark_sim")
        assert live == node_sh(node, "cat /etc/deepseek-spark/fence-sim.live"), node
        assert "policy drop" in live and node_sh(node, "systemctl is-enabled deepseek-spark-fence-sim.service").strip() == "enabled"


def test_prometheus_scrapes_every_target_and_every_panel_reads_data(first, project):
    """monitoring.server: the REAL Prometheus (Debian's) scrapes exactly the `prometheus` output's targets, each
    `up == 1` through its HTTP API, and every query of the stack's dashboard returns series from it."""
    outputs = project.outputs()
    prom = observing.prometheus(outputs, CLUSTER)
    client, model = openai_client(first.env)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Who are you?"}],
                                            max_tokens=16, stream=True)  # a streamed answer of several tokens: the
    assert "test double" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)  # gaps between
    t0 = time.monotonic()
    up = observing.wait_every_target_up(prom, outputs)
    TIMINGS["sim: every Prometheus target up, after the no-op up"] = time.monotonic() - t0
    assert sorted((s["metric"]["role"], s["metric"]["instance"]) for s in up) == sorted(
        [("engine", at("172.30.99.11:8888"))] + [(role, at(f"172.30.99.1{i}:{port}")) for i in (1, 2, 3)
                                             for role, port in (("guard", 9850), ("node", 9100))])  # fmt: skip
    observing.record_scrape_costs(prom, STACK)
    observing.wait_panels(prom, dashboard.dashboard(outputs["prometheus"]["scrape_configs"], STACK))
    total = {s["metric"]["node"]: float(s["value"][1]) for s in observing.query(prom, "node_memory_MemTotal_bytes")}
    assert total == {n: 124620 * 2**20 for n in NODES}, total  # each node's unified memory, not this machine's
    rules = observing.api(prom, "rules")["groups"]
    assert [r["name"] for g in rules for r in g["rules"]] == [
        r["alert"] for g in outputs["alert_rules"]["groups"] for r in g["rules"]], "Prometheus runs the stack's rules"


def test_a_rail_set_down_raises_the_fabric_alert_naming_node_and_rail_then_resolves(first, project, alert_sink):
    t0 = time.time()
    sim_faults.set_rail(CLUSTER, "spark2", "roceP2p1s0f1", state="DOWN")
    try:
        hit = alert_sink.wait(lambda r: r.status == "firing" and r.labels.get("alertname") == "DsparkRailDown", t0,
                              90, "rail-down alert")  # fmt: skip
    finally:
        sim_faults.reset_fabric(CLUSTER)
    TIMINGS["alert: a rail set down, to the webhook"] = hit.at - t0
    assert (hit.labels["node"], hit.labels["rail"], hit.labels["hca"]) == ("spark2", "enP2p1s0f1np1", "roceP2p1s0f1")
    summary = hit.annotations["summary"]
    assert "rail enP2p1s0f1np1 (roceP2p1s0f1) of spark2 (rank 1) is down" in summary, summary
    assert "python -m dspark doctor --stack sim" in summary
    back = alert_sink.wait(lambda r: r.status == "resolved" and r.labels.get("alertname") == "DsparkRailDown",
                           hit.at, 60, "its resolution")  # fmt: skip
    TIMINGS["alert: the rail back, resolved at the webhook"] = back.at - hit.at
    assert "42" in ask(first.env)  # the group served on one rail meanwhile


def test_a_serving_change_takes_the_group_down_head_first_before_any_new_rank_starts(first, project):
    before_ranks, before_shards = containers_of(STACK), shard_mtimes()
    project.set_config("cluster.serving.maxRunningRequests", "3")
    preview = project.preview().check()
    # What the reviewer reads: the 3 ranks, the group generation, the fabric gate, the readiness probe, the 3
    # preflights and memory gates, the image agreement and the 3 guards replaced; the changed flag value; nothing
    # on disk.
    assert "+-16 to replace" in resources_summary(preview.text), resources_summary(preview.text)
    assert '"4" => "3"' in preview.text
    assert "engram" not in "".join(line for line in preview.text.splitlines() if line.lstrip().startswith("+-"))
    caches = compile_caches()
    grpc_log = project.work_dir.parent / "grpc-serving-change.jsonl"  # secrets in plain text: never kept
    t0 = time.time()
    project.timed("sim: serving change, up to answer", project.up(grpc_log=grpc_log)).check()
    events = container_events(t0 - 1, time.time() + 1)
    check_provider_trace(grpctrace.reduce(grpctrace.load(grpc_log)), project.work_dir.parent / "trace-serving-change.json")
    grpc_log.unlink()
    assert_group_restarted_head_first(events, before_ranks)
    assert shard_mtimes() == before_shards
    assert "42" in ask(first.env)
    # the restarted ranks mount the same compile-cache volume and find what the first boot tuned there
    assert compile_caches() == caches and all(caches.values())
    for name, node in zip(RANKS, NODES):
        assert "compile cache: reusing /root/.cache/flashinfer/dspark-sim-autotune.json" in node_sh(
            node, f"docker logs {name} 2>&1")


GOLDEN = Path(__file__).parent / "golden" / "serving-change.json"


def check_provider_trace(trace: dict, keep: Path) -> None:
    """The provider calls of the serving change, reduced (sim/grpctrace.py: keys and decisions, no values), as
    the README's comparison with the real plugins reads them: kept as `keep`, and equal to the golden trace
    (DSPARK_UPDATE_GOLDEN=1 rewrites it after a deliberate change; review its diff)."""
    text = json.dumps(trace, indent=1, sort_keys=True) + "\n"
    assert "sk-e2e" not in text and '"value"' not in text  # no value, so no secret
    keep.write_text(text)
    if os.environ.get("DSPARK_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    lines = grpctrace.diff(json.loads(GOLDEN.read_text()), trace)
    assert not lines, "the providers decided otherwise than tests/e2e/golden/serving-change.json:\n" + "\n".join(lines[:30])
    for rank in RANKS:  # each rank: diffed (a replace, delete first), deleted, then created
        # (the engine diffs a rank with its old inputs first, once per replaced resource it depends on: no change)
        calls = [c for c in trace[rank.replace("sim-", "sim-sglang-")]["calls"] if c["method"] != "Check"]
        assert [c["method"] for c in calls[-3:]] == ["Diff", "Delete", "Create"], (rank, calls)
        assert all(c["changes"] == "DIFF_NONE" for c in calls[:-3]), (rank, calls)
        diff = calls[-3]
        assert diff["replaces"] and diff["deleteBeforeReplace"], diff
    generation = next(c for c in trace["sim-sglang-generation"]["calls"] if c["method"] == "Diff")
    assert generation["replaces"] == ["triggers"], generation


def compile_caches() -> dict[str, str]:
    """node -> the compile-cache volume its rank mounts at /root/.cache, and the cached file's content."""
    out = {}
    for name, node in zip(RANKS, NODES):
        volume = node_sh(node, f"docker inspect -f '{{{{range .Mounts}}}}{{{{if eq .Destination \"{launch.CACHE_MOUNT}\"}}}}"
                               f"{{{{.Name}}}}{{{{end}}}}{{{{end}}}}' {name}").strip()
        data = node_sh(node, f"cat /var/lib/docker/volumes/{volume}/_data/flashinfer/dspark-sim-autotune.json", check=False)
        out[node] = f"{volume} {data}" if volume and data else ""
    return out


def test_the_ranks_use_both_twins_and_the_gate_measured_every_pair(first, project):
    """Both RoCE twins of the cabled port in every rank's NCCL env (found on the node at start), and
    the bandwidth of every pair of nodes over both rails, kept in the `fabric` output."""
    for rank, node in zip(RANKS, NODES):
        logs = node_sh(node, f"docker logs {rank} 2>&1")
        assert ("NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1 NCCL_IB_GID_INDEX=3 NCCL_SOCKET_IFNAME=enp1s0f1np1"
                in logs), logs[-2000:]  # fmt: skip
    gate = project.outputs()["fabric"]["sim"]
    assert gate["ok"] and gate["floorGbps"] == 175
    pairs = {(p["a"], p["b"]): p for p in gate["pairs"]}
    assert set(pairs) == {("spark1", "spark2"), ("spark1", "spark3"), ("spark2", "spark3")}
    for p in pairs.values():
        assert [r["client"] for r in p["rails"]] == ["rocep1s0f1", "roceP2p1s0f1"] and p["totalGbps"] == 187.0
    TIMINGS["sim: fabric gate (3 pairs x 2 rails), seconds measuring"] = sum(p["seconds"] for p in pairs.values())


def test_rank_containers_carry_the_memory_plans_limit_and_the_oom_score(first, project):
    """The limit the preview shows (memory = memorySwap, from the memory plan) is the container's cgroup
    limit on the node, and the rank's process is the kernel's first OOM choice."""
    text = project.cli("config", "get", "deepseek-spark:cluster", "--json").check().text
    doc = json.loads(text[text.index("{"):text.rindex("}") + 1])
    sp = stackplan.build_stack(parse_stack(doc.get("objectValue") or json.loads(doc["value"])), STACK).groups[0]
    for rank, (name, node) in enumerate(zip(RANKS, NODES)):
        memory, swap, pid = node_sh(node, f"docker inspect -f '{{{{.HostConfig.Memory}}}} {{{{.HostConfig.MemorySwap}}}} "
                                          f"{{{{.State.Pid}}}}' {name}").split()
        # what its node's budget leaves it (the node exporter's, and on spark1 Prometheus's, limits counted)
        assert int(memory) == int(swap) == sp.budgets[rank].rank.limit_mib * 1024 * 1024 == \
            sp.group.specs[rank].memory_mib * 1024 * 1024
        assert node_sh(node, f"cat /proc/{pid}/oom_score_adj").strip() == str(launch.OOM_SCORE_ADJ)


# fault -> (how the sim breaks the fabric, what `up` must say); each fails `up` before any rank starts
FABRIC_FAULTS = {
    "a twin down": (
        lambda: sim_faults.set_rail(CLUSTER, "spark2", "roceP2p1s0f1", state="DOWN"),
        "preflight spark2: FAIL fabric-rails: roceP2p1s0f1 (enP2p1s0f1np1), twin of rocep1s0f1 on the cabled "
        "port, is DOWN"),
    "a port at 100G": (
        lambda: [sim_faults.set_rail(CLUSTER, "spark3", rail, speed_mbps=100000, gbps=46.5)
                 for rail in ("rocep1s0f1", "roceP2p1s0f1")],
        "preflight spark3: FAIL fabric-link-speed: enp1s0f1np1 (rocep1s0f1) negotiated 100000Mb/s, "
        "fabric.linkSpeedMbps is 200000 (a port left at 100G halves the fabric); on a switch, set the port to "
        "200G with autonegotiation off"),
    "an MTU mismatch": (
        lambda: sim_faults.set_rail(CLUSTER, "spark3", "rocep1s0f1", mtu=1500),
        "preflight spark3: FAIL fabric-mtu: enp1s0f1np1 (rocep1s0f1) has MTU 1500, fabric.mtu is 9000"),
    "the fabric IP on the management interface": (
        None,  # a config change: every fabricIp is its node's host (the 10 GbE management addresses)
        at("preflight spark2: FAIL fabric-ip: fabricIp 172.30.99.12 is on enP7s7, which is not a ConnectX-7 "
           "interface")),
}  # fmt: skip


def test_each_fabric_fault_fails_up_in_preflight_naming_node_link_figure_and_fix(first, project):
    """Each try restarts the group (a new serving.generation: a preflight that passed in an earlier failed
    `up` is not re-run for the same revision), so every node's preflight runs again; with the fabric
    broken it fails, and the running group is neither stopped nor joined by a new rank."""
    failures = {}
    for generation, (fault, (breaks, expect)) in enumerate(FABRIC_FAULTS.items(), start=1):
        project.set_config("cluster.serving.generation", str(generation))
        before = containers_of(STACK)
        if breaks is None:
            # one node alone on the management subnet: refused at preview (it shares no link with its peers)
            project.set_config("cluster.nodes[1].fabricIp", at("172.30.99.12"))
            refused = project.preview()
            assert refused.code != 0 and "spark1 and spark2 have no data-plane addresses in one /24 subnet" in refused.text
            for i in (0, 2):
                project.set_config(f"cluster.nodes[{i}].fabricIp", at(f"172.30.99.1{i + 1}"))
        else:
            breaks()
        run, events = timed_up(project, f"sim: up with {fault} (fails in preflight)", expect_ok=False)
        failures[fault] = run
        fails = [line.strip() for line in run.text.splitlines() if "FAIL" in line or "error:" in line]
        assert run.code != 0 and expect in run.text, (fault, fails or run.text[-4000:])
        assert containers_of(STACK) == before, fault
        assert not [e for e in events if e.action in ("destroy", "start") and e.name in RANKS], fault
        if breaks is None:
            assert "control and data plane on one address" in run.text  # the preview's warning
            for i in range(3):
                project.set_config(f"cluster.nodes[{i}].fabricIp", at(f"10.99.1.1{i + 1}"))
        sim_faults.reset_fabric(CLUSTER)
    assert "42" in ask(first.env)  # the old group served throughout


def test_a_link_that_carries_13_gbps_fails_the_gate_then_a_healthy_fabric_comes_up(first, project):
    """ethtool says 200G, the link carries 6.5 Gb/s per twin: preflight passes, the bandwidth gate fails
    naming the pairs and figures, and no new rank starts; with the link repaired `up` converges."""
    project.set_config("cluster.serving.generation", str(len(FABRIC_FAULTS) + 1))
    for rail in ("rocep1s0f1", "roceP2p1s0f1"):
        sim_faults.set_rail(CLUSTER, "spark2", rail, gbps=6.5)
    run, events = timed_up(project, "sim: up with a link carrying 13 Gb/s (fails at the gate)", expect_ok=False)
    assert run.code != 0
    assert "fabric gate: FAIL spark1<->spark2 carried 13 Gb/s over 2 rail(s)" in run.text, run.text[-4000:]
    assert "below fabric.minBandwidthGbps 175" in run.text and "autonegotiation off" in run.text
    assert not [e for e in events if e.action == "start" and e.name in RANKS]
    sim_faults.reset_fabric(CLUSTER)
    timed_up(project, "sim: up after the fabric is repaired")
    assert "42" in ask(first.env)
    assert project.outputs()["fabric"]["sim"]["ok"]


def test_nccl_debug_shows_every_rank_on_net_ib(first, project):
    """serving.ncclDebug: NCCL_DEBUG=INFO from the next restart; every rank's NCCL (the double, with NCCL
    2.30's device selection) logs both twins and channels via NET/IB."""
    project.set_config("cluster.serving.ncclDebug", "true")
    timed_up(project, "sim: ncclDebug on, up to answer")
    for name, node in zip(RANKS, NODES):
        logs = node_sh(node, f"docker logs {name} 2>&1")
        assert bootlog.nccl_transport(logs) == "NET/IB", logs[-2000:]
        assert "NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE" in logs
    assert "42" in ask(first.env)


def test_an_argv_the_image_refuses_fails_up_at_the_check_before_any_rank_stops(first, project):
    """A release without an option table here (0.5.22): preview only warns, and the image's own parser
    (the argcheck step on every node) refuses the flag before the running group is touched."""
    before = containers_of(STACK)
    project.set_config("cluster.engineVersion", "0.5.22")
    project.set_config("cluster.serving.extraArgs[9]", "--no-such-flag")
    project.preview().check()  # preview cannot know this release's options (a warning, tests/unit/test_rules.py)
    run, events = timed_up(project, "sim: up with an argv the image refuses (fails at argcheck)", expect_ok=False)
    assert run.code != 0
    assert run.seconds < 60, f"failed only after {run.seconds:.0f}s"
    assert "argcheck: node spark1 rank 0 (sglang): refused: --no-such-flag: " in run.text
    assert "unrecognized arguments: --no-such-flag" in run.text  # the engine's own message
    assert project.api_key not in run.text
    # nothing of the running group was stopped or started: the check runs before the generation
    assert containers_of(STACK) == before
    assert not [e for e in events if e.action in ("destroy", "start") and e.name in RANKS]
    assert "42" in ask(first.env)
    project.cli("config", "rm", "--path", "deepseek-spark:cluster.serving.extraArgs[9]").check()
    project.cli("config", "rm", "--path", "deepseek-spark:cluster.engineVersion").check()
    project.up().check()
    assert "42" in ask(first.env)


def test_a_node_with_another_image_is_refused_before_any_rank_stops(first, project):
    """spark2's base image (what sim/overlay builds FROM) is replaced under the same tag: the next group
    start reads every node's image ID, and `up` fails naming the nodes and IDs, the running group untouched."""
    before = containers_of(STACK)
    base = sim_images.ENGINE_IMAGE
    inspect = f"docker image inspect -f '{{{{.Id}}}}' {base}"
    original = node_sh("spark1", inspect).strip()
    node_sh("spark2", f"printf 'FROM {base}\\nLABEL moved=1\\n' | docker build -q -t {base} - >/dev/null")
    moved = node_sh("spark2", inspect).strip()
    assert moved != original
    project.set_config("cluster.serving.generation", "1")
    try:
        run, events = timed_up(project, "sim: up with another image on one node (fails)", expect_ok=False)
        assert run.code != 0
        assert f"image sim: FAIL the group's nodes do not hold the same image: {base} differs: " in run.text
        assert f"{original} on spark1, spark3" in run.text and f"{moved} on spark2" in run.text
        assert containers_of(STACK) == before
        assert not [e for e in events if e.action in ("destroy", "start") and e.name in RANKS]
        assert "42" in ask(first.env)
    finally:
        node_sh("spark2", f"docker tag {original} {base} && docker rmi {moved} >/dev/null")
    # the generation bump stays pending: the next test's first `up` restarts the group on the same image again


def test_a_pool_below_the_plan_or_memory_held_on_a_node_fails_up_naming_the_figures(first, project):
    """The double obtains half the pinned pool (memory held on the node): `up` fails with both figures;
    with readiness.kvShortfall: warn it passes, and the shortfall is in the output. Then memory held on
    spark2 (the node's /proc/meminfo model): the memory gate fails `up` once the old group is down and
    before any new rank starts, naming the node, the figures and the holder; released, `up` converges."""
    project.set_config("cluster.serving.extraEnv.DSPARK_SIM_KV_SHARE", "0.5")
    run, _ = timed_up(project, "sim: up with a KV pool below the plan (fails)", expect_ok=False)
    assert run.code != 0
    assert "FAILED: the KV pool rank 0 obtained is 375,000 tokens, 50% of the 750,000 the plan expects" in run.text
    project.set_config("cluster.readiness.kvShortfall", "warn")
    timed_up(project, "sim: the same with kvShortfall: warn")
    boot = project.outputs()["boot"]["sim"]
    assert boot["kvTokens"] == 375_000 and "375,000" in boot["shortfall"]
    for path in ("cluster.serving.extraEnv.DSPARK_SIM_KV_SHARE", "cluster.readiness.kvShortfall"):
        project.cli("config", "rm", "--path", f"deepseek-spark:{path}").check()
    sim_faults.hold_memory(CLUSTER, "spark2", 118 * 1024)
    try:
        run, events = timed_up(project, "sim: up with memory held on spark2 (fails at the memory gate)", expect_ok=False)
        assert run.code != 0
        assert "memory spark2: FAIL available: " in run.text and "the memory plan needs" in run.text
        assert "for the worker rank; largest processes: sim-memory-hold (pid " in run.text
        assert not containers_of(STACK), "a rank started although a node lacked the memory"
        assert not [e for e in events if e.action == "start" and e.name in RANKS]
        code, doctor = dspark(project, "doctor")
        assert code == 1 and "memory spark2: " in doctor and " SHORT" in doctor
    finally:
        sim_faults.release_memory(CLUSTER, "spark2")
    timed_up(project, "sim: memory released, up")
    assert project.outputs()["boot"]["sim"]["shortfall"] is None


def test_refresh_after_a_rank_killed_at_its_limit_and_one_removed_then_up_restarts_the_whole_group(first, project):
    """rank 1 runs away (the double allocates without bound on SIGUSR1) and its container's memory limit kills
    it (lowered to 256 MiB: the sim cannot hold the plan's ~120 GiB); `dspark status` says so."""
    before_ranks = containers_of(STACK)
    code, out = dspark(project, "guard", "pause", "--reason", "refresh and up repair the group here, not the guard")
    assert code == 0, out
    node_sh("spark2", "docker update --memory 256m --memory-swap 256m sim-rank1 >/dev/null && docker kill -s USR1 sim-rank1 >/dev/null")
    deadline = time.monotonic() + 60
    while node_sh("spark2", "docker inspect -f '{{.State.Status}} {{.State.OOMKilled}}' sim-rank1").split() != ["exited", "true"]:
        assert time.monotonic() < deadline, node_sh("spark2", "docker inspect -f '{{json .State}}' sim-rank1")
        time.sleep(0.5)
    _, status = dspark(project, "status")
    assert "OOM killed" in status, status
    node_sh("spark3", "docker rm -f sim-rank2 >/dev/null")
    t0 = time.monotonic()
    refresh = project.refresh().check()
    assert "sim-sglang-rank2" in refresh.text and "deleted" in resources_summary(refresh.text)
    run, events = timed_up(project, "sim: up after refresh")
    TIMINGS["sim: refresh and repair"] = time.monotonic() - t0
    starts = {n: first_event(events, "start", n).t for n in RANKS}
    assert set(starts) == set(RANKS), "every rank restarted, none left alone"
    assert max(starts, key=starts.get) == HEAD, "the head starts last"
    assert not set(containers_of(STACK).values()) & set(before_ranks.values())
    assert "42" in ask(first.env)
    assert dspark(project, "guard", "resume")[0] == 0  # the new group's guards found the marker: still paused


def test_key_rotation_and_a_new_state_dir_take_the_group_down_head_first(first, project, tmp_path):
    before_ranks = containers_of(STACK)
    new_key = "sk-e2e-rotated-" + "5" * 24
    project.cli("config", "set", "--secret", "deepseek-spark:apiKey", stdin=new_key).check()
    project.set_config("cluster.stateDir", "/var/lib/deepseek-spark-rotated")
    run, events = timed_up(project, "sim: key rotation and stateDir, up to answer")
    assert_group_restarted_head_first(events, before_ranks)
    assert node_sh("spark1", "ls /var/lib/deepseek-spark/sim 2>/dev/null || true").strip() == "", "old key file left"
    assert node_sh("spark1", "stat -c %a /var/lib/deepseek-spark-rotated/sim/api-key").strip() == "600"
    env = client_env(project, tmp_path)
    assert env["OPENAI_API_KEY"] == new_key and "42" in ask(env)
    with pytest.raises(openai.AuthenticationError):
        ask(env, key=project.api_key)
    assert new_key not in run.text


def test_a_node_stopped_mid_up_fails_naming_it_then_up_converges(first, project, tmp_path):
    before_shards = shard_mtimes()
    project.set_config("cluster.serving.maxRunningRequests", "2")
    proc = project.up_in_background()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "sim-rank0" in node_sh("spark1", "docker ps -a --format '{{.Names}}'"):
        time.sleep(0.2)  # the old group is going down: the new one is about to start
    sim_cluster.stop_node(CLUSTER, "spark2", log=lambda m: None)
    try:
        text, _ = proc.communicate(timeout=600)
    finally:
        sim_cluster.start_node(CLUSTER, "spark2", log=lambda m: None)
    assert proc.returncode != 0
    assert at("172.30.99.12") in text, text[-3000:]  # spark2's address, in the failing step's message
    run, _ = timed_up(project, "sim: up after the node came back")
    assert "42" in ask(client_env(project, tmp_path))
    assert shard_mtimes() == before_shards, "nothing lost, nothing re-packed"
