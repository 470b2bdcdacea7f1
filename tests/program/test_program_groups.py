"""__main__.py under Pulumi mocks for stacks with several groups behind the router (tp4x2, sim-x2):
the router, each group's membership, the rolling order in the graph, the outputs; and the one-group
stacks, which must plan exactly as before (no router, same resource names)."""

import copy
import json
from pathlib import Path

import pulumi
import pytest

from harness import TEST_API_KEY, Secret, cluster_of, plain_strings, reveal, run_program

CONTAINER = "docker:index/container:Container"
LOCAL = "command:local:Command"
REMOTE = "command:remote:Command"
GROUP_STACKS = ["tp4x2", "sim-x2"]


@pytest.fixture(scope="module", params=GROUP_STACKS)
def stack(request):
    return request.param


@pytest.fixture(scope="module")
def rec(stack):
    return run_program(stack)


def labels_of(res) -> dict:
    return {lab["label"]: lab["value"] for lab in reveal(res.inputs)["labels"]}


def group_ranks(rec, stack, group):
    return sorted(
        (r for r in rec.ranks() if labels_of(r).get("deepseek-spark.stack") == f"{stack}-{group}"),
        key=lambda r: int(labels_of(r)["deepseek-spark.rank"]),
    )


def test_router_runs_sglang_router_with_every_group_as_a_worker(rec, stack):
    router = rec.named(f"{stack}-router-container")
    args = router.inputs["command"]
    heads = [g["endpoint"].removesuffix("/v1") for g in rec.outputs["groups"]]
    assert args[args.index("--worker-urls") + 1 :] == heads and len(heads) == 2
    assert args[args.index("--policy") + 1] == "round_robin"
    assert args[args.index("--port") + 1] == "8889" and args[args.index("--prometheus-port") + 1] == "29000"
    assert args[args.index("--request-timeout-secs") + 1] == "1800"
    script = router.inputs["entrypoints"][2]
    assert "sglang_router.launch_router" in script and '--api-key "$(cat /run/secrets/dspark-api-key)"' in script
    assert router.inputs["networkMode"] == "host" and router.inputs["restart"] == "unless-stopped"
    assert router.delete_before_replace and "mustRun" in router.replace_on_changes
    mount = router.inputs["mounts"][0]
    assert mount["target"] == "/run/secrets/dspark-api-key" and mount["readOnly"] is True
    key_file = rec.named(f"{stack}-router-api-key")
    assert key_file.inputs["create"].count(mount["source"]) >= 1 and reveal(key_file.inputs["stdin"]) == TEST_API_KEY
    # The router is on its node's docker engine, through its own provider.
    node = rec.outputs["router"]["node"]
    host = next(n["host"] for n in rec.outputs["nodes"] if n["name"] == node)
    assert rec.named(f"{stack}-router-docker").inputs["host"].endswith(f"@{host}")


def test_the_router_has_a_memory_limit_and_its_nodes_rank_gives_it_room(rec, stack):
    """router.memoryMiB (1024) is the router container's limit, no swap; the rank on its node is given what its
    budget leaves (never more), and the preview log shows that node's budget with the router in it."""
    router = rec.named(f"{stack}-router-container")
    assert router.inputs["memory"] == router.inputs["memorySwap"] == 1024
    head = group_ranks(rec, stack, "a")[0]
    budget_mib = int(121.7 * 1024) - 1536
    assert head.inputs["memory"] == head.inputs["memorySwap"] <= budget_mib - 1024
    log = next(m for _, m in rec.logs if m.startswith("[group a] memory budget per node"))
    assert f"spark1: budget {budget_mib:,} MiB" in log and f"{stack}-router 1,024" in log


def test_the_key_never_reaches_router_args_labels_or_outputs(rec):
    for res in rec.resources:
        for text in plain_strings(res.inputs):
            assert TEST_API_KEY not in text, f"API key in plain input of {res.name}"
    for name, value in rec.outputs.items():
        for text in plain_strings(value):
            assert TEST_API_KEY not in text, f"API key in plain output {name}"
    assert isinstance(rec.outputs["client_config"], Secret)


