"""The policy pack's guardrails against the resources the real stacks register (all pass) and against
deliberately bad copies of them (each refused, with a message that names the problem and never a
secret). Validators run through the real pulumi-policy policy objects from policy/policies.py, with
the same ResourceValidationArgs shape pulumi-policy's analyzer builds."""

from __future__ import annotations

import pytest
from policy_helpers import STACKS, as_args, as_stack_resource, changed, custom, facts_for, stack_config

import guardrails
import shellscan
import policies
from harness import TEST_API_KEY, TEST_SSH_KEY, Registered, cluster_of

CKPT = cluster_of("tp4")["model"]["checkpointDir"]


def run_policy(name: str, resource: Registered, stack: str = "tp4", config: dict | None = None) -> list[str]:
    """Messages the named policy reports for one resource (through pulumi-policy's own objects)."""
    policy = next(p for p in policies.build(facts_for(stack)) if p.name == name)
    found: list[str] = []
    policy.validate(as_args(resource, config), lambda message, urn=None: found.append(message))
    return found


def run_stack_policy(name: str, resources: list[Registered], stack: str = "tp4") -> list[str]:
    from pulumi_policy import StackValidationArgs

    policy = next(p for p in policies.build(facts_for(stack)) if p.name == name)
    found: list[str] = []
    policy.validate(StackValidationArgs([as_stack_resource(r) for r in resources]), lambda m, urn=None: found.append(m))
    return found


def test_the_pack_has_every_guardrail_and_all_are_mandatory():
    from pulumi_policy import EnforcementLevel, ResourceValidationPolicy, StackValidationPolicy

    built = policies.build(facts_for("tp4"))
    assert [p.name for p in built] == [s.name for s in guardrails.POLICIES]
    assert {p.name for p in built} >= {
        "no-privileged-containers", "nfs-exports-read-only-to-named-hosts", "rank-containers-restart-no",
        "rank-containers-delete-before-replace", "checkpoint-never-deleted", "no-secrets-in-plain-inputs",
        "no-ram-offload",
    }  # fmt: skip
    assert all(p.enforcement_level == EnforcementLevel.MANDATORY for p in built)
    kinds = {p.name: type(p) for p in built}
    assert kinds["checkpoint-volumes-mounted-read-only"] is StackValidationPolicy
    assert kinds["no-privileged-containers"] is ResourceValidationPolicy
    assert built[0].config_schema.properties["allowPrivileged"]["type"] == "boolean"


@pytest.mark.parametrize("stack", STACKS)
def test_the_real_stacks_pass_every_policy(recordings, stack):
    rec = recordings[stack]
    resources = custom(rec)
    raw = cluster_of(stack)
    nodes = raw.get("nodes") or [n for g in raw.get("groups", []) for n in g["nodes"]]
    assert len([r for r in resources if guardrails.is_rank(as_args(r))]) == len(nodes)
    violations = []
    for policy in policies.build(facts_for(stack)):
        report = lambda m, urn=None, name=policy.name: violations.append((name, m))  # noqa: E731
        if isinstance(policy, __import__("pulumi_policy").StackValidationPolicy):
            from pulumi_policy import StackValidationArgs

            policy.validate(StackValidationArgs([as_stack_resource(r) for r in resources]), report)
        else:
            for r in resources:
                policy.validate(as_args(r), report)
    assert violations == []


# ------------------------------------------------------------------------------------------ privileged


def test_privileged_container_is_refused_unless_the_config_allows_it(recordings):
    rank = recordings["tp4"].named("tp4-sglang-rank1")
    bad = changed(rank, privileged=True)
    found = run_policy("no-privileged-containers", bad)
    assert len(found) == 1 and "privileged" in found[0] and "tp4-rank1" in found[0]
    assert run_policy("no-privileged-containers", bad, config={"allowPrivileged": True}) == []
    assert run_policy("no-privileged-containers", rank) == []


