"""Behaviour of the operator CLI (`python -m dspark`) against fake nodes and a local endpoint."""

from __future__ import annotations

import io
import json
import re
import shlex
import socket
import time
from pathlib import Path

import pytest
import yaml

import harness
from planning import commands, memoryplan, plan, stackplan
from declared.cluster import parse_cluster
from declared.stack import parse_stack
from dspark import nodes as dnodes
from dspark.__main__ import main
from programs import probe
from dspark.cmd_status import boot_phase
from ops_fakes import KEY, REAL_ON_NODE, ROOT, FakeContainer, FakeEndpoint, cluster_for, outputs, state

STACKS = ["tp3", "tp4", "tp2", "sim", "sim-tp2"]


def cfg_of(stack: str):
    return parse_cluster(harness.group_of(stack))


def revision_of(stack: str) -> str:
    """The revision the program labels the ranks with: the group's plan within its stack (whose node exporters
    share each node's memory budget with the rank)."""
    return stackplan.build_stack(parse_stack(harness.cluster_of(stack)), stack).groups[0].revision


def run(argv, **kw) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, out=out, err=err, **kw)
    return code, out.getvalue(), err.getvalue()


def closed_url() -> str:
    """An endpoint nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


def write_stack(tmp_path: Path, stack: str, cluster: dict, extra: dict | None = None) -> Path:
    doc = {"config": {"deepseek-spark:cluster": cluster, **(extra or {})}}
    (tmp_path / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    return tmp_path


def args(cmd: str, stack: str, outputs_file: str | None = None, project: Path = ROOT, *rest: str) -> list[str]:
    a = [cmd, "--stack", stack, "--project-dir", str(project)]
    if outputs_file:
        a += ["--outputs-file", outputs_file]
    return a + list(rest)


# ------------------------------------------------------------------------------------------ plan


@pytest.mark.parametrize("stack", STACKS)
def test_plan_json_has_every_rank_flags_env_memory_and_revision(stack, tmp_path):
    cfg = cfg_of(stack)
    # plan never reads outputs: a missing outputs file must not matter
    code, out, err = run(args("plan", stack, str(tmp_path / "absent.json"), ROOT, "--json"))
    assert code == 0, err
    doc = json.loads(out)
    specs = plan.group_specs(cfg, stack)
    assert doc["group_revision"] == revision_of(stack)
    assert doc["memory_plan"] == memoryplan.memory_plan(cfg).to_output()
    assert [n["name"] for n in doc["nodes"]] == [n.name for n in cfg.nodes]
    for n, spec in zip(doc["nodes"], specs):
        assert n["container"]["name"] == f"{stack}-rank{spec.rank}"
        assert n["container"]["args"] == spec.args
        assert n["container"]["env"] == spec.env
        assert n["container"]["labels"][plan.REVISION_LABEL] == doc["group_revision"]
        assert n["checkpoint_volume"] == {"name": f"{stack}-checkpoint", "driver_opts": plan.volume_options(cfg, spec.rank)}
        assert n["preflight"]["script"] == commands.preflight(cfg, stack, spec.rank)
        assert {"docker", "gpu", "gpu-idle", "infiniband", "fabric-link"} <= set(n["preflight"]["checks"])
        role_plan = next(r for r in doc["memory_plan"]["ranks"] if r["role"] == ("head" if spec.rank == 0 else "worker"))
        assert n["memory"] == role_plan
        if cfg.engine == "sglang":
            assert n["engram"]["files"] == plan.shard_files(spec.rank, cfg.serving.tp_size)
            assert "--node-rank" in n["container"]["args"]
            assert n["container"]["args"][n["container"]["args"].index("--node-rank") + 1] == str(spec.rank)
        else:
            assert n["engram"] is None
    if cfg.image_build is not None:
        assert doc["image"]["build"]["digest"] == plan.image_build_digest(cfg)
    else:
        assert doc["image"]["build"] is None


def test_plan_matches_what_the_program_registers():
    """The plan is what `pulumi up` would create: same revision, same flags and env per rank."""
    rec = harness.run_program("tp3")
    code, out, _ = run(args("plan", "tp3", None, ROOT, "--json"))
    doc = json.loads(out)
    assert doc["group_revision"] == rec.outputs["group_revision"]
    containers = {r.plain["name"]: r.plain for r in rec.of_type("docker:index/container:Container")}
    for n in doc["nodes"]:
        c = containers[n["container"]["name"]]
        assert c["command"] == n["container"]["args"]
        assert sorted(c["envs"]) == sorted(f"{k}={v}" for k, v in n["container"]["env"].items())
        labels = {lab["label"]: lab["value"] for lab in c["labels"]}
        assert labels[plan.REVISION_LABEL] == doc["group_revision"]


def test_plan_shows_the_gateway_the_program_registers():
    rec = harness.run_program("sim-team")
    code, out, _ = run(args("plan", "sim-team", None, ROOT, "--json"))
    gw = json.loads(out)["gateway"]
    assert gw["endpoint"] == rec.outputs["endpoint"] and gw["members"] == harness.reveal(rec.outputs["gateway"])["members"]
    names = {r.plain["name"] for r in rec.of_type("docker:index/container:Container")}
    assert set(gw["containers"]) <= names
    assert json.loads(run(args("plan", "tp3", None, ROOT, "--json"))[1])["gateway"] is None


def test_plan_prints_no_secret(tmp_path):
    cluster = harness.cluster_of("tp4")
    project = write_stack(tmp_path, "tp4", cluster, {
        "deepseek-spark:apiKey": {"secure": "v1:c2VjcmV0LWNpcGhlcnRleHQ="},
        "deepseek-spark:sshPrivateKey": {"secure": "v1:a2V5LWNpcGhlcnRleHQ="},
    })  # fmt: skip
    outs = outputs(tmp_path / "o.json", "http://10.0.0.1:8888/v1", "abc", key=KEY)
    for extra in ([], ["--json"]):
        code, out, err = run(args("plan", "tp4", outs, project, *extra))
        assert code == 0, err
        assert KEY not in out and "c2VjcmV0" not in out and "a2V5" not in out
        assert "v1:" not in out


def test_plan_table_is_aligned_and_names_every_node():
    code, out, _ = run(args("plan", "tp4", None, ROOT))
    assert code == 0
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("RANK  ROLE"))
    rows = lines[header + 1: header + 5]
    col = lines[header].index("CONTAINER")
    assert [r[col:].split()[0] for r in rows] == [f"tp4-rank{i}" for i in range(4)]
    assert "memory plan" in out and "fits" in out
    assert "spark4 (rank 3): docker gpu gpu-idle" in out
    assert "--node-rank 3" in out


def test_plan_refuses_a_config_that_breaks_a_rule(tmp_path):
    cluster = harness.cluster_of("tp3")
    cluster["serving"]["maxTotalTokens"] = 90_000_000
    project = write_stack(tmp_path, "tp3", cluster)
    code, out, _ = run(args("plan", "tp3", None, project, "--json"))
    doc = json.loads(out)
    assert code == 1
    # the static pool cannot hold the KV pin, and no node's budget holds what each rank would then need
    assert [e["rule"] for e in doc["validation"]["errors"]] == ["memory-plan-fits"] + ["node-memory-budget"] * 3
    assert "lower serving.maxTotalTokens" in doc["validation"]["errors"][0]["fix"]
    assert doc["nodes"] == [] and doc["memory_budget"] == []


def test_a_bad_stack_file_exits_3_naming_the_field(tmp_path):
    cluster = harness.cluster_of("tp3")
    cluster["serving"]["tpSize"] = "three"
    project = write_stack(tmp_path, "tp3", cluster)
    code, _, err = run(args("plan", "tp3", None, project))
    assert code == 3
    assert "cluster.serving.tpSize" in err
    code, _, err = run(args("plan", "nope", None, project))
    assert code == 3 and "Pulumi.nope.yaml not found" in err


# ------------------------------------------------------------------------------------------ status


def test_status_healthy(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev, log="INFO The server is fired up and ready to roll!\n")
    with FakeEndpoint() as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, rev)
        code, out, _ = run(args("status", "tp3", outs, ROOT, "--json"), runner=fake)
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == "healthy"
    assert [r["state"] for r in doc["ranks"]] == ["running"] * 3
    assert all(r["revision_ok"] for r in doc["ranks"])
    assert doc["health"]["status"] == 200 and doc["boot_phase"] is None
    assert [r["gpu_memory_used_mib"] for r in doc["ranks"]] == [40960] * 3
    assert doc["ranks"][0]["started_at"] == "2025-06-01T10:00:00Z" and doc["ranks"][0]["finished_at"] is None
    assert fake.hosts_called() == {"10.0.0.1", "10.0.0.2", "10.0.0.3"}


def team_status(tmp_path, gateway_ready: bool = True, running: tuple[str, ...] = ("sim-team-gateway", "sim-team-gateway-db"),
                admin: dict | None = None, text: bool = False):  # fmt: skip
    """`dspark status --stack sim-team` on fake nodes: the group behind one FakeEndpoint, the gateway behind
    another (its readiness route), the gateway's containers and gateway_admin.py's replies on spark1."""
    cfg = parse_stack(harness.cluster_of("sim-team")).single
    rev = plan.group_revision(plan.group_specs(cfg, "sim-team"), plan.image_build_digest(cfg))
    fake = cluster_for(cfg, "sim-team", rev, log="INFO Application startup complete.\n")
    spark1 = fake.nodes["172.30.99.11"]
    for c in running:
        spark1.containers[c] = FakeContainer(state(), {})
    spark1.gateway_admin = admin or {
        "keys": (0, '{"alice": "active", "bob": "revoked"}\n'),
        "usage": (0, '{"admin": {"requests": 1, "failures": 0, "prompt_tokens": 5, "completion_tokens": 2}, '
                     '"alice": {"requests": 3, "failures": 1, "prompt_tokens": 30, "completion_tokens": 9}}\n'),
    }
    with FakeEndpoint() as group, FakeEndpoint(health_path="/health/readiness",
                                               health=200 if gateway_ready else 503) as gw:  # fmt: skip
        path = tmp_path / "o.json"
        outputs(path, gw.base_url, rev)
        data = json.loads(path.read_text())
        data["gateway"] = {"endpoint": gw.base_url, "upstream": group.base_url, "members": ["alice", "bob"]}
        path.write_text(json.dumps(data))
        code, out, _ = run(args("status", "sim-team", str(path), ROOT, *([] if text else ["--json"])), runner=fake,
                           forward=fake.forward)  # fmt: skip
    return code, (out if text else json.loads(out)), group.base_url, gw.base_url


def test_status_behind_the_gateway_checks_the_group_and_the_gateway_and_lists_the_members(tmp_path):
    """sim-team's `endpoint` output is the gateway's (its /health wants a key); the group's is `gateway.upstream`."""
    code, doc, group, gw = team_status(tmp_path)
    assert doc["health"]["url"] == group.removesuffix("/v1") + "/health" and doc["health"]["status"] == 200
    assert code == 0 and doc["verdict"] == "healthy", doc["problems"]
    g = doc["gateway"]
    assert g["readiness"] == {"url": gw.removesuffix("/v1") + "/health/readiness", "status": 200, "error": None}
    assert g["containers"] == {"sim-team-gateway": "running", "sim-team-gateway-db": "running"}
    assert g["members"]["alice"] == {"key": "active", "requests": 3, "failures": 1, "prompt_tokens": 30,
                                     "completion_tokens": 9}  # fmt: skip
    assert g["members"]["bob"] == {"key": "revoked", "requests": 0, "failures": 0, "prompt_tokens": 0,
                                   "completion_tokens": 0}  # fmt: skip
    assert g["members"]["carol"]["key"] == "not registered"  # in the stack file, not (yet) in the database
    assert g["members"]["admin"] == {"key": "admin key", "requests": 1, "failures": 0, "prompt_tokens": 5,
                                     "completion_tokens": 2}  # fmt: skip
    _, text, _, gw = team_status(tmp_path, text=True)
    assert f"gateway {gw} on spark1: sim-team-gateway running, sim-team-gateway-db running; readiness 200" in text
    assert re.search(r"^bob +revoked +0 ", text, re.M) and re.search(r"^alice +active +3 +1 +30 +9$", text, re.M)


