"""The rules on a group's memory: a known memory profile for its engine (the test doubles' only on the sim
stacks), a memory plan that fits (planning/memoryplan.py), a context the checkpoint and the KV pool can hold, and
the warnings where the published figures leave doubt. Registered with the others when planning/rules.py imports
this module (each node's budget: planning/budget_rules.py).
"""

from __future__ import annotations

from . import memoryplan
from .rulebook import Finding, rule
from declared.cluster import ClusterConfig


def is_sim_stack(stack: str) -> bool:
    """The simulated cluster's stacks (sim, sim-tp2, ...): the only ones that may plan with test doubles."""
    return stack == "sim" or stack.startswith("sim-")


@rule("known-profile")
def known_profile(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    names = sorted(n for n, p in memoryplan.PROFILES.items() if p.engine == cfg.engine and n not in memoryplan.TEST_DOUBLE_PROFILES)
    prof = memoryplan.PROFILES.get(cfg.model.profile)
    if prof is None or prof.engine != cfg.engine:
        return [Finding("known-profile", "model.profile", cfg.model.profile,
                        f"no memory profile of that name for engine {cfg.engine}", f"use one of {names}")]  # fmt: skip
    if cfg.model.profile in memoryplan.TEST_DOUBLE_PROFILES and not is_sim_stack(stack):
        return [Finding("known-profile", "model.profile", cfg.model.profile,
                        f"the test double's memory figures (a tiny fake checkpoint) on stack {stack!r}: the memory "
                        "plan would approve anything", f"use one of {names}")]  # fmt: skip
    return []


@rule("memory-plan-fits")
def _memory(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    if known_profile(cfg, stack):
        return []  # reported by known-profile
    if cfg.engine == "vllm":
        return _vllm_memory(cfg)
    prof = memoryplan.PROFILES[cfg.model.profile]
    mp = memoryplan.memory_plan(cfg)
    s = cfg.serving
    if not mp.known:
        return [Finding("memory-plan-fits", "serving.tpSize", s.tp_size,
                        f"profile {cfg.model.profile} has no published memory figures for TP={s.tp_size}",
                        f"use a TP size with figures: {sorted(prof.weights_gib_by_tp)}")]  # fmt: skip
    out = []
    head = mp.ranks[0]
    unified = cfg.memory.unified_gib
    floor = prof.min_mem_fraction_by_tp.get(s.tp_size)
    if floor is not None and s.mem_fraction_static < floor:
        out.append(Finding("memory-plan-fits", "serving.memFractionStatic", s.mem_fraction_static,
                           f"TP={s.tp_size} has been measured to need at least {floor} (below it the weights leave "
                           "no KV budget at boot)", f"set serving.memFractionStatic to {floor} or more"))  # fmt: skip
    if head.weights_gib + head.draft_gib >= unified:
        return [Finding("memory-plan-fits", "serving.tpSize", s.tp_size,
                        f"resident weights per rank are {head.weights_gib + head.draft_gib:.1f} GiB at TP={s.tp_size}, "
                        f"more than a Spark's {unified} GiB",
                        "SGLang needs 3+ Sparks for this checkpoint: list 3 or 4 nodes")]  # fmt: skip
    if not head.static_fits:
        limit = memoryplan.max_tokens_that_fit(cfg)
        out.append(Finding("memory-plan-fits", "serving.maxTotalTokens", s.max_total_tokens,
                           f"the head's static pool ({s.mem_fraction_static:g} x {unified} = {head.static_pool_gib:.1f} GiB) "
                           f"cannot hold weights {head.weights_gib + head.draft_gib:.1f} + KV {head.kv_gib:.1f} + "
                           f"window {head.window_gib:.2f} = {head.static_used_gib:.1f} GiB",
                           f"lower serving.maxTotalTokens to at most {limit}, or raise serving.memFractionStatic "
                           f"if the outside budget allows"))  # fmt: skip
    if not head.outside_fits:
        max_frac = (unified - head.outside_needed_gib) / unified
        out.append(Finding("memory-plan-fits", "serving.memFractionStatic", s.mem_fraction_static,
                           f"leaves {head.outside_gib:.1f} GiB outside the static pool but CUDA graphs "
                           f"{head.cuda_graphs_gib:.1f} + NCCL {head.nccl_gib:.2f} + runtime floor "
                           f"{head.runtime_floor_gib:.1f} need {head.outside_needed_gib:.1f} GiB (a head OOM hangs every rank)",
                           f"lower serving.memFractionStatic to at most {max_frac:.3f} or lower "
                           f"serving.maxRunningRequests; never raise them to fix a full KV pool"))  # fmt: skip
    return out


def _vllm_memory(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    prof = memoryplan.PROFILES[cfg.model.profile]
    s = cfg.serving
    mp = memoryplan.vllm_memory_plan(cfg)
    if not mp.known:
        return [Finding("memory-plan-fits", "serving.tpSize", s.tp_size,
                        f"profile {cfg.model.profile} has published figures for TP={sorted(prof.weights_gib_by_tp)} only",
                        f"serve this checkpoint on {min(prof.weights_gib_by_tp)} Sparks, or SGLang on 3-4")]  # fmt: skip
    r = mp.ranks[0]
    out = []
    if not r.static_fits:
        fit = max(0, int((r.static_pool_gib - r.weights_gib) / memoryplan.vllm_kv_gib(cfg, 1)))
        out.append(Finding("memory-plan-fits", "serving.maxModelLen", s.max_model_len,
                           f"gpuMemoryUtilization {s.gpu_memory_utilization:g} x {cfg.memory.unified_gib} = "
                           f"{r.static_pool_gib:.1f} GiB cannot hold weights {r.weights_gib:.0f} + KV {r.kv_gib:.1f} GiB",
                           f"lower serving.maxModelLen first (131072 -> 65536 or 32768; at most {fit} fits)"))  # fmt: skip
    if not r.outside_fits:
        out.append(Finding("memory-plan-fits", "serving.gpuMemoryUtilization", s.gpu_memory_utilization,
                           f"leaves {r.outside_gib:.1f} GiB for the runtime, which needs up to {r.outside_needed_gib:.1f} GiB",
                           f"lower serving.gpuMemoryUtilization to at most "
                           f"{(cfg.memory.unified_gib - r.outside_needed_gib) / cfg.memory.unified_gib:.2f}"))  # fmt: skip
    return out


@rule("context-length-supported")
def _context(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    prof = memoryplan.PROFILES.get(cfg.model.profile)
    s = cfg.serving
    out = []
    if cfg.engine == "vllm":
        if prof is not None and prof.engine == "vllm" and s.max_model_len > prof.max_model_len:
            out.append(Finding("context-length-supported", "serving.maxModelLen", s.max_model_len,
                               f"more than the {prof.max_model_len} tokens verified for this checkpoint",
                               f"set serving.maxModelLen to {prof.max_model_len} or less"))  # fmt: skip
        return out
    limit = prof.max_context_by_tp.get(s.tp_size) if prof and prof.engine == "sglang" else None
    if limit is not None and s.context_length > limit:
        out.append(Finding("context-length-supported", "serving.contextLength", s.context_length,
                           f"TP={s.tp_size} supports at most {limit} tokens of context",
                           f"set serving.contextLength to {limit} or less (1M needs 4 Sparks)"))  # fmt: skip
    if s.context_length > s.max_total_tokens:
        out.append(Finding("context-length-supported", "serving.contextLength", s.context_length,
                           f"one request of this length cannot fit the KV pool of {s.max_total_tokens} tokens",
                           "lower serving.contextLength to at most serving.maxTotalTokens"))  # fmt: skip
    return out


@rule("kv-pin-clamp-warning")
def _kv_clamp(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    prof = memoryplan.PROFILES.get(cfg.model.profile)
    if cfg.engine != "sglang" or prof is None or prof.engine != "sglang":
        return []
    published = prof.published_kv_pool_by_tp.get(cfg.serving.tp_size)
    if published is None or cfg.serving.max_total_tokens <= published[1]:
        return []
    return [Finding("kv-pin-clamp-warning", "serving.maxTotalTokens", cfg.serving.max_total_tokens,
                    f"at TP={cfg.serving.tp_size} the pool actually obtained was {published[0]:,}-{published[1]:,} tokens; "
                    "SGLang silently clamps a larger pin", "after up, the `boot` output shows the pool rank 0 obtained "
                    "(the readiness check expects at least minKvShare of the clamped figure)",
                    level="warning")]  # fmt: skip


@rule("vllm-weights-range-warning")
def _vllm_high(cfg: ClusterConfig, stack: str = "") -> list[Finding]:
    prof = memoryplan.PROFILES.get(cfg.model.profile)
    if cfg.engine != "vllm" or prof is None or prof.engine != "vllm" or not memoryplan.vllm_memory_plan(cfg).fits:
        return []
    high = memoryplan.vllm_memory_plan(cfg, weights="high").ranks[0]
    if high.static_fits:
        return []
    return [Finding("vllm-weights-range-warning", "serving.maxModelLen", cfg.serving.max_model_len,
                    f"fits with the low end of the published weights ({memoryplan.vllm_memory_plan(cfg).ranks[0].weights_gib:.0f} "
                    f"GiB/node) but not with the high end ({high.weights_gib:.0f} GiB: weights + KV {high.static_used_gib:.0f} "
                    f"> {high.static_pool_gib:.0f} GiB)",
                    "if vLLM fails with CUDA out of memory, lower serving.maxModelLen to 65536 or 32768 first",
                    level="warning")]  # fmt: skip
