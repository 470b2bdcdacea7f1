"""declared.flags: which serving.extraArgs element would set a flag the program manages.

Behaviour cases, the program's own command lines, the stack files, and properties checked against
argparse parsers built from the REAL engines' option tables (declared/options, dumped from the
PyPI packages; tests/conformance checks they still match).
"""

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from declared import flags
from declared.stackfiles import project_stacks
from planning import launch
from declared.cluster import parse_cluster
from harness import cluster_of
from sim.testdouble import flags as double

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "arg,flag",
    [
        ("--tp-s", "--tp"),
        ("--tp=8", "--tp"),
        ("--tp", "--tp"),
        ("--tp-size", "--tp"),
        ("--tensor-parallel-size=2", "--tp"),
        ("--tensor", "--tp"),
        ("--mem-fraction", "--mem-fraction-static"),
        ("--mem-fraction-static=0.99", "--mem-fraction-static"),
        ("--context-len", "--context-length"),
        ("--model", "--model-path"),
        ("--model=/etc", "--model-path"),
        ("--model-p", "--model-path"),
        ("--api-k", "--api-key"),
        ("--ep", "--ep-size"),
        ("--expert-parallel-size=1", "--ep-size"),
        ("--nccl-init-addr", "--dist-init-addr"),
        ("--max-total", "--max-total-tokens"),
        ("--max-running", "--max-running-requests"),
        ("--cuda-graph-max", "--cuda-graph-max-bs-decode"),
        ("--chunked-prefill", "--chunked-prefill-size"),
        ("--speculative-dspark", "--speculative-dspark-block-size"),
        ("--speculative-algo=NONE", "--speculative-algorithm"),
        ("--load-format=dummy", "--load-format"),
        ("--served-model", "--served-model-name"),
        ("--node-r", "--node-rank"),
        ("--nnodes=1", "--nnodes"),
        ("--dist-init", "--dist-init-addr"),
        ("--ho", "--host"),
        ("--po", "--port"),
        ("--random-seed=1", "--random-seed"),
        ("--reasoning", "--reasoning-parser"),
        ("--tool-call", "--tool-call-parser"),
    ],
)
def test_sglang_refuses_aliases_prefixes_and_values(arg, flag):
    assert flags.managed_flag(arg, "sglang") == flag


@pytest.mark.parametrize(
    "arg,flag",
    [
        ("--max_model_len", "--max-model-len"),
        ("--max-model-len=1", "--max-model-len"),
        ("--max_model_len=999999", "--max-model-len"),
        ("--max-model", "--max-model-len"),
        ("--max-model-len.foo", "--max-model-len"),
        ("-tp", "--tensor-parallel-size"),
        ("-tp=8", "--tensor-parallel-size"),
        ("-t", "--tensor-parallel-size"),
        ("--tensor_parallel_size", "--tensor-parallel-size"),
        ("--tensor_par=2", "--tensor-parallel-size"),
        ("--gpu-memory", "--gpu-memory-utilization"),
        ("--gpu_memory_utilization=0.99", "--gpu-memory-utilization"),
        ("--kv-cache-d", "--kv-cache-dtype"),
        ("--max-num-s", "--max-num-seqs"),
        ("--distributed_executor_backend=mp", "--distributed-executor-backend"),
        ("--served_model_name", "--served-model-name"),
        ("--api_key=x", "--api-key"),
        ("--model", "--model"),
        ("--model=/etc", "--model"),
        ("--mod", "--model"),
        ("--host", "--host"),
        ("--port=1", "--port"),
    ],
)
def test_vllm_refuses_aliases_prefixes_underscores_and_values(arg, flag):
    """(also: flags the program does not set but that act outside the memory plan or the endpoint)"""
    assert flags.managed_flag(arg, "vllm") == flag