@pytest.mark.parametrize("change, problem, fix", [
    ({"gateway_ready": False}, "gateway readiness", "docker logs --tail 50 sim-team-gateway"),
    ({"running": ("sim-team-gateway-db",)}, "gateway container sim-team-gateway on spark1 is missing",
     "pulumi up --refresh --stack sim-team"),
])  # fmt: skip
def test_status_a_gateway_down_is_the_stack_down_whatever_the_ranks_do(tmp_path, change, problem, fix):
    code, doc, _, _ = team_status(tmp_path, **change)
    assert code == 2 and doc["verdict"] == "down" and doc["health"]["status"] == 200
    assert any(problem in p for p in doc["problems"]), doc["problems"]
    assert any(fix in f for f in doc["fixes"]), doc["fixes"]


def test_status_a_gateway_database_that_does_not_answer_is_degraded(tmp_path):
    refused = (1, "gateway database not reachable: connection refused\n")
    code, doc, _, _ = team_status(tmp_path, admin={"keys": refused, "usage": refused})
    assert code == 1 and doc["verdict"] == "degraded" and doc["gateway"]["members"] is None
    assert "connection refused" in doc["gateway"]["members_error"]


def test_status_finds_a_stopped_rank_down_and_says_how_to_repair(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev)
    rank1 = fake.nodes["10.0.0.2"].containers["tp3-rank1"]
    rank1.state = state("exited", 137, finished="2025-06-01T11:02:03.5Z", oom=True)
    rank1.log = "loading\nRuntimeError: NCCL error: remote process exited\nshutting down\n"
    with FakeEndpoint(health=503) as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, rev)
        code, out, _ = run(args("status", "tp3", outs), runner=fake)
        jcode, jout, _ = run(args("status", "tp3", outs, ROOT, "--json"), runner=fake)
    assert code == 2 == jcode
    assert "verdict: DOWN (exit 2)" in out
    assert "rank 1 (tp3-rank1 on spark2) is exited, exit code 137, OOM killed, finished 2025-06-01T11:02:03Z" in out
    assert "pulumi up --refresh --stack tp3" in out
    doc = json.loads(jout)
    r1 = doc["ranks"][1]
    assert (r1["state"], r1["exit_code"], r1["oom_killed"]) == ("exited", 137, True)
    assert r1["last_error"] == "RuntimeError: NCCL error: remote process exited"
    assert any("refresh records the stopped" in f for f in doc["fixes"])


