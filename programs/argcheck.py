"""The engine's own argument check, run inside the serving image on each node before a group starts.

    python3 - --node spark2 --rank 1 --check sglang 42 --model-path /model ... < argcheck.py

(``--check ENGINE N`` takes the next N elements as that program's argv; several may follow.)

Standard library only, plus the engine package the image carries: it imports the engine's REAL
parsing code (nothing of this project is in the image) and runs it on the exact argv of one rank:
- ``sglang``: ``sglang.srt.server_args.prepare_server_args`` (what ``sglang serve`` and
  ``python3 -m sglang.launch_server`` call: argparse with ``allow_abbrev`` left on, the
  ``--config`` merge, ``ServerArgs.from_cli_args``); the DSPARK draft weights, the
  ``num_draft_tokens == block + 1`` rule and the DSV4.1 adapter (``/opt/dsv41``) are checked here;
- ``vllm``: the ``vllm`` CLI's parser with the ``serve`` subcommand exactly as
  ``vllm.entrypoints.cli.main`` builds it, then ``ServeSubcommand.validate``
  (``validate_parsed_serve_args``); ``VLLM_TARGET_DEVICE=cpu`` lets it build without a GPU. The Ray
  backend needs ``ray`` importable in the image;
- ``ray``: ``ray start``'s click command, parsed (``make_context``) and never invoked;
- ``router``: ``sglang_router.launch_router.parse_router_args``.
No GPU, no network (the caller runs it with ``--network none``), nothing started.

Exit 0: accepted (one line saying so). Exit 3: refused, with one line
``deepseek-spark argcheck: node N rank R (engine V): refused: <flag>: <the engine's own message>``
and the engine's output before it. Exit 4: the image cannot run the check (engine not importable).

``--dump-options ENGINE`` prints the real parser's option table as JSON (option strings, dest,
nargs, kind, type, choices, default): the simulator's engine double builds its parser from those
dumps (sim/testdouble/options), and tests/conformance checks they still match the real packages.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import sys

ADAPTER_DIR = "/opt/dsv41"  # the DeepSeek-V4.1 adapter the SGLang images must carry
# What the image must hold besides its parsers (DSPARK draft weights, the adapter, Ray for the Ray
# backend). Off in the conformance tier, which runs the parsers in a plain venv (tests/conformance).
IMAGE_CHECKS = True


class Refused(Exception):
    def __init__(self, flag: str, message: str):
        super().__init__(message)
        self.flag = flag
        self.message = message


def _flag_of(message: str) -> str:
    """The option an argparse/click error names (``-`` when it names none)."""
    for pattern in (
        r"ambiguous option: (\S+?)(?:=\S*)? could match",
        r"unrecognized arguments: (\S+)",
        r"argument (\S+?)(?:/\S+)?: ",
        r"[Nn]o such option: (\S+)",
        r"[Ii]nvalid value for '([^']+)'",
        r"Option '([^']+)'",
        r"the following arguments are required: (\S+?),?(?:\s|$)",
    ):
        m = re.search(pattern, message)
        if m:
            return m.group(1).rstrip(",")
    return "-"


def _parse(fn, *args):
    """Run a parse, turning argparse's ``SystemExit`` (message on stderr) into ``Refused``."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return fn(*args)
    except SystemExit as e:
        if e.code in (0, None):
            raise Refused("-", "the parser exited without an error (--help or --version in the argv?)") from None
        text = err.getvalue().strip()
        last = text.splitlines()[-1] if text else f"exit {e.code}"
        raise Refused(_flag_of(last), last) from None
    finally:
        # the parser's own last lines (argparse prints a usage of hundreds of options before its error)
        tail = err.getvalue().strip().splitlines()[-3:]
        if tail:
            sys.stderr.write("\n".join(tail) + "\n")


# ------------------------------------------------------------------------------------- engines ----
def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
    ServerArgs.add_cli_args(parser)
    return parser


def check_sglang(argv: list[str]) -> str:
    from sglang.srt.server_args import prepare_server_args

    args = _parse(prepare_server_args, argv)
    algo = str(getattr(args, "speculative_algorithm", None) or "")
    if algo.upper() == "DSPARK" and IMAGE_CHECKS:
        block = getattr(args, "speculative_dspark_block_size", None)
        draft_tokens = getattr(args, "speculative_num_draft_tokens", None)
        if block is not None and draft_tokens is not None and int(draft_tokens) != int(block) + 1:
            raise Refused("--speculative-num-draft-tokens",
                          f"DSPARK needs speculative_num_draft_tokens == block + 1 = {int(block) + 1}, got {draft_tokens}")
        draft = getattr(args, "speculative_draft_model_path", None)
        model = str(getattr(args, "model_path", "") or "")
        if draft:
            if not os.path.isdir(draft):
                raise Refused("--speculative-draft-model-path", f"DSPARK draft weights not found at {draft}")
        elif not (os.path.isdir(os.path.join(model, "dspark")) or _bundles_draft(model)):
            raise Refused("--speculative-algorithm",
                          f"DSPARK needs draft weights: none bundled in {model} (no dspark/ subfolder, no draft "
                          "entry in config.json) and no --speculative-draft-model-path")
    if IMAGE_CHECKS and not os.path.isdir(ADAPTER_DIR):
        raise Refused("-", f"the image has no DeepSeek-V4.1 adapter at {ADAPTER_DIR} (build the recipe's overlay)")
    return "sglang " + _version("sglang")


def _bundles_draft(model: str) -> bool:
    """config.json names a bundled draft (``dspark_config``/``draft_config``/MTP layers)."""
    try:
        with open(os.path.join(model, "config.json")) as f:
            conf = json.load(f)
    except (OSError, ValueError):
        return False
    return any(conf.get(k) for k in ("dspark_config", "draft_config", "num_nextn_predict_layers"))