def test_group_b_goes_down_only_after_group_a_is_back_in_rotation(rec, stack):
    member_a = rec.named(f"{stack}-a-router-member")
    gen_a, gen_b = rec.named(f"{stack}-a-sglang-generation"), rec.named(f"{stack}-b-sglang-generation")
    assert member_a.urn in gen_b.dependencies
    assert not any("-b-" in short for short in (d.rsplit("::", 1)[-1] for d in gen_a.dependencies))
    # Only a dependsOn edge: replacing group a must not replace (take down) group b.
    assert all(member_a.urn not in deps for deps in gen_b.property_dependencies.values())


def test_membership_leaves_the_rotation_before_its_group_stops(rec, stack):
    for group in ("a", "b"):
        member = rec.named(f"{stack}-{group}-router-member")
        check = rec.named(f"{stack}-{group}-readiness-check")
        router = rec.named(f"{stack}-router-container")
        # Triggers from the readiness check: a restarted group deletes the membership first.
        assert check.urn in member.property_dependencies["triggers"]
        assert router.urn in member.property_dependencies["triggers"]
        assert member.delete_before_replace
        worker = next(g for g in rec.outputs["groups"] if g["name"] == group)["endpoint"].removesuffix("/v1")
        assert member.inputs["create"].startswith("python3 -m programs.membership add")
        assert f"--worker {worker}" in member.inputs["create"] and f"--worker {worker}" in member.inputs["delete"]
        assert "--drain-timeout" in member.inputs["delete"] and "--engine sglang" in member.inputs["delete"]
        assert reveal(member.inputs["environment"])["DSPARK_API_KEY"] == TEST_API_KEY


def test_routed_sglang_groups_serve_metrics_for_the_drain(rec, stack):
    for group in ("a", "b"):
        ranks = group_ranks(rec, stack, group)
        assert len(ranks) == 4 if stack == "tp4x2" else 2
        for r in ranks:
            assert "--enable-metrics" in r.inputs["command"]


def test_outputs_point_clients_at_the_router(rec, stack):
    out = rec.outputs
    router = out["router"]
    assert out["endpoint"] == router["endpoint"] and router["endpoint"].endswith(":8889/v1")
    assert out["client_config"].value["base_url"] == router["endpoint"]
    assert [g["name"] for g in out["groups"]] == ["a", "b"]
    a, b = out["groups"]
    assert set(a["nodes"]).isdisjoint(b["nodes"]) and a["revision"] != b["revision"]
    assert {n["group"] for n in out["nodes"]} == {"a", "b"}
    assert set(out["memory_plan"]) == {"a", "b"} and "group_revision" not in out
    ready = rec.named(f"{stack}-router-readiness-check")
    assert "--url " + router["endpoint"] in ready.inputs["create"] and "--rank" not in ready.inputs["create"]
    assert {rec.named(f"{stack}-a-router-member").urn, rec.named(f"{stack}-b-router-member").urn} <= set(
        ready.dependencies
    )


def test_group_resources_carry_the_group_in_their_names(rec, stack):
    names = {labels_of(r)["deepseek-spark.stack"] for r in rec.of_type(CONTAINER)}
    assert names == {stack, f"{stack}-a", f"{stack}-b"}  # the router, then each group's ranks
    containers = {r.inputs["name"] for r in rec.of_type(CONTAINER)}
    assert f"{stack}-a-rank0" in containers and f"{stack}-b-rank0" in containers and f"{stack}-router" in containers