def test_status_names_a_rank_that_never_started_and_the_restart_that_brings_the_group_back(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev)
    fake.nodes["10.0.0.2"].containers["tp3-rank1"].state = state("created", 0)
    with FakeEndpoint(health=503) as ep:
        code, out, _ = run(args("status", "tp3", outputs(tmp_path / "o.json", ep.base_url, rev)), runner=fake)
    assert code == 2 and "rank 1 (tp3-rank1 on spark2) is created" in out
    assert "python -m dspark restart --stack tp3 --yes" in out and "pulumi up --refresh" not in out


def test_status_missing_rank_is_down(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev)
    del fake.nodes["10.0.0.3"].containers["tp3-rank2"]
    with FakeEndpoint() as ep:  # rank 0 still answers: a missing rank is still "down"
        code, out, _ = run(args("status", "tp3", outputs(tmp_path / "o.json", ep.base_url, rev)), runner=fake)
    assert code == 2
    assert "rank 2 (tp3-rank2 on spark3) does not exist" in out


def test_status_revision_mismatch_is_degraded(tmp_path):
    rev = revision_of("tp4")
    fake = cluster_for(cfg_of("tp4"), "tp4", rev)
    fake.nodes["10.0.0.3"].containers["tp4-rank2"].labels[plan.REVISION_LABEL] = "0000aaaa0000aaaa"
    with FakeEndpoint() as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, rev)
        code, out, _ = run(args("status", "tp4", outs, ROOT, "--json"), runner=fake)
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "degraded"
    assert [r["revision_ok"] for r in doc["ranks"]] == [True, True, False, True]
    assert "runs group revision 0000aaaa0000aaaa" in doc["problems"][0]
    assert any("pulumi up --refresh --stack tp4" in f for f in doc["fixes"])


def test_status_compares_with_the_stack_output_not_the_config(tmp_path):
    """The ranks carry what was deployed; an edited config is a pending change, not drift."""
    fake = cluster_for(cfg_of("tp3"), "tp3", "deployed0000rev0")
    with FakeEndpoint() as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, "deployed0000rev0")
        code, out, _ = run(args("status", "tp3", outs, ROOT, "--json"), runner=fake)
    doc = json.loads(out)
    assert code == 0
    assert doc["revision"] == {"expected": "deployed0000rev0", "source": "outputs", "planned": revision_of("tp3")}
    assert any("pulumi preview --diff --stack tp3" in n for n in doc["notes"])


