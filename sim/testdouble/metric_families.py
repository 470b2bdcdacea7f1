"""The Prometheus families the TEST DOUBLE engines serve on ``/metrics``, and how (stdlib only).

Each family is one the REAL engine registers, with its name as the text exposition shows it (a counter's
ends in ``_total``), its type, its label names in the real order and a histogram's bucket bounds:
tests/conformance/test_real_metrics.py reads the real packages' collectors (sglang 0.5.23, vllm 0.31.0 and
0.33.0) and fails when a row here differs from them, or when the doubles serve something else. Values come
from what the double really does: requests in flight, tokens counted per request, latencies measured on
the double's own answers, the KV pool it obtained at boot (``--max-total-tokens`` x DSPARK_SIM_KV_SHARE).

SGLang (``sglang/srt/observability/metrics_collector.py``): the scheduler's gauges carry
``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`` (``SchedulerMetricsCollector.init_new``), the
tokenizer's counters and histograms ``model_name, engine_type`` (``tokenizer_metric_labels``), several with
``is_streaming`` ("true"/"false"); tokenizer series appear with the first request of their kind, as the
real ones do. vLLM (``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``): ``model_name, engine``, every
series created at start (engine "0"), ``request_success`` for each finish reason.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

SGLANG_SCHEDULER = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
SGLANG_TOKENIZER = ("model_name", "engine_type")
VLLM_ENGINE = ("model_name", "engine")
SGLANG_SRC = "sglang/srt/observability/metrics_collector.py"
VLLM_SRC = "vllm/v1/metrics/loggers.py PrometheusStatLogger"
VLLM_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # vllm/v1/engine FinishReason

_LATENCY = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
_ITL = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6,
        0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
_QUEUE = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
          60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0,
          1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0)
_VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
              80.0, 160.0, 640.0, 2560.0)
_VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_VLLM_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True)
class Family:
    name: str  # as the text exposition names it (a counter's ends in _total)
    kind: str  # counter | gauge | histogram
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds, +Inf left out
    source: str = ""  # where the real engine declares it


def _sched(name: str, help_: str, kind: str = "gauge", buckets: tuple[float, ...] = ()) -> Family:
    return Family(name, kind, SGLANG_SCHEDULER, help_, buckets, SGLANG_SRC + " SchedulerMetricsCollector")


def _tok(name: str, kind: str, help_: str, streaming: bool = True, buckets: tuple[float, ...] = ()) -> Family:
    labels = SGLANG_TOKENIZER + (("is_streaming",) if streaming else ())
    return Family(name, kind, labels, help_, buckets, SGLANG_SRC + " TokenizerMetricsCollector")


def _vllm(name: str, kind: str, help_: str, buckets: tuple[float, ...] = (), extra: tuple[str, ...] = ()) -> Family:
    return Family(name, kind, VLLM_ENGINE + extra, help_, buckets, VLLM_SRC)


SGLANG: tuple[Family, ...] = (
    _sched("sglang:num_running_reqs", "The number of running requests."),
    _sched("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    _sched("sglang:gen_throughput", "The generation throughput (token/s)."),
    _sched("sglang:num_used_tokens", "The number of used tokens."),
    _sched("sglang:token_usage", "The token usage."),
    _sched("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
    _sched("sglang:cache_hit_rate", "The prefix cache hit rate."),
    _sched("sglang:context_len", "Maximum context length."),
    _sched("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", "histogram", _QUEUE),
    _tok("sglang:num_requests_total", "counter", "Number of requests processed."),
    _tok("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    _tok("sglang:generation_tokens_total", "counter", "Number of generation tokens processed."),
    _tok("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", streaming=False),
    _tok("sglang:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
         buckets=_LATENCY),
    _tok("sglang:e2e_request_latency_seconds", "histogram", "Histogram of End-to-end request latency in seconds",
         buckets=_LATENCY + (600.0, 1200.0, 1800.0, 2400.0)),
    _tok("sglang:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
         streaming=False, buckets=_ITL),
)  # fmt: skip

VLLM: tuple[Family, ...] = (
    _vllm("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    _vllm("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    _vllm("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    _vllm("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine."),
    _vllm("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    _vllm("vllm:generation_tokens_total", "counter", "Number of generation tokens processed."),
    _vllm("vllm:request_success_total", "counter", "Count of successfully processed requests.",
          extra=("finished_reason",)),
    _vllm("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.", _VLLM_TTFT),
    _vllm("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.", _VLLM_ITL),
    _vllm("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.",
          _VLLM_LATENCY),
    _vllm("vllm:request_queue_time_seconds", "histogram", "Histogram of time spent in WAITING phase for request.",
          _VLLM_LATENCY),
)  # fmt: skip

FAMILIES = {"sglang": SGLANG, "vllm": VLLM}


# ------------------------------------------------------------------------------------------ values


def _num(v: float) -> str:
    """A value as prometheus_client writes it (its floatToGoString): 1.0, 0.25, +Inf, 1e+06."""
    d = float(v)
    if d in (float("inf"), float("-inf")):
        return "+Inf" if d > 0 else "-Inf"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        return f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.") + f"e+0{dot - 1}"
    return s


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    esc = [v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for v in values]
    parts = [f'{n}="{v}"' for n, v in zip(names, esc)] + ([extra] if extra else [])
    return "{" + ",".join(parts) + "}" if parts else ""


class Registry:
    """The values of one engine's families, by label values (thread-safe), rendered as Prometheus text 0.0.4."""

    def __init__(self, families: tuple[Family, ...]):
        self.families = {f.name: f for f in families}
        self.lock = threading.Lock()
        self.values: dict[str, dict[tuple[str, ...], list[float]]] = {f.name: {} for f in families}

    def _cell(self, name: str, values: tuple[str, ...]) -> list[float]:
        fam = self.families[name]
        if len(values) != len(fam.labels):
            raise ValueError(f"{name} has labels {fam.labels}, got {values}")
        size = len(fam.buckets) + 3 if fam.kind == "histogram" else 1  # buckets, +Inf, sum (count = +Inf)
        return self.values[name].setdefault(values, [0.0] * size)

    def touch(self, name: str, values: tuple[str, ...]) -> None:
        """Create the series at zero (as a real collector's `.labels(...)` does)."""
        with self.lock:
            self._cell(name, values)

    def set(self, name: str, values: tuple[str, ...], value: float) -> None:
        with self.lock:
            self._cell(name, values)[0] = float(value)

    def inc(self, name: str, values: tuple[str, ...], by: float = 1.0) -> None:
        with self.lock:
            self._cell(name, values)[0] += by

    def observe(self, name: str, values: tuple[str, ...], value: float) -> None:
        bounds = self.families[name].buckets
        with self.lock:
            cell = self._cell(name, values)
            for i, bound in enumerate(bounds):
                if value <= bound:
                    cell[i] += 1
                    break
            else:
                cell[len(bounds)] += 1
            cell[-1] += value

    def render(self) -> str:
        out: list[str] = []
        with self.lock:
            for name, fam in self.families.items():
                out += [f"# HELP {name} {fam.help}", f"# TYPE {name} {fam.kind}"]
                for values, cell in self.values[name].items():
                    if fam.kind != "histogram":
                        out.append(f"{name}{_labels(fam.labels, values)} {_num(cell[0])}")
                        continue
                    total = 0.0
                    for bound, n in zip((*fam.buckets, float("inf")), cell[:-1]):
                        total += n
                        out.append(f"{name}_bucket{_labels(fam.labels, values, f'le={chr(34)}{_num(bound)}{chr(34)}')} "
                                   f"{_num(total)}")  # fmt: skip
                    out.append(f"{name}_count{_labels(fam.labels, values)} {_num(total)}")
                    out.append(f"{name}_sum{_labels(fam.labels, values)} {_num(cell[-1])}")
        return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ requests


