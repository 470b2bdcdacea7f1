"""__main__.py under Pulumi mocks for the real stack files, asserting the resource graph."""

import json
import shlex

import pytest

from declared.cluster import ClusterConfig
from planning import launch, memoryplan, plan
from harness import TEST_API_KEY, TEST_SSH_KEY, Secret, cluster_of, group_of, plain_strings, reveal, run_program

CONTAINER = "docker:index/container:Container"
VOLUME = "docker:index/volume:Volume"
REMOTE = "command:remote:Command"
LOCAL = "command:local:Command"
DOCKER_PROVIDER = "pulumi:providers:docker"
IMAGE = "docker:index/remoteImage:RemoteImage"

STACKS = ["tp3", "tp4", "tp2"]  # every real stack file
SGLANG_STACKS = ["tp3", "tp4"]


@pytest.fixture(scope="module", params=STACKS)
def stack(request):
    return request.param


@pytest.fixture(scope="module")
def rec(stack):
    return run_program(stack)


@pytest.fixture(scope="module", params=SGLANG_STACKS)
def sg_stack(request):
    return request.param


@pytest.fixture(scope="module")
def sg_rec(sg_stack):
    return run_program(sg_stack)


def ranks(rec):
    out = {}
    for r in rec.ranks():
        labels = {lab["label"]: lab["value"] for lab in r.inputs["labels"]}
        out[int(labels["deepseek-spark.rank"])] = (r, labels)
    return [out[i] for i in sorted(out)]


def flag(args, name):
    return args[args.index(name) + 1]


def provider_of_node(rec, stack, node):
    return rec.named(f"{stack}-{node}-docker").urn


def short(urn):
    return urn.rsplit("::", 1)[-1]


def test_one_rank_container_per_node_on_that_nodes_provider(sg_rec, sg_stack):
    cfg = cluster_of(sg_stack)
    n = len(cfg["nodes"])
    got = ranks(sg_rec)
    assert len(got) == n == len(sg_rec.of_type(DOCKER_PROVIDER))
    for rank, (res, labels) in enumerate(got):
        node = cfg["nodes"][rank]["name"]
        assert res.provider_urn == provider_of_node(sg_rec, sg_stack, node)
        args = res.inputs["command"]
        assert flag(args, "--node-rank") == str(rank)
        assert flag(args, "--nnodes") == str(n)
        assert flag(args, "--tp") == str(n)
        boot = cfg["nodes"][0]["host" if cfg["fabric"].get("bootstrap") == "management" else "fabricIp"]
        assert flag(args, "--dist-init-addr") == f"{boot}:20000"
        assert res.inputs["name"] == f"{sg_stack}-rank{rank}"
        assert labels["deepseek-spark.role"] == ("head" if rank == 0 else "worker")


def test_docker_providers_reach_each_node_over_ssh(rec, stack):
    for node in cluster_of(stack)["nodes"]:
        p = rec.named(f"{stack}-{node['name']}-docker")
        assert p.inputs["host"] == f"ssh://{node['sshUser']}@{node['host']}"
        opts = json.loads(p.inputs["sshOpts"]) if isinstance(p.inputs["sshOpts"], str) else p.inputs["sshOpts"]
        assert "BatchMode=yes" in opts and "StrictHostKeyChecking=yes" in opts
    for r in rec.resources:
        if r.type.startswith("docker:"):
            assert r.provider, f"{r.name} would fall back to a default docker provider"