def test_one_group_stacks_have_no_router_and_keep_their_names():
    rec = run_program("tp4")
    assert not [r for r in rec.resources if "router" in r.name]
    assert {r.inputs["name"] for r in rec.ranks()} == {f"tp4-rank{i}" for i in range(4)}
    assert {r.inputs["name"] for r in rec.containers("guard")} == {"tp4-guard"}
    assert rec.named("tp4-sglang-generation") and rec.named("tp4-readiness-check")
    assert all(r.inputs["command"].count("--enable-metrics") == 1 for r in rec.ranks())  # observed by default
    assert set(rec.outputs) == {"endpoint", "model", "api_key", "nodes", "memory_plan", "group_revision", "groups",
                                "boot", "fabric", "prometheus", "alert_rules", "client_config", "monitoring",
                                "exposure"}  # fmt: skip
    jobs = {c["job_name"]: c for c in rec.outputs["prometheus"]["scrape_configs"]}
    assert set(jobs) == {"tp4-engine", "tp4-guard", "tp4-node"}  # no router: rank 0, the guards, the node exporters
    assert jobs["tp4-engine"]["static_configs"] == [{"targets": ["10.0.0.1:8888"], "labels": {
        "stack": "tp4", "group": "tp4", "engine": "sglang", "role": "engine"}}]  # fmt: skip
    assert jobs["tp4-guard"]["static_configs"][0]["targets"] == [f"10.0.0.{i}:9850" for i in range(1, 5)]
    assert [c["targets"] for c in jobs["tp4-node"]["static_configs"]] == [[f"10.0.0.{i}:9100"] for i in range(1, 5)]
    assert rec.outputs["monitoring"] == {"node_exporters": [f"10.0.0.{i}:9100" for i in range(1, 5)]}
    assert rec.outputs["groups"][0]["name"] == "tp4" and rec.outputs["groups"][0]["revision"] == rec.outputs[
        "group_revision"
    ]


def test_a_change_to_one_group_changes_only_its_revision():
    base = run_program("tp4x2").outputs["groups"]
    raw = cluster_of("tp4x2")
    raw["groups"][1]["serving"] = {"maxRunningRequests": 4}
    changed = run_program("tp4x2", cluster=raw).outputs["groups"]
    assert changed[0]["revision"] == base[0]["revision"] and changed[1]["revision"] != base[1]["revision"]
    raw = cluster_of("tp4x2")
    raw["serving"]["maxRunningRequests"] = 4  # the shared block: both groups
    both = run_program("tp4x2", cluster=raw).outputs["groups"]
    assert all(n["revision"] != o["revision"] for n, o in zip(both, base))


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda r: r["groups"][1]["nodes"].__setitem__(0, dict(r["groups"][0]["nodes"][0])),
         "cluster.groups[1](b).nodes[0].name = 'spark1': is also a node of group 'a'"),
        (lambda r: r["router"].__setitem__("node", "spark9"), "cluster.router.node = 'spark9': is not a node"),
        (lambda r: r["router"].__setitem__("port", 8888), "cluster.router.port = 8888: is the group's serving.port on spark1"),
        (lambda r: r["router"].__setitem__("metricsPort", 20000),
         "cluster.router.metricsPort = 20000: is the group's serving.distPort on spark1"),
        (lambda r: r["groups"][1].__setitem__("model", {"servedName": "other"}),
         "cluster.groups[1](b).model.servedName = 'other': differs from group 'a'"),
        (lambda r: r["groups"][1].__setitem__("serving", {"tpSize": 3}),
         "cluster.groups[1](b).serving.tpSize = 3: 4 nodes are listed"),
        (lambda r: r.__setitem__("imageBuild", {"context": "sim/overlay"}), "cluster.router.image = None: the router takes its image from group 'a', whose image is built"),
    ],
)  # fmt: skip
def test_bad_group_config_names_the_field_and_registers_nothing(change, expected):
    raw = cluster_of("tp4x2")
    change(raw)
    with pytest.raises(pulumi.RunError) as err:
        run_program("tp4x2", cluster=raw)
    assert expected in str(err.value), str(err.value)
    assert "fix:" in str(err.value)
    assert pulumi.runtime.settings.SETTINGS.monitor.recording.resources == []


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda r: r["groups"][0].__setitem__("ssh", {}), "cluster.groups[0].ssh: not a per-group field"),
        (lambda r: r["groups"][1].__setitem__("name", "B"), "cluster.groups[1].name: 'B' must be"),
        (lambda r: r["groups"][1].__setitem__("name", "a"), "the name 'a' is used twice"),
        (lambda r: r.__setitem__("nodes", r["groups"][0]["nodes"]), "cluster.nodes: with `groups` every node"),
        (lambda r: r["router"].__setitem__("policy", "fastest"), "cluster.router.policy: Input should be"),
    ],
)  # fmt: skip
def test_bad_group_shapes_are_refused_at_parse(change, expected):
    raw = cluster_of("tp4x2")
    change(raw)
    with pytest.raises(pulumi.RunError) as err:
        run_program("tp4x2", cluster=raw)
    assert expected in str(err.value), str(err.value)