@pytest.mark.parametrize("stack,log,phase", [
    ("tp3", "Init torch distributed begin.\n[TP0] Load weight begin. avail mem=118.2 GB\n", "loading weights"),
    ("tp3", "[TP0] Load weight end.\n[TP0] Capture cuda graph begin. This can take up to several minutes.\n",
     "capturing CUDA graphs"),
    ("tp2", "Ray runtime started.\n(RayWorker) Loading weights took 812.2 seconds\n"
            "INFO Capturing CUDA graph shapes: 100%\n", "capturing CUDA graphs"),
    ("sim", "[sglang-sim test-double rank 0] group formed (3/3 ranks)\n", "joining the rank group"),
])  # fmt: skip
def test_status_reports_the_boot_phase_while_not_healthy(tmp_path, stack, log, phase):
    rev = revision_of(stack)
    fake = cluster_for(cfg_of(stack), stack, rev, log=log)
    with FakeEndpoint(health=503) as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, rev)
        code, out, _ = run(args("status", stack, outs, ROOT, "--json"), runner=fake)
        tcode, text, _ = run(args("status", stack, outs), runner=fake)
    doc = json.loads(out)
    assert code == 2 == tcode and doc["health"]["status"] == 503
    assert doc["boot_phase"]["phase"] == phase
    assert f"boot phase (rank 0): {phase}" in text
    assert any("booting" in f for f in doc["fixes"])


def test_boot_phase_is_the_readiness_probes_and_shows_its_line():
    """status names the phase exactly as the readiness probe does (one list of patterns)."""
    lines = ["Load weight begin.", "Load weight end.", "Capture cuda graph begin. This can take a while",
             "noise"]  # fmt: skip
    assert boot_phase(lines) == (probe.boot_phase("\n".join(lines)), "Capture cuda graph begin. This can take a while")
    assert boot_phase(lines)[0] == "capturing CUDA graphs"
    assert boot_phase(lines + ["INFO The server is fired up and ready to roll!"])[0] == probe.BOOT_PHASES[-1][0]
    assert boot_phase(["nothing here"]) is None


def test_status_a_served_but_unhealthy_head_suggests_a_group_restart(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev, log="The server is fired up and ready to roll!\n")
    with FakeEndpoint(health=503) as ep:
        code, out, _ = run(args("status", "tp3", outputs(tmp_path / "o.json", ep.base_url, rev), ROOT, "--json"),
                           runner=fake)  # fmt: skip
    doc = json.loads(out)
    assert code == 2 and doc["boot_phase"]["phase"] == probe.BOOT_PHASES[-1][0]
    assert not any("booting" in f for f in doc["fixes"])
    assert any("bump serving.generation" in f for f in doc["fixes"])


def test_status_redacts_the_key_from_log_lines(tmp_path):
    rev = revision_of("tp3")
    log = f"server_args=ServerArgs(api_key='{KEY}')\nERROR: request with Bearer {KEY} failed\n"
    fake = cluster_for(cfg_of("tp3"), "tp3", rev, log=log)
    with FakeEndpoint(health=500) as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, rev)
        for extra in ([], ["--json"]):
            code, out, _ = run(args("status", "tp3", outs, ROOT, *extra), runner=fake)
            assert KEY not in out
            assert "Bearer [secret] failed" in out


def test_status_without_outputs_withholds_logs_and_uses_the_planned_revision(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev, log=f"ERROR {KEY}\n")
    code, out, _ = run(args("status", "tp3", str(tmp_path / "absent.json"), ROOT, "--json"), runner=fake)
    doc = json.loads(out)
    assert KEY not in out
    assert doc["revision"]["source"] == "config"
    assert all(r["revision_ok"] and r["log_withheld"] and r["last_error"] is None for r in doc["ranks"])
    assert any("stack outputs unavailable" in n for n in doc["notes"])
    assert code == 2  # the endpoint of the config (10.0.0.1) does not answer here


def test_status_gpu_memory_sources_and_unreachable_node(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev)
    fake.nodes["10.0.0.2"].gpu = "[N/A]\n"  # a GB10 reports unified memory as N/A
    fake.nodes["10.0.0.2"].gpu_apps = "61000\n1200\n"
    fake.nodes["10.0.0.3"].unreachable = True
    with FakeEndpoint() as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, rev)
        code, out, _ = run(args("status", "tp3", outs, ROOT, "--json"), runner=fake)
        _, text, _ = run(args("status", "tp3", outs), runner=fake)
    doc = json.loads(out)
    assert [(r["gpu_memory_used_mib"], r["gpu_memory_source"]) for r in doc["ranks"]] == [
        (40960, "memory.used"), (62200, "compute-apps"), (None, None)]
    assert doc["ranks"][2]["state"] == "unreachable"
    assert code == 1 and doc["verdict"] == "degraded"  # rank 0 answers; one node cannot be asked
    row = next(line for line in text.splitlines() if line.startswith("2 "))
    assert "unreachable" in row and " ? " in row


def test_status_watch_repeats_as_json_lines(tmp_path):
    rev = revision_of("sim")
    fake = cluster_for(cfg_of("sim"), "sim", rev)
    slept = []
    with FakeEndpoint() as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, rev)
        code, out, _ = run(args("status", "sim", outs, ROOT, "--json", "--watch", "7", "--count", "3"),
                           runner=fake, sleep=slept.append)  # fmt: skip
    docs = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(docs) == 3 and slept == [7.0, 7.0]
    assert all(d["verdict"] == "healthy" for d in docs)


def test_nodes_are_reached_with_the_programs_ssh_options(tmp_path):
    cfg = cfg_of("sim")
    fake = cluster_for(cfg, "sim", revision_of("sim"))
    run(args("status", "sim", outputs(tmp_path / "o.json", closed_url(), revision_of("sim")), ROOT), runner=fake)
    targets = {(t, p) for t, p, _, _ in fake.calls}
    assert targets == {("root@172.30.99.11", 22), ("root@172.30.99.12", 22), ("root@172.30.99.13", 22)}
    assert all(opts == commands.ssh_opts(cfg) for _, _, opts, _ in fake.calls)
    assert any(o.startswith("UserKnownHostsFile=") for o in commands.ssh_opts(cfg))


