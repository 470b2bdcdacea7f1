"""The vLLM + Ray graph (stack tp2, seed 004) under mocks: ordering, group revision, downloads."""

import pytest

from planning import launch, plan
from harness import TEST_API_KEY, Secret, cluster_of, plain_strings, reveal, run_program

CONTAINER = "docker:index/container:Container"
REMOTE = "command:remote:Command"
HF_TOKEN = "hf_test_0123456789abcdefghijklmnop"


@pytest.fixture(scope="module")
def rec():
    return run_program("tp2")


def containers(rec):
    return sorted(rec.ranks(), key=lambda r: r.name)


def env_of(res):
    return dict(e.split("=", 1) for e in res.inputs["envs"])


def flag(args, name):
    return args[args.index(name) + 1]


def test_head_serves_vllm_with_the_seed_flags(rec):
    head, worker = containers(rec)
    assert head.provider_urn == rec.named("tp2-spark1-docker").urn
    args = head.inputs["command"]
    assert args[:2] == ["serve", launch.MODEL_MOUNT]
    assert flag(args, "--tensor-parallel-size") == "2"
    assert flag(args, "--distributed-executor-backend") == "ray"
    assert flag(args, "--kv-cache-dtype") == "fp8_ds_mla"
    assert flag(args, "--max-model-len") == "131072"
    assert flag(args, "--port") == "8000" and flag(args, "--host") == "10.0.0.1"  # the head's management address
    assert "--api-key" not in args
    wrapper = head.inputs["entrypoints"][2]
    assert 'ray start --head --port "$RAY_PORT"' in wrapper and 'export VLLM_API_KEY="$(cat' in wrapper
    assert wrapper.index("ray.nodes()") < wrapper.index('exec vllm "$@"'), "serve only after Ray has every node"


def test_worker_joins_the_head_over_the_fabric(rec):
    head, worker = containers(rec)
    assert worker.provider_urn == rec.named("tp2-spark2-docker").urn
    assert worker.inputs["command"] == ["ray", "start", "--block", "--address", "10.0.22.1:6379",
                                        "--node-ip-address", "10.0.22.2", "--num-gpus", "1", "--disable-usage-stats",
                                        "--node-manager-port", "6380", "--object-manager-port", "6381",
                                        "--runtime-env-agent-port", "6382", "--metrics-export-port", "6383",
                                        "--min-worker-port", "6390", "--max-worker-port", "6479",
                                        "--dashboard-host", "127.0.0.1"]  # fmt: skip
    assert "VLLM_API_KEY" not in worker.inputs["entrypoints"][2]


def test_fabric_env_per_node(rec):
    cfg = cluster_of("tp2")
    for rank, res in enumerate(containers(rec)):
        env = env_of(res)
        assert env["VLLM_HOST_IP"] == cfg["nodes"][rank]["fabricIp"]
        # both twins and the socket interface are found on the node at every start, from the fabric IP
        assert "NCCL_IB_HCA" not in env and env["DSPARK_FABRIC_IP"] == cfg["nodes"][rank]["fabricIp"]
        assert env["RAY_memory_monitor_refresh_ms"] == "0"  # no Ray OOM killer on unified memory
        assert env["RAY_ADDRESS"] == "10.0.22.1:6379" and env["DSPARK_RAY_NODES"] == "2"


def test_worker_depends_on_head_not_the_reverse(rec):
    head, worker = containers(rec)
    assert head.urn in worker.dependencies
    assert worker.urn not in head.dependencies
    assert all(c.delete_before_replace for c in (head, worker))
    assert all(c.inputs["restart"] == "no" for c in (head, worker))
    generation = rec.named("tp2-vllm-generation")
    assert all(generation.urn in c.property_dependencies["labels"] for c in (head, worker))


def test_each_container_waits_for_its_node(rec):
    for rank, res in enumerate(containers(rec)):
        node = f"spark{rank + 1}"
        deps = {d.rsplit("::", 1)[-1] for d in res.dependencies}
        assert {f"tp2-{node}-preflight", f"tp2-image-{node}", f"tp2-checkpoint-{node}"} <= deps


def test_no_engram_shards_for_vllm(rec):
    assert not [r for r in rec.resources if "engram" in r.name]
    assert "engram" not in rec.named("tp2-spark1-preflight").inputs["create"]


def test_weights_downloaded_once_on_the_head_and_copied_over_connectx7(rec):
    cfg = cluster_of("tp2")
    triggers = [cfg["model"]["hfRepo"], cfg["model"]["revision"], cfg["model"]["checkpointDir"]]
    dl = rec.named("tp2-checkpoint-download-spark1")
    assert dl.inputs["triggers"] == triggers and dl.retain_on_delete and "delete" not in dl.inputs
    assert "--entrypoint hf " in dl.inputs["create"] and "--revision" in dl.inputs["create"]
    assert not [r for r in rec.of_type(REMOTE) if r.name == "tp2-checkpoint-download-spark2"]  # one hub pull
    # the head serves its download read-only to spark2's ConnectX-7 address only, after the download
    seed = rec.named("tp2-checkpoint-seed")
    assert dl.urn in seed.dependencies and seed.inputs["triggers"] == triggers
    assert "hosts allow = 10.0.22.2\n" in seed.inputs["create"] and "read only = yes" in seed.inputs["create"]
    copy = rec.named("tp2-checkpoint-copy-spark2")
    assert seed.urn in copy.dependencies and copy.retain_on_delete and copy.inputs["triggers"] == triggers
    assert "rsync://10.0.22.1:8730/checkpoint/" in copy.inputs["create"] and "stdin" not in copy.inputs
    stop = rec.named("tp2-checkpoint-seed-stop")
    assert copy.urn in stop.dependencies
    for node, step in (("spark1", dl), ("spark2", copy)):
        volume = rec.named(f"tp2-checkpoint-{node}")
        assert step.urn in volume.dependencies
        assert volume.inputs["driverOpts"] == {"type": "none", "o": "bind", "device": cfg["model"]["checkpointDir"]}
    assert not [r for r in rec.of_type(REMOTE) if r.name.endswith("-export")]
    # preflight does not require the weights that the download will fetch
    assert "checkpoint-shards" not in rec.named("tp2-spark1-preflight").inputs["create"]


