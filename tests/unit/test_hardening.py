"""Hostile and careless inputs, one test per case of the hardening issue: each is refused at preview
with a message naming the field, the value and the fix (or, for host keys, verified), before
anything touches a node. The execution test of every generated script is test_shell_injection.py;
argparse prefixes and aliases of managed flags are test_flags.py."""

import os
import stat
from pathlib import Path

import pulumi
import pytest

from declared import hostkeys
from planning import launch, memoryplan, plan, rules
from declared.cluster import ConfigError, parse_cluster
from harness import ROOT, cluster_of, fake_host_key, group_of, run_program


def refused(raw, field: str, stack: str = "tp4") -> str:
    """The refusal of `raw` (shape or rule), which must name `field`; returns its text."""
    try:
        cfg = parse_cluster(raw)
    except ConfigError as exc:
        text = str(exc)
    else:
        errors, _ = rules.check(cfg, stack)
        assert errors, f"{field}: accepted"
        text = "\n".join(map(str, errors))
    assert f"cluster.{field}" in text, text
    return text


def with_(stack: str, path: list, value):
    raw = cluster_of(stack)
    target = raw
    for key in path[:-1]:
        target = target.setdefault(key, {}) if isinstance(key, str) else target[key]
    target[path[-1]] = value
    return raw


# ------------------------------------------------------------------------------------------ exports(5)


@pytest.mark.parametrize("opts", [["ro)", "10.9.9.9(rw"], ["ro\n/ *(rw,no_root_squash)"], ["ro,rw"], ["ro sync"]])
def test_export_options_cannot_write_another_export_entry(opts):
    text = refused(with_("tp4", ["share", "exportOptions"], opts), "share.exportOptions")
    assert "one option per list item" in text


def test_export_and_mount_options_are_a_list_of_single_options():
    cfg = parse_cluster(group_of("tp4"))
    assert cfg.share.export_options == ["ro", "sync", "no_subtree_check", "no_root_squash", "insecure"]
    from planning import commands

    assert commands.export_line(cfg).endswith("(ro,sync,no_subtree_check,no_root_squash,insecure)")
    assert plan.volume_options(cfg, 1)["o"].startswith("addr=10.0.22.1,nfsvers=4.2,ro,")
    refused(with_("tp4", ["share", "mountOptions"], ["nfsvers=4.2", "rw"]), "share.mountOptions")


# ------------------------------------------------------------------------------------------ memory


def test_cuda_graphs_are_planned_at_the_batch_size_actually_captured():
    raw = with_("tp4", ["serving", "maxRunningRequests"], 128)
    cfg = parse_cluster(raw)
    graphs = memoryplan.memory_plan(cfg).ranks[0].cuda_graphs_gib
    args = launch.sglang_args(cfg, 0)
    assert args[args.index("--cuda-graph-max-bs-decode") + 1] == "128"
    assert graphs == pytest.approx(memoryplan.PROFILES[cfg.model.profile].cuda_graph_gb_at_bs16 * 8 * 1e9 / 2**30)
    assert "CUDA graphs 41.7" in refused(raw, "serving.memFractionStatic")  # not outside the 0.80 pool


def test_the_test_double_memory_profile_is_refused_outside_the_sim_stacks():
    raw = with_("tp4", ["model", "profile"], "sim-test-double")
    assert "test double" in refused(raw, "model.profile", stack="tp4")
    errors, _ = rules.check(parse_cluster(group_of("sim")), "sim")
    assert errors == []


@pytest.mark.parametrize("value", [129, 1e6, 0])
def test_unified_memory_is_bounded(value):
    refused(with_("tp4", ["memory", "unifiedGiB"], value), "memory.unifiedGiB")


def test_the_readme_spelling_of_memory_fields_is_the_accepted_one():
    cfg = parse_cluster(with_("tp4", ["memory"], {"unifiedGiB": 120.0, "runtimeFloorGiB": 4}))
    assert (cfg.memory.unified_gib, cfg.memory.runtime_floor_gib) == (120.0, 4)


@pytest.mark.parametrize("key", ["PYTORCH_CUDA_ALLOC_CONF", "NCCL_BUFFSIZE", "DSV41_CACHE_GIB", "CUDA_VISIBLE_DEVICES"])
def test_extra_env_that_changes_memory_use_is_refused(key):
    refused(with_("tp4", ["serving", "extraEnv"], {key: "1"}), f"serving.extraEnv.{key}")