def test_the_groups_guard_alone_runs_privileged_and_only_as_itself(recordings):
    """The guard drops the page cache and checks the rails on the node (its start gates): privileged by design. A
    container labelled as a guard that runs anything but the guard's archive is refused like any other."""
    guard = recordings["tp4"].named("tp4-guard-spark2")
    assert guard.inputs["privileged"] is True and run_policy("no-privileged-containers", guard) == []
    impostor = changed(guard, command=["-c", "import os; os.system('sh')"])
    assert len(run_policy("no-privileged-containers", impostor)) == 1
    as_shell = changed(guard, entrypoints=["/bin/sh"])
    assert len(run_policy("no-privileged-containers", as_shell)) == 1


def test_cap_add_all_counts_as_privileged(recordings):
    rank = recordings["tp4"].named("tp4-sglang-rank2")
    found = run_policy("no-privileged-containers", changed(rank, capabilities={"adds": ["IPC_LOCK", "ALL"]}))
    assert len(found) == 1 and "ALL capabilities" in found[0]


# ---------------------------------------------------------------------------------------- NFS exports


@pytest.mark.parametrize(
    "edit, expect",
    [
        (lambda s: s.replace("10.0.22.2(", "*("), "exported to *"),
        (lambda s: s.replace("(ro,", "(rw,"), "read-write"),
        (lambda s: s.replace("10.0.22.3(ro,", "10.0.22.0/24(ro,"), "10.0.22.0/24"),
        (lambda s: s.replace("10.0.22.4(ro,", "(ro,"), "everyone"),
        (lambda s: s.replace("(ro,sync", "(sync"), "without an explicit 'ro'"),
    ],
    ids=["wildcard", "read-write", "network", "anonymous-client", "no-ro"],
)
def test_world_visible_or_writable_exports_are_refused(recordings, edit, expect):
    export = recordings["tp4"].named("tp4-checkpoint-export")
    create = export.plain["create"]
    assert "/etc/exports.d/deepseek-spark-tp4.exports" in create
    found = run_policy("nfs-exports-read-only-to-named-hosts", changed(export, create=edit(create)))
    assert found and any(expect in m for m in found), found


@pytest.mark.parametrize(
    "script, expect",
    [
        ("exportfs -o rw,sync '*:/home/zurih/NewModels/DS4.1'\n", "exported to *"),
        ("echo '/srv/x' >> /etc/exports\n", "every host"),
        ("cat > /etc/exports.d/x.exports <<EOF\n/srv/x 10.0.22.2(ro)\nEOF\n", "cannot read"),
        ("sudo -n cp /tmp/x.exports /etc/exports.d/x.exports && exportfs -ra\n", "cannot verify"),
    ],
    ids=["exportfs-o", "echo-no-clients", "heredoc", "cp"],
)
def test_other_ways_of_writing_exports_are_read_or_refused(recordings, script, expect):
    export = recordings["tp4"].named("tp4-checkpoint-export")
    found = run_policy("nfs-exports-read-only-to-named-hosts", changed(export, create=script))
    assert any(expect in m for m in found), found


def test_unexporting_and_removing_exports_is_allowed(recordings):
    export = recordings["tp4"].named("tp4-checkpoint-export")
    assert "rm -f" in export.plain["delete"]
    ok = changed(export, create="exportfs -u 10.0.0.2:/srv/x\nsudo -n rm -f /etc/exports.d/x.exports\n")
    assert run_policy("nfs-exports-read-only-to-named-hosts", ok) == []


# -------------------------------------------------------------------------------------- rank lifecycle


@pytest.mark.parametrize("restart", ["always", "unless-stopped", "on-failure"])
def test_rank_containers_must_not_restart_on_their_own(recordings, restart):
    rank = recordings["tp4"].named("tp4-sglang-rank0")
    found = run_policy("rank-containers-restart-no", changed(rank, restart=restart))
    assert len(found) == 1 and repr(restart) in found[0]


def test_restart_policy_is_only_enforced_on_rank_containers(recordings):
    rank = recordings["tp4"].named("tp4-sglang-rank0")
    labels = [label for label in rank.inputs["labels"] if label["label"] != "deepseek-spark.role"]
    other = changed(rank, restart="always", labels=labels)
    assert run_policy("rank-containers-restart-no", other) == []