def test_a_router_in_front_of_one_group():
    raw = cluster_of("tp4")
    raw["router"] = {"node": "spark1", "port": 8889}
    rec = run_program("tp4", cluster=raw)
    assert rec.outputs["endpoint"] == "http://10.0.0.1:8889/v1"
    assert rec.named("tp4-router-container").inputs["command"][-2:] == ["--worker-urls", "http://10.0.0.1:8888"]
    assert rec.named("tp4-router-member") and {r.inputs["name"] for r in rec.of_type(CONTAINER)} >= {"tp4-rank0"}


def test_vllm_groups_behind_the_router_need_an_image_with_it():
    raw = copy.deepcopy(cluster_of("tp2"))
    raw["router"] = {"node": "spark1"}
    with pytest.raises(pulumi.RunError, match=r"cluster.router.image = None: the router takes its image from group 'tp2', which runs vLLM"):
        run_program("tp2", cluster=raw)
    raw["router"]["image"] = "lmsysorg/sglang:dev-dsv41"
    rec = run_program("tp2", cluster=raw)
    member = rec.named("tp2-router-member")
    assert "--engine vllm" in member.inputs["delete"]
    assert rec.named("tp2-router-container").inputs["image"] == "lmsysorg/sglang:dev-dsv41"
    assert json.dumps(rec.outputs["router"]).count("8000") == 1  # the vLLM head's port as the worker


@pytest.fixture
def local_docker(tmp_path, monkeypatch):
    """A unix socket standing for the docker engine where Pulumi runs."""
    import socket

    from declared import settings

    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    monkeypatch.setattr(settings, "LOCAL_DOCKER_SOCKET", str(path))
    yield path
    server.close()


def test_a_router_where_pulumi_runs(local_docker):
    from declared import settings

    raw = cluster_of("tp4x2")
    raw["router"] = {"node": "local", "address": "192.168.1.20"}
    rec = run_program("tp4x2", cluster=raw)
    assert rec.named("tp4x2-router-docker-local").inputs["host"] == "unix:///var/run/docker.sock"
    assert settings.LOCAL_DOCKER_SOCKET != "/var/run/docker.sock"  # the fixture's: the check read that one
    key_file = rec.named("tp4x2-router-api-key")
    assert key_file.type == LOCAL and reveal(key_file.inputs["stdin"]) == TEST_API_KEY
    assert "/.local/state/deepseek-spark/tp4x2-router/api-key" in key_file.inputs["create"]
    assert all(TEST_API_KEY not in text for text in plain_strings(key_file.inputs))  # only as a secret
    assert rec.outputs["endpoint"] == "http://192.168.1.20:8889/v1" and rec.outputs["router"]["node"] == "local"
    member = rec.named("tp4x2-a-router-member")
    assert "--router http://192.168.1.20:8889" in member.inputs["create"]


