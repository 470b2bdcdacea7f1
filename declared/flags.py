"""The engine flags the program sets itself, and which `serving.extraArgs` element would set one.

Why this exists: `launch.sglang_args` / `launch.vllm_serve_args` append `serving.extraArgs` LAST, so
an extra flag that names a setting the program already put on the command line wins over the
validated value. Comparing the text before `=` with a set of flag names is not enough, because
the engines parse with argparse:

- aliases: SGLang `--tp` / `--tp-size` / `--tensor-parallel-size`, `--model` / `--model-path`,
  `--ep` / `--expert-parallel-size`, `--nccl-init-addr` / `--dist-init-addr`; vLLM `-tp`.
- abbreviations: argparse's default `allow_abbrev=True` resolves any unique prefix of a long
  option (`--mem-fraction 0.99` sets `--mem-fraction-static`). Both engines keep the default:
  SGLang's `prepare_server_args` builds `argparse.ArgumentParser(prog="sglang serve")`; vLLM's
  `FlexibleArgumentParser` and the `serve` subparser (`subparsers.add_parser`) never pass
  `allow_abbrev`. SGLang even relies on it: upstream declares no `--tp`, it is the abbreviation
  of `--tp-size` the docs and `launch.sglang_args` use.
  A single-dash prefix is matched whatever `allow_abbrev` says (CPython's `_get_option_tuples`):
  `-t 8` sets vLLM's `-tp`.
- underscores: vLLM's `FlexibleArgumentParser.parse_args` rewrites `--max_model_len` to
  `--max-model-len` (everything after `--` up to the first `.`) before argparse sees it, and
  turns a dotted `--flag.key value` into `--flag <json>`. SGLang does neither (an underscore
  spelling is an unknown flag there: the launch fails, nothing is overridden).
- `--flag=value` forms.

Choice on prefixes: an element that is a prefix of a managed option string (anything longer than
the bare `-` / `--`) is refused even when argparse would find it ambiguous. A unique prefix would
set the managed flag; an ambiguous one makes the launch exit 2. Refusing both is the safe side,
and it costs nothing as long as no real option is a strict prefix of a managed one (none of the
options in sim/testdouble/flags.py or the stack files is; tests/unit/test_flags.py checks).
Values (elements not starting with `-`) are never looked at; a value that itself starts with `-`
and prefixes a managed option (e.g. `-t`) is refused too.

Pure data + one function, stdlib only: `planning/serving_rules.py` (rule `extra-args-not-managed`)
is the consumer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ManagedFlag:
    flag: str  # the spelling the program writes (launch.sglang_args / launch.vllm_serve_args)
    aliases: tuple[str, ...]  # other option strings of the same engine argument
    setting: str  # where the program's value comes from
    source: str  # where the engine defines the option

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases)


_SGL = "sglang/srt/arg_groups/fields/"  # 0.5.21+: ServerArgs' fields, one module per namespace
_SGL_ADD = "sglang/srt/server_args.py ServerArgs.add_cli_args"
_VLLM_ENGINE = "vllm/engine/arg_utils.py EngineArgs.add_cli_args"
_VLLM_FRONTEND = "vllm/entrypoints/common/cli_args.py FrontendArgs (0.33; vllm/entrypoints/openai/cli_args.py before)"

# `python3 -m sglang.launch_server` as launch.sglang_args builds it; --api-key is appended by the
# launch wrapper on the head (launch.launch_wrapper, key="arg").
SGLANG: tuple[ManagedFlag, ...] = (
    ManagedFlag("--model-path", ("--model",), "the checkpoint mount (launch.MODEL_MOUNT)",
                f"{_SGL}model.py model_path, Arg(aliases=['--model'])"),
    ManagedFlag("--served-model-name", (), "model.servedName", f"{_SGL}model.py served_model_name"),
    ManagedFlag("--trust-remote-code", (), "always on (launch.sglang_args)", f"{_SGL}model.py trust_remote_code (switch)"),
    ManagedFlag("--load-format", (), "fixed: safetensors (launch.sglang_args)", f"{_SGL}model.py load_format"),
    ManagedFlag("--tp", ("--tp-size", "--tensor-parallel-size"), "serving.tpSize",
                f"{_SGL}parallel.py tp_size, Arg(aliases=['--tensor-parallel-size']); `--tp` is argparse's "
                "abbreviation of --tp-size (no other option starts with it)"),
    ManagedFlag("--ep-size", ("--expert-parallel-size", "--ep"), "serving.epSize",
                f"{_SGL}parallel.py ep_size"),
    ManagedFlag("--nnodes", (), "the number of nodes", f"{_SGL}parallel.py nnodes"),
    ManagedFlag("--node-rank", (), "the rank's index in nodes", f"{_SGL}parallel.py node_rank"),
    ManagedFlag("--dist-init-addr", ("--nccl-init-addr",), "head fabricIp + serving.distPort",
                f"{_SGL}parallel.py dist_init_addr"),
    ManagedFlag("--host", (), "fixed: 0.0.0.0 (launch.sglang_args)", f"{_SGL}serving.py host"),
    ManagedFlag("--port", (), "serving.port", f"{_SGL}serving.py port"),
    ManagedFlag("--api-key", (), "the apiKey secret, appended by the launch wrapper", f"{_SGL}serving.py api_key"),
    ManagedFlag("--context-length", (), "serving.contextLength", f"{_SGL}model.py context_length"),
    ManagedFlag("--max-total-tokens", (), "serving.maxTotalTokens", f"{_SGL}memory.py max_total_tokens"),
    ManagedFlag("--max-running-requests", (), "serving.maxRunningRequests", f"{_SGL}schedule.py max_running_requests"),
    ManagedFlag("--cuda-graph-max-bs-decode", (), "serving.maxRunningRequests (graphs the memory plan counts)",
                f"{_SGL}exec_.py cuda_graph_max_bs_decode (0.5.15+; `--cuda-graph-max-bs` is gone from 0.5.20)"),
    ManagedFlag("--mem-fraction-static", (), "serving.memFractionStatic", f"{_SGL}memory.py mem_fraction_static"),
    ManagedFlag("--chunked-prefill-size", (), "serving.chunkedPrefillSize", f"{_SGL}schedule.py chunked_prefill_size"),
    ManagedFlag("--random-seed", (), "fixed: 0 (launch.sglang_args)", f"{_SGL}model.py random_seed"),
    ManagedFlag("--enable-decoder-swa-bounded-replay", ("--no-enable-decoder-swa-bounded-replay",),
                "always on (launch.sglang_args)",
                f"{_SGL}exec_.py enable_decoder_swa_bounded_replay (BooleanOptionalAction: --no- turns it off)"),
    ManagedFlag("--tool-call-parser", (), "fixed: deepseekv41 (launch.sglang_args)", f"{_SGL_ADD} --tool-call-parser (dynamic choices)"),
    ManagedFlag("--reasoning-parser", (), "fixed: deepseek-v41 (launch.sglang_args)",
                f"{_SGL_ADD} --reasoning-parser (dynamic choices)"),
    ManagedFlag("--speculative-algorithm", (), "serving.specAlgo", f"{_SGL}spec.py speculative_algorithm"),
    ManagedFlag("--speculative-dspark-block-size", (), "serving.dsparkBlockSize",
                f"{_SGL}spec.py speculative_dspark_block_size"),
)  # fmt: skip

# `vllm serve MODEL ...` as launch.vllm_serve_args builds it; the API key reaches vLLM as
# VLLM_API_KEY (launch.launch_wrapper, key="env:VLLM_API_KEY"), so --api-key would replace it.
VLLM: tuple[ManagedFlag, ...] = (
    ManagedFlag("--model", (), "the positional MODEL: the checkpoint mount (launch.MODEL_MOUNT)",
                f"{_VLLM_ENGINE} model_group '--model'; positional model_tag in vllm/entrypoints/openai/"
                "cli_args.py make_arg_parser; FlexibleArgumentParser.parse_args moves `--model X` there"),
    ManagedFlag("--served-model-name", (), "model.servedName", f"{_VLLM_ENGINE} model_group"),
    ManagedFlag("--tensor-parallel-size", ("-tp",), "serving.tpSize",
                f"{_VLLM_ENGINE} parallel_group add_argument('--tensor-parallel-size', '-tp')"),
    ManagedFlag("--distributed-executor-backend", (), "serving.distributedExecutorBackend",
                f"{_VLLM_ENGINE} parallel_group"),
    ManagedFlag("--kv-cache-dtype", (), "serving.kvCacheDtype", f"{_VLLM_ENGINE} cache_group (CacheConfig.cache_dtype)"),
    ManagedFlag("--max-model-len", (), "serving.maxModelLen", f"{_VLLM_ENGINE} model_group"),
    ManagedFlag("--gpu-memory-utilization", ("--device-memory-utilization",), "serving.gpuMemoryUtilization",
                f"{_VLLM_ENGINE} cache_group (--device-memory-utilization: its alias)"),
    ManagedFlag("--host", (), "fixed: 0.0.0.0 (launch.vllm_serve_args)", f"{_VLLM_FRONTEND}.host"),
    ManagedFlag("--port", (), "serving.port", f"{_VLLM_FRONTEND}.port"),
    ManagedFlag("--api-key", (), "the apiKey secret, exported as VLLM_API_KEY", f"{_VLLM_FRONTEND}.api_key"),
    ManagedFlag("--max-num-seqs", (), "serving.maxRunningRequests", f"{_VLLM_ENGINE} scheduler_group"),
)  # fmt: skip

ENGINES: dict[str, tuple[ManagedFlag, ...]] = {"sglang": SGLANG, "vllm": VLLM}

# Flags the program does not set but that would take memory or the endpoint outside the plan:
# refused in extraArgs the same way (aliases, prefixes, underscores).
UNPLANNED: dict[str, tuple[ManagedFlag, ...]] = {
    "sglang": (
        ManagedFlag("--cuda-graph-bs-decode", (), "refused: captures batch sizes the memory plan does not count",
                    f"{_SGL}exec_.py cuda_graph_bs_decode"),
        ManagedFlag("--cuda-graph-bs-prefill", (), "refused: captures prefill graphs the memory plan does not count",
                    f"{_SGL}exec_.py cuda_graph_bs_prefill"),
        ManagedFlag("--cuda-graph-max-bs-prefill", (), "refused: prefill graphs the memory plan does not count",
                    f"{_SGL}exec_.py cuda_graph_max_bs_prefill"),
        ManagedFlag("--cuda-graph-config", (), "refused: its JSON wins over the per-phase graph flags the plan sets",
                    f"{_SGL}exec_.py cuda_graph_config (type_parser=parse_cuda_graph_config_arg)"),
        ManagedFlag("--speculative-num-draft-tokens", (), "refused: serving.dsparkBlockSize sets it (block + 1)",
                    f"{_SGL}spec.py speculative_num_draft_tokens"),
    ),
    "vllm": (
        ManagedFlag("--kv-cache-memory-bytes", (), "refused: replaces serving.gpuMemoryUtilization in the plan",
                    f"{_VLLM_ENGINE} cache_group"),
        ManagedFlag("--num-gpu-blocks-override", (), "refused: a KV size outside the memory plan",
                    f"{_VLLM_ENGINE} cache_group"),
        ManagedFlag("--uds", (), "refused: a unix socket instead of serving.port (the endpoint would be gone)",
                    f"{_VLLM_FRONTEND}.uds"),
    ),
}  # fmt: skip

# Engines whose parser resolves unique prefixes of long options (allow_abbrev left at True):
# SGLang python/sglang/srt/server_args.py prepare_server_args; vLLM vllm/utils/argparse_utils.py
# FlexibleArgumentParser + vllm/entrypoints/cli/serve.py subparsers.add_parser("serve", ...).
ABBREVIATES = {"sglang": True, "vllm": True}
# Engines that read `_` as `-` in long option names (vLLM FlexibleArgumentParser.parse_args).
UNDERSCORES = {"sglang": False, "vllm": True}


def spellings(engine: str) -> frozenset[str]:
    """Every option string ``engine``'s extraArgs may not set: managed flags, unplanned ones, aliases."""
    return frozenset(s for m in ENGINES[engine] + UNPLANNED[engine] for s in m.spellings)


