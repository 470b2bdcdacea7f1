"""The TEST DOUBLES' parsers (``python3 -m sglang.launch_server``, ``vllm serve MODEL``), derived from
the REAL engines' option tables: ``options/<engine>-<version>.json`` next to this module in the
image (copied from ``declared/options``, which ``programs/argcheck.py --dump-options`` wrote
from the PyPI packages; tests/conformance checks they still match the real parsers).

So the doubles accept exactly the option strings the real parsers accept, with the real ones'
``allow_abbrev=True`` (a unique prefix resolves, an ambiguous one exits 2: ``ambiguous option``),
``nargs``, int/float types, choices (the dynamic ones too, as the real ``add_cli_args`` computed
them) and defaults, and unknown flags exit 2. What they do not reproduce: custom ``type=`` parsers
(a value a real custom parser refuses, such as bad JSON for ``--cuda-graph-config``, is accepted as a
string) and the engines' post-parse resolution; sim/adaptations.py lists that. ``ray`` is real Ray
(the PyPI wheel in the engine image) and has no table here.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

HERE = Path(__file__).parent
# In the image the tables sit next to this module; in the repository they are declared/options.
OPTIONS_DIRS = (HERE / "options", HERE.parent.parent / "declared" / "options")
# The releases the doubles stand in for (one image carries both engines).
VERSIONS = {"sglang": os.environ.get("DSPARK_SIM_SGLANG_VERSION", "0.5.23"),
            "vllm": os.environ.get("DSPARK_SIM_VLLM_VERSION", "0.31.0")}
TYPES = {"int": int, "float": float, "str": str}


def load_table(engine: str, version: str | None = None) -> dict:
    version = version or VERSIONS[engine]
    for d in OPTIONS_DIRS:
        path = d / f"{engine}-{version}.json"
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError(f"TEST DOUBLE: no option table {engine}-{version}.json in {[str(d) for d in OPTIONS_DIRS]}")


def version_of(engine: str) -> str:
    return VERSIONS[engine] + "+test-double"


def add_table(parser: argparse.ArgumentParser, table: dict) -> argparse.ArgumentParser:
    """Add every option of a real parser's table to ``parser`` (help is argparse's own)."""
    for row in table["options"]:
        names, dest, kind = row["options"], row["dest"], row["kind"]
        if kind == "exit":
            if "--version" in names:
                parser.add_argument(*names, action="version", version=table.get("version", "?"))
            continue  # -h/--help: argparse adds its own
        if kind in ("const", "switch", "boolean-optional"):
            negatives = [n for n in names if kind == "boolean-optional" and n.startswith("--no-")]
            positives = [n for n in names if n not in negatives]
            const = row["const"] if kind == "const" else True
            parser.add_argument(*positives, dest=dest, action="store_const", const=const, default=row["default"])
            if negatives:
                parser.add_argument(*negatives, dest=dest, action="store_const", const=False, default=row["default"])
            continue
        typ = TYPES.get(row["type"] or "str", str)
        kw: dict = {"type": typ, "default": row["default"]}
        if row["nargs"] is not None:
            kw["nargs"] = row["nargs"]
        if row["choices"] is not None:
            try:
                kw["choices"] = [typ(c) for c in row["choices"]]
            except ValueError:
                kw["choices"] = row["choices"]
        if kind == "append":
            kw["action"] = "append"
        if names:
            parser.add_argument(*names, dest=dest, required=row["required"], **kw)
        else:  # a positional
            parser.add_argument(dest, **kw)
    return parser


def build_parser(engine: str = "sglang", prog: str | None = None) -> argparse.ArgumentParser:
    table = load_table(engine)
    parser = argparse.ArgumentParser(
        prog=prog or table["prog"],
        description=f"TEST DOUBLE for {engine} {table['version']} (its real option table; not the real program)",
        allow_abbrev=table.get("allow_abbrev", True),
    )
    return add_table(parser, table)


def build_vllm_cli(version: str | None = None) -> argparse.ArgumentParser:
    """The ``vllm`` command: ``vllm serve MODEL [options of the real serve parser]`` and ``vllm --version``."""
    table = load_table("vllm")
    top = argparse.ArgumentParser(prog="vllm", description="TEST DOUBLE of the vLLM CLI (dspark-sim); NOT vLLM")
    top.add_argument("-v", "--version", action="version", version=version or version_of("vllm"))
    sub = top.add_subparsers(dest="subparser", required=True)
    add_table(sub.add_parser("serve", help="serve the OpenAI-compatible API (TEST DOUBLE)"), table)
    return top


def normalize_vllm_argv(argv: list[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser reads ``--max_model_len`` as ``--max-model-len`` (the name up to
    the first ``.``; ``--flag.key value`` becomes ``--flag`` with JSON, not reproduced here)."""
    out = []
    for a in argv:
        if a.startswith("--") and "_" in a.split("=", 1)[0]:
            key, eq, val = a.partition("=")
            name, dot, rest = key.partition(".")
            a = name.replace("_", "-") + dot + rest + eq + val
        out.append(a)
    return out


def parse_args(argv: list[str], engine: str = "sglang") -> argparse.Namespace:
    """Parse like the real launcher: unknown or ambiguous flags -> exit code 2 (argparse ``error``)."""
    if engine == "vllm":
        return build_vllm_cli().parse_args(["serve", *normalize_vllm_argv(argv)])
    return build_parser(engine).parse_args(argv)


def human_int(text: str) -> int:
    """vLLM's human-readable integers: ``131072``, ``128k`` (x1024), ``1M``, ``25.6k`` -> int."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", str(text).strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}")
    num, unit = m.groups()
    if "." in num and not unit:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}")
    return int(float(num) * 1024 ** " kmg".index(unit.lower() or " "))
