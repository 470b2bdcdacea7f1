"""What the engine reports it obtained at boot, read from rank 0's log (stdlib only; run by the
readiness probe where Pulumi runs). A line that is not in the log is unknown (None), never guessed.

The lines, as the engines' own source writes them:
- SGLang 0.5.21-0.5.23, ``sglang/srt/managers/scheduler.py`` (tp rank 0, once the pools exist):
  ``max_total_num_tokens=N, chunked_prefill_size=C, max_prefill_tokens=P, max_running_requests=R,
  context_len=L, available_gpu_mem=X GB`` -> the KV pool in tokens (the seed's "full_token"), the
  context length, the concurrency and the memory left;
- SGLang, ``sglang/srt/speculative/dspark_components/dspark_worker_v2.py``: ``Initialized DSpark draft
  runner. ...`` -> DSPARK speculative decoding is active (``off`` when the scheduler line is there and
  this one is not);
- vLLM 0.31.0 and 0.33.0, ``vllm/v1/core/kv_cache_utils.py`` ``update_kv_cache_capacity``:
  ``GPU KV cache size: 1,234 tokens, Maximum concurrency for 131,072 tokens per request: 2.50x``;
- vLLM, ``vllm/v1/worker/gpu_worker.py``: ``Available KV cache memory: 15.2 GiB``.
"""

from __future__ import annotations

import re

SGLANG_SCHEDULER = re.compile(
    r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
    r"max_running_requests=(\d+), context_len=(\d+), available_(?:gpu|cpu)_mem=([\d.]+) GB"
)
SGLANG_DSPARK = re.compile(r"Initialized DSpark draft runner\.")
VLLM_KV = re.compile(r"\b(?:GPU|CPU|XPU)(?: \+ host)? KV cache size: ([\d,]+) tokens, "
                     r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
VLLM_KV_MEMORY = re.compile(r"Available KV cache memory: ([\d.]+) GiB")


def _last(pattern: re.Pattern[str], text: str):
    found = None
    for found in pattern.finditer(text):
        pass
    return found


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse(engine: str, text: str) -> dict:
    """The figures in rank 0's log (the last boot's, when the log holds several), None where unknown."""
    if engine == "sglang":
        m = _last(SGLANG_SCHEDULER, text)
        spec = "DSPARK" if SGLANG_DSPARK.search(text) else ("off" if m else None)
        return {
            "kvTokens": int(m.group(1)) if m else None,
            "contextLength": int(m.group(5)) if m else None,
            "maxRunningRequests": int(m.group(4)) if m else None,
            "availableGpuMemGB": float(m.group(6)) if m else None,
            "speculative": spec,
        }
    m, mem = _last(VLLM_KV, text), _last(VLLM_KV_MEMORY, text)
    return {
        "kvTokens": _int(m.group(1)) if m else None,
        "contextLength": _int(m.group(2)) if m else None,
        "maxConcurrency": float(m.group(3)) if m else None,
        "kvCacheGiB": float(mem.group(1)) if mem else None,
    }


def verdict(boot: dict, expected_tokens: int, min_share: float) -> str | None:
    """Why the pool the engine obtained is too small for the plan, or None (enough, or unknown)."""
    got = boot.get("kvTokens")
    if got is None or not expected_tokens or min_share <= 0:
        return None
    if got >= min_share * expected_tokens:
        return None
    return (f"the KV pool rank 0 obtained is {got:,} tokens, {got / expected_tokens:.0%} of the {expected_tokens:,} "
            f"the plan expects (threshold {min_share:.0%}); likely causes: memory held on the head (page cache, "
            "another process or container: see `dspark doctor`), or a pin above what this TP layout obtains")


# NCCL's own lines (NCCL_DEBUG=INFO, src/transport/net_ib/init.cc and src/transport/net.cc): the
# devices NET/IB uses, and each channel's transport (`via NET/IB/0` over RoCE, `via NET/Socket/0` over TCP).
NCCL_TRANSPORT_LINE = re.compile(r"NCCL (?:INFO|WARN) (?:NET/IB : Using|NET/Socket : Using|.* via NET/)|NCCL WARN")
NCCL_VIA = re.compile(r"\bvia NET/(IB|Socket)\b")


def nccl_transport(text: str) -> str | None:
    """`NET/IB` or `NET/Socket` (either wins if any channel used it: a socket fallback is what matters),
    from a rank's log at NCCL_DEBUG=INFO; None when NCCL logged no channel (NCCL_DEBUG=WARN)."""
    seen = set(NCCL_VIA.findall(text))
    return "NET/Socket" if "Socket" in seen else ("NET/IB" if "IB" in seen else None)

