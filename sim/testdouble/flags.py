"""Launcher flag tables of the TEST DOUBLES (the single place): ``sglang``
(``python3 -m sglang.launch_server``) and ``vllm`` (``vllm serve MODEL``). ``ray`` is real Ray (the
PyPI wheel in the engine image), so it has no table here.

Each table maps flag -> kind: ``"value"`` takes one argument, ``"values"`` one or more
(argparse ``nargs="+"``), ``"bool"`` is a store_true switch. Typed flags are in ``TYPES``,
restricted ones in ``CHOICES``, defaults in ``TABLE_DEFAULTS``, short aliases in ``ALIASES``.
Every parser is strict like the real launchers: ``allow_abbrev=False`` and unknown flags exit 2.
"""
from __future__ import annotations

import argparse
import re

SGLANG_FLAGS: dict[str, str] = {
    "--model-path": "value",
    "--served-model-name": "value",
    "--trust-remote-code": "bool",
    "--load-format": "value",
    "--tp": "value",
    "--tp-size": "value",
    "--ep-size": "value",
    "--nnodes": "value",
    "--node-rank": "value",
    "--dist-init-addr": "value",
    "--dist-timeout": "value",
    "--host": "value",
    "--port": "value",
    "--api-key": "value",
    "--context-length": "value",
    "--max-total-tokens": "value",
    "--max-running-requests": "value",
    "--cuda-graph-max-bs": "value",
    "--mem-fraction-static": "value",
    "--chunked-prefill-size": "value",
    "--attention-backend": "value",
    "--moe-runner-backend": "value",
    "--random-seed": "value",
    "--enable-decoder-swa-bounded-replay": "bool",
    "--tool-call-parser": "value",
    "--reasoning-parser": "value",
    "--speculative-algorithm": "value",
    "--speculative-dspark-block-size": "value",
    "--fp8-gemm-backend": "value",
    "--watchdog-timeout": "value",
    "--sleep-on-idle": "bool",
    "--min-free-slots-delay": "value",
    "--enable-metrics": "bool",
    "--log-level": "value",
}

# `vllm serve MODEL [flags]` (MODEL is positional). Only flags real vLLM has; `--ray-address` is not one
# (vLLM reads RAY_ADDRESS from the environment). `-tp` is vLLM's alias of --tensor-parallel-size.
VLLM_FLAGS: dict[str, str] = {
    "--served-model-name": "values",
    "--tensor-parallel-size": "value",
    "--distributed-executor-backend": "value",
    "--kv-cache-dtype": "value",
    "--max-model-len": "value",
    "--host": "value",
    "--port": "value",
    "--api-key": "value",
    "--gpu-memory-utilization": "value",
    "--max-num-seqs": "value",
    "--trust-remote-code": "bool",
    "--enforce-eager": "bool",
    "--disable-custom-all-reduce": "bool",
    "--enable-prefix-caching": "bool",
    "--uvicorn-log-level": "value",
    "--disable-log-requests": "bool",
}

ENGINES: dict[str, dict[str, str]] = {
    "sglang": SGLANG_FLAGS,
    "vllm": VLLM_FLAGS,
}

# every table a TEST DOUBLE parser is built from
TABLES: dict[str, dict[str, str]] = dict(ENGINES)

INT_FLAGS = {"--tp", "--tp-size", "--ep-size", "--nnodes", "--node-rank", "--port", "--dist-timeout"}

DEFAULTS = {"--host": "127.0.0.1", "--port": "30000", "--nnodes": "1", "--node-rank": "0"}


