"""Every validation rule: the seed stacks pass it, and a broken config fails it naming field and fix."""

import pytest

from planning import rules
from declared.cluster import parse_cluster
from harness import cluster_of, group_of


def _set(path, value):
    def mutate(raw):
        node = raw
        *parents, last = path
        for p in parents:
            node = node[p]
        node[last] = value
        return raw

    return mutate


def _two_nodes_sglang(raw):
    raw["nodes"] = raw["nodes"][:2]
    raw["serving"].update(tpSize=2, epSize=2, contextLength=131072, maxTotalTokens=131072)
    return raw


def _duplicate_host(raw):
    raw["nodes"][1]["host"] = raw["nodes"][0]["host"]
    return raw


def _tp8(raw):
    raw["nodes"] = [dict(raw["nodes"][0], name=f"spark{i}", host=f"10.0.0.{i}", fabricIp=f"10.0.22.{i}")
                    for i in range(1, 9)]  # fmt: skip
    raw["serving"].update(tpSize=8, epSize=8)
    return raw


# rule -> (base stack, mutation that must trip it, field the finding must name)
FAILING = {
    "engine-fields": ("tp4", _set(["serving", "maxModelLen"], 65536), "serving.maxModelLen"),
    "node-count-equals-tp": ("tp4", _set(["serving", "tpSize"], 3), "serving.tpSize"),
    "unique-nodes": ("tp4", _duplicate_host, "nodes[1].host"),
    "fabric-ip-is-ipv4": ("tp4", _set(["nodes", 2, "fabricIp"], "spark3-cx7"), "nodes[2].fabricIp"),
    "fabric-planes": ("tp3", _set(["fabric", "bootstrap"], "fabric"), "fabric.bootstrap"),
    "fabric-link-ips": ("tp3", _set(["nodes", 0, "linkIps"], ["10.0.22.1"]), "nodes[0].linkIps[0]"),
    "ep-divides-tp": ("tp4", _set(["serving", "epSize"], 3), "serving.epSize"),
    "ports-distinct": ("tp4", _set(["serving", "distPort"], 8888), "serving.distPort"),
    "no-ram-offload": ("tp4", _set(["serving", "offloadMode"], "ram"), "serving.offloadMode"),
    "known-profile": ("tp4", _set(["model", "profile"], "llama"), "model.profile"),
    "memory-plan-fits": ("tp4", _set(["serving", "maxTotalTokens"], 16000000), "serving.maxTotalTokens"),
    "context-length-supported": ("tp3", _set(["serving", "contextLength"], 1048576), "serving.contextLength"),
    "topology-fits-node-count": ("tp4", _set(["topology"], "direct"), "topology"),
    "nfs-share-read-only": ("tp4", _set(["share"], {"exportOptions": ["rw", "sync"]}), "share.exportOptions"),
    "extra-args-not-managed": ("tp4", _set(["serving", "extraArgs"], ["--tp", "2"]), "serving.extraArgs[0]"),
    "extra-env-not-managed": ("tp4", _set(["serving", "extraEnv"], {"NODE_RANK": "0"}), "serving.extraEnv.NODE_RANK"),
    "tp3-padding-warning": ("tp3", lambda raw: raw, "serving.tpSize"),
    "dev-image-warning": ("tp4", _set(["image"], "lmsysorg/sglang:dev-dsv41"), "image"),
    "vllm-weights-range-warning": ("tp2", lambda raw: raw, "serving.maxModelLen"),
    "kv-pin-clamp-warning": ("tp4", lambda raw: raw, "serving.maxTotalTokens"),
    "image-build-context-exists": ("tp4", _set(["imageBuild"], {"context": "no/such/recipe"}), "imageBuild.context"),
    "ring-needs-nccl-overlay-warning": ("tp4", _set(["topology"], "ring"), "topology"),
    "pinned-revision-warning": ("tp2", _set(["model", "revision"], "main"), "model.revision"),
    "paths-apart-from-checkpoint": ("tp4", _set(["stateDir"], "/home/zurih/NewModels/DS4.1/state"), "stateDir"),
    "engine-version": ("tp4", _set(["serving", "extraArgs"], ["--cuda-graph-max-bs", "8"]), "serving.extraArgs[0]"),
}
# rule -> (base stack, mutation) of a config the rule must accept (default: tp4 as it is)
PASSING = {
    "dev-image-warning": ("tp4", _set(["image"], "lmsysorg/sglang@sha256:" + "3" * 64)),
    "vllm-weights-range-warning": ("tp2", lambda raw: _set(["serving", "gpuMemoryUtilization"], 0.88)(
        _set(["serving", "maxModelLen"], 16384)(raw))),
    "pinned-revision-warning": ("tp2", _set(["model", "revision"], "a" * 40)),
    "kv-pin-clamp-warning": ("tp4", _set(["serving", "maxTotalTokens"], 6_000_000)),
    "fabric-link-ips": ("tp3", lambda raw: raw),  # a triangle: a linkIp per further cable, each its own subnet
}
# vLLM variants of the engine-aware rules: (mutation of tp2, field the finding must name)
VLLM_FAILING = {
    "engine-fields": (_set(["serving", "memFractionStatic"], 0.8), "serving.memFractionStatic"),
    "node-count-equals-tp": (_set(["serving", "tpSize"], 3), "serving.tpSize"),
    "memory-plan-fits": (_set(["serving", "maxModelLen"], 1048576), "serving.maxModelLen"),
    "context-length-supported": (_set(["serving", "maxModelLen"], 2000000), "serving.maxModelLen"),
    "ports-distinct": (_set(["serving", "rayPort"], 8000), "serving.rayPort"),
    "engine-version": (_set(["serving", "extraArgs"], ["--ray-address", "auto"]), "serving.extraArgs[0]"),
    "extra-args-not-managed": (_set(["serving", "extraArgs"], ["--max-model-len", "8192"]), "serving.extraArgs[0]"),
    "known-profile": (_set(["model", "profile"], "deepseek-v4.1-flash-mxfp4"), "model.profile"),
}


