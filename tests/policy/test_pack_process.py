"""The policy pack as the Pulumi CLI runs it, without the CLI.

`pulumi preview --policy-pack policy` starts the pack's program with `python -m pulumi.policy
<engine> <pack dir>` (stack config in PULUMI_CONFIG, secrets decrypted), reads the gRPC port it
prints, and calls the Analyzer service: GetAnalyzerInfo, Configure (policy config), Analyze per
resource and AnalyzeStack. This test does the same, sending the resources the program registers
(secrets marked as the engine marks them), and reads the diagnostics the CLI would print.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys

import grpc
import pytest
from google.protobuf import empty_pb2, json_format, struct_pb2
from policy_helpers import POLICY_DIR, ROOT, changed, stack_config
from pulumi.runtime import rpc
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from harness import TEST_API_KEY, Registered, Secret, run_program


def _wire(value):
    """Registered inputs -> the JSON form of the engine's property Struct (secrets as signature objects)."""
    if isinstance(value, Secret):
        return {rpc._special_sig_key: rpc._special_secret_sig, "value": _wire(value.value)}
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire(v) for v in value]
    return value


def _struct(inputs: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    json_format.ParseDict(_wire(inputs), s)
    return s


def _options(r: Registered) -> analyzer_pb2.AnalyzerResourceOptions:
    return analyzer_pb2.AnalyzerResourceOptions(
        protect=r.protect,
        deleteBeforeReplace=r.delete_before_replace,
        deleteBeforeReplaceDefined=True,
        parent=r.parent,
    )


def analyze_request(r: Registered) -> analyzer_pb2.AnalyzeRequest:
    return analyzer_pb2.AnalyzeRequest(type=r.type, properties=_struct(r.inputs), urn=r.urn, name=r.name, options=_options(r))


@pytest.fixture(scope="module")
def pack():
    """The policy pack process for tp4, and a stub to its Analyzer service."""
    env = dict(os.environ)
    env.update(
        PULUMI_CONFIG=json.dumps(stack_config("tp4")),
        PULUMI_PROJECT="deepseek-spark",
        PULUMI_STACK="tp4",
        PULUMI_DRY_RUN="true",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")])),
    )
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", str(POLICY_DIR)],
        cwd=POLICY_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline().strip() if ready else ""
        if not line.isdigit():
            proc.kill()
            pytest.fail(f"the policy pack did not print its port: {line!r}\n{proc.stderr.read()}")
        channel = grpc.insecure_channel(f"127.0.0.1:{line}")
        grpc.channel_ready_future(channel).result(timeout=20)
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tp4():
    return run_program("tp4")


def configure(stub, **policy_props):
    request = analyzer_pb2.ConfigureAnalyzerRequest()
    for name, props in policy_props.items():
        cfg = analyzer_pb2.PolicyConfig(enforcementLevel=analyzer_pb2.MANDATORY)
        cfg.properties.update(props)
        request.policyConfig[name.replace("_", "-")].CopyFrom(cfg)
    stub.Configure(request)


def test_the_pack_describes_its_policies_and_config(pack):
    info = pack.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "deepseek-spark-guardrails" and info.supportsConfig
    by_name = {p.name: p for p in info.policies}
    assert len(by_name) == 8
    assert all(p.enforcementLevel == analyzer_pb2.MANDATORY for p in info.policies)
    privileged = by_name["no-privileged-containers"]
    assert json_format.MessageToDict(privileged.configSchema.properties)["allowPrivileged"]["default"] is False
    assert by_name["checkpoint-volumes-mounted-read-only"].policy_type == analyzer_pb2.POLICY_TYPE_STACK


def test_every_tp4_resource_passes(pack, tp4):
    configure(pack)
    diagnostics = []
    for r in tp4.resources:
        if r.custom:
            diagnostics += [(r.name, d.policyName, d.message) for d in pack.Analyze(analyze_request(r)).diagnostics]
    assert diagnostics == []
    stack = analyzer_pb2.AnalyzeStackRequest(
        resources=[
            analyzer_pb2.AnalyzerResource(type=r.type, properties=_struct(r.inputs), urn=r.urn, name=r.name,
                                          options=_options(r), parent=r.parent, dependencies=r.dependencies)
            for r in tp4.resources if r.custom
        ]
    )  # fmt: skip
    assert list(pack.AnalyzeStack(stack).diagnostics) == []


def test_bad_rank_is_refused_mandatorily_and_the_key_is_never_echoed(pack, tp4):
    configure(pack)
    rank0 = tp4.named("tp4-sglang-rank0")
    bad = changed(
        rank0, privileged=True, restart="always", _dbr=False,
        envs=[*rank0.inputs["envs"], f"LEAKED_API_KEY={TEST_API_KEY}", "OFFLOAD_MODE=ram"],
    )  # fmt: skip
    diagnostics = list(pack.Analyze(analyze_request(bad)).diagnostics)
    assert {d.policyName for d in diagnostics} == {
        "no-privileged-containers", "rank-containers-restart-no", "rank-containers-delete-before-replace",
        "no-secrets-in-plain-inputs", "no-ram-offload",
    }  # fmt: skip
    assert all(d.enforcementLevel == analyzer_pb2.MANDATORY for d in diagnostics)
    assert all(TEST_API_KEY not in d.message for d in diagnostics)


def test_a_secret_marked_input_still_counts_when_it_is_in_the_wrong_place(pack, tp4):
    """The engine sends secrets wrapped; pulumi-policy unwraps them, so the value check still sees it."""
    configure(pack)
    rank1 = tp4.named("tp4-sglang-rank1")
    bad = changed(rank1, labels=[*rank1.inputs["labels"], {"label": "hint", "value": Secret(TEST_API_KEY)}])
    diagnostics = list(pack.Analyze(analyze_request(bad)).diagnostics)
    assert [d.policyName for d in diagnostics] == ["no-secrets-in-plain-inputs"]
    assert "labels." in diagnostics[0].message and TEST_API_KEY not in diagnostics[0].message


def test_privileged_is_allowed_through_policy_config(pack, tp4):
    bad = changed(tp4.named("tp4-sglang-rank2"), privileged=True)
    configure(pack)
    assert [d.policyName for d in pack.Analyze(analyze_request(bad)).diagnostics] == ["no-privileged-containers"]
    configure(pack, no_privileged_containers={"allowPrivileged": True})
    assert list(pack.Analyze(analyze_request(bad)).diagnostics) == []
    configure(pack)


def test_world_readable_export_and_checkpoint_delete_are_refused(pack, tp4):
    configure(pack)
    export = tp4.named("tp4-checkpoint-export")
    bad = changed(export, create=export.inputs["create"].replace("10.0.22.2(ro,", "*(rw,"),
                  delete="rm -rf /home/zurih/NewModels/DS4.1\n")  # fmt: skip
    names = sorted(d.policyName for d in pack.Analyze(analyze_request(bad)).diagnostics)
    nfs = "nfs-exports-read-only-to-named-hosts"
    assert names == ["checkpoint-never-deleted", nfs, nfs]  # world-visible, and read-write