def test_rank_containers_must_be_delete_before_replace(recordings):
    rank = recordings["tp3"].named("tp3-sglang-rank2")
    assert run_policy("rank-containers-delete-before-replace", rank, "tp3") == []
    found = run_policy("rank-containers-delete-before-replace", changed(rank, _dbr=False), "tp3")
    assert len(found) == 1 and "delete_before_replace" in found[0]


# ------------------------------------------------------------------------------------------ checkpoint


@pytest.mark.parametrize(
    "script, expect",
    [
        (f"rm -rf {CKPT}\n", "deletes the checkpoint"),
        (f"sudo -n rm -rf {CKPT.rsplit('/', 1)[0]}\n", "contains the checkpoint"),
        (f"d={CKPT}; rm -f \"$d\"/model-00001-of-00048.safetensors\n", "inside the checkpoint"),
        (f"rm -f {CKPT}/*.safetensors\n", "inside the checkpoint"),
        ("rm -rf /home/zurih/*\n", "contains the checkpoint"),
        ('rm -rf "$HOME/NewModels"\n', "known only at run time"),
        ("rm -rf NewModels\n", "known only at run time"),
        ("find /home/zurih -name '*.tmp' -delete\n", "can be the checkpoint"),
        (f"mv {CKPT} /tmp/old\n", "deletes the checkpoint"),
        (f"rsync -a --delete /srv/empty/ {CKPT}/\n", "deletes the checkpoint"),
        (f"sh -c 'rm -rf {CKPT}'\n", "deletes the checkpoint"),
        ("ls /home | xargs rm -rf\n", "known only at run time"),
    ],
    ids=["rm-dir", "rm-parent", "rm-var", "rm-glob", "rm-parent-glob", "rm-home-var", "rm-relative", "find-delete",
         "mv", "rsync-delete", "nested-sh", "xargs"],
)  # fmt: skip
def test_commands_that_could_delete_the_checkpoint_are_refused(recordings, script, expect):
    shard = recordings["tp4"].named("tp4-engram-spark1")
    for field in ("create", "delete"):
        found = run_policy("checkpoint-never-deleted", changed(shard, **{field: script}))
        assert any(expect in m for m in found), (field, found)
        assert all(field in m for m in found)


def test_deletes_elsewhere_are_allowed(recordings):
    """The program's own deletes (engram shards, API key file, exports file) pass, and so do unrelated ones."""
    shard = recordings["tp4"].named("tp4-engram-spark1")
    assert "rm -f" in shard.plain["delete"] and "rm -f" in shard.plain["create"]
    assert run_policy("checkpoint-never-deleted", shard) == []
    ok = changed(shard, delete=f"rm -rf {CKPT}-old /home/zurih/NewModels/DS4.0\ndocker rm -f tp4-rank0\n")
    assert run_policy("checkpoint-never-deleted", ok) == []


def test_checkpoint_dir_comes_from_the_stack_config_and_the_policy_config(recordings):
    shard = recordings["tp4"].named("tp4-engram-spark1")
    bad = changed(shard, delete="rm -rf /data/other-checkpoint\n")
    assert run_policy("checkpoint-never-deleted", bad) == []
    found = run_policy("checkpoint-never-deleted", bad, config={"checkpointDirs": ["/data/other-checkpoint"]})
    assert len(found) == 1 and "deletes the checkpoint" in found[0]


def test_checkpoint_mounts_must_be_read_only(recordings):
    rec = recordings["tp4"]
    worker_volume = rec.named("tp4-checkpoint-spark2")
    assert worker_volume.plain["driverOpts"]["type"] == "nfs"
    rw_nfs = dict(worker_volume.plain["driverOpts"], o=worker_volume.plain["driverOpts"]["o"].replace(",ro,", ","))
    found = run_policy("checkpoint-never-deleted", changed(worker_volume, driverOpts=rw_nfs))
    assert len(found) == 1 and "without 'ro'" in found[0]

    rank = rec.named("tp4-sglang-rank1")
    bind = [{"target": "/models", "source": CKPT, "type": "bind", "readOnly": False}]
    found = run_policy("checkpoint-never-deleted", changed(rank, mounts=bind))
    assert len(found) == 1 and "writable" in found[0]