def _findings(raw, name, stack="tp4"):
    cfg = parse_cluster(raw)
    fn = dict(rules.RULES)[name]
    return fn(cfg, stack)


def test_every_rule_has_a_failing_case():
    assert set(FAILING) == {name for name, _ in rules.RULES}


@pytest.mark.parametrize("name", sorted(FAILING))
def test_rule_fails_naming_field_value_and_fix(name):
    stack, mutate, field = FAILING[name]
    found = _findings(mutate(cluster_of(stack)), name)
    assert found, f"{name} did not fire"
    assert any(f.field == field for f in found), [f.field for f in found]
    for f in found:
        text = str(f)
        assert text.startswith(f"cluster.{f.field} = ") and "; fix: " in text
        assert f.fix.strip()


@pytest.mark.parametrize("name", sorted(FAILING))
def test_rule_passes_on_a_good_config(name):
    stack, mutate = PASSING.get(name, ("tp4", lambda raw: raw))
    assert _findings(mutate(cluster_of(stack)), name) == []


@pytest.mark.parametrize("name", sorted(VLLM_FAILING))
def test_vllm_variant_of_rule_fails(name):
    mutate, field = VLLM_FAILING[name]
    found = _findings(mutate(cluster_of("tp2")), name)
    assert any(f.field == field for f in found), [str(f) for f in found]


def test_vllm_stack_has_no_errors_only_the_seed_warnings():
    errors, warnings = rules.check(parse_cluster(group_of("tp2")))
    assert errors == []
    assert {w.rule for w in warnings} == {"vllm-weights-range-warning", "pinned-revision-warning"}


def test_vllm_memory_fix_says_to_lower_max_model_len_first():
    raw = _set(["serving", "maxModelLen"], 1048576)(cluster_of("tp2"))
    (f,) = _findings(raw, "memory-plan-fits")
    assert "lower serving.maxModelLen first (131072 -> 65536 or 32768" in f.fix


def test_missing_sglang_fields_are_reported_alone():
    raw = cluster_of("tp4")
    del raw["serving"]["contextLength"]
    del raw["engram"]
    errors, _ = rules.check(parse_cluster(raw))
    assert {e.field for e in errors} == {"serving.contextLength", "engram"}


def test_download_needs_a_repo():
    raw = _set(["model", "source"], "download")(cluster_of("tp4"))
    assert [f.field for f in _findings(raw, "engine-fields")] == ["model.hfRepo"]


@pytest.mark.parametrize("stack", ["tp3", "tp4", "tp2", "sim", "sim-tp2"])
def test_seed_stacks_have_no_errors(stack):
    errors, _ = rules.check(parse_cluster(group_of(stack)), stack)
    assert errors == []


