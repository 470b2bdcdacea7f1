"""`pulumi preview|up` of a stack, with __main__.py run as an Automation API inline program.

    python -m dspark.inline preview|up --stack sim --work-dir DIR [--diff] [--policy-pack policy] [--event-log F]

`dspark demo` and the e2e tier run `preview`/`up` through it; everything else is the plain Pulumi
CLI. Only the program's execution differs from a user's `pulumi up --stack sim`: the CLI would start pulumi-language-python, which cannot be built
here (the module proxy refuses its module), so the CLI connects to the Automation API's in-process
language server instead (`--client`) and the program runs in this process. The CLI's own output
(the rendered preview a reviewer reads, the update's summary) is passed through unchanged on
stdout. Exit code: the CLI's.

SIGINT/SIGTERM: this process keeps waiting for the CLI (its caller signals the whole process group,
so the CLI gets the signal itself, cancels the update cleanly and unlocks the stack); exiting here
first would leave the CLI running with the stack locked.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import runpy
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIM_PLUGINS = ROOT / "sim/providers/bin"  # the docker and command plugin TEST DOUBLES


def environment(engine: Path, backend: Path, pulumi_home: Path, passphrase: dict[str, str],
                sim_plugins: bool) -> dict[str, str]:  # fmt: skip
    """The Pulumi CLI's environment for a local file backend: the built CLI first on PATH (then the
    sim's plugin test doubles, for the sim stacks only), no plugin downloads, no prompts.
    `passphrase`: PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE."""
    path = [str(engine)] + ([str(SIM_PLUGINS)] if sim_plugins else [])
    return {
        **os.environ,
        "PATH": os.pathsep.join([*path, os.environ.get("PATH", "")]),
        "PULUMI_HOME": str(pulumi_home),
        "PULUMI_BACKEND_URL": backend.as_uri(),
        **passphrase,
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_SKIP_CONFIRMATIONS": "true",
        "DSPARK_ENGINE_DIR": str(engine),
        "DSPARK_PYTHON": sys.executable,
        "NO_COLOR": "1",
    }


def plain(value):
    """An Automation API event (nested objects) as JSON-able data, every field kept."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "__dict__"):
        return {k: plain(v) for k, v in vars(value).items() if v is not None}
    return value


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("op", choices=["preview", "up"])
    ap.add_argument("--stack", required=True)
    ap.add_argument("--work-dir", required=True, help="the project directory (Pulumi.yaml, Pulumi.<stack>.yaml)")
    ap.add_argument("--diff", action="store_true")
    ap.add_argument("--policy-pack", action="append", default=[])
    ap.add_argument("--policy-pack-config", action="append", default=[])
    ap.add_argument("--event-log", help="append the engine's events here, one JSON object per line")
    args = ap.parse_args()
    for sig in (signal.SIGINT, signal.SIGTERM):  # a handler, not SIG_IGN: the CLI must not inherit "ignore"
        signal.signal(sig, lambda *_: print("deepseek-spark: signal received; waiting for the Pulumi CLI to stop",
                                            file=sys.stderr, flush=True))

    sys.path.insert(0, str(ROOT))
    from pulumi import automation as auto

    work_dir = Path(args.work_dir).resolve()

    def program() -> None:
        # As the language host would run it: from the project directory, as __main__.
        os.chdir(work_dir)
        runpy.run_path(str(work_dir / "__main__.py"), run_name="__main__")

    cli = auto.PulumiCommand(root=str(Path(os.environ["DSPARK_ENGINE_DIR"]).parent))
    ws = auto.LocalWorkspace(work_dir=str(work_dir), program=program, pulumi_command=cli)
    stack = auto.Stack.select(args.stack, ws)
    common = dict(on_output=lambda line: print(line, end="" if line.endswith("\n") else "\n", flush=True),
                  color="never", policy_packs=args.policy_pack or None, diff=args.diff or None,
                  policy_pack_configs=args.policy_pack_config or None)  # fmt: skip
    if args.event_log:
        log = open(args.event_log, "a")
        common["on_event"] = lambda event: (log.write(json.dumps(plain(event), default=str) + "\n"), log.flush())
    try:
        if args.op == "preview":
            stack.preview(**common)
        else:
            stack.up(**common)
    except auto.CommandError as exc:
        # The CLI's output already went to stdout line by line; the exception repeats stderr.
        print(str(exc).split("stderr:", 1)[-1].strip(), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