# ------------------------------------------------------------------------------------------ logs


def test_logs_prefix_each_line_with_its_rank_and_redact_the_key(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev, log=f"line one\n--api-key {KEY}\nline three\n")
    outs = outputs(tmp_path / "o.json", closed_url(), rev)
    code, out, err = run(args("logs", "tp3", outs, ROOT, "--tail", "2"), runner=fake)
    assert code == 0, err
    assert KEY not in out
    assert out.splitlines() == [
        "[rank0 spark1] --api-key [secret]", "[rank0 spark1] line three",
        "[rank1 spark2] --api-key [secret]", "[rank1 spark2] line three",
        "[rank2 spark3] --api-key [secret]", "[rank2 spark3] line three",
    ]  # fmt: skip


def test_logs_of_one_rank_ask_only_its_node_and_pass_since_quoted(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev, log="a\nb\n")
    outs = outputs(tmp_path / "o.json", closed_url(), rev)
    code, out, _ = run(args("logs", "tp3", outs, ROOT, "--rank", "1", "--since", "1h30m", "--tail", "all"),
                       runner=fake)  # fmt: skip
    assert code == 0 and out == "[rank1 spark2] a\n[rank1 spark2] b\n"
    assert fake.hosts_called() == {"10.0.0.2"}
    (remote,) = [c[3] for c in fake.calls]
    assert shlex.split(remote) == ["docker", "logs", "--tail", "all", "--since", "1h30m", "tp3-rank1", "2>&1"]


def test_logs_of_a_missing_rank_exit_1(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev, log="ok\n")
    del fake.nodes["10.0.0.2"].containers["tp3-rank1"]
    code, out, err = run(args("logs", "tp3", outputs(tmp_path / "o.json", closed_url(), rev)), runner=fake)
    assert code == 1
    assert "[rank1 spark2] (no log: Error response from daemon: No such container: tp3-rank1)" in err
    assert "[rank0 spark1] ok" in out and "[rank2 spark3] ok" in out


def test_logs_need_the_key_to_redact(tmp_path):
    fake = cluster_for(cfg_of("tp3"), "tp3", "x", log=f"{KEY}\n")
    code, out, err = run(args("logs", "tp3", str(tmp_path / "absent.json")), runner=fake)
    assert code == 3 and out == "" and "to redact it" in err and fake.calls == []


def test_logs_follow_streams_one_rank_redacting_line_by_line(tmp_path):
    rev = revision_of("tp3")
    seen = []

    def streamer(target, port, ssh_opts, remote):
        seen.append((target, port, remote))
        yield "booting"
        yield f"api_key={KEY}"

    outs = outputs(tmp_path / "o.json", closed_url(), rev)
    code, out, _ = run(args("logs", "tp3", outs, ROOT, "--rank", "2", "--follow"), streamer=streamer)
    assert code == 0
    assert out == "[rank2 spark3] booting\n[rank2 spark3] api_key=[secret]\n"
    assert seen == [("zurih@10.0.0.3", 22, "docker logs --follow --tail 100 tp3-rank2 2>&1")]
    code, _, err = run(args("logs", "tp3", outs, ROOT, "--follow"), streamer=streamer)
    assert code == 3 and "--rank N" in err