def test_rank_container_settings(rec):
    for res, _ in ranks(rec):
        i = res.inputs
        assert i["networkMode"] == "host" and i["ipcMode"] == "host"
        assert i["gpus"] == "all" and i["restart"] == "no" and i["mustRun"] is True
        assert i["devices"] == [{"hostPath": "/dev/infiniband", "containerPath": "/dev/infiniband", "permissions": "rwm"}]
        # the memory plan's limit for this rank, swap included: a runaway rank is killed by its cgroup
        assert i["memory"] == i["memorySwap"] and 100 * 1024 < i["memory"] <= int((121.7 - 1.5) * 1024)
        ulimits = {u["name"]: (u["soft"], u["hard"]) for u in i["ulimits"]}
        assert ulimits["memlock"] == (-1, -1) and ulimits["stack"] == (67108864, 67108864)
        env = dict(e.split("=", 1) for e in i["envs"])
        # the rails and socket interface are found on the node at every start (programs/rails.py)
        assert "NCCL_IB_HCA" not in env and "NCCL_SOCKET_IFNAME" not in env and env["DSPARK_FABRIC_IP"]
        assert env["NCCL_IB_ROCE_VERSION_NUM"] == "2" and "DSPARK_RAILS" in i["entrypoints"][2]
        assert env["NCCL_BUFFSIZE"] == "1048576" and env["NCCL_LL128_BUFFSIZE"] == "262144"
        mounts = {m["target"]: m for m in i["mounts"]}
        assert mounts[launch.MODEL_MOUNT]["readOnly"] is True and mounts[launch.MODEL_MOUNT]["type"] == "volume"


def test_ranks_are_delete_before_replace(rec):
    assert all(res.delete_before_replace for res, _ in ranks(rec))


def test_head_depends_on_every_worker(sg_rec):
    (head, _), *workers = ranks(sg_rec)
    assert {w.urn for w, _ in workers} <= set(head.dependencies)
    for w, _ in workers:
        assert not {x.urn for x, _ in ranks(sg_rec)} & set(w.dependencies), "workers must not wait on each other"


def test_each_rank_waits_for_its_nodes_prerequisites(sg_rec, sg_stack):
    for rank, (res, _) in enumerate(ranks(sg_rec)):
        node = cluster_of(sg_stack)["nodes"][rank]["name"]
        deps = {short(d) for d in res.dependencies}
        assert {f"{sg_stack}-{node}-preflight", f"{sg_stack}-image-{node}", f"{sg_stack}-checkpoint-{node}",
                f"{sg_stack}-engram-{node}"} <= deps  # fmt: skip


def test_group_revision_equal_on_all_ranks_and_exported(rec):
    revs = {labels[plan.REVISION_LABEL] for _, labels in ranks(rec)}
    assert len(revs) == 1
    assert rec.outputs["group_revision"] == revs.pop()


@pytest.mark.parametrize(
    "change",
    [
        {"maxRunningRequests": 2},
        {"memFractionStatic": 0.79},
        {"extraEnv": {"NCCL_DEBUG": "INFO"}},
        {"extraArgs": ["--log-level", "debug"]},
        {"specAlgo": "off"},
        {"dsparkBlockSize": 5},
        {"chunkedPrefillSize": 2048},
    ],
    ids=lambda c: next(iter(c)),
)
def test_any_serving_change_changes_revision_on_all_ranks(change):
    base = ranks(run_program("tp4"))
    raw = cluster_of("tp4")
    raw["serving"].update(change)
    changed = ranks(run_program("tp4", cluster=raw))
    old = {labels[plan.REVISION_LABEL] for _, labels in base}
    new = [labels[plan.REVISION_LABEL] for _, labels in changed]
    assert len(set(new)) == 1 and set(new) != old


def test_image_and_fabric_changes_also_change_revision():
    old = ranks(run_program("tp4"))[0][1][plan.REVISION_LABEL]
    for section, change in (("image", "lmsysorg/sglang@sha256:" + "a" * 64), ("fabric", {"ibHca": "rocep1s0f1"})):
        raw = cluster_of("tp4")
        raw[section] = change if section == "image" else {**raw[section], **change}
        assert ranks(run_program("tp4", cluster=raw))[3][1][plan.REVISION_LABEL] != old


def test_engram_shards_retained_with_revision_triggers(sg_rec, sg_stack):
    cfg = cluster_of(sg_stack)
    shards = [sg_rec.named(f"{sg_stack}-engram-{n['name']}") for n in cfg["nodes"]]
    for rank, s in enumerate(shards):
        assert s.retain_on_delete and s.delete_before_replace
        assert s.inputs["triggers"][:3] == [cfg["model"]["revision"], f"tp={len(cfg['nodes'])}", f"rank={rank}"]
        assert f"--rank {rank} --tp {len(cfg['nodes'])}" in s.inputs["create"]


def test_shards_not_retained_when_asked():
    raw = cluster_of("tp4")
    raw["engram"]["retain"] = False
    rec = run_program("tp4", cluster=raw)
    assert not any(r.retain_on_delete for r in rec.of_type(REMOTE))