def _option_key(arg: str, engine: str) -> str:
    """The option string the engine's parser looks up for one argv element."""
    key = arg.split("=", 1)[0]
    if engine == "vllm":
        key = key.split(".", 1)[0]  # `--flag.key value` is parsed as `--flag <json>`
    if UNDERSCORES[engine] and key.startswith("--"):
        key = "--" + key[2:].replace("_", "-")
    return key


def managed_entry(arg: str, engine: str) -> ManagedFlag | None:
    """The managed flag (with its provenance) that ``arg`` would set; see `managed_flag`."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} (expected one of {sorted(ENGINES)})")
    if not arg.startswith("-"):
        return None  # a value or a positional, not an option
    key = _option_key(arg, engine)
    table = ENGINES[engine] + UNPLANNED[engine]
    for m in table:
        if key in m.spellings:
            return m
    if key in ("-", "--"):
        return None
    for m in table:
        for s in m.spellings:
            # single-dash prefixes match in any parser; long ones only where abbreviations are on
            if s.startswith(key) and (ABBREVIATES[engine] or not key.startswith("--")):
                return m
    return None


def managed_flag(arg: str, engine: str) -> str | None:
    """The managed flag that ``arg`` (one element of serving.extraArgs) would set when parsed by
    ``engine``'s real launcher ("sglang" or "vllm"), as the program spells it; None otherwise.

    Only elements starting with `-` are options. `=value` is dropped; for vLLM `_` reads as `-`
    in long options and a dotted `--flag.key` counts as `--flag`. An exact flag or alias matches;
    so does any prefix of one (longer than `-`/`--`), unique or ambiguous: argparse would either
    resolve it to that flag or refuse to start. When a prefix fits several managed flags, the
    first in table order is returned. Raises ValueError for an unknown engine.
    """
    entry = managed_entry(arg, engine)
    return entry.flag if entry else None


# ------------------------------------------------------------------ engine versions and their options ----
# The option tables of the real engines, dumped from the PyPI packages by `programs/argcheck.py
# --dump-options` (tests/conformance checks they still match). The simulator's engine double builds its
# parser from the same files, so the sim refuses what the real parser refuses.
OPTIONS_DIR = Path(__file__).parent / "options"

# The oldest release each engine may be declared at: the DeepSeek-V4.1 flags the program sets
# (DSPARK, the deepseekv41 parsers, --attention-backend dsv4) first appear in SGLang 0.5.21; the
# seed's vLLM path needs vLLM >= 0.31.0.
MIN_VERSION = {"sglang": "0.5.21", "vllm": "0.31.0"}


@dataclass(frozen=True)
class FlagChange:
    """A flag that only some releases of an engine have (checked at preview for the declared version)."""

    engine: str
    flag: str
    replacement: str  # what to write instead
    added: str | None = None  # the first release that has it
    removed: str | None = None  # the first release that no longer has it
    source: str = ""


HISTORY: tuple[FlagChange, ...] = (
    FlagChange("sglang", "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", removed="0.5.20",
               source="deprecated alias of --cuda-graph-max-bs-decode in 0.5.15-0.5.19; from 0.5.20 argparse finds "
                      "it ambiguous (--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill)"),
    FlagChange("sglang", "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs", added="0.5.15"),
    FlagChange("sglang", "--speculative-dspark-block-size", "an SGLang release with DSPARK (0.5.21+)", added="0.5.21"),
    FlagChange("vllm", "--ray-address", "RAY_ADDRESS in the environment (the program sets it)", removed="0.31.0",
               source="refused by vLLM 0.31.0 and 0.33.0 (the seed's `--ray-address auto`)"),
)  # fmt: skip


def version_key(version: str) -> tuple[int, ...]:
    """``0.5.15.post1`` -> (0, 5, 15, 1): release order."""
    parts = version.replace(".post", ".").split(".")
    return tuple(int(p) for p in parts if p.isdigit())


def history_problem(engine: str, flag: str, version: str) -> FlagChange | None:
    """The change that makes ``flag`` (an exact option string) absent from ``engine`` ``version``."""
    v = version_key(version)
    for c in HISTORY:
        if c.engine == engine and c.flag == flag:
            if (c.removed and v >= version_key(c.removed)) or (c.added and v < version_key(c.added)):
                return c
    return None


def load_options(engine: str, version: str) -> dict | None:
    """The real parser's option table of ``engine`` ``version`` (None: none was dumped for it)."""
    path = OPTIONS_DIR / f"{engine}-{version}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def known_versions(engine: str) -> list[str]:
    return sorted((p.stem.split("-", 1)[1] for p in OPTIONS_DIR.glob(f"{engine}-*.json")), key=version_key)