def test_logs_follow_default_streamer_runs_the_system_ssh(tmp_path, monkeypatch):
    """The real path: `ssh <opts> -p <port> <user@host> <remote>`, output streamed and redacted."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    argv_file = tmp_path / "argv"
    (bindir / "ssh").write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' \"$@\" > {shlex.quote(str(argv_file))}\n"
        f"echo 'first line'\necho 'token {KEY} here' >&2\n"
    )
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    outs = outputs(tmp_path / "o.json", closed_url(), "x")
    code, out, _ = run(args("logs", "sim", outs, ROOT, "--rank", "1", "--follow", "--tail", "5"))
    assert code == 0
    assert out.splitlines() == ["[rank1 spark2] first line", "[rank1 spark2] token [secret] here"]
    argv = argv_file.read_text().splitlines()
    cfg = cfg_of("sim")
    assert argv == [*commands.ssh_opts(cfg), "-p", "22", "root@172.30.99.12",
                    "docker logs --follow --tail 5 sim-rank1 2>&1"]  # fmt: skip


def test_default_runner_is_probe_on_node(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text('#!/bin/sh\nfor a; do last="$a"; done\necho "ran: $last"\n')
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setattr(probe, "on_node", REAL_ON_NODE)  # safe: `ssh` is the stub above
    n = dnodes.Nodes(cfg_of("tp2"), "tp2")
    assert n.run(n[1], "echo hi") == (0, "ran: echo hi\n")


# ------------------------------------------------------------------------------------------ doctor


def test_doctor_lists_a_missing_shard_and_a_stopped_rank_with_fixes(tmp_path):
    cfg = cfg_of("tp3")
    rev = revision_of("tp3")
    fake = cluster_for(cfg, "tp3", rev)
    fake.nodes["10.0.0.2"].files.discard(f"{cfg.engram.dir}/engram-l14-r1of3.bin")
    fake.nodes["10.0.0.3"].containers["tp3-rank2"].state = state("exited", 1, finished="2025-06-01T12:00:00Z")
    with FakeEndpoint() as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, rev)
        code, out, _ = run(args("doctor", "tp3", outs, ROOT, "--json"), runner=fake)
        tcode, text, _ = run(args("doctor", "tp3", outs), runner=fake)
    doc = json.loads(out)
    assert code == 1 == tcode
    checks = {(f["node"], f["check"]) for f in doc["findings"]}
    assert checks == {("spark2", "engram-shard-missing"), ("spark3", "rank-stopped")}
    shard = next(f for f in doc["findings"] if f["check"] == "engram-shard-missing")
    assert "/home/zurih/dsv41-engram/engram-l14-r1of3.bin" in shard["what"]
    assert "--replace 'urn:pulumi:tp3::deepseek-spark::" in shard["fix"] and "tp3-engram-spark2'" in shard["fix"]
    stopped = next(f for f in doc["findings"] if f["check"] == "rank-stopped")
    assert "pulumi up --refresh --stack tp3" in stopped["fix"] and "exit code 1" in stopped["what"]
    assert doc["nodes"][1]["engram"]["missing"] == ["engram-l14-r1of3.bin"]
    assert "spark2: engram shard /home/zurih/dsv41-engram/engram-l14-r1of3.bin is missing" in text
    assert doc["health"] is None  # not every rank runs: no health verdict on a broken group


def test_doctor_shows_each_nodes_memory_and_a_stopped_rank_whose_start_would_fail_the_gate(tmp_path):
    cfg = cfg_of("tp3")
    rev = revision_of("tp3")
    fake = cluster_for(cfg, "tp3", rev)
    fake.nodes["10.0.0.3"].containers["tp3-rank2"].state = state("exited", 137, oom=True)
    fake.nodes["10.0.0.3"].meminfo = (124620, 40000, 30000)  # 40 GiB available, 30 GiB of it page cache
    fake.nodes["10.0.0.1"].meminfo = (124620, 20000, 100)  # short too, but rank 0 runs: its own memory
    with FakeEndpoint() as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, rev)
        code, out, _ = run(args("doctor", "tp3", outs, ROOT, "--json"), runner=fake)
        _, text, _ = run(args("doctor", "tp3", outs), runner=fake)
    doc = json.loads(out)
    need = memoryplan.rank_need_mib(cfg, 2)
    assert doc["nodes"][2]["memory"]["availableMiB"] == 40000 and doc["nodes"][2]["memory"]["needMiB"] == need
    memory = [f for f in doc["findings"] if f["check"] == "memory"]
    assert [f["node"] for f in memory] == ["spark3"]
    assert f"40000 MiB available of 124620 MiB (30000 MiB page cache), the memory plan needs {need} MiB" in memory[0]["what"]
    assert "OOM killed" in next(f["what"] for f in doc["findings"] if f["check"] == "rank-stopped")
    assert f"memory spark2: 118000 MiB available of 124620 MiB, 900 MiB page cache; the plan needs " \
           f"{memoryplan.rank_need_mib(cfg, 1)} MiB at the next start\n" in text
    assert "memory spark3: 40000 MiB available" in text and text.count(" SHORT") == 2
    # report-only: doctor never drops a node's cache
    assert all("--report-only" in c[3] for c in fake.calls if "DSPARK_MEMGATE" in c[3])


def test_doctor_engram_fix_names_the_pack_commands_urn():
    """The URN in the fix is the engram pack command's: same type chain (engine rule: every parent's
    type, the stack excluded) and name as the program registers it."""
    from dspark.cmd_doctor import engram_shard_urn
    from dspark.stack import load

    rec = harness.run_program("tp3")
    by_urn = {r.urn: r for r in rec.resources}
    shard = rec.named("tp3-engram-spark2")
    types, r = [], shard
    while r is not None:
        types.insert(0, r.type)
        r = by_urn.get(r.parent)
    expected = f"urn:pulumi:tp3::deepseek-spark::{'$'.join(types)}::tp3-engram-spark2"
    assert engram_shard_urn(load("tp3", ROOT), "spark2") == expected


def test_doctor_clean_cluster_has_no_findings(tmp_path):
    rev = revision_of("sim")
    fake = cluster_for(cfg_of("sim"), "sim", rev)
    with FakeEndpoint() as ep:
        code, out, _ = run(args("doctor", "sim", outputs(tmp_path / "o.json", ep.base_url, rev), ROOT, "--json"),
                           runner=fake)  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["findings"] == [] and doc["health"]["status"] == 200
    # preflight ran on every node, as the program's script
    scripts = [shlex.split(c[3])[2] for c in fake.calls if "preflight $node" in c[3]]
    cfg = cfg_of("sim")
    assert sorted(scripts) == sorted(commands.preflight(cfg, "sim", r) for r in range(3))


def test_doctor_reports_preflight_failures_revision_drift_and_unreachable_nodes(tmp_path):
    rev = revision_of("tp4")
    fake = cluster_for(cfg_of("tp4"), "tp4", rev)
    fake.nodes["10.0.0.2"].preflight_fail = [
        ("gpu-idle", "2 process(es) already use the GPU; stop them (nvidia-smi shows which) before serving")]
    fake.nodes["10.0.0.3"].containers["tp4-rank2"].labels[plan.REVISION_LABEL] = "old0old0old0old0"
    fake.nodes["10.0.0.4"].unreachable = True
    code, out, _ = run(args("doctor", "tp4", outputs(tmp_path / "o.json", closed_url(), rev), ROOT, "--json"),
                       runner=fake)  # fmt: skip
    doc = json.loads(out)
    assert code == 1
    by = {(f["node"], f["check"]): f for f in doc["findings"]}
    assert set(by) == {("spark2", "preflight:gpu-idle"), ("spark3", "revision-mismatch"), ("spark4", "unreachable")}
    assert by[("spark2", "preflight:gpu-idle")]["fix"] == "stop them (nvidia-smi shows which) before serving"
    assert "old0old0old0old0" in by[("spark3", "revision-mismatch")]["what"]
    assert "ssh" in by[("spark4", "unreachable")]["fix"] and "-p 22 zurih@10.0.0.4" in by[("spark4", "unreachable")]["fix"]


@pytest.mark.parametrize("stat,expect", [("fail 124 ", "does not answer within 5 s"),
                                         ("fail 1 stat: cannot read file system information: Stale file handle",
                                          "stale file handle")])  # fmt: skip
def test_doctor_finds_a_stale_nfs_checkpoint_mount(tmp_path, stat, expect):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev)
    fake.nodes["10.0.0.3"].volumes["tp3-checkpoint"]["stat"] = stat
    fake.nodes["10.0.0.1"].volumes["tp3-checkpoint"]["stat"] = "fail 124 "  # the head binds: not NFS, not judged
    with FakeEndpoint() as ep:
        code, out, _ = run(args("doctor", "tp3", outputs(tmp_path / "o.json", ep.base_url, rev), ROOT, "--json"),
                           runner=fake)  # fmt: skip
    doc = json.loads(out)
    assert code == 1
    (f,) = doc["findings"]
    assert (f["node"], f["check"]) == ("spark3", "nfs-stale") and expect in f["what"]
    assert "exportfs -v" in f["fix"] and "10.0.23.1" in f["fix"]  # the head on spark3's link
    # non-root user: the stat runs through sudo -n
    (probe_cmd,) = [c[3] for c in fake.calls if c[0] == "zurih@10.0.0.3" and "docker volume inspect" in c[3]]
    assert "sudo -n timeout -k 2 5 stat -f" in shlex.split(probe_cmd)[2]


def test_doctor_missing_volume_and_unhealthy_running_group(tmp_path):
    rev = revision_of("sim-tp2")
    fake = cluster_for(cfg_of("sim-tp2"), "sim-tp2", rev)
    with FakeEndpoint(health=503) as ep:
        code, out, _ = run(args("doctor", "sim-tp2", outputs(tmp_path / "o.json", ep.base_url, rev), ROOT, "--json"),
                           runner=fake)  # fmt: skip
        doc = json.loads(out)
        assert code == 1
        (f,) = doc["findings"]
        assert f["check"] == "health" and "serving.generation" in f["fix"]
        del fake.nodes["172.30.99.12"].volumes["sim-tp2-checkpoint"]
        code, out, _ = run(args("doctor", "sim-tp2", outputs(tmp_path / "o.json", ep.base_url, rev), ROOT, "--json"),
                           runner=fake)  # fmt: skip
    doc = json.loads(out)
    assert ("spark2", "checkpoint-volume-missing") in {(f["node"], f["check"]) for f in doc["findings"]}
    assert doc["nodes"][0]["engram"] is None  # vLLM: no shards to look for


# ------------------------------------------------------------------------------------------ smoke


def test_smoke_measures_time_to_first_token(tmp_path):
    with FakeEndpoint(answer="The answer is 42", first_token_delay=0.4, token_delay=0.05) as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, "x")
        code, out, err = run(args("smoke", "sim", outs, ROOT, "--json"))
    assert code == 0, err
    doc = json.loads(out)
    s, c = doc["stream"], doc["chat"]
    assert s["answer"] == c["answer"] == "The answer is 42"
    assert 0.4 <= s["ttft_s"] < 0.6  # the role-only chunk at t=0 is not the first token
    assert s["total_s"] >= s["ttft_s"] + 3 * 0.05
    assert s["chunks"] == 4 and s["tokens_source"] == "usage" and s["completion_tokens"] == 5
    assert s["tokens_per_second"] == pytest.approx(5 / s["total_s"], rel=0.05)
    assert s["decode_tokens_per_second"] == pytest.approx(4 / (s["total_s"] - s["ttft_s"]), rel=0.05)
    assert c["total_s"] >= 0.4 and c["completion_tokens"] == 5
    assert KEY not in out
    assert ep.auth == [f"Bearer {KEY}"] * 2
    assert ep.requests[1]["stream"] is True and ep.requests[0]["messages"][0]["content"] == "What is 19 + 23?"


def test_smoke_counts_chunks_without_usage_and_prints_a_table(tmp_path):
    with FakeEndpoint(answer="forty two is 42", usage=False) as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, "x", client_config=False)
        code, out, _ = run(args("smoke", "tp2", outs))
        jcode, jout, _ = run(args("smoke", "tp2", outs, ROOT, "--json"))
    assert code == 0 == jcode
    doc = json.loads(jout)
    assert (doc["stream"]["completion_tokens"], doc["stream"]["tokens_source"]) == (4, "chunks")
    assert doc["chat"]["completion_tokens"] is None
    assert "verdict: OK (exit 0)" in out and "stream" in out and KEY not in out


def test_smoke_fails_on_a_refused_key_or_a_wrong_answer_without_printing_the_key(tmp_path):
    with FakeEndpoint(key="another-key-entirely") as ep:
        outs = outputs(tmp_path / "o.json", ep.base_url, "x")
        code, out, _ = run(args("smoke", "tp3", outs, ROOT, "--json"))
    doc = json.loads(out)
    assert code == 1 and doc["chat"]["http_status"] == 401 and "refused the stack's API key" in doc["chat"]["error"]
    assert KEY not in out
    with FakeEndpoint(answer=f"I am {KEY}") as ep:  # even an endpoint echoing the key does not get it printed
        outs = outputs(tmp_path / "o.json", ep.base_url, "x")
        code, out, _ = run(args("smoke", "tp3", outs))
    assert code == 1 and KEY not in out and "[secret]" in out and "FAILED" in out


def test_smoke_needs_outputs(tmp_path):
    code, _, err = run(args("smoke", "tp3", str(tmp_path / "absent.json")))
    assert code == 3 and "stack outputs unavailable" in err


def test_smoke_reports_an_endpoint_that_does_not_answer(tmp_path):
    start = time.monotonic()
    code, out, _ = run(args("smoke", "tp3", outputs(tmp_path / "o.json", closed_url(), "x"), ROOT, "--json"))
    doc = json.loads(out)
    assert code == 1 and "cannot reach the endpoint" in doc["chat"]["error"]
    assert time.monotonic() - start < 10


# ------------------------------------------------------------------------------------------ quoting


@pytest.mark.parametrize("name", ["tp3-rank0", "x'; rm -rf / #", "$(reboot)", "a b\nc"])
def test_remote_commands_quote_every_value(name):
    assert shlex.split(dnodes.inspect_cmd(name)) == ["docker", "inspect", "--format", dnodes.INSPECT_FORMAT, name]
    assert shlex.split(dnodes.logs_cmd(name, tail="5", since="10m")) == [
        "docker", "logs", "--tail", "5", "--since", "10m", name, "2>&1"]  # fmt: skip
    sh, c, script = shlex.split(dnodes.files_cmd([f"/d/{name}", "/d/ok"]))
    assert (sh, c) == ("sh", "-c")
    listed = script.split(" in ", 1)[1].split("; do", 1)[0]
    assert shlex.split(listed) == [f"/d/{name}", "/d/ok"]
    sh, c, script = shlex.split(dnodes.volume_probe_cmd(name))
    inner = script.split("--format '{{.Mountpoint}}' ", 1)[1].split(" 2>&1)", 1)[0]
    assert shlex.split(inner) == [name]


def test_since_values():
    assert all(dnodes.valid_since(v) for v in ("10m", "1h30m", "90s", "1717236000", "2025-06-01T10:00:00Z"))
    assert not any(dnodes.valid_since(v) for v in ("10 m", "yesterday", "1h;reboot", ""))
    code, _, _ = run(args("logs", "tp3", None, ROOT, "--since", "$(reboot)"))
    assert code == 3


def test_status_a_hand_started_rank_without_the_label_is_degraded_once(tmp_path):
    rev = revision_of("tp3")
    fake = cluster_for(cfg_of("tp3"), "tp3", rev)
    del fake.nodes["10.0.0.2"].containers["tp3-rank1"].labels[plan.REVISION_LABEL]
    with FakeEndpoint() as ep:
        code, out, _ = run(args("status", "tp3", outputs(tmp_path / "o.json", ep.base_url, rev), ROOT, "--json"),
                           runner=fake)  # fmt: skip
    doc = json.loads(out)
    assert code == 1
    assert doc["problems"] == [f"rank 1 (tp3-rank1) has no {plan.REVISION_LABEL} label: not started by this program"]


def test_plan_of_one_group_matches_what_the_program_registers_for_it():
    """A stack with groups: dspark needs --group, and then plans exactly that group (names, revision
    with the router's --enable-metrics, args)."""
    rec = harness.run_program("tp4x2")
    code, _, err = run(args("plan", "tp4x2", None, ROOT, "--json"))
    assert code == 3 and "pass --group; its groups are a, b" in err
    code, _, err = run(args("plan", "tp4x2", None, ROOT, "--json", "--group", "c"))
    assert code == 3 and "no group 'c'" in err
    containers = {r.plain["name"]: r.plain for r in rec.of_type("docker:index/container:Container")}
    for group in rec.outputs["groups"]:
        code, out, err = run(args("plan", "tp4x2", None, ROOT, "--json", "--group", group["name"]))
        doc = json.loads(out)
        assert code == 0, err
        assert doc["stack"] == f"tp4x2-{group['name']}" and doc["group_revision"] == group["revision"]
        assert [n["name"] for n in doc["nodes"]] == group["nodes"]
        for n in doc["nodes"]:
            assert containers[n["container"]["name"]]["command"] == n["container"]["args"]
            assert "--enable-metrics" in n["container"]["args"]


def test_plan_shows_each_nodes_memory_budget_with_the_gateway_on_the_head(tmp_path):
    """`dspark plan --stack tp3` with a gateway on the head: the head's budget holds the rank, LiteLLM and its
    database (out of memory.sideReserveGiB: the rank's limit is the same on every node), and the gate's need is the
    budget's."""
    cluster = harness.cluster_of("tp3")
    cluster["gateway"] = {}
    project = write_stack(tmp_path, "tp3", cluster)
    code, out, err = run(args("plan", "tp3", None, project, "--json"))
    assert code == 0, err
    doc = json.loads(out)
    head = doc["memory_budget"][0]
    assert head["node"] == "spark1" and head["budgetMiB"] == head["unifiedMiB"] - head["reserveMiB"] == 123084
    assert [(c["container"], c["limitMiB"]) for c in head["containers"]] == [
        ("tp3-rank0", 123084 - 4096 - 256), ("tp3-gateway", 1024), ("tp3-gateway-db", 512),
        ("tp3-node-exporter", 64), ("tp3-guard", 256)]  # fmt: skip
    assert head["limitsMiB"] == 120588 and head["freeMiB"] == 4096 - 1024 - 512 - 64
    assert doc["nodes"][0]["memory_limit_mib"] == 123084 - 4096 - 256
    assert doc["nodes"][0]["memory_gate_need_mib"] == head["containers"][0]["needMiB"] == 110815
    assert [b["containers"][0]["limitMiB"] for b in doc["memory_budget"][1:]] == [123084 - 4096 - 256] * 2
    code, text, _ = run(args("plan", "tp3", None, project))
    assert code == 0
    row = next(line for line in text.splitlines() if line.lstrip().startswith("spark1  124,620"))
    assert row.split()[:7] == ["spark1", "124,620", "1,536", "123,084", "120,588", "2,496", "7,917"]
    assert row.rstrip().endswith("tp3-rank0 118,732 (needs 110,815), tp3-gateway 1,024, tp3-gateway-db 512, "
                                 "tp3-node-exporter 64, tp3-guard 256")