def vllm_parser() -> argparse.ArgumentParser:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the serve parser cannot be built without a GPU otherwise
    import vllm.entrypoints.cli.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")  # as vllm.entrypoints.cli.main builds it
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    parser._dspark_cmds = {}
    for cmd in serve.cmd_init():
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
        parser._dspark_cmds[cmd.name] = cmd
    return parser


def check_vllm(argv: list[str]) -> str:
    parser = vllm_parser()
    args = _parse(parser.parse_args, argv)
    cmd = parser._dspark_cmds.get(args.subparser)
    if cmd is None:
        raise Refused(argv[0] if argv else "-", f"not a vllm subcommand this check knows: {argv[:1]}")
    _parse(cmd.validate, args)
    backend = getattr(args, "distributed_executor_backend", None)
    if backend == "ray" and IMAGE_CHECKS and importlib.util.find_spec("ray") is None:
        raise Refused("--distributed-executor-backend",
                      "--distributed-executor-backend ray, but Ray is not importable in the image "
                      "(NVIDIA's vLLM images ship without it): install ray, or use distributedExecutorBackend: mp")
    return "vllm " + _version("vllm")


def check_ray(argv: list[str]) -> str:
    import click
    from ray.scripts.scripts import start

    if argv[:1] != ["start"]:
        raise Refused(argv[0] if argv else "-", "only `ray start` is checked")
    try:
        with start.make_context("ray start", list(argv[1:])):
            pass
    except click.exceptions.Exit as e:
        if e.exit_code:
            raise Refused("-", f"ray start exited {e.exit_code}") from None
    except click.ClickException as e:
        message = e.format_message()
        raise Refused(_flag_of(message), message) from None
    return "ray " + _version("ray")


def check_router(argv: list[str]) -> str:
    from sglang_router.launch_router import parse_router_args

    _parse(parse_router_args, argv)
    return "sglang-router " + _version("sglang-router")


CHECKS = {"sglang": check_sglang, "vllm": check_vllm, "ray": check_ray, "router": check_router}


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001  the test double images carry no dist-info for the engines
        return getattr(sys.modules.get(dist.replace("-", "_")), "__version__", "unknown")


# ------------------------------------------------------------------------------ option tables ----
def _kind(action: argparse.Action) -> str:
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
        return "exit"
    if isinstance(action, argparse._SubParsersAction):
        return "subcommands"
    if action.nargs == 0:
        if isinstance(action, argparse.BooleanOptionalAction):
            return "boolean-optional"
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)):
            return "const"
        return "switch"  # a custom zero-argument action
    if isinstance(action, argparse._AppendAction):
        return "append"
    return "value"


def _plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    return repr(value)[:80]


def option_table(parser: argparse.ArgumentParser, subcommand: str | None = None) -> list[dict]:
    """Every option of ``parser`` (or of its ``subcommand``) as plain data, in declaration order."""
    if subcommand:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[subcommand]
    rows = []
    for a in parser._actions:
        kind = _kind(a)
        if kind == "subcommands":
            continue
        typ = a.type if isinstance(a.type, type) else None
        rows.append({
            "options": list(a.option_strings),
            "dest": a.dest,
            "kind": kind,
            "nargs": a.nargs if isinstance(a.nargs, (int, str)) else None,
            "type": typ.__name__ if typ in (int, float, str) else None,
            "choices": sorted(str(c) for c in a.choices) if a.choices is not None else None,  # sets: no order
            "default": None if a.default is argparse.SUPPRESS else _plain(a.default),
            "const": _plain(a.const) if kind == "const" else None,
            "required": bool(a.required),
        })
    return rows


def dump_options(engine: str) -> dict:
    if engine == "sglang":
        parser, sub, prog = sglang_parser(), None, "sglang serve"
    else:
        parser, sub, prog = vllm_parser(), "serve", "vllm serve"
    return {
        "engine": engine,
        "version": _version(engine),
        "prog": prog,
        "allow_abbrev": parser.allow_abbrev,
        "options": option_table(parser, sub),
    }


# ------------------------------------------------------------------------------------------ main ----
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--dump-options"]:
        json.dump(dump_options(argv[1]), sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    opts, checks = {}, []
    while argv:
        if argv[0] == "--check":
            engine, n = argv[1], int(argv[2])
            checks.append((engine, argv[3:3 + n]))
            argv = argv[3 + n:]
        else:
            opts[argv[0]] = argv[1]
            argv = argv[2:]
    where = f"deepseek-spark argcheck: node {opts.get('--node', '?')} rank {opts.get('--rank', '?')}"
    for engine, engine_argv in checks:
        if engine not in CHECKS:
            print(f"{where}: unknown engine {engine!r} (expected one of {sorted(CHECKS)})", flush=True)
            return 2
        try:
            what = CHECKS[engine](engine_argv)
        except Refused as e:
            line = f"{where} ({engine}): refused: {e.flag}: {e.message}"
            print(line, flush=True)
            print(line, file=sys.stderr, flush=True)  # last, where a log tail or an error summary looks
            return 3
        except ImportError as e:
            print(f"{where} ({engine}): the image cannot run the {engine} check: {e}", flush=True)
            return 4
        print(f"{where}: {what} accepts the argv ({len(engine_argv)} elements)", flush=True)
    return 0


if __name__ == "__main__":
    # Run as a file, its folder (components/, which has an sglang.py) would shadow the engine package;
    # fed on stdin, as on the nodes, there is no __file__ and no such entry.
    if globals().get("__file__"):
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.exit(main())