def resolve(token: str, table: dict) -> tuple[str | None, list[str]]:
    """What the real parser makes of one option token (``--flag`` or ``--flag=value``), with argparse's
    rules: an exact option string, else (``allow_abbrev``) the one long option it is a prefix of.
    Returns (the option string it resolves to or None, the candidates when ambiguous or none)."""
    key = token.split("=", 1)[0]
    if table["engine"] == "vllm":
        key = _option_key(key, "vllm")
    strings = [o for row in table["options"] for o in row["options"]]
    if key in strings:
        return key, []
    if table.get("allow_abbrev", True) and key.startswith("--") and len(key) > 2:
        matches = [o for o in strings if o.startswith(key) and o.startswith("--")]
        dests = {row["dest"] for row in table["options"] for o in row["options"] if o in matches}
        if len(dests) == 1:
            return matches[0], []
        return None, matches
    if not key.startswith("--") and len(key) > 1:  # single-dash: argparse matches prefixes of short options too
        matches = [o for o in strings if not o.startswith("--") and o.startswith(key)]
        if len(matches) == 1:
            return matches[0], []
        return None, matches
    return None, []


def option_tokens(argv: list[str]) -> list[str]:
    """The elements of ``argv`` the parser reads as options (not values, not negative numbers)."""
    out = []
    for a in argv:
        if not a.startswith("-") or a in ("-", "--"):
            continue
        try:
            float(a)
            continue
        except ValueError:
            out.append(a)
    return out