def test_warnings_do_not_block():
    errors, warnings = rules.check(parse_cluster(group_of("tp3")))
    assert not errors
    assert {w.rule for w in warnings} == {"tp3-padding-warning", "dev-image-warning"}
    _, tp4_warnings = rules.check(parse_cluster(group_of("tp4")))
    assert {w.rule for w in tp4_warnings} == {"dev-image-warning", "kv-pin-clamp-warning"}


def test_memory_fix_names_the_largest_kv_pin_that_fits():
    raw = _set(["serving", "maxTotalTokens"], 16000000)(cluster_of("tp4"))
    (finding,) = [f for f in _findings(raw, "memory-plan-fits") if f.field == "serving.maxTotalTokens"]
    limit = int(finding.fix.split("at most ")[1].split(",")[0])
    assert 8000000 < limit < 16000000  # the seed's 8M fits, 16M does not
    ok = _set(["serving", "maxTotalTokens"], limit)(cluster_of("tp4"))
    assert [f for f in _findings(ok, "memory-plan-fits") if f.field == "serving.maxTotalTokens"] == []


def test_memory_outside_pool_says_what_to_lower():
    raw = _set(["serving", "memFractionStatic"], 0.99)(cluster_of("tp3"))
    found = [f for f in _findings(raw, "memory-plan-fits") if f.field == "serving.memFractionStatic"]
    assert found and "lower serving.memFractionStatic to at most 0.9" in found[0].fix
    assert "never raise" in found[0].fix


def test_sglang_on_two_sparks_does_not_fit():
    found = _findings(_two_nodes_sglang(cluster_of("tp4")), "memory-plan-fits")
    assert found and "3+ Sparks" in found[0].fix


def test_tp_without_published_figures_is_refused():
    found = _findings(_tp8(cluster_of("tp4")), "memory-plan-fits")
    assert found and "no published memory figures for TP=8" in found[0].problem


def test_ram_offload_through_extra_env_is_refused_too():
    raw = _set(["serving", "extraEnv"], {"OFFLOAD_MODE": "RAM"})(cluster_of("tp4"))
    assert [f.field for f in _findings(raw, "no-ram-offload")] == ["serving.extraEnv.OFFLOAD_MODE"]


def test_secret_in_extra_env_is_refused_without_echoing_it():
    raw = _set(["serving", "extraEnv"], {"API_KEY": "hunter2"})(cluster_of("tp4"))
    (f,) = _findings(raw, "extra-env-not-managed")
    assert "hunter2" not in str(f)


def test_ring_needs_four_nodes_and_direct_at_most_three():
    assert _findings(_set(["topology"], "ring")(cluster_of("tp3")), "topology-fits-node-count")
    assert not _findings(_set(["topology"], "ring")(cluster_of("tp4")), "topology-fits-node-count")
    assert not _findings(_set(["topology"], "direct")(cluster_of("tp3")), "topology-fits-node-count")


def test_context_longer_than_kv_pool_is_refused():
    raw = _set(["serving", "maxTotalTokens"], 200000)(cluster_of("tp3"))
    assert any("KV pool" in f.problem for f in _findings(raw, "context-length-supported"))


def test_tp3_below_the_measured_static_fraction_is_refused():
    raw = _set(["serving", "memFractionStatic"], 0.90)(cluster_of("tp3"))
    found = [f for f in _findings(raw, "memory-plan-fits") if f.field == "serving.memFractionStatic"]
    assert found and "at least 0.944" in found[0].problem and "0.944 or more" in found[0].fix


def test_nfs_server_ip_must_be_an_address():
    raw = _set(["nodes", 1, "nfsServerIp"], "head-cx7")(cluster_of("tp3"))
    assert [f.field for f in _findings(raw, "fabric-ip-is-ipv4")] == ["nodes[1].nfsServerIp"]


def test_image_build_needs_the_dockerfile_in_the_context():
    raw = _set(["imageBuild"], {"context": "sim/overlay", "dockerfile": "Dockerfile.canary-roce"})(cluster_of("tp4"))
    assert [f.field for f in _findings(raw, "image-build-context-exists")] == ["imageBuild.dockerfile"]
    ok = _set(["imageBuild"], {"context": "sim/overlay"})(cluster_of("tp4"))
    assert _findings(ok, "image-build-context-exists") == []