def test_checkpoint_volume_mounts_are_read_only_across_the_stack(recordings):
    rec = recordings["tp4"]
    resources = [r for r in rec.resources if r.custom]
    assert run_stack_policy("checkpoint-volumes-mounted-read-only", resources) == []

    rank = rec.named("tp4-sglang-rank3")
    mounts = [dict(m, readOnly=False) if m["source"] == "tp4-checkpoint" else m for m in rank.plain["mounts"]]
    found = run_stack_policy(
        "checkpoint-volumes-mounted-read-only", [changed(rank, mounts=mounts) if r is rank else r for r in resources]
    )
    assert len(found) == 1 and "tp4-rank3" in found[0] and "checkpoint volume tp4-checkpoint" in found[0]

    shard = rec.named("tp4-engram-spark2")
    create = shard.plain["create"]
    assert "tp4-checkpoint:/models/DeepSeek-V4.1-Flash:ro" in create
    rw = changed(shard, create=create.replace(":/models/DeepSeek-V4.1-Flash:ro", ":/models/DeepSeek-V4.1-Flash"))
    found = run_stack_policy("checkpoint-volumes-mounted-read-only", [rw if r is shard else r for r in resources])
    assert len(found) == 1 and "tp4-engram-spark2" in found[0] and "add :ro" in found[0]


# --------------------------------------------------------------------------------------------- secrets


def test_the_api_key_in_a_plain_input_is_refused_and_never_repeated(recordings):
    rank0 = recordings["tp4"].named("tp4-sglang-rank0")
    bad = changed(rank0, envs=[*rank0.plain["envs"], f"SGLANG_KEY_HINT={TEST_API_KEY}"])
    found = run_policy("no-secrets-in-plain-inputs", bad)
    assert any("envs." in m and "secret from the stack config" in m for m in found), found
    assert all(TEST_API_KEY not in m for m in found)

    bad = changed(rank0, command=[*rank0.plain["command"], "--api-key", TEST_API_KEY])
    found = run_policy("no-secrets-in-plain-inputs", bad)
    assert any("literal argument" in m for m in found) and all(TEST_API_KEY not in m for m in found)


def test_the_key_in_a_command_script_is_refused_but_stdin_is_its_place(recordings):
    key_file = recordings["tp4"].named("tp4-sglang-api-key")
    assert key_file.plain["stdin"] == TEST_API_KEY  # the program's way: on stdin, as a secret input
    assert run_policy("no-secrets-in-plain-inputs", key_file) == []
    leaky = changed(key_file, create=f"printf '%s' '{TEST_API_KEY}' > /var/lib/deepseek-spark/tp4/api-key\n")
    found = run_policy("no-secrets-in-plain-inputs", leaky)
    assert len(found) == 1 and found[0].startswith("tp4-sglang-api-key: create contains a secret")


def test_secret_shaped_values_are_refused_even_when_not_in_the_stack_config(recordings):
    rec = recordings["tp4"]
    provider = rec.named("tp4-spark1-docker")
    found = run_policy("no-secrets-in-plain-inputs", changed(provider, sshOpts=["-o", f"IdentityAgent={TEST_SSH_KEY}"]))
    assert len(found) == 1 and "secret from the stack config" in found[0]
    kind = "OPENSSH " + "PRIVATE KEY"  # built here so the repository holds no key-shaped line
    pem = f"-----BEGIN {kind}-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END {kind}-----"
    preflight = rec.named("tp4-spark1-preflight")
    found = run_policy("no-secrets-in-plain-inputs", changed(preflight, create=f"echo '{pem}' > /tmp/k\n"))
    assert len(found) == 1 and "private key" in found[0]
    readiness = rec.named("tp4-readiness-check")
    found = run_policy(
        "no-secrets-in-plain-inputs",
        changed(readiness, create="curl -H 'Authorization: Bearer abcdefghijklmnop0123' http://10.0.0.1:8888/v1/models"),
    )
    assert len(found) == 1 and "bearer token" in found[0]
    scrape = "authorization:\n  type: Bearer\n  credentials_file: /run/dspark-monitoring/gateway-metrics-key\n"
    assert run_policy("no-secrets-in-plain-inputs", changed(readiness, create=f"cat > /x <<'E'\n{scrape}E\n")) == []
    rank = rec.named("tp4-sglang-rank1")
    found = run_policy("no-secrets-in-plain-inputs", changed(rank, envs=[*rank.plain["envs"], "HF_TOKEN=hf_abcdef"]))
    assert len(found) == 1 and "env HF_TOKEN" in found[0]
    assert "DSV41_MAX_NEW_TOKENS=32768" in rank.plain["envs"]  # TOKENS is not TOKEN: no false alarm


