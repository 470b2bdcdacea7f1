"""Launcher flag tables of the TEST DOUBLE engines (one place; add ``vllm`` here later).

Each engine maps flag -> kind: ``"value"`` takes one argument, ``"bool"`` is a store_true switch.
Integer-valued flags the double actually uses are typed in ``INT_FLAGS``.
"""
from __future__ import annotations

import argparse

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

ENGINES: dict[str, dict[str, str]] = {
    "sglang": SGLANG_FLAGS,
    # "vllm": VLLM_FLAGS,  # future: `vllm serve` test double
}

INT_FLAGS = {"--tp", "--tp-size", "--ep-size", "--nnodes", "--node-rank", "--port", "--dist-timeout"}

DEFAULTS = {"--host": "127.0.0.1", "--port": "30000", "--nnodes": "1", "--node-rank": "0"}


def build_parser(engine: str = "sglang", prog: str | None = None) -> argparse.ArgumentParser:
    table = ENGINES[engine]
    parser = argparse.ArgumentParser(
        prog=prog or f"{engine} (TEST DOUBLE)",
        description=f"TEST DOUBLE for the {engine} launcher (simulator stand-in, not an engine)",
        allow_abbrev=False,
    )
    for flag, kind in table.items():
        dest = flag[2:].replace("-", "_")
        if kind == "bool":
            parser.add_argument(flag, dest=dest, action="store_true")
        else:
            typ = int if flag in INT_FLAGS else str
            default = DEFAULTS.get(flag)
            parser.add_argument(flag, dest=dest, type=typ,
                                default=typ(default) if default is not None else None)
    return parser


def parse_args(argv: list[str], engine: str = "sglang") -> argparse.Namespace:
    """Parse like the real launcher: unknown flags -> exit code 2 (argparse ``error``)."""
    return build_parser(engine).parse_args(argv)