def test_a_router_where_pulumi_runs_without_a_docker_engine_there_is_refused_at_preview(tmp_path, monkeypatch):
    """pulumi-docker pings a unix:// engine when it configures its provider, at preview too: without one
    the preview fails; the program says why first, naming the field and both fixes."""
    from declared import settings

    monkeypatch.setattr(settings, "LOCAL_DOCKER_SOCKET", str(tmp_path / "no-docker.sock"))
    raw = cluster_of("tp4x2")
    raw["router"] = {"node": "local"}
    with pytest.raises(pulumi.RunError, match=r"router.node: local runs the router on the docker engine where "
                                              r"Pulumi runs, and there is none at .*no-docker.sock") as err:
        run_program("tp4x2", cluster=raw, preview=True)
    assert "router.node: <a node's name>" in str(err.value)
    (tmp_path / "no-docker.sock").write_text("")  # a file there is not an engine either
    with pytest.raises(pulumi.RunError, match="there is none at"):
        run_program("tp4x2", cluster=raw, preview=True)


def test_a_node_named_local_is_ambiguous_for_the_router():
    raw = cluster_of("tp4x2")
    raw["groups"][1]["nodes"][3]["name"] = "local"
    raw["router"]["node"] = "local"
    with pytest.raises(pulumi.RunError, match="cluster.router.node = 'local': names where Pulumi runs, and a node"):
        run_program("tp4x2", cluster=raw)


def test_prometheus_scrapes_the_router_and_every_group_head(rec, stack):
    configs = {c["job_name"]: c for c in rec.outputs["prometheus"]["scrape_configs"]}
    router_host = rec.outputs["router"]["endpoint"].split("//")[1].split(":")[0]
    assert configs[f"{stack}-router"]["static_configs"][0]["targets"] == [f"{router_host}:29000"]
    engines = configs[f"{stack}-engine"]["static_configs"]
    assert [(e["labels"]["group"], e["targets"]) for e in engines] == [
        (g["name"], [g["endpoint"].split("//")[1].removesuffix("/v1")]) for g in rec.outputs["groups"]
    ]
    guards = configs[f"{stack}-guard"]["static_configs"]
    assert [g["labels"]["group"] for g in guards] == [g["name"] for g in rec.outputs["groups"]]
    assert sum(len(g["targets"]) for g in guards) == len(rec.ranks()) and configs[f"{stack}-guard"]["honor_labels"]
    assert all(TEST_API_KEY not in text for text in plain_strings(rec.outputs["prometheus"]))


def test_alert_rules_output_covers_every_group(rec, stack):
    rules = rec.outputs["alert_rules"]["groups"][0]["rules"]
    assert rec.outputs["alert_rules"]["groups"][0]["name"] == f"deepseek-spark-{stack}"
    for alert in ("DsparkGroupDown", "DsparkRankDown", "DsparkKvPoolBelowPlan", "DsparkTimeToFirstTokenHigh"):
        assert {r["labels"]["group"] for r in rules if r["alert"] == alert} == {g["name"] for g in rec.outputs["groups"]}
    assert all(r["labels"]["stack"] == stack for r in rules)
    assert all(TEST_API_KEY not in text for text in plain_strings(rec.outputs["alert_rules"]))


def test_boot_output_per_group_from_each_readiness_probe():
    """`boot`: what each group's probe printed (its last `deepseek-spark boot:` line); None without one."""
    line = 'readiness: ...\ndeepseek-spark boot: {"kvTokens": 6213120, "expectedKvTokens": 5980000, "shortfall": null}'
    rec = run_program("tp4x2", command_stdout={"tp4x2-a-readiness-check": line})
    assert rec.outputs["boot"] == {"a": {"kvTokens": 6213120, "expectedKvTokens": 5980000, "shortfall": None},
                                   "b": None}


