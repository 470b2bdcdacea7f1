"""The published figures dspark bench sets its results beside (seeds 000 and 004, by engine and TP
size), and how they and the measured numbers are formatted."""

from __future__ import annotations

from typing import Any

from declared.cluster import ClusterConfig
from planning import memoryplan

NO_REFERENCE_TEST_DOUBLE = "no reference (test double)"
# The published figures, keyed by engine and TP size: the reference a run is compared with.
# Numbers are tokens per second unless named otherwise; a [low, high] pair is a published range.
REFERENCES: dict[str, dict[str, Any]] = {
    "sglang/tp4": {
        "source": "seed 000",
        "setup": "4 DGX Sparks, TP=4, SGLang; decode: prose, 256 completion tokens",
        "single_stream_tok_s": 45.4,
        "aggregate_tok_s": {1: 45.4, 2: 72.9, 4: 103.1, 8: 114.1, 16: 134.2},
        "per_stream_tok_s": {1: 45.4, 2: 37.9, 4: 26.7, 8: 23.2, 16: 22.0},
        "ttft_ms": {1: 212, 2: 232, 4: 270, 8: 2700, 16: 12450},
        "prefill_tok_s": 3800,
        "notes": ["prefill peaks at about 3.8k tok/s at 16K-32K context "
                  "(3,350 tok/s at a 4K prompt, 3,251 at 128K)"],
    },
    "sglang/tp3": {
        "source": "seed 000",
        "setup": "3 DGX Sparks, TP=3, SGLang",
        "single_stream_tok_s": 37.9,
        "aggregate_tok_s": {1: 37.9, 4: 78.6},
        "per_stream_tok_s": {1: 37.9},
        "ttft_ms": {},
        "prefill_tok_s": None,
        "notes": [],
    },
    "vllm/tp2": {
        "source": "seed 004",
        "setup": "2 DGX Sparks, TP=2, vLLM + Ray",
        "single_stream_tok_s": [38, 73],
        "aggregate_tok_s": {1: [38, 73], 2: [104, 110], 4: [135, 169], 6: [219, 256], 16: [135, 270]},
        "per_stream_tok_s": {1: [38, 73]},
        "ttft_ms": {},
        "prefill_tok_s": None,
        "notes": ["the range spans engines and quantizations: vLLM with FP8+MXFP4 about 38-41 tok/s, "
                  "TensorFold with EXL3 about 73"],
    },
}  # fmt: skip


# ------------------------------------------------------------------------------------------ reference


def is_test_double(cfg: ClusterConfig) -> bool:
    return cfg.model.profile in memoryplan.TEST_DOUBLE_PROFILES


def reference_key(cfg: ClusterConfig) -> str:
    return f"{cfg.engine}/tp{cfg.serving.tp_size}"


def reference_for(cfg: ClusterConfig) -> dict:
    """The published figures for the stack's engine and TP size, or why there are none."""
    if is_test_double(cfg):
        return {"key": None, "none": NO_REFERENCE_TEST_DOUBLE}
    key = reference_key(cfg)
    ref = REFERENCES.get(key)
    if ref is None:
        return {"key": None, "none": f"no reference for {cfg.engine} TP{cfg.serving.tp_size}"}
    return {"key": key, **ref}


def fmt_ref(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return "-".join(fmt_ref(v) for v in value)
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def fmt_k(value: Any) -> str:
    """3800 -> "~3.8k" (the published prefill is an approximate peak)."""
    if value is None:
        return "-"
    return f"~{value / 1000:.1f}k" if value >= 1000 else f"~{value}"


def fmt_ms(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:g} ms"


def reference_at(ref: dict, concurrency: int) -> str:
    """The reference cell of a measured row: the published figures at that concurrency."""
    if ref.get("none"):
        return ref["none"]
    agg = ref["aggregate_tok_s"].get(concurrency)
    if agg is None:
        return "-"
    text = f"{fmt_ref(agg)} tok/s"
    per = ref["per_stream_tok_s"].get(concurrency)
    if concurrency > 1 and per is not None:
        text += f" ({fmt_ref(per)}/stream)"
    ttft = ref["ttft_ms"].get(concurrency)
    if ttft is not None:
        text += f", TTFT {fmt_ms(ttft)}"
    return text


def reference_row(ref: dict) -> list[str]:
    """The table's last row: the reference's headline figures, under the measured columns."""
    if ref.get("none"):
        return ["ref", "-", "-", "-", "-", "-", "-", ref["none"]]
    agg = ref["aggregate_tok_s"]
    top = max(agg) if agg else None
    ttft = ref["ttft_ms"]
    return [
        "ref", f"{ref['source']} {ref['key']}",
        f"{fmt_ref(agg[top])} @{top}" if top is not None and top > 1 else "-",
        f"{fmt_ref(ref['single_stream_tok_s'])} @1",
        "-",
        fmt_k(ref.get("prefill_tok_s")),
        f"{fmt_ms(ttft[1])} @1" if 1 in ttft else "-",
        f"published ({ref['source']}): the reference",
    ]  # fmt: skip
