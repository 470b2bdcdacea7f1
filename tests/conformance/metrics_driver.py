"""Runs inside a conformance environment (the REAL engine package): the Prometheus families the engine registers
when it serves with metrics on, read from its own collectors (prometheus_client's registry), as JSON.

    <venv>/bin/python tests/conformance/metrics_driver.py sglang|vllm > families.json

{name as the text exposition shows it (a counter's ends in _total): {"kind", "labels" (in order), "buckets"}}.
SGLang: the scheduler's collector built by SchedulerMetricsCollector.init_new (tp rank 0, published context), the
tokenizer's with tokenizer_metric_labels(), the HTTP middleware's; vLLM: PrometheusStatLogger for engine 0, as the
API server's frontend makes it, and log_engine_initialized (its info gauges). Nothing is served or loaded: the
model is a two-layer config.json written here.
"""
import contextlib
import io
import json
import sys
import tempfile
import types
from pathlib import Path

TINY_MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 4, "vocab_size": 1000,
              "max_position_embeddings": 4096}  # fmt: skip


def families(registry, prefix: str) -> dict:
    out = {}
    for c in list(registry._collector_to_names):
        name = getattr(c, "_name", None)
        if not name or not name.startswith(prefix):
            continue
        kind = c._type
        out[name + "_total" if kind == "counter" else name] = {
            "kind": kind, "labels": list(c._labelnames),
            "buckets": [float(b) for b in c._upper_bounds[:-1]] if kind == "histogram" else [],
        }
    return out


def sglang() -> dict:
    from prometheus_client import REGISTRY
    from sglang.srt import runtime_context
    from sglang.srt.observability import http_request_metrics, metrics_collector as mc
    from sglang.srt.server_args import ServerArgs

    model = Path(tempfile.mkdtemp())
    (model / "config.json").write_text(json.dumps(TINY_MODEL))
    args = ServerArgs(model_path=str(model), served_model_name="m", enable_metrics=True, device="cpu")
    runtime_context.publish(args, role="scheduler", ranks=runtime_context.SpawnRanks(world_rank=0))
    mc.SchedulerMetricsCollector.init_new(server_args=args, enable_priority_scheduling=False, enable_lora=False,
                                          enable_hierarchical_cache=False)  # fmt: skip
    mc.TokenizerMetricsCollector(server_args=args, labels=mc.tokenizer_metric_labels())
    http_request_metrics.init_http_request_metrics()
    return families(REGISTRY, "sglang:")


def vllm() -> dict:
    from prometheus_client import REGISTRY
    from vllm.config import VllmConfig
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    cfg = VllmConfig()
    # what the logger reads of the model's config (building a ModelConfig would load a tokenizer)
    object.__setattr__(cfg, "model_config", types.SimpleNamespace(served_model_name="m", max_model_len=131072,
                                                                  is_diffusion=False))  # fmt: skip
    cfg.cache_config.num_gpu_blocks = 100
    logger = PrometheusStatLogger(cfg, [0])
    logger.log_engine_initialized()
    return families(REGISTRY, "vllm:")


with contextlib.redirect_stdout(io.StringIO()):  # engines log while they import
    found = {"sglang": sglang, "vllm": vllm}[sys.argv[1]]()
print(json.dumps(found, sort_keys=True))