def test_nfs_export_lists_exactly_the_worker_fabric_ips_read_only(sg_rec, sg_stack):
    cfg = cluster_of(sg_stack)
    export = sg_rec.named(f"{sg_stack}-checkpoint-export")
    head_provider_host = cfg["nodes"][0]["host"]
    assert reveal(export.inputs["connection"])["host"] == head_provider_host
    line = [ln for ln in export.inputs["create"].splitlines() if "exports.d" in ln and "tee" in ln][0]
    exported = line.split("'")[3]  # printf '%s\n' '<exports line>' | tee <file>
    path, *clients = exported.split()
    assert path == cfg["model"]["checkpointDir"]
    assert [c.split("(")[0] for c in clients] == [n["fabricIp"] for n in cfg["nodes"][1:]]
    for c in clients:
        opts = c.split("(")[1].rstrip(")").split(",")
        assert "ro" in opts and "rw" not in opts
    assert "*" not in exported
    assert export.delete_before_replace and "rm -f /etc/exports.d/" in export.inputs["delete"]


def test_checkpoint_volumes_bind_on_head_nfs_on_workers(sg_rec, sg_stack):
    cfg = cluster_of(sg_stack)
    heads = [cfg["nodes"][0]["fabricIp"], *cfg["nodes"][0].get("linkIps", [])]
    export_urn = sg_rec.named(f"{sg_stack}-checkpoint-export").urn
    for rank, node in enumerate(cfg["nodes"]):
        v = sg_rec.named(f"{sg_stack}-checkpoint-{node['name']}")
        assert v.provider_urn == provider_of_node(sg_rec, sg_stack, node["name"])
        opts = v.inputs["driverOpts"]
        assert v.inputs["name"] == f"{sg_stack}-checkpoint" and v.delete_before_replace
        if rank == 0:
            assert opts == {"type": "none", "o": "bind", "device": cfg["model"]["checkpointDir"]}
        else:
            assert opts["type"] == "nfs" and opts["device"] == f":{cfg['model']['checkpointDir']}"
            # the head's address on the link it shares with this worker (tp3: one /24 per cable)
            server = next(ip for ip in heads if ip.rsplit(".", 1)[0] == node["fabricIp"].rsplit(".", 1)[0])
            assert opts["o"].startswith(f"addr={server},nfsvers=4.2,ro,")
            assert export_urn in v.dependencies


def test_local_share_mode_has_no_export_and_binds_everywhere():
    raw = cluster_of("tp4")
    raw["share"] = {"mode": "local"}
    rec = run_program("tp4", cluster=raw)
    assert not [r for r in rec.of_type(REMOTE) if r.name.endswith("-export")]
    checkpoints = [v for v in rec.of_type(VOLUME) if "-checkpoint-" in v.name]
    assert len(checkpoints) == 4 and {v.inputs["driverOpts"]["type"] for v in checkpoints} == {"none"}


def test_images_on_every_node_kept_on_destroy(rec, stack):
    images = [i for i in rec.of_type(IMAGE) if "ServingImage" in i.parent]
    assert len(images) == len(cluster_of(stack)["nodes"])
    image = cluster_of(stack)["image"]
    assert all(i.inputs["keepLocally"] is True and i.inputs["name"] == image for i in images)
    assert all(i.custom_timeouts.get("create") == "60m" for i in images)


def test_readiness_waits_for_all_ranks_and_gets_key_by_env(rec):
    (check,) = [r for r in rec.of_type(LOCAL) if r.name.endswith("-readiness-check")]
    assert {r.urn for r, _ in ranks(rec)} <= set(check.dependencies)
    env = check.inputs["environment"]
    assert env == {"DSPARK_API_KEY": Secret(TEST_API_KEY)}
    # Probes again whenever any rank is (re)created: its triggers are the rank containers' IDs.
    assert check.inputs["triggers"] == [f"{r.name}-id" for r, _ in ranks(rec)]
    assert set(check.property_dependencies["triggers"]) == {r.urn for r, _ in ranks(rec)}
    assert "programs.probe" in check.inputs["create"]
    for rank, (res, labels) in enumerate(ranks(rec)):  # it watches every rank on its node
        assert f"--rank {rank}={res.inputs['name']}@" in check.inputs["create"]