def human_int(text: str) -> int:
    """vLLM's human-readable integers: ``131072``, ``128k`` (x1024), ``1M``, ``25.6k`` -> int."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}")
    num, unit = m.groups()
    if "." in num and not unit:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}")
    return int(float(num) * 1024 ** " kmg".index(unit.lower() or " "))


TYPES: dict[str, dict[str, type | object]] = {
    "sglang": {f: int for f in INT_FLAGS},
    "vllm": {"--tensor-parallel-size": int, "--port": int, "--max-model-len": human_int,
             "--gpu-memory-utilization": float, "--max-num-seqs": int},
}

CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "sglang": {},
    "vllm": {
        "--distributed-executor-backend": ("ray", "mp", "uni", "external_launcher"),
        "--kv-cache-dtype": ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"),
        "--uvicorn-log-level": ("critical", "error", "warning", "info", "debug", "trace"),
    },
}

TABLE_DEFAULTS: dict[str, dict[str, str]] = {
    "sglang": DEFAULTS,
    "vllm": {"--tensor-parallel-size": "1", "--host": "0.0.0.0", "--port": "8000",
             "--gpu-memory-utilization": "0.9", "--kv-cache-dtype": "auto", "--uvicorn-log-level": "info"},
}

ALIASES: dict[str, dict[str, tuple[str, ...]]] = {
    "sglang": {},
    "vllm": {"--tensor-parallel-size": ("-tp",)},
}

PROGS = {"sglang": "python3 -m sglang.launch_server (TEST DOUBLE)", "vllm": "vllm serve (TEST DOUBLE)"}


def add_table(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """Add every flag of table ``name`` to ``parser`` (types, choices, defaults, aliases)."""
    types, choices = TYPES[name], CHOICES[name]
    defaults, aliases = TABLE_DEFAULTS[name], ALIASES[name]
    for flag, kind in TABLES[name].items():
        names = [flag, *aliases.get(flag, ())]
        dest = flag[2:].replace("-", "_")
        if kind == "bool":
            parser.add_argument(*names, dest=dest, action="store_true")
            continue
        typ = types.get(flag, str)
        default = defaults.get(flag)
        kw = {"nargs": "+"} if kind == "values" else {}
        if flag in choices:
            kw["choices"] = choices[flag]
        parser.add_argument(*names, dest=dest, type=typ, default=typ(default) if default is not None else None,
                            **kw)
    return parser


def build_parser(engine: str = "sglang", prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog or PROGS.get(engine, f"{engine} (TEST DOUBLE)"),
        description=f"TEST DOUBLE for {engine} (simulator stand-in, not the real program)",
        allow_abbrev=False,
    )
    if engine == "vllm":
        parser.add_argument("model", metavar="MODEL", help="checkpoint directory (must hold config.json)")
    return add_table(parser, engine)


def build_vllm_cli(version: str = "0.0.0+test-double") -> argparse.ArgumentParser:
    """The ``vllm`` command: ``vllm serve MODEL [VLLM_FLAGS]`` and ``vllm --version``."""
    top = argparse.ArgumentParser(prog="vllm", allow_abbrev=False,
                                  description="TEST DOUBLE of the vLLM CLI (dspark-sim); this is NOT vLLM")
    top.add_argument("-v", "--version", action="version", version=version)
    sub = top.add_subparsers(dest="subparser", required=True)
    serve = sub.add_parser("serve", allow_abbrev=False, help="serve the OpenAI-compatible API (TEST DOUBLE)")
    serve.add_argument("model", metavar="MODEL", help="checkpoint directory (must hold config.json)")
    add_table(serve, "vllm")
    return top


def normalize_vllm_argv(argv: list[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser accepts ``--max_model_len`` for ``--max-model-len``."""
    out = []
    for a in argv:
        if a.startswith("--") and "_" in a.split("=", 1)[0]:
            key, eq, val = a.partition("=")
            a = key.replace("_", "-") + eq + val
        out.append(a)
    return out


def parse_args(argv: list[str], engine: str = "sglang") -> argparse.Namespace:
    """Parse like the real launcher: unknown flags -> exit code 2 (argparse ``error``)."""
    if engine == "vllm":
        argv = normalize_vllm_argv(argv)
    return build_parser(engine).parse_args(argv)