def test_an_image_build_context_too_big_for_the_build_commands_stdin_is_refused(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM lmsysorg/sglang:dev-dsv41\nCOPY adapter /opt/dsv41\n")
    (tmp_path / "weights.bin").write_bytes(b"\0" * (33 * 2**20))
    raw = _set(["imageBuild"], {"context": str(tmp_path)})(cluster_of("tp4"))
    [found] = _findings(raw, "image-build-context-exists")
    assert found.field == "imageBuild.context" and "33.0 MiB" in found.problem and ".dockerignore" in found.fix
    (tmp_path / ".dockerignore").write_text("*.bin\n")
    assert _findings(raw, "image-build-context-exists") == []


@pytest.mark.parametrize("mutate, field, words", [
    # the fatal one: the flag the program itself used to write, refused by every SGLang from 0.5.20
    (_set(["serving", "extraArgs"], ["--cuda-graph-max-bs", "8"]), "serving.extraArgs[0]",
     ["--cuda-graph-max-bs", "removed in 0.5.20", "--cuda-graph-max-bs-decode"]),
    # not in the real 0.5.23 parser at all
    (_set(["serving", "extraArgs"], ["--no-such-flag"]), "serving.extraArgs[0]", ["no such option", "0.5.23"]),
    # a prefix the real parser finds ambiguous
    (_set(["serving", "extraArgs"], ["--cuda-graph-b", "1"]), "serving.extraArgs[0]", ["ambiguous"]),
    # a release older than the DeepSeek-V4.1 flags
    (_set(["engineVersion"], "0.5.19"), "engineVersion", ["0.5.21"]),
    # a release with DSPARK but without the flag name the program writes is impossible; an older
    # one without --cuda-graph-max-bs-decode is refused by its version alone (above)
])
def test_engine_version_names_flag_version_and_replacement(mutate, field, words):
    found = [f for f in _findings(mutate(cluster_of("tp4")), "engine-version") if f.level == "error"]
    assert any(f.field == field for f in found), [str(f) for f in found]
    text = " ".join(str(f) for f in found)
    for w in words:
        assert w in text, (w, text)


def test_engine_version_without_a_table_warns_and_leaves_it_to_the_image():
    raw = _set(["engineVersion"], "0.5.22")(cluster_of("tp4"))
    raw["serving"]["extraArgs"] = [*raw["serving"]["extraArgs"], "--no-such-flag"]
    found = _findings(raw, "engine-version")
    assert [f.level for f in found] == ["warning"] and "argcheck" in found[0].fix
    # a renamed flag is still refused for a release without a table
    raw["serving"]["extraArgs"] += ["--cuda-graph-max-bs", "8"]
    assert any(f.level == "error" for f in _findings(raw, "engine-version"))


def test_vllm_mp_backend_may_set_dist_port_and_keeps_ray_port():
    raw = _set(["serving", "distributedExecutorBackend"], "mp")(cluster_of("tp2"))
    raw["serving"]["distPort"] = 29500
    assert _findings(raw, "engine-fields") == []
    raw["serving"]["distPort"] = 8000  # its rendezvous port must not be the API's
    assert [f.field for f in _findings(raw, "ports-distinct")] == ["serving.distPort"]
    ray = _set(["serving", "distPort"], 29500)(cluster_of("tp2"))
    assert [f.field for f in _findings(ray, "engine-fields")] == ["serving.distPort"]  # the Ray backend has no use for it


@pytest.mark.parametrize("profile", ["llama", "deepseek-v4.1-flash-nvfp4"])  # unknown; the other engine's
def test_a_profile_without_figures_for_the_engine_is_reported_not_a_crash(profile):
    """The rules that plan rank specs (engine-version) wait for known-profile instead of failing on the figures."""
    errors, _ = rules.check(parse_cluster(_set(["model", "profile"], profile)(cluster_of("tp4"))), "tp4")
    assert [e.rule for e in errors] == ["known-profile"]


def test_the_guards_port_is_its_own_on_every_node():
    raw = cluster_of("tp4")
    raw["serving"]["selfHeal"] = {"port": 20000}  # the rendezvous port
    found = _findings(raw, "ports-distinct")
    assert [(f.field, f.value) for f in found] == [("serving.selfHeal.port", 20000)]
    assert "equals serving.distPort" in str(found[0]) and "selfHeal.port 9850" in str(found[0])
    raw["serving"]["selfHeal"] = {"enabled": False, "port": 20000}  # no guard, no port
    assert _findings(raw, "ports-distinct") == []