def test_api_key_file_written_from_stdin_on_the_head(rec, stack):
    (key_cmd,) = [r for r in rec.of_type(REMOTE) if r.name.endswith("-api-key")]
    assert reveal(key_cmd.inputs["connection"])["host"] == cluster_of(stack)["nodes"][0]["host"]
    assert key_cmd.inputs["stdin"] == Secret(TEST_API_KEY)
    assert key_cmd.inputs["logging"] == "none"
    assert key_cmd.delete_before_replace
    # A new key or a new file path replaces the file (the old one is deleted, not left behind).
    key, path = key_cmd.inputs["triggers"]
    assert key == Secret(TEST_API_KEY) and path.endswith(f"/{stack}/api-key") and path in key_cmd.inputs["create"]
    # ... and the group generation, whose triggers hold the file's ID (and the image identity the nodes
    # agree on), and with it every rank.
    (generation,) = [r for r in rec.of_type(LOCAL) if r.name.endswith("-generation")]
    assert sorted(generation.property_dependencies["triggers"]) == sorted([key_cmd.urn, rec.named(f"{stack}-image-agree").urn])


def test_secrets_never_in_plain_inputs_labels_or_outputs(rec):
    for res in rec.resources:
        for text in plain_strings(res.inputs):
            assert TEST_API_KEY not in text, f"API key in plain input of {res.name}"
            assert "not-a-real-key" not in text, f"ssh key in plain input of {res.name}"
        for key in ("create", "update", "delete"):
            assert TEST_API_KEY not in json.dumps(reveal(res.inputs.get(key, ""))), f"key in {key} of {res.name}"
    for res, labels in ranks(rec):
        assert TEST_API_KEY not in json.dumps(labels) and "--api-key" not in res.inputs["command"]
    for name, value in rec.outputs.items():
        for text in plain_strings(value):
            assert TEST_API_KEY not in text, f"API key in plain output {name}"
    assert isinstance(rec.outputs["api_key"], Secret) and rec.outputs["api_key"].value == TEST_API_KEY
    for text in (m for _, m in rec.logs):
        assert TEST_API_KEY not in text


def test_connections_carry_the_ssh_key_as_a_secret(rec):
    for res in rec.of_type(REMOTE):
        conn = res.inputs["connection"]
        assert reveal(conn)["privateKey"] == TEST_SSH_KEY
        assert TEST_SSH_KEY not in list(plain_strings(conn))


def test_outputs(rec, stack):
    cfg = cluster_of(stack)
    out = rec.outputs
    assert out["endpoint"] == f"http://10.0.0.1:{cfg['serving']['port']}/v1"
    assert out["model"] == "deepseek-v4.1-flash"
    assert [n["rank"] for n in out["nodes"]] == list(range(len(cfg["nodes"])))
    assert out["nodes"][0]["role"] == "head" and out["nodes"][1]["container"] == f"{stack}-rank1"
    assert out["memory_plan"]["fits"] is True
    cc = out["client_config"]
    assert isinstance(cc, Secret)
    assert cc.value["base_url"] == out["endpoint"] and cc.value["api_key"] == TEST_API_KEY
    assert cc.value["openai_env"] == {"OPENAI_BASE_URL": out["endpoint"], "OPENAI_API_KEY": TEST_API_KEY,
                                      "OPENAI_MODEL": "deepseek-v4.1-flash"}  # fmt: skip


def test_memory_plan_is_printed(rec):
    assert any(level == "INFO" and m.startswith("memory plan (") for level, m in rec.logs)


def test_each_nodes_memory_budget_is_printed_with_the_limit_every_rank_gets(rec, stack):
    """The preview log: a line per node, its budget and each container's limit, the rank's need; the limits
    are the ones the rank containers are registered with."""
    log = next(m for level, m in rec.logs if level == "INFO" and m.startswith("memory budget per node"))
    lines = log.splitlines()[1:]
    ranks = sorted((r for r in rec.of_type("docker:index/container:Container") if "-rank" in r.inputs["name"]),
                   key=lambda r: r.inputs["name"])  # fmt: skip
    assert [line.split(":")[0].strip() for line in lines] == [n["name"] for n in cluster_of(stack)["nodes"]]
    for line, rank in zip(lines, ranks):
        assert f"{rank.inputs['name']} {rank.inputs['memory']:,} (needs " in line and " headroom " in line


