"""programs/bootlog.py and the probe's boot check: what rank 0 reports it obtained, against the plan.

The log lines are the real engines' formats (see bootlog's docstring for the source of each)."""
import json

import pytest

from declared.cluster import parse_cluster
from harness import cluster_of, group_of
from planning import commands, memoryplan
from programs import bootlog, probe

SGLANG_LOG = """\
[2026-12-01 10:00:01] Load weight end. type=DeepseekV4ForCausalLM, dtype=torch.bfloat16, avail mem=30.10 GB
[2026-12-01 10:00:02] Initialized DSpark draft runner. attention_backend=dsv4, model=/models/x, gamma=3, verify_num_draft_tokens=4, query_token_num=4, sample_from_anchor=False, mask_token_id=1, markov_head=None
[2026-12-01 10:00:09] max_total_num_tokens=6213120, chunked_prefill_size=1024, max_prefill_tokens=16384, max_running_requests=8, context_len=1048576, available_gpu_mem=5.81 GB
"""
VLLM_LOG = """\
(EngineCore_DP0 pid=88) INFO 12-01 10:00:00 [gpu_worker.py:693] Available KV cache memory: 15.24 GiB
(EngineCore_DP0 pid=88) INFO 12-01 10:00:00 [kv_cache_utils.py:2466] GPU KV cache size: 405,504 tokens, Maximum concurrency for 131,072 tokens per request: 3.09x
"""


def test_sglang_lines_give_pool_speculative_and_context():
    assert bootlog.parse("sglang", SGLANG_LOG) == {
        "kvTokens": 6213120, "contextLength": 1048576, "maxRunningRequests": 8, "availableGpuMemGB": 5.81,
        "speculative": "DSPARK"}


def test_sglang_without_the_draft_line_is_off_and_without_any_line_unknown():
    no_draft = "\n".join(line for line in SGLANG_LOG.splitlines() if "DSpark" not in line)
    assert bootlog.parse("sglang", no_draft)["speculative"] == "off"
    assert bootlog.parse("sglang", "booting...") == {
        "kvTokens": None, "contextLength": None, "maxRunningRequests": None, "availableGpuMemGB": None,
        "speculative": None}


def test_the_last_boot_counts():
    again = SGLANG_LOG + SGLANG_LOG.replace("6213120", "5000000")
    assert bootlog.parse("sglang", again)["kvTokens"] == 5000000


def test_vllm_lines():
    assert bootlog.parse("vllm", VLLM_LOG) == {
        "kvTokens": 405504, "contextLength": 131072, "maxConcurrency": 3.09, "kvCacheGiB": 15.24}
    assert bootlog.parse("vllm", "")["kvTokens"] is None


@pytest.mark.parametrize("got, ok", [(6_000_000, True), (5_382_000, True), (5_381_999, False), (None, True)])
def test_verdict_against_the_share_of_the_expected_pool(got, ok):
    why = bootlog.verdict({"kvTokens": got}, 5_980_000, 0.9)
    assert (why is None) == ok
    if not ok:
        assert "5,381,999 tokens" in why and "5,980,000" in why and "memory held on the head" in why


def test_expected_pool_is_the_pin_clamped_to_what_the_layout_obtains():
    tp4 = parse_cluster(group_of("tp4"))  # pins 8M; the seed obtained 5.98-6.49M at TP4
    assert memoryplan.expected_kv_tokens(tp4) == 5_980_000
    assert memoryplan.expected_kv_tokens(parse_cluster(group_of("tp3"))) == 750_000
    assert memoryplan.expected_kv_tokens(parse_cluster(group_of("tp2"))) == 131072  # one maxModelLen request


def test_probe_prints_the_boot_line_and_fails_or_warns(capsys):
    boot = bootlog.parse("sglang", SGLANG_LOG.replace("6213120", "3000000"))
    lines = []
    assert probe.check_boot(boot, 5_980_000, 0.9, "fail", log=lines.append) is False
    assert probe.check_boot(boot, 5_980_000, 0.9, "warn", log=lines.append) is True
    assert lines[1].startswith("readiness: FAILED: the KV pool rank 0 obtained is 3,000,000 tokens")
    assert lines[3].startswith("readiness: WARNING: ")
    out = memoryplan.boot_from_probe("\n".join(["readiness: ... answered '42'", *lines[:2]]))
    assert out["kvTokens"] == 3_000_000 and out["expectedKvTokens"] == 5_980_000 and out["shortfall"]
    assert memoryplan.boot_from_probe("no boot line") is None


def test_probe_reads_rank0_log_over_ssh_with_a_grep():
    seen = []

    def run(target, port, opts, remote):
        seen.append((target, port, remote))
        return 0, SGLANG_LOG

    boot = probe.rank0_boot(["1=sim-rank1@root@10.0.0.2:22", "0=sim-rank0@root@10.0.0.1:22"], [], "sglang", run=run)
    assert boot["kvTokens"] == 6213120
    assert seen[0][:2] == ("root@10.0.0.1", 22) and "docker logs sim-rank0" in seen[0][2]
    assert json.dumps(boot)  # what the boot output carries is plain JSON


def test_readiness_command_carries_the_plan_figures():
    cmd = commands.readiness(parse_cluster(group_of("tp4")), "tp4")
    assert "--engine sglang --expect-kv-tokens 5980000 --min-kv-share 0.9 --kv-shortfall fail" in cmd


def test_nccl_transport_from_a_ranks_log_at_nccl_debug_info():
    ib = ("spark1:42:42 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:10.99.1.11<0>\n"
          "spark1:42:42 [0] NCCL INFO Channel 00/0 : 2[0] -> 0[0] [receive] via NET/IB/0\n")
    assert bootlog.nccl_transport(ib) == "NET/IB"
    assert bootlog.nccl_transport(ib + "spark1:42:42 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n") == "NET/Socket"
    assert bootlog.nccl_transport("deepseek-spark: rank 0 NCCL_IB_HCA=rocep1s0f1\n") is None  # NCCL_DEBUG=WARN
    kept = [line for line in ib.splitlines() + ["INFO: Started server process"] if bootlog.NCCL_TRANSPORT_LINE.search(line)]
    assert len(kept) == 2