@pytest.mark.parametrize(
    "arg,engine",
    [
        # values and positionals are not options
        ("8", "sglang"), ("dsv4", "sglang"), ("1800", "vllm"), ("-1", "vllm"), ("-0.5", "sglang"),
        # the bare prefix characters are not abbreviations
        ("-", "sglang"), ("--", "sglang"), ("-", "vllm"), ("--", "vllm"),
        # SGLang reads no underscore spellings: an unknown flag there, it cannot override anything
        ("--max_total_tokens", "sglang"), ("--tp_size", "sglang"),
        # longer than a managed flag is not a prefix of it
        ("--model-impl", "sglang"), ("--model-impl", "vllm"), ("--tp-sizes", "sglang"),
        ("--max-num-batched-tokens", "vllm"),
        # managed by the other engine only
        ("--tool-call-parser", "vllm"), ("--context-length", "vllm"), ("--max-model-len", "sglang"),
        ("-tp", "sglang"),
        # harmless flags in use
        ("--attention-backend", "sglang"), ("--moe-runner-backend", "sglang"), ("--fp8-gemm-backend", "sglang"),
        ("--watchdog-timeout", "sglang"), ("--watchdog-timeout=1800", "sglang"), ("--sleep-on-idle", "sglang"),
        ("--min-free-slots-delay", "sglang"), ("--enable-metrics", "sglang"), ("--log-level", "sglang"),
        ("--dp", "sglang"), ("--disable-cuda-graph", "sglang"),
        ("--enforce-eager", "vllm"), ("--enable-prefix-caching", "vllm"), ("--enable_prefix_caching", "vllm"),
        ("--uvicorn-log-level=debug", "vllm"), ("--disable-log-requests", "vllm"), ("-O3", "vllm"),
    ],
)  # fmt: skip
def test_harmless_elements_pass(arg, engine):
    assert flags.managed_flag(arg, engine) is None


def test_unknown_engine_is_an_error():
    with pytest.raises(ValueError, match="unknown engine"):
        flags.managed_flag("--tp", "trtllm")


def test_every_entry_names_its_setting_and_engine_source():
    for engine, table in flags.ENGINES.items():
        names = [s for m in table for s in m.spellings]
        assert len(names) == len(set(names)), f"{engine}: a spelling is listed twice"
        for m in table:
            assert m.setting and m.source, m
            assert all(s.startswith("-") for s in m.spellings), m


def _options(argv):
    return {a for a in argv if a.startswith("-")}


def test_every_flag_the_program_sets_is_managed():
    """launch.sglang_args / launch.vllm_serve_args: each option maps to itself, and each managed flag is
    one the program sets (or the key / the positional model it passes another way)."""
    cfg = parse_cluster(dict(cluster_of("tp4"), serving=dict(cluster_of("tp4")["serving"], extraArgs=[])))
    sglang = set().union(*(_options(launch.sglang_args(cfg, r)) for r in range(len(cfg.nodes))))
    raw = cluster_of("tp2")
    raw["serving"].update(extraArgs=[], maxRunningRequests=8)
    vllm = _options(launch.vllm_serve_args(parse_cluster(raw)))
    # --enable-metrics: a switch the program always sets and a user's extraArgs may repeat (it cannot turn it off)
    switches = {"sglang": {"--enable-metrics"}, "vllm": set()}
    for engine, options, elsewhere in (("sglang", sglang, {"--api-key"}), ("vllm", vllm, {"--api-key", "--model"})):
        assert {o for o in options if flags.managed_flag(o, engine) != o} == switches[engine], engine
        assert {m.flag for m in flags.ENGINES[engine]} - options == elsewhere, engine


def _stack_clusters():
    for stack in project_stacks(ROOT):
        path = ROOT / f"Pulumi.{stack}.yaml"
        config = yaml.safe_load(path.read_text()).get("config") or {}
        cluster = config.get("deepseek-spark:cluster")
        if cluster:
            yield path.name, cluster


def test_no_stack_file_extra_arg_is_refused():
    seen = 0
    for name, cluster in _stack_clusters():
        engine = cluster.get("engine", "sglang")
        for arg in cluster.get("serving", {}).get("extraArgs", []):
            seen += 1
            assert flags.managed_flag(str(arg), engine) is None, f"{name}: {arg}"
    assert seen  # the stack files do carry extraArgs (tp3, tp4, sim)


TABLES = [("sglang", "0.5.23"), ("vllm", "0.31.0"), ("vllm", "0.33.0")]  # the real parsers' tables (tests/conformance keeps them real)


def _rows(engine, version):
    return [r for r in flags.load_options(engine, version)["options"] if r["kind"] != "exit"]


@pytest.mark.parametrize("engine, version", TABLES)
def test_managed_flags_match_the_real_parsers(engine, version):
    """Every managed spelling is a real option string (or argparse's abbreviation of one) of one dest,
    and every real option string of that dest is listed: a new alias upstream fails here."""
    rows = _rows(engine, version)
    by_option = {o: r for r in rows for o in r["options"]}
    for m in flags.ENGINES[engine] + flags.UNPLANNED[engine]:
        if m.flag == "--model" and engine == "vllm":
            continue  # the positional MODEL (model_tag); FlexibleArgumentParser moves `--model X` there
        resolved = {flags.resolve(s, flags.load_options(engine, version))[0] for s in m.spellings}
        assert None not in resolved, (m.flag, resolved)
        dests = {by_option[o]["dest"] for o in resolved}
        assert len(dests) == 1, (m.flag, dests)
        real = set(next(r for r in rows if r["dest"] in dests)["options"])
        assert real <= set(m.spellings), f"{engine} {version}: {m.flag} misses aliases {sorted(real - set(m.spellings))}"