def _normalized(rec):
    return sorted(
        (r.type, r.name, json.dumps(r.inputs, sort_keys=True, default=repr), tuple(sorted(r.dependencies)),
         r.provider, r.delete_before_replace, r.retain_on_delete, tuple(sorted(r.replace_with)))
        for r in rec.resources
    )  # fmt: skip


@pytest.mark.parametrize("stack_name", [*STACKS, "sim"])
def test_deterministic(stack_name):
    assert _normalized(run_program(stack_name)) == _normalized(run_program(stack_name))


def test_preview_mode_registers_the_same_graph():
    assert _normalized(run_program("tp4", preview=True)) == _normalized(run_program("tp4"))


def test_components_follow_naming_and_tokens(rec, stack):
    comps = [r for r in rec.resources if not r.custom]
    engine = ("EngramShards", "SglangGroup") if cluster_of(stack)["engine"] == "sglang" else ("VllmRayGroup",)
    assert {r.type for r in comps} == {
        f"deepseek-spark:index:{c}"
        for c in ("DeepSeekCluster", "SparkNode", "CheckpointShare", "ServingImage", "CompileCaches", "Readiness",
                  "FabricGate", "Guard", "Monitoring", "Fence", *engine)
    }  # fmt: skip
    by_urn = {r.urn: r for r in rec.resources}
    for r in rec.resources:
        if r.type == "deepseek-spark:index:DeepSeekCluster":
            assert r.name == stack
            continue
        if r.type in ("deepseek-spark:index:Monitoring", "deepseek-spark:index:Fence"):  # the stack's, beside its groups
            assert r.name == f"{stack}-{r.type.rsplit(':', 1)[1].lower()}" and r.parent not in by_urn
            continue
        parent = by_urn[r.parent]
        assert r.name.startswith(parent.name + "-"), f"{r.name} not named after its parent {parent.name}"


def _label(res, name):
    return {lab["label"]: lab["value"] for lab in res.inputs["labels"]}.get(name)


def test_every_rank_takes_its_label_from_the_group_generation(rec):
    """One resource upstream of every rank, replaced delete-before-replace whenever the group must
    restart: the engine then deletes every rank in its chain before any new rank can start."""
    (generation,) = [r for r in rec.of_type(LOCAL) if r.name.endswith("-generation")]
    assert generation.delete_before_replace
    assert generation.inputs["triggers"][0] == rec.outputs["group_revision"]
    for res, labels in ranks(rec):
        assert labels["deepseek-spark.generation"] == f"{generation.name}-id"
        assert generation.urn in res.property_dependencies["labels"]


def test_head_inputs_come_from_every_worker_so_it_is_deleted_first(sg_rec):
    """depends_on alone would let the engine replace workers while the old head still holds distPort."""
    (head, _), *workers = ranks(sg_rec)
    assert _label(head, "deepseek-spark.after") == ",".join(f"{w.name}-id" for w, _ in workers)
    generation = next(r for r in sg_rec.resources if r.name.endswith("-generation"))
    assert set(head.property_dependencies["labels"]) == {w.urn for w, _ in workers} | {generation.urn}
    assert all(_label(w, "deepseek-spark.after") is None for w, _ in workers)


def test_rank_mounts_take_the_volume_name_from_its_volume(rec, stack):
    for rank, (res, _) in enumerate(ranks(rec)):
        node = cluster_of(stack)["nodes"][rank]["name"]
        assert rec.named(f"{stack}-checkpoint-{node}").urn in res.property_dependencies["mounts"]


def test_every_rank_waits_for_every_nodes_prerequisites(rec, stack):
    names = [n["name"] for n in cluster_of(stack)["nodes"]]
    needed = {f"{stack}-{n}-preflight" for n in names} | {f"{stack}-image-{n}" for n in names}
    needed |= {f"{stack}-checkpoint-{n}" for n in names}
    for res, _ in ranks(rec):
        assert needed <= {short(d) for d in res.dependencies}, res.name