# ------------------------------------------------------------------------------------------ paths


@pytest.mark.parametrize("path", ["/etc", "/usr", "/", "/usr/share/models", "//etc", "/var/lib", "/proc/x"])
def test_system_directories_are_refused_for_the_checkpoint(path):
    raw = with_("tp2", ["model", "checkpointDir"], path)  # tp2 downloads ~400 GiB into it on every node
    assert "system directory" in refused(raw, "model.checkpointDir", stack="tp2")


@pytest.mark.parametrize("stack", ["tp4", "tp2"])
def test_state_dir_never_inside_or_above_the_checkpoint(stack):
    ckpt = cluster_of(stack)["model"]["checkpointDir"]
    refused(with_(stack, ["stateDir"], ckpt + "/keys"), "stateDir", stack)
    refused(with_(stack, ["stateDir"], str(Path(ckpt).parent)), "stateDir", stack)


def test_engram_dir_never_inside_the_checkpoint():
    ckpt = cluster_of("tp4")["model"]["checkpointDir"]
    refused(with_("tp4", ["engram", "dir"], ckpt + "/engram"), "engram.dir")


# ------------------------------------------------------------------------------------------ hosts


@pytest.mark.parametrize("host", ["10.0.0.1:2222", "-oProxyCommand=touch", "spark 1", "root@10.0.0.1", "fe80::1",
                                  "[10.0.0.1]", "10.0.0.1/24", "", "spark1.lan.", "1.2.3"])  # fmt: skip
def test_bad_hosts_are_refused(host):
    refused(with_("tp4", ["nodes", 1, "host"], host), "nodes[1].host")


@pytest.mark.parametrize("host", ["10.0.0.2", "spark2", "spark2.lan", "SPARK2.example.com"])
def test_good_hosts_pass(host):
    assert parse_cluster(with_("tp4", ["nodes", 1, "host"], host)).nodes[1].host == host


@pytest.mark.parametrize(
    "path, value",
    [
        (["fabric", "socketIfname"], "eth0 eth1"),
        (["fabric", "ibHca"], "roce;reboot"),
        (["model", "hfRepo"], "nvidia/x y"),
        (["model", "revision"], "main\nrm"),
        (["image"], "lmsysorg/sglang:dev $(id)"),
        (["serving", "extraEnv"], {"A=B": "1"}),
        (["readiness", "expect"], ""),
    ],
)
def test_fields_that_reach_a_shell_a_flag_or_an_env_have_strict_shapes(path, value):
    stack = "tp2" if path[-1] == "hfRepo" else "tp4"
    field = ".".join(str(p) for p in path)
    if path[-1] == "extraEnv":
        field = "serving.extraEnv"
    refused(with_(stack, path, value), field, stack)


@pytest.mark.parametrize("port_field, port", [("port", 22), ("distPort", 8265), ("port", 2222)])
def test_ports_of_ssh_and_ray_dashboard_are_refused(port_field, port):
    raw = with_("tp4", ["nodes", 2, "sshPort"], 2222)
    raw["serving"][port_field] = port
    refused(raw, f"serving.{port_field}")


# ------------------------------------------------------------------------------------------ host keys


def test_remote_commands_pin_the_host_key_ssh_trusts(tmp_path):
    known = tmp_path / "known_hosts"
    raw = cluster_of("tp4")
    keys = {n["host"]: fake_host_key(n["host"]) for n in raw["nodes"]}
    known.write_text("".join(f"{h} {k}\n" for h, k in keys.items()) + "10.0.0.1 ssh-rsa AAAAB3NzaC1yc2E=\n")
    raw["ssh"] = {**raw.get("ssh", {}), "knownHostsFile": str(known)}
    rec = run_program("tp4", cluster=raw)
    for node in raw["nodes"]:
        preflight = rec.named(f"tp4-{node['name']}-preflight")
        conn = preflight.plain["connection"]
        assert conn["hostKey"] == keys[node["host"]], "ed25519 preferred, from the file ssh reads"