@pytest.mark.parametrize("engine, version", TABLES)
def test_real_option_strings_managed_iff_their_dest_is(engine, version):
    rows = _rows(engine, version)
    table = flags.load_options(engine, version)
    managed = {by for m in flags.ENGINES[engine] + flags.UNPLANNED[engine] for s in m.spellings
               if (by := flags.resolve(s, table)[0])}
    managed_dests = {r["dest"] for r in rows if set(r["options"]) & managed}
    for r in rows:
        for o in r["options"]:
            got = flags.managed_entry(o, engine)
            assert (got is not None) == (r["dest"] in managed_dests), (engine, o, got)


# ---- properties against the real parsers' tables (argparse, allow_abbrev=True) --------------------


def _value(row):
    """A value the parser accepts for ``row`` that differs from its default (None for a switch)."""
    if row["kind"] != "value" and row["kind"] != "append":
        return None
    if row["choices"]:
        return next(c for c in row["choices"] if c != str(row["default"]))
    return "7" if row["type"] in ("int", "float") else "x7"


def _prefixes(name):
    start = 3 if name.startswith("--") else 2  # more than the bare "--" / "-"
    return [name[:i] for i in range(start, len(name) + 1)]


def _parse(engine, argv):
    """The dests the real-table parser sets, or None when argparse refuses the argv."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return vars(double.parse_args(argv, engine))
        except SystemExit:
            return None


def _check_prefixes(engine, version, spell, positional):
    rows = [r for r in _rows(engine, version) if r["options"]]
    baseline = _parse(engine, positional)
    table = flags.load_options(engine, version)
    managed = {flags.resolve(s, table)[0] for m in flags.ENGINES[engine] for s in m.spellings} - {None}
    managed_dests = {r["dest"] for r in rows if set(r["options"]) & managed}
    resolved = []
    for row in rows:
        if row["dest"] not in managed_dests:
            continue
        value = _value(row)
        for name in row["options"]:
            for prefix in _prefixes(name):
                for arg in spell(prefix):
                    for form in ([[arg]] if value is None else [[arg, value], [f"{arg}={value}"]]):
                        ns = _parse(engine, positional + form)
                        if ns is None:
                            continue
                        changed = {k for k, v in ns.items() if v != baseline.get(k)}
                        if changed & managed_dests:
                            resolved.append(arg)
                            assert flags.managed_flag(form[0], engine) is not None, (engine, form, changed)
    return resolved


def test_sglang_every_prefix_argparse_resolves_to_a_managed_flag_is_refused():
    resolved = _check_prefixes("sglang", "0.5.23", lambda p: [p], ["--model-path", "/models/m"])
    assert {"--tp-s", "--mem-fraction", "--context-len", "--api-k", "--max-total"} <= set(resolved)


def test_vllm_every_prefix_and_underscore_spelling_argparse_resolves_to_a_managed_flag_is_refused():
    def spell(prefix):
        return [prefix, "--" + prefix[2:].replace("-", "_")] if prefix.startswith("--") else [prefix]

    resolved = _check_prefixes("vllm", "0.31.0", spell, ["/models/m"])
    assert {"-tp", "--max_model_len", "--max-model", "--tensor_parallel_size", "--gpu-mem"} <= set(resolved)


def test_single_dash_prefix_resolves():
    """argparse matches single-dash prefixes whatever allow_abbrev says: `-t 2` is `-tp 2` in vLLM."""
    assert double.parse_args(["/models/m", "-t", "2"], "vllm").tensor_parallel_size == 2
    assert flags.managed_flag("-t", "vllm") == "--tensor-parallel-size"


@pytest.mark.parametrize("arg, engine, flag", [("--cuda-graph-bs-d=1", "sglang", "--cuda-graph-bs-decode"),
                                               ("--cuda-graph-config", "sglang", "--cuda-graph-config"),
                                               ("--no-enable-decoder-swa", "sglang", "--enable-decoder-swa-bounded-replay"),
                                               ("--device-memory-util", "vllm", "--gpu-memory-utilization"),
                                               ("--kv_cache_memory_bytes", "vllm", "--kv-cache-memory-bytes"),
                                               ("--num-gpu-blocks", "vllm", "--num-gpu-blocks-override"),
                                               ("--uds", "vllm", "--uds")])  # fmt: skip
def test_flags_outside_the_memory_plan_or_the_endpoint_are_refused_too(arg, engine, flag):
    assert flags.managed_flag(arg, engine) == flag