def test_a_rank_found_stopped_is_replaced_not_started_in_place(rec):
    """After a refresh found a rank stopped (mustRun false), `up` must not start the old container
    alone (the provider's in-place update): mustRun forces a replacement."""
    assert all(res.replace_on_changes == ["mustRun"] and not res.ignore_changes for res, _ in ranks(rec))


def test_preflight_reruns_before_every_group_start(rec, stack):
    for node in cluster_of(stack)["nodes"]:
        assert rec.named(f"{stack}-{node['name']}-preflight").inputs["triggers"] == [rec.outputs["group_revision"]]


@pytest.mark.parametrize(
    "change",
    [{"share": {"mode": "local"}}, {"share": {"mountOptions": ["nfsvers=4.2", "ro", "hard"]}}, {"serving": {"generation": 1}}],
    ids=["share-mode", "mount-options", "generation"],
)
def test_checkpoint_mount_and_generation_changes_restart_the_whole_group(change):
    old = run_program("tp4").outputs["group_revision"]
    raw = cluster_of("tp4")
    for section, values in change.items():
        raw[section] = {**raw.get(section, {}), **values}
    after = run_program("tp4", cluster=raw)
    assert after.outputs["group_revision"] != old
    assert {_label(r, plan.REVISION_LABEL) for r, _ in ranks(after)} == {after.outputs["group_revision"]}


def test_worker_mounts_the_head_address_on_its_own_link():
    raw = cluster_of("tp3")
    raw["nodes"][1]["nfsServerIp"] = "10.0.22.1"
    raw["nodes"][2]["nfsServerIp"] = "10.0.23.1"
    rec = run_program("tp3", cluster=raw)
    assert rec.named("tp3-checkpoint-spark2").inputs["driverOpts"]["o"].startswith("addr=10.0.22.1,")
    assert rec.named("tp3-checkpoint-spark3").inputs["driverOpts"]["o"].startswith("addr=10.0.23.1,")


def test_image_built_on_every_node_when_image_build_is_set(tmp_path):
    """Each node builds the image on its own engine from the context the command sends on stdin (the recipe's
    files, nothing else), labelled with the build's digest, before its RemoteImage reads the ID; a changed
    overlay rebuilds (the digest is in the script and the image's triggers) and restarts the group."""
    import base64
    import io
    import tarfile

    ctx = tmp_path / "recipe"
    (ctx / "adapter").mkdir(parents=True)
    (ctx / "Dockerfile").write_text("FROM lmsysorg/sglang:dev-dsv41\nCOPY adapter /opt/dsv41\n")
    (ctx / "adapter" / "model.py").write_text("v1\n")
    raw = cluster_of("tp4")
    raw["image"] = "dsv41-4x-spark:local"
    raw["imageBuild"] = {"context": str(ctx), "args": {"B": "2", "A": "1"}}
    rec = run_program("tp4", cluster=raw)
    assert not rec.of_type("docker:index/image:Image")  # no buildkit resource: the node's own `docker build`
    images = [i for i in rec.of_type(IMAGE) if "ServingImage" in i.parent]
    builds = [c for c in rec.of_type("command:remote:Command") if c.name.endswith("-build") and "ServingImage" in c.parent]
    assert len(images) == len(builds) == 4
    digest = plan.image_build_digest(ClusterConfig.model_validate(raw))
    for b in builds:
        node = b.name.split("-image-", 1)[1].removesuffix("-build")
        script = b.plain["create"]
        assert b.plain["update"] == script and "base64 -d | docker build" in script
        assert (f"docker build --label deepseek-spark.build={digest} -t dsv41-4x-spark:local -f Dockerfile "
                "--build-arg A=1 --build-arg B=2 --platform linux/arm64 -") in script
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(b.plain["stdin"]))) as tar:
            assert sorted(tar.getnames()) == ["Dockerfile", "adapter/model.py"]
            assert tar.extractfile("adapter/model.py").read() == b"v1\n"
        assert rec.named(f"tp4-{node}-preflight").urn in b.dependencies  # docker answers once preflight passed
        image = rec.named(f"tp4-image-{node}")
        assert image.plain["name"] == "dsv41-4x-spark:local" and image.plain["keepLocally"] is True
        assert image.plain["triggers"] == {"build": digest} and b.urn in image.dependencies
        assert image.provider_urn == rec.named(f"tp4-{node}-docker").urn
    assert builds[0].plain["stdin"] == run_program("tp4", cluster=raw).named(builds[0].name).plain["stdin"]  # same bytes
    revision = rec.outputs["group_revision"]
    (ctx / "Dockerfile").write_text("FROM lmsysorg/sglang:dev-dsv41\nCOPY adapter /opt/dsv41\nRUN true\n")
    again = run_program("tp4", cluster=raw)
    assert again.outputs["group_revision"] != revision, "a changed overlay restarts the group"
    assert again.named(builds[0].name).plain["create"] != builds[0].plain["create"], "a changed overlay rebuilds"