def test_a_node_missing_from_known_hosts_is_refused_with_strict_checking(tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("10.0.0.1 " + fake_host_key("10.0.0.1") + "\n")
    raw = cluster_of("tp4")
    raw["ssh"] = {"knownHostsFile": str(known)}
    with pytest.raises(pulumi.RunError, match=r"cluster.nodes\[1\].hostKey: no host key for 10.0.0.2") as err:
        run_program("tp4", cluster=raw)
    assert "ssh-keyscan -p 22 10.0.0.2" in str(err.value)
    raw["ssh"]["strictHostKeyChecking"] = False  # accept-new, like the docker provider's ssh then
    assert run_program("tp4", cluster=raw).named("tp4-spark2-preflight").plain["connection"].get("hostKey") is None


def test_an_rsa_only_pin_is_refused_with_the_ed25519_fix(tmp_path):
    """pulumi-command's client offers only ssh-rsa (SHA-1) for an RSA pin, which OpenSSH 8.8+ refuses:
    a node known only by its RSA key (or pinned to one) fails the preview, not every remote command."""
    known = tmp_path / "known_hosts"
    raw = cluster_of("tp4")
    known.write_text("".join(f"{n['host']} {fake_host_key(n['host'])}\n" for n in raw["nodes"][1:])
                     + "10.0.0.1 ssh-rsa AAAAB3NzaC1yc2E=\n")  # fmt: skip
    raw["ssh"] = {"knownHostsFile": str(known)}
    with pytest.raises(pulumi.RunError, match=r"cluster.nodes\[0\].hostKey: 10.0.0.1 would be pinned to an RSA host key") as err:
        run_program("tp4", cluster=raw)
    assert "OpenSSH 8.8" in str(err.value) and f"ssh-keyscan -t ed25519 -p 22 10.0.0.1 >> {known}" in str(err.value)
    raw["nodes"][0]["hostKey"] = "ssh-rsa AAAAB3NzaC1yc2E="
    with pytest.raises(pulumi.RunError, match=r"\(nodes\[0\].hostKey\)"):
        run_program("tp4", cluster=raw)


def test_hashed_and_port_entries_of_known_hosts_are_understood(tmp_path):
    import base64
    import hashlib
    import hmac

    salt = os.urandom(20)
    digest = hmac.new(salt, b"[10.0.0.7]:2222", hashlib.sha1).digest()
    key = fake_host_key("10.0.0.7", 2222)
    (tmp_path / "kh").write_text(f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()} {key}\n")
    assert hostkeys.lookup(str(tmp_path / "kh"), "10.0.0.7", 2222) == key
    assert hostkeys.lookup(str(tmp_path / "kh"), "10.0.0.7", 22) is None
    assert hostkeys.lookup(str(tmp_path / "missing"), "10.0.0.7") is None


# ------------------------------------------------------------------------------------------ API key


@pytest.mark.parametrize("key", ["-sk-0123456789abcdef", "sk-0123456789abcdéf", "EMPTY", "null", "x", "sk-short"])
def test_keys_that_would_break_or_open_the_endpoint_are_refused(key):
    with pytest.raises(pulumi.RunError, match=r"(?s)deepseek-spark:apiKey .*pulumi config set --secret"):
        run_program("tp4", api_key=key)


def test_the_readme_client_recipe_executes_no_value():
    readme = (ROOT / "README.md").read_text()
    assert 'eval "$(' not in readme and "--format openai-env --out" in readme


# ------------------------------------------------------------------------------------------ messages, not tracebacks


def test_cluster_given_as_a_plain_string_is_a_message():
    with pytest.raises(pulumi.RunError, match="is a plain string, not a structured value; fix: write it as a YAML"):
        run_program("tp4", cluster="nodes: spark1")


def test_an_unreadable_build_context_file_is_a_finding_not_a_traceback(tmp_path, monkeypatch):
    ctx = tmp_path / "recipe"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM x\n")
    secret = ctx / "key.pem"
    secret.write_text("k")
    secret.chmod(0)
    real_open = open

    def deny(path, *a, **k):  # root reads any file: make key.pem unreadable for everyone
        if str(path) == str(secret):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", deny)
    text = refused(with_("tp4", ["imageBuild"], {"context": str(ctx)}), "imageBuild.context")
    assert "key.pem" in text and ".dockerignore" in text
    secret.chmod(stat.S_IRUSR | stat.S_IWUSR)


@pytest.mark.parametrize("field, value", [(["serving", "contextLength"], 10**400), (["serving", "tpSize"], 2**70),
                                          (["memory", "unifiedGiB"], float("inf"))])  # fmt: skip
def test_absurd_numbers_are_messages(field, value):
    raw = with_("tp4", field, value)
    with pytest.raises(ConfigError, match=r"cluster\." + r"\.".join(field)):
        parse_cluster(raw)
