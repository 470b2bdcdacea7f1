"""TEST DOUBLES of the engines' parsing entry points that programs/argcheck.py imports, installed in
the sim's engine image under the real module paths (sim/images.py):

- ``sglang.srt.server_args``: ``ServerArgs.add_cli_args`` and ``prepare_server_args`` over the real
  0.5.23 option table (flags.py), as ``prepare_server_args`` builds its parser;
- ``vllm.entrypoints.cli.serve``: ``cmd_init()`` with the ``serve`` subcommand over the real vLLM
  option table, and its ``validate`` (the checks of ``validate_parsed_serve_args`` the table can
  express: none beyond parsing; see sim/adaptations.py);
- ``vllm.utils.argparse_utils``: ``FlexibleArgumentParser`` (underscores read as dashes).
Stdlib only.
"""
from __future__ import annotations

import argparse

from . import flags


class ServerArgs:
    """TEST DOUBLE of ``sglang.srt.server_args.ServerArgs``: only its CLI registration."""

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        flags.add_table(parser, flags.load_table("sglang"))


def prepare_server_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sglang serve")  # allow_abbrev left on, as upstream
    ServerArgs.add_cli_args(parser)
    return parser.parse_args(argv)


class FlexibleArgumentParser(argparse.ArgumentParser):
    """TEST DOUBLE of vLLM's parser: ``--max_model_len`` reads as ``--max-model-len``."""

    def parse_args(self, args=None, namespace=None):  # noqa: D102
        import sys

        argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(flags.normalize_vllm_argv(argv), namespace)


class ServeSubcommand:
    name = "serve"

    @staticmethod
    def cmd(args) -> None:  # pragma: no cover - the check never dispatches
        raise SystemExit("TEST DOUBLE: serve is not run by the parse check")

    def validate(self, args) -> None:
        pass

    def subparser_init(self, subparsers) -> argparse.ArgumentParser:
        parser = subparsers.add_parser("serve", help="TEST DOUBLE of vllm serve")
        return flags.add_table(parser, flags.load_table("vllm"))


def cmd_init() -> list[ServeSubcommand]:
    return [ServeSubcommand()]