def test_image_build_revision_follows_what_the_build_sends(tmp_path):
    """An ignored file does not restart the group; a changed build arg, platform or sent file does."""
    ctx = tmp_path / "recipe"
    (ctx / "adapter").mkdir(parents=True)
    (ctx / "Dockerfile").write_text("FROM lmsysorg/sglang:dev-dsv41\nCOPY adapter /opt/dsv41\n")
    (ctx / "adapter" / "model.py").write_text("v1\n")
    (ctx / ".dockerignore").write_text("*.md\n**/__pycache__\n")
    (ctx / "NOTES.md").write_text("draft\n")
    raw = cluster_of("tp4")
    raw["image"] = "dsv41-4x-spark:local"
    raw["imageBuild"] = {"context": str(ctx), "args": {"A": "1"}}

    def revision(**build):
        cfg = {**raw, "imageBuild": {**raw["imageBuild"], **build}}
        return run_program("tp4", cluster=cfg).outputs["group_revision"]

    base = revision()
    (ctx / "NOTES.md").write_text("edited notes\n")
    (ctx / "adapter" / "__pycache__").mkdir()
    (ctx / "adapter" / "__pycache__" / "model.pyc").write_bytes(b"\0")
    assert revision() == base, "an ignored file restarted the group"
    assert revision(args={"A": "2"}) != base
    assert revision(platform="linux/amd64") != base
    (ctx / "adapter" / "model.py").write_text("v2\n")
    assert revision() != base


def test_each_node_has_a_memory_gate_between_the_generation_and_every_rank(rec, stack):
    """The memory gate runs on its node once the old group is down (it depends on the new generation)
    and before any rank starts (every rank depends on every node's gate), with the plan's figure."""
    cfg = cluster_of(stack)
    generation = next(r for r in rec.resources if r.name.endswith("-generation"))
    gates = []
    for rank, node in enumerate(cfg["nodes"]):
        gate = next(r for r in rec.of_type(REMOTE) if r.name.endswith(f"-rank{rank}-memory"))
        gates.append(gate.urn)
        assert generation.urn in gate.dependencies and f"{stack}-{node['name']}-preflight" in {short(d) for d in gate.dependencies}
        assert reveal(gate.inputs["connection"])["host"] == node["host"]
        assert gate.inputs["stdin"].startswith('"""The memory gate')
        assert f"--node {node['name']} " in gate.inputs["create"] and "--need-mib " in gate.inputs["create"]
        assert "--no-drop" not in gate.inputs["create"]  # memory.dropCaches is on by default
        # an update (a new gate program or connection, no group start) reports only: the group holds the memory
        assert gate.inputs["update"] == gate.inputs["create"] + " --report-only"
    for res, _ in ranks(rec):
        assert set(gates) <= set(res.dependencies), res.name


def test_the_memory_gates_need_is_what_the_plan_places_on_the_node():
    from declared.cluster import parse_cluster

    cfg = parse_cluster(group_of("tp3"))
    mp = memoryplan.memory_plan(cfg)
    head, worker = mp.ranks
    assert memoryplan.rank_need_mib(cfg, 0) == int((head.static_used_gib + head.outside_needed_gib) * 1024)
    assert memoryplan.rank_need_mib(cfg, 1) == int((worker.static_used_gib + worker.outside_needed_gib) * 1024)
    assert memoryplan.rank_need_mib(cfg, 0) > memoryplan.rank_need_mib(cfg, 1)  # the head holds rank 0's extra