# ---------------------------------------------------------------------------------------------- offload


def test_offload_mode_ram_is_refused_in_env_and_scripts(recordings):
    rec = recordings["tp4"]
    rank = rec.named("tp4-sglang-rank0")
    envs = [e if not e.startswith("OFFLOAD_MODE=") else "OFFLOAD_MODE=ram" for e in rank.plain["envs"]]
    assert "OFFLOAD_MODE=nvme" in rank.plain["envs"] and envs != rank.plain["envs"]
    found = run_policy("no-ram-offload", changed(rank, envs=envs))
    assert len(found) == 1 and "env OFFLOAD_MODE=ram" in found[0]
    shard = rec.named("tp4-engram-spark1")
    found = run_policy("no-ram-offload", changed(shard, create="docker run -e OFFLOAD_MODE=RAM img true\n"))
    assert len(found) == 1 and "create sets OFFLOAD_MODE=ram" in found[0]
    assert run_policy("no-ram-offload", changed(shard, create="echo OFFLOAD_MODE=ramdisk\n")) == []


# ------------------------------------------------------------------------------------------- plumbing


def test_facts_read_the_config_the_cli_passes_to_a_policy_pack():
    env = {"PULUMI_CONFIG": __import__("json").dumps(
        {"deepseek-spark:config:apiKey": TEST_API_KEY, **{k: v for k, v in stack_config("tp3").items() if "apiKey" not in k}}
    )}  # fmt: skip
    facts = guardrails.StackFacts.from_environment(env)
    assert facts.secrets == (TEST_API_KEY, TEST_SSH_KEY)
    assert facts.checkpoint_dirs == (CKPT,)
    assert guardrails.StackFacts.from_environment({}).secrets == ()
    short = guardrails.StackFacts.from_config({"deepseek-spark:apiKey": "abc"})
    assert short.secrets == ()  # too short to search for without matching everything


def test_shell_reader_follows_pipelines_wrappers_and_variables():
    walked = shellscan.walk_script(
        "set -eu\nd=/srv/a; f=\"$d/b\"\nprintf '%s\\n' 'x y' | sudo -n tee /etc/exports.d/t.exports >/dev/null\n"
        "if [ -f \"$f\" ]; then sudo -n rm -f \"$f\"; fi\ncommand -v exportfs >/dev/null 2>&1\n"
    )
    assert walked is not None
    by_word = {c.argv[0]: (c, env) for c, env in walked if c.argv}
    tee, _ = by_word["tee"]
    assert tee.stdin_from.argv[0] == "printf" and tee.writes == ["/dev/null"]
    rm, env = by_word["rm"]
    assert shellscan.deleted_paths(rm) == ["$f"] and env["f"] == "/srv/a/b"
    assert by_word["command"][0].argv == ["command", "-v", "exportfs"]
    assert shellscan.walk_script("echo 'unbalanced") is None


def test_the_checkpoint_download_may_write_but_nothing_else_may(recordings):
    dl = recordings["tp2"].named("tp2-checkpoint-download-spark1")
    assert run_policy("checkpoint-never-deleted", dl, stack="tp2") == []
    other_target = changed(dl, create=dl.inputs["create"].replace("--local-dir /download", "--local-dir /elsewhere"))
    assert run_policy("checkpoint-never-deleted", other_target, stack="tp2")
    not_a_download = changed(dl, create=dl.inputs["create"].replace("--entrypoint hf", "--entrypoint sh"))
    assert run_policy("checkpoint-never-deleted", not_a_download, stack="tp2")


