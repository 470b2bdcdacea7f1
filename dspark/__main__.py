"""python -m dspark <plan|status|logs|doctor|smoke|bench|diagnose> --stack <stack> [options]; see dspark/__init__.py
(bench: dspark/cmd_bench.py)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Optional, Sequence, TextIO

from . import __doc__ as OVERVIEW
from . import (
    cmd_bench, cmd_demo, cmd_diagnose, cmd_doctor, cmd_guard, cmd_logs, cmd_plan, cmd_repair, cmd_restart, cmd_smoke,
    cmd_status,
)
from .nodes import Nodes, Runner, Streamer, valid_since
from .stack import DsparkError, group_names, load

CANNOT_RUN = 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # exit 3, not argparse's 2 (status uses 2 for "down")
        self.print_usage(sys.stderr)
        self.exit(CANNOT_RUN, f"{self.prog}: error: {message}\n")


def _positive(value: str) -> float:
    v = float(value)
    if v <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return v


def _tail(value: str) -> str:
    if value != "all" and not value.isdigit():
        raise argparse.ArgumentTypeError("a number of lines or 'all'")
    return value


def _since(value: str) -> str:
    if not valid_since(value):
        raise argparse.ArgumentTypeError("a duration (10m, 1h30m), a unix time or an RFC 3339 date")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m dspark", description=OVERVIEW,
                          formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--stack", required=True, help="the stack (tp3, tp4, tp2, sim, ...)")
    common.add_argument("--group", help="in a stack with groups (tp4x2, ...): the group to look at")
    common.add_argument("--project-dir", default=".", help="where Pulumi.<stack>.yaml is (default: .)")
    common.add_argument("--outputs-file", help="stack outputs saved with `pulumi stack output --json --show-secrets` "
                        "(default: run that command)")  # fmt: skip
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, module, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_, description=module.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip

    sp = add("plan", cmd_plan, "what every node runs, from the config alone")
    sp.add_argument("--json", action="store_true", help="machine-readable output (shape: see --help above)")
    sp = add("status", cmd_status, "ranks, revision, health; exit 0 healthy, 1 degraded, 2 down")
    sp.add_argument("--json", action="store_true", help="machine-readable output (shape: see --help above)")
    sp.add_argument("--watch", type=_positive, metavar="SECONDS", help="repeat every SECONDS until interrupted")
    sp.add_argument("--count", type=int, metavar="N", help="with --watch: stop after N rounds")
    sp = add("logs", cmd_logs, "docker logs of the ranks, key redacted")
    sp.add_argument("--rank", type=int, help="one rank (default: every rank)")
    sp.add_argument("--follow", "-f", action="store_true", help="stream one rank's log (needs --rank)")
    sp.add_argument("--since", type=_since, metavar="DURATION", help="e.g. 10m, 2h, 2025-01-01T00:00:00Z")
    sp.add_argument("--tail", type=_tail, default="100", metavar="N", help="lines per rank, or 'all' (default 100)")
    sp.add_argument("--nccl", action="store_true", help="only NCCL's device and transport lines (serving.ncclDebug)")
    sp = add("doctor", cmd_doctor, "preflight now + drift, each finding with its fix")
    sp.add_argument("--json", action="store_true", help="machine-readable output (shape: see --help above)")
    sp = add("smoke", cmd_smoke, "one chat completion and one streamed one")
    sp.add_argument("--json", action="store_true", help="machine-readable output (shape: see --help above)")
    sp.add_argument("--timeout", type=_positive, default=120.0, help="seconds per request (default 120)")
    sp = add("bench", cmd_bench, "llama-benchy at each concurrency level, next to the published figures")
    sp.add_argument("--json", action="store_true", help="machine-readable output (shape: see --help above)")
    sp.add_argument("--concurrency", type=cmd_bench.parse_concurrency, default=[1, 2, 4, 8, 16], metavar="1,2,4,8,16",
                    help="concurrent streams per level, comma-separated (default 1,2,4,8,16)")
    sp.add_argument("--out", metavar="DIR", help="folder for the results (default bench-<stack>-<UTC timestamp>)")
    sp.add_argument("--tokenizer", metavar="PATH", help="a local tokenizer.json (the checkpoint's) for exact prompt "
                    "sizes (default: a BPE trained on the shipped corpus: approximate)")
    sp.add_argument("--pp", type=cmd_bench.positive_int, default=4096, help="prompt tokens per request (default 4096)")
    sp.add_argument("--tg", type=cmd_bench.positive_int, default=256,
                    help="tokens to generate per request (default 256, as seed 000)")
    sp.add_argument("--runs", type=cmd_bench.positive_int, default=3,
                    help="measured runs per level, after one warmup (default 3)")
    sp.add_argument("--timeout", type=_positive, default=3600.0, help="seconds for the whole run (default 3600)")
    sp.add_argument("--extra-args", default="", metavar='"ARGS"', help="more llama-benchy flags, e.g. "
                    '--extra-args="--exact-tg --no-cache"')
    sp = sub.add_parser("demo", help="the simulated cluster up through the real engine, then an answer",
                        description=cmd_demo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--stack", default="sim", choices=sorted(cmd_demo.SIM_STACKS), help="a sim stack (default sim)")
    sp.add_argument("--project-dir", default=".", help="where Pulumi.<stack>.yaml is (default: .)")
    sp.add_argument("--down", action="store_true", help="destroy the stack and delete the simulated cluster")
    sp.add_argument("--cluster", metavar="NAME", help="the simulated cluster to run on (default: the demo's own, "
                    "<stack>-demo; the tests pass theirs)")
    sp = add("repair", cmd_repair, "put back what drifted (refresh + up), never an unapplied config change")
    sp.add_argument("--yes", action="store_true", help="repair the drift found (default: only report it)")
    sp.add_argument("--policy-pack", action="append", default=[], metavar="DIR",
                    help="run these policy packs, as `pulumi up --policy-pack` (repeatable)")
    sp = add("restart", cmd_restart, "start a group over as a whole (up with its generation replaced)")
    sp.add_argument("--yes", action="store_true", help="restart (default: only show what the restart would do)")
    sp.add_argument("--policy-pack", action="append", default=[], metavar="DIR",
                    help="run these policy packs, as `pulumi up --policy-pack` (repeatable)")
    sp = add("guard", cmd_guard, "the self-healing guard: status, pause for maintenance, resume")
    sp.add_argument("action", choices=("status", "pause", "resume"))
    sp.add_argument("--json", action="store_true", help="status: machine-readable")
    sp.add_argument("--reason", default="", help="pause: why (shown by status and the guard's /status)")
    sp.add_argument("--for", dest="for_", type=_duration, metavar="DURATION",
                    help="pause: end the pause by itself after this long (30m, 2h, 1d)")
    sp = add("diagnose", cmd_diagnose, "one support file (.tar.gz) for an issue: versions, plan, outputs, status, "
             "doctor, logs, guard, last up; no secret")  # fmt: skip
    sp.add_argument("--out", metavar="FILE", help="the file (or a folder for it) (default "
                    "diagnose-<stack>-<UTC timestamp>.tar.gz)")  # fmt: skip
    sp.add_argument("--timeout", type=_positive, default=cmd_diagnose.TIMEOUT,
                    help="seconds for the nodes (default 60); a node that does not answer is given up on")
    sp.add_argument("--tail", type=cmd_bench.positive_int, default=cmd_diagnose.TAIL, metavar="N",
                    help="last lines of each log (default 2000)")
    sp.add_argument("--up-log", metavar="FILE", help="what the last `pulumi up` printed, saved by you")
    return p


def _duration(value: str) -> float:
    try:
        return cmd_guard.parse_for(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(
    argv: Optional[Sequence[str]] = None,
    *,
    runner: Optional[Runner] = None,
    streamer: Optional[Streamer] = None,
    out: Optional[TextIO] = None,
    err: Optional[TextIO] = None,
    sleep: Callable[[float], None] = time.sleep,
    forward: Optional[Callable] = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage errors (exit 3) and --help (0) as a return code
        return exc.code if isinstance(exc.code, int) else CANNOT_RUN
    try:
        if args.command == "demo":
            return cmd_demo.run(args.project_dir, args.stack, args.down, out, err, args.cluster)
        # a repair is the whole stack's: without --group it asks every group's guard
        groups = [args.group] if args.command != "repair" or args.group else group_names(args.stack, args.project_dir)
        stack = load(args.stack, args.project_dir, args.outputs_file, groups[0])
        if args.command == "plan":
            return cmd_plan.run(stack, args.json, out)
        if args.command == "repair":
            each = [stack] + [load(args.stack, args.project_dir, args.outputs_file, g) for g in groups[1:]]
            return cmd_repair.run(stack, out, err, yes=args.yes, policy_packs=args.policy_pack, guards=lambda: {
                g.group or g.short: cmd_guard.collect(g, Nodes(g.cfg, g.plan_name, runner=runner, streamer=streamer,
                                                               forward=forward)) for g in each})  # fmt: skip
        if args.command == "restart":
            return cmd_restart.run(stack, out, err, yes=args.yes, policy_packs=args.policy_pack)
        if args.command == "smoke":
            return cmd_smoke.run(stack, args.json, out, timeout=args.timeout)
        if args.command == "bench":
            return cmd_bench.run(stack, args.json, out, err, concurrency=args.concurrency, out_dir=args.out,
                                 tokenizer=args.tokenizer, pp=args.pp, tg=args.tg, runs=args.runs,
                                 timeout=args.timeout, extra_args=args.extra_args)  # fmt: skip
        if args.command == "diagnose":
            return cmd_diagnose.run(stack, out, err, runner=runner, out_file=args.out, timeout=args.timeout,
                                    tail=args.tail, up_log=args.up_log, forward=forward)  # fmt: skip
        nodes = Nodes(stack.cfg, stack.plan_name, runner=runner, streamer=streamer, forward=forward)
        if args.command == "status":
            return cmd_status.run(stack, nodes, args.json, out, watch=args.watch, count=args.count, sleep=sleep)
        if args.command == "logs":
            return cmd_logs.run(stack, nodes, out, err, rank=args.rank, follow=args.follow, since=args.since,
                                tail=args.tail, nccl=args.nccl)  # fmt: skip
        if args.command == "doctor":
            return cmd_doctor.run(stack, nodes, args.json, out)
        if args.command == "guard":
            return cmd_guard.run(stack, nodes, args.action, out, as_json=args.json, reason=args.reason,
                                 for_s=args.for_)  # fmt: skip
    except DsparkError as exc:
        err.write(f"dspark {args.command}: {exc}\n")
        return CANNOT_RUN
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