@pytest.mark.parametrize("memory, present, flag", [({"dropCaches": False}, True, "--no-drop"), ({"memoryGate": False}, False, None)])
def test_the_memory_gate_can_skip_the_drop_or_be_turned_off(memory, present, flag):
    raw = cluster_of("tp2")
    raw["memory"] = {**raw.get("memory", {}), **memory}
    after = run_program("tp2", cluster=raw)
    gates = [r for r in after.of_type(REMOTE) if r.name.endswith("-memory")]
    assert bool(gates) == present
    if flag:
        assert all(flag in g.inputs["create"] for g in gates)


@pytest.mark.parametrize("stack_name, refs", [("tp3", ["lmsysorg/sglang:dev-dsv41"]), ("sim", ["sglang-sim:test-double"])])
def test_the_group_starts_only_when_every_nodes_image_id_agrees(stack_name, refs):
    """A pulled image is compared by its own ID; an image built on each node by the ID of the base it is
    built FROM (sim/overlay/Dockerfile), since two builds never share an ID. The agreement reads every node
    over ssh before the group generation, which follows what the nodes agree on."""
    rec = run_program(stack_name)
    nodes = cluster_of(stack_name)["nodes"]
    agree = rec.named(f"{stack_name}-image-agree")
    argv = shlex.split(agree.inputs["create"])
    assert argv[:3] == ["python3", "-m", "programs.imagecheck"]
    spec = json.loads(argv[argv.index("--spec") + 1])
    assert spec == {"group": stack_name, "refs": refs,
                    "nodes": [{"name": n["name"], "target": f"{n['sshUser']}@{n['host']}", "port": 22} for n in nodes]}
    # again before every group start, and whenever a node's image changes
    assert agree.inputs["triggers"][0] == rec.outputs["group_revision"] and len(agree.inputs["triggers"]) == 1 + len(nodes)
    assert {short(d) for d in agree.dependencies} >= {f"{stack_name}-image-{n['name']}" for n in nodes}
    generation = rec.named(f"{stack_name}-sglang-generation")
    assert agree.urn in generation.property_dependencies["triggers"]


def test_base_images_are_the_dockerfiles_from_lines_not_its_stages():
    text = "ARG BASE=lmsysorg/sglang:dev\nFROM ${BASE} AS build\nRUN make\nFROM build\nFROM scratch\n" \
           "FROM --platform=linux/arm64 nvidia/cuda:13.0-base AS cuda\n"
    assert plan.base_images(text) == ["lmsysorg/sglang:dev", "nvidia/cuda:13.0-base"]
    assert plan.base_images(text, {"BASE": "mine:1"}) == ["mine:1", "nvidia/cuda:13.0-base"]


def test_every_rank_mounts_its_nodes_compile_cache_kept_on_destroy(rec, stack):
    """FlashInfer/DeepGEMM/vLLM (~/.cache), Triton and torch inductor (pointed there) keep what they compile
    and tune in a volume per node, retained on destroy; its name follows the node's image ID."""
    for rank, (res, _) in enumerate(ranks(rec)):
        node = cluster_of(stack)["nodes"][rank]["name"]
        cache = rec.named(f"{stack}-compile-cache-{node}")
        assert cache.retain_on_delete and cache.provider.startswith(provider_of_node(rec, stack, node))
        mount = next(m for m in res.inputs["mounts"] if m["target"] == launch.CACHE_MOUNT)
        assert mount["type"] == "volume" and not mount.get("readOnly")
        assert cache.urn in res.property_dependencies["mounts"]
        env = dict(e.split("=", 1) for e in res.inputs["envs"])
        assert env["TRITON_CACHE_DIR"] == "/root/.cache/triton" and env["TORCHINDUCTOR_CACHE_DIR"] == "/root/.cache/torchinductor"


def test_the_compile_cache_volume_name_follows_the_image_id():
    from components.caches import volume_name

    a, b = volume_name("tp3-compile-cache", "sha256:aaa"), volume_name("tp3-compile-cache", "sha256:bbb")
    assert a.startswith("tp3-compile-cache-") and len(a) == len("tp3-compile-cache-") + 12 and a != b
    assert a == volume_name("tp3-compile-cache", "sha256:aaa")