def test_a_stale_ssh_agent_socket_is_refused_at_preview_with_both_fixes(tmp_path, monkeypatch):
    """pulumi-command dials SSH_AUTH_SOCK before every remote command (even with a private key) and fails it
    when nothing answers: the program says so at preview, before anything touches a node."""
    import socket

    gone = tmp_path / "agent.gone"
    monkeypatch.setenv("SSH_AUTH_SOCK", str(gone))
    with pytest.raises(pulumi.RunError, match=r"SSH_AUTH_SOCK is .*agent.gone, and no ssh agent answers there "
                                              r"\(no such file or directory\)") as err:
        run_program("tp4", preview=True)
    assert "env -u SSH_AUTH_SOCK pulumi up" in str(err.value) and "ssh-agent" in str(err.value)
    dead = tmp_path / "agent.dead"  # a socket file nobody listens on: refused
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))
    s.close()
    monkeypatch.setenv("SSH_AUTH_SOCK", str(dead))
    with pytest.raises(pulumi.RunError, match=r"\(connection refused\)"):
        run_program("tp4", preview=True)
    live = tmp_path / "agent.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(live))
    server.listen(1)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(live))
    try:
        assert run_program("tp4", preview=True).named("tp4-spark1-preflight")  # an answering agent is fine
    finally:
        server.close()


def test_remote_commands_ride_out_dial_failures_and_the_docker_ssh_shares_one_connection():
    """The defaults: pulumi-command's own dial limit (10: ~11 s of retries, enough for sshd's MaxStartups drops)
    and timeout; one ssh master per node for the docker provider; both configurable."""
    rec = run_program("tp4")
    conn = reveal(rec.named("tp4-spark2-preflight").inputs["connection"])
    assert conn["dialErrorLimit"] == 10 and conn["perDialTimeout"] == 15
    opts = rec.named("tp4-spark2-docker").inputs["sshOpts"]
    opts = json.loads(opts) if isinstance(opts, str) else opts
    assert "ControlMaster=auto" in opts and "ControlPath=~/.ssh/dspark-%C" in opts and "ControlPersist=60" in opts
    raw = cluster_of("tp4")
    raw["ssh"] = {"connectionReuse": False, "dialErrorLimit": 30, "perDialTimeout": 5}
    rec = run_program("tp4", cluster=raw)
    conn = reveal(rec.named("tp4-spark2-preflight").inputs["connection"])
    assert conn["dialErrorLimit"] == 30 and conn["perDialTimeout"] == 5
    assert "ControlMaster=auto" not in str(rec.named("tp4-spark2-docker").inputs["sshOpts"])


def test_connection_reuse_without_its_control_path_directory_is_a_warning_naming_the_fix(monkeypatch):
    import tempfile

    with tempfile.TemporaryDirectory(prefix="h") as home:  # short enough for the socket (tmp_path is not)
        monkeypatch.setenv("HOME", home)  # no ~/.ssh here
        rec = run_program("tp4", preview=True)
        warning = next(w for w in rec.warnings() if "controlPath" in w)
        assert "its directory ~/.ssh does not exist here" in warning and "mkdir -m 700 -p ~/.ssh" in warning
        (Path(home) / ".ssh").mkdir()
        assert not [w for w in run_program("tp4", preview=True).warnings() if "controlPath" in w]


def test_a_control_path_too_long_for_a_unix_socket_is_refused_at_preview_naming_the_fix(monkeypatch):
    """ssh binds its master at <ControlPath>.<16 characters> first: past 107 characters every ssh, and so every
    docker call, fails; the preview says so before anything touches a node (and a short one passes)."""
    raw = cluster_of("tp4")
    raw["ssh"] = {"controlPath": "~/.local/state/deepseek-spark-sim/sim-team-demo/cm-%C"}
    monkeypatch.setenv("HOME", "/root")
    with pytest.raises(Exception, match=r"controlPath .* makes sockets of up to 95 characters here \(with "
                                        r"HOME=/root\).*at most 90.*~/.ssh/dspark-%h-%p-%r"):
        run_program("tp4", cluster=raw, preview=True)
    raw["ssh"] = {"controlPath": "~/.local/state/deepseek-spark-sim/cm-%h-%p-%r"}
    run_program("tp4", cluster=raw, preview=True)
