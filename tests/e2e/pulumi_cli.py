"""The real Pulumi CLI against the simulated cluster: one project directory, one stack, a local
file backend and the passphrase secrets provider, as a user would set them up.

    p = PulumiProject.create(tmp, "sim", engine_dir)     # stack init + secrets, like the README
    p.preview(diff=True, policy_pack=True).text          # what a reviewer reads
    p.up(); p.outputs(); p.refresh(); p.destroy()

Every command is the plain CLI, run in the project folder as a user types it: `pulumi preview --diff
--policy-pack policy`, `pulumi up --yes`, ... The CLI starts the Python language host (the TEST DOUBLE
sim/languagehost, linked next to the CLI by .ci/engine-setup), which runs __main__.py in the project's
virtualenv (`.venv`, the repository's) with the real pulumi-language-python-exec, and the policy pack in
policy/.venv. The docker and command resource plugins on PATH are the TEST DOUBLES in sim/providers, the
only ones the engine can find (automatic plugin downloads are off).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dspark import engine as pulumi_engine
from sim.retarget import retarget
from e2e.timings import TIMINGS

ROOT = Path(__file__).resolve().parents[2]
PASSPHRASE = "e2e-only-passphrase"  # protects a throwaway test stack's secrets, nothing else
POLICY_PACK = "policy"  # the pack (PulumiPolicy.yaml), run by the language host in policy/.venv
EVENT_LOG = {"PULUMI_DEBUG_COMMANDS": "true"}  # what makes preview and up take --event-log (as the Automation API sets)


def engine_dir() -> Path | None:
    """Where .ci/engine-setup put the CLI (it prints the directory on its last line; cached: <1 s)."""
    if os.environ.get("DSPARK_ENGINE_DIR"):
        return Path(os.environ["DSPARK_ENGINE_DIR"])
    proc = subprocess.run(["bash", str(ROOT / ".ci/engine-setup")], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass
class Run:
    """One CLI command: its exit code, its output (stdout then stderr) and how long it took."""

    args: list[str]
    code: int
    text: str
    seconds: float

    def check(self) -> "Run":
        assert self.code == 0, f"`pulumi {' '.join(self.args)}` failed ({self.code}):\n{self.text[-6000:]}"
        return self


class PulumiProject:
    def __init__(self, work_dir: Path, stack: str, engine: Path):
        self.work_dir, self.stack, self.engine = work_dir, stack, engine
        # everything the scenario showed a user: every command's output, and the engine's events of every
        # preview/up (`--event-log`, a file each; this CLI's refresh and destroy take no --event-log)
        self.transcript: list[str] = []
        self.event_logs = 0
        self.env = pulumi_engine.environment(engine, work_dir.parent / "state", work_dir.parent / "pulumi-home",
                                             {"PULUMI_CONFIG_PASSPHRASE": PASSPHRASE}, sim_plugins=True)

    @classmethod
    def create(cls, base: Path, stack: str, engine: Path, secrets: dict[str, str], cluster: str) -> "PulumiProject":
        """A project directory of its own running the checkout's program (dspark.engine.PROJECT_LINKS), its stack
        file the checked-in one moved onto the simulated `cluster` (sim.retarget; the CLI writes to it), the stack
        initialised with the passphrase provider and `secrets` set as secret config."""
        work = base / "project"
        pulumi_engine.link_project(work, ROOT)
        name = f"Pulumi.{stack}.yaml"
        (work / name).write_text(retarget((ROOT / name).read_text(), cluster))
        (base / "state").mkdir()
        p = cls(work, stack, engine)
        p.cli("stack", "init", stack, "--secrets-provider", "passphrase").check()
        for key, value in secrets.items():
            p.cli("config", "set", "--secret", f"deepseek-spark:{key}", stdin=value).check()
        return p

    # ------------------------------------------------------------------ commands

    def cli(self, *args: str, stdin: str | None = None, timeout: float = 900) -> Run:
        """`pulumi <args> --stack <stack> --non-interactive` (flags go before a `--` in args)."""
        flags = ["--non-interactive"] if args[:2] == ("stack", "init") else ["--stack", self.stack, "--non-interactive"]
        cut = args.index("--") if "--" in args else len(args)
        full = [*args[:cut], *flags, *args[cut:]]
        return self._run([str(self.engine / "pulumi"), *full], list(args), stdin, timeout)

    def _run(self, argv: list[str], label: list[str], stdin: str | None, timeout: float,
             env: dict[str, str] | None = None) -> Run:  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.run(argv, cwd=self.work_dir, env={**self.env, **(env or {})}, input=stdin or "",
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        self.transcript.append(proc.stdout + proc.stderr)
        return Run(label, proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0)

    def event_texts(self) -> list[str]:
        """The event log files of the scenario so far, as text."""
        return [f.read_text() for f in sorted(self.work_dir.parent.glob("events*.jsonl"))]

    def _argv(self, op: str, diff: bool = False, policy_pack: bool = False,
              policy_config: Path | None = None) -> list[str]:  # fmt: skip
        """`pulumi preview|up ...` as a user types it in the project folder (up: `--yes --skip-preview`, the preview
        being a command of its own), its events into a log file of its own."""
        self.event_logs += 1
        log = self.work_dir.parent / f"events-{self.event_logs:03d}.jsonl"
        argv = [op, *(["--yes", "--skip-preview"] if op == "up" else []), *(["--diff"] if diff else [])]
        argv += ["--policy-pack", POLICY_PACK] if policy_pack else []
        argv += ["--policy-pack-config", str(policy_config)] if policy_config else []
        return [str(self.engine / "pulumi"), *argv, "--event-log", str(log), "--stack", self.stack, "--non-interactive"]

    def _engine(self, op: str, diff: bool, policy_pack: bool, timeout: float = 900,
                policy_config: Path | None = None, env: dict[str, str] | None = None) -> Run:  # fmt: skip
        argv = self._argv(op, diff, policy_pack, policy_config)
        return self._run(argv, argv[1:argv.index("--event-log")], None, timeout, {**EVENT_LOG, **(env or {})})

    def up_in_background(self) -> subprocess.Popen:
        """`up` left running (to break a node under it); read its output with communicate()."""
        return subprocess.Popen(self._argv("up"), cwd=self.work_dir, env={**self.env, **EVENT_LOG},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip

    def preview(self, diff: bool = True, policy_pack: bool = True, policy_config: Path | None = None) -> Run:
        return self._engine("preview", diff, policy_pack, policy_config=policy_config)

    def up(self, policy_pack: bool = True, diff: bool = False, timeout: float = 900, grpc_log: Path | None = None) -> Run:
        """`up`; with `grpc_log`, the CLI records its gRPC traffic there (PULUMI_DEBUG_GRPC: secrets in plain text)."""
        env = {"PULUMI_DEBUG_GRPC": str(grpc_log)} if grpc_log else None
        return self._engine("up", diff, policy_pack, timeout=timeout, env=env)

    def refresh(self) -> Run:
        return self.cli("refresh", "--yes", "--diff")

    def destroy(self) -> Run:
        return self.cli("destroy", "--yes")

    def set_config(self, path: str, value: str) -> None:
        """`pulumi config set --path deepseek-spark:<path> <value>` (a reviewer's one-line change)."""
        self.cli("config", "set", "--path", f"deepseek-spark:{path}", "--", value).check()

    def outputs(self) -> dict:
        """`pulumi stack output --json --show-secrets`: what `python -m dspark.clients` reads."""
        proc = subprocess.run([str(self.engine / "pulumi"), "stack", "output", "--json", "--show-secrets",
                               "--stack", self.stack], cwd=self.work_dir, env=self.env, capture_output=True,
                              text=True)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def timed(self, label: str, run: Run) -> Run:
        TIMINGS[label] = run.seconds
        return run