def test_hf_token_reaches_the_download_on_stdin_only(rec):
    assert "stdin" not in rec.named("tp2-checkpoint-download-spark1").inputs  # no token configured
    with_token = run_program("tp2", secrets={"hfToken": HF_TOKEN})
    assert with_token.named("tp2-checkpoint-download-spark1").inputs["stdin"] == Secret(HF_TOKEN)
    # and none of the download's output reaches the engine's log (pulumi-command logs every line otherwise)
    assert with_token.named("tp2-checkpoint-download-spark1").inputs["logging"] == "none"
    for res in with_token.resources:
        assert not [t for t in plain_strings(res.inputs) if HF_TOKEN in t], res.name


def test_plain_text_hf_token_is_refused():
    import pulumi

    with pytest.raises(pulumi.RunError, match="hfToken is stored in plain text"):
        run_program("tp2", secrets={"hfToken": HF_TOKEN}, plain=("hfToken",))


@pytest.mark.parametrize("change", [{"maxModelLen": 65536}, {"gpuMemoryUtilization": 0.8},
                                    {"extraEnv": {"NCCL_DEBUG": "INFO"}}, {"maxRunningRequests": 8}])  # fmt: skip
def test_any_serving_change_replaces_the_whole_group(rec, change):
    raw = cluster_of("tp2")
    raw["serving"].update(change)
    after = run_program("tp2", cluster=raw)
    labels = [{lab["label"]: lab["value"] for lab in c.inputs["labels"]}[plan.REVISION_LABEL] for c in containers(after)]
    assert len(set(labels)) == 1 and labels[0] != rec.outputs["group_revision"]


def test_readiness_and_outputs(rec):
    (check,) = [r for r in rec.of_type("command:local:Command") if r.name.endswith("-readiness-check")]
    assert {c.urn for c in containers(rec)} <= set(check.dependencies)
    assert check.inputs["environment"] == {"DSPARK_API_KEY": Secret(TEST_API_KEY)}
    assert "--url http://10.0.0.1:8000/v1" in check.inputs["create"]
    assert rec.outputs["endpoint"] == "http://10.0.0.1:8000/v1"
    assert rec.outputs["memory_plan"]["profile"] == "deepseek-v4.1-flash-nvfp4" and rec.outputs["memory_plan"]["fits"]
    assert [n["role"] for n in rec.outputs["nodes"]] == ["head", "worker"]
    assert isinstance(rec.outputs["client_config"], Secret)


def test_seed_warnings_are_printed(rec):
    text = "\n".join(rec.warnings())
    assert "lower serving.maxModelLen to 65536 or 32768 first" in text
    assert "cluster.model.revision = 'main'" in text


def test_sglang_only_fields_are_refused_on_vllm():
    import pulumi

    raw = cluster_of("tp2")
    raw["serving"]["memFractionStatic"] = 0.8
    raw["serving"]["contextLength"] = 131072
    raw["engram"] = {"dir": "/srv/engram"}
    with pytest.raises(pulumi.RunError) as err:
        run_program("tp2", cluster=raw)
    text = str(err.value)
    assert "cluster.serving.memFractionStatic = 0.8: is a SGLang setting and this stack runs engine vllm" in text
    assert "cluster.serving.contextLength" in text and "cluster.engram" in text
    assert pulumi.runtime.settings.SETTINGS.monitor.recording.resources == []


def test_vllm_only_fields_are_refused_on_sglang():
    import pulumi

    raw = cluster_of("tp4")
    raw["serving"]["kvCacheDtype"] = "fp8"
    with pytest.raises(pulumi.RunError, match=r"cluster\.serving\.kvCacheDtype = 'fp8': is a vLLM setting"):
        run_program("tp4", cluster=raw)


def test_engine_defaults_for_vllm():
    raw = cluster_of("tp2")
    for key in ("port",):
        del raw["serving"][key]
    del raw["image"]
    del raw["model"]["profile"]
    rec = run_program("tp2", cluster=raw)
    assert rec.outputs["endpoint"].endswith(":8000/v1")
    assert {i.inputs["name"] for i in rec.of_type("docker:index/remoteImage:RemoteImage") if "ServingImage" in i.parent} \
        == {"vllm/vllm-openai:v0.31.0"}
    assert rec.outputs["memory_plan"]["profile"] == "deepseek-v4.1-flash-nvfp4"
    assert reveal(rec.named("tp2-vllm-api-key").inputs["stdin"]) == TEST_API_KEY


def test_ray_worker_inputs_come_from_the_head_so_it_goes_first(rec):
    head, worker = containers(rec)
    labels = {lab["label"]: lab["value"] for lab in worker.inputs["labels"]}
    assert labels["deepseek-spark.after"] == "tp2-vllm-rank0-id"
    assert set(worker.property_dependencies["labels"]) == {head.urn, rec.named("tp2-vllm-generation").urn}