# ---------------------------------------------------------------------------------- one source of truth


@pytest.mark.parametrize(
    "edit, expect",
    [
        (lambda s: s.replace("insecure)", "insecure) 10.9.9.9(rw,no_root_squash)"), "read-write"),
        (lambda s: s.replace("(ro,sync", "(ro,sync,anonuid=!0"), "is not `name` or `name=value`"),
        (lambda s: s.replace("/home/zurih/NewModels/DS4.1 ", "/etc "), "system directory"),
    ],
    ids=["second-client-rw", "odd-option", "system-dir"],
)
def test_the_pack_refuses_exports_with_the_programs_own_shapes(recordings, edit, expect):
    export = recordings["tp4"].named("tp4-checkpoint-export")
    found = run_policy("nfs-exports-read-only-to-named-hosts", changed(export, create=edit(export.plain["create"])))
    assert any(expect in m for m in found), found


def test_the_pack_and_the_program_judge_the_api_key_alike(recordings):
    from declared import shapes

    weak = dict(stack_config("tp4"), **{"deepseek-spark:apiKey": "-starts-with-a-dash-0123"})
    facts = guardrails.StackFacts.from_config(weak)
    assert facts.api_key_problem == shapes.api_key_problem("-starts-with-a-dash-0123") is not None
    head = recordings["tp4"].named("tp4-sglang-rank0")
    found = guardrails.check_no_plain_secrets(as_args(head), {}, facts)
    assert any("must not start with '-'" in m for m in found), found
    assert guardrails.check_no_plain_secrets(as_args(head), {}, facts_for("tp4")) == []


def test_a_python_heredoc_is_trusted_only_when_it_is_the_repositorys_own_program(recordings):
    """The preflight feeds programs/rails.py to python3 in a quoted heredoc: byte for byte that program
    passes; any other body cannot be accounted for, and a shell-fed body is read as script."""
    preflight = recordings["tp4"].named("tp4-spark2-preflight")
    create = preflight.plain["create"]
    assert "<<'DSPARK_RAILS'" in create
    assert run_policy("checkpoint-never-deleted", preflight) == []
    tampered = create.replace("import argparse\n", "import argparse\nimport shutil; shutil.rmtree('/x')\n")
    found = run_policy("checkpoint-never-deleted", changed(preflight, create=tampered + "rm -f /tmp/x\n"))
    assert any("cannot be parsed" in m for m in found), found
    via_sh = "sh <<'EOF'\nrm -rf /home/zurih/NewModels/DS4.1\nEOF\n"
    found = run_policy("checkpoint-never-deleted", changed(preflight, create=via_sh))
    assert found and "cannot be parsed" not in found[0], found


def test_a_heredoc_a_shells_c_script_reads_is_what_that_script_runs_reads():
    """`sh -c 'cat > "$1"' sh FILE <<'X'` (how the gateway's and the monitoring's files are written): the shell
    reads its script from -c, `cat` reads the heredoc, as data; a `sh -c 'sh'` still reads it as script."""
    assert shellscan.heredoc_reader("sudo sh -c 'cat > \"$1\"' sh /var/lib/x/rules.yml.tmp <<'DSPARK_AB'") is None
    assert shellscan.heredoc_reader("sh -c 'python3 -' <<'X'") == "python"
    assert shellscan.heredoc_reader("sh -c 'exec sh' <<'X'") == "shell"
    assert shellscan.heredoc_reader("sh <<'X'") == "shell"
    body = "groups:\n- summary: '{{ $labels.node }} isn't up\"\n"  # unbalanced quotes: not a script, and not read as one
    script = f"set -eu\nsh -c 'cat > \"$1\"' sh /tmp/r.yml <<'DSPARK_X'\n{body}DSPARK_X\nmv -f /tmp/r.yml /tmp/s.yml\n"
    assert [c.argv[0] for c in shellscan.parse_script(script)] == ["set", "sh", "mv"]