class Request:
    """One request being answered: when it arrived, its first and last token, its tokens so far."""

    def __init__(self, prompt_tokens: int, stream: bool):
        self.prompt_tokens, self.stream = prompt_tokens, stream
        self.arrived = time.monotonic()
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.generated = 0


class EngineMetrics:
    """What a double's /metrics shows, fed by the requests it answers. `started` -> `token` per generated
    token (the first one is time to first token) -> `finished` or `aborted` (the client went away)."""

    def __init__(self, engine: str, model: str, kv_pool_tokens: int, context_len: int = 0, rank: int = 0):
        self.engine, self.kv_pool = engine, max(0, int(kv_pool_tokens))
        self.registry = Registry(FAMILIES[engine])
        self.lock = threading.Lock()
        self.active: set[Request] = set()
        self.generated: deque[tuple[float, int]] = deque()  # (when, tokens) over the last THROUGHPUT_S
        if engine == "sglang":
            self.sched = (model, "unified", str(rank), "0", "0")
            self.tok = (model, "unified")
            self.registry.set("sglang:max_total_num_tokens", self.sched, self.kv_pool)
            self.registry.set("sglang:context_len", self.sched, context_len)
            self.registry.set("sglang:cache_hit_rate", self.sched, 0.0)
            self.registry.touch("sglang:queue_time_seconds", self.sched)
        else:
            self.sched = self.tok = (model, "0")
            for fam in VLLM:
                if "finished_reason" in fam.labels:
                    for reason in VLLM_FINISH_REASONS:
                        self.registry.touch(fam.name, self.tok + (reason,))
                else:
                    self.registry.touch(fam.name, self.tok)

    THROUGHPUT_S = 10.0

    @property
    def running(self) -> int:
        with self.lock:
            return len(self.active)

    def started(self, prompt_tokens: int, stream: bool) -> Request:
        r = Request(prompt_tokens, stream)
        with self.lock:
            self.active.add(r)
        queue = "sglang:queue_time_seconds" if self.engine == "sglang" else "vllm:request_queue_time_seconds"
        self.registry.observe(queue, self.sched, 0.0)  # the double never queues
        return r

    def token(self, r: Request) -> None:
        now = time.monotonic()
        if r.first_at is None:
            r.first_at = now
            ttft = now - r.arrived
            if self.engine == "sglang":
                self.registry.observe("sglang:time_to_first_token_seconds", self._stream(r), ttft)
            else:
                self.registry.observe("vllm:time_to_first_token_seconds", self.tok, ttft)
        else:
            itl = "sglang:inter_token_latency_seconds" if self.engine == "sglang" else "vllm:inter_token_latency_seconds"
            self.registry.observe(itl, self.tok, now - (r.last_at or now))
        r.last_at = now
        r.generated += 1
        with self.lock:
            self.generated.append((now, 1))

    def answer(self, r: Request, n: int) -> None:
        """A non-streamed answer of `n` tokens, written whole: its first token is now, no inter-token gaps."""
        now = time.monotonic()
        r.first_at = r.last_at = now
        if self.engine == "sglang":
            self.registry.observe("sglang:time_to_first_token_seconds", self._stream(r), now - r.arrived)
        else:
            self.registry.observe("vllm:time_to_first_token_seconds", self.tok, now - r.arrived)
        r.generated += max(0, n)
        with self.lock:
            self.generated.append((now, max(0, n)))

    def finished(self, r: Request) -> None:
        self._end(r)
        e2e = time.monotonic() - r.arrived
        if self.engine == "sglang":
            labels = self._stream(r)
            self.registry.inc("sglang:num_requests_total", labels)
            self.registry.inc("sglang:prompt_tokens_total", labels, r.prompt_tokens)
            self.registry.inc("sglang:generation_tokens_total", labels, r.generated)
            self.registry.observe("sglang:e2e_request_latency_seconds", labels, e2e)
        else:
            self.registry.inc("vllm:prompt_tokens_total", self.tok, r.prompt_tokens)
            self.registry.inc("vllm:generation_tokens_total", self.tok, r.generated)
            self.registry.inc("vllm:request_success_total", self.tok + ("stop",))
            self.registry.observe("vllm:e2e_request_latency_seconds", self.tok, e2e)

    def aborted(self, r: Request) -> None:
        self._end(r)
        if self.engine == "sglang":
            self.registry.inc("sglang:num_aborted_requests_total", self.tok)
        else:  # vLLM counts what an aborted request processed, and its end under finished_reason "abort"
            self.registry.inc("vllm:prompt_tokens_total", self.tok, r.prompt_tokens)
            self.registry.inc("vllm:generation_tokens_total", self.tok, r.generated)
            self.registry.inc("vllm:request_success_total", self.tok + ("abort",))

    def _end(self, r: Request) -> None:
        with self.lock:
            self.active.discard(r)

    def _stream(self, r: Request) -> tuple[str, ...]:
        return self.tok + ("true" if r.stream else "false",)

    def text(self) -> str:
        """/metrics: the gauges as of now, then every family."""
        now = time.monotonic()
        with self.lock:
            running = len(self.active)
            used = sum(r.prompt_tokens + r.generated for r in self.active)
            while self.generated and self.generated[0][0] < now - self.THROUGHPUT_S:
                self.generated.popleft()
            rate = sum(n for _, n in self.generated) / self.THROUGHPUT_S
        usage = min(1.0, used / self.kv_pool) if self.kv_pool else 0.0
        if self.engine == "sglang":
            for name, value in (("sglang:num_running_reqs", running), ("sglang:num_queue_reqs", 0),
                                ("sglang:num_used_tokens", used), ("sglang:token_usage", usage),
                                ("sglang:gen_throughput", rate)):  # fmt: skip
                self.registry.set(name, self.sched, value)
        else:
            self.registry.set("vllm:num_requests_running", self.tok, running)
            self.registry.set("vllm:num_requests_waiting", self.tok, 0)
            self.registry.set("vllm:kv_cache_usage_perc", self.tok, usage)
        return self.registry.render()
