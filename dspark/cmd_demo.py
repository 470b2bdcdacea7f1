"""demo: the main job on the simulated cluster, in one command: `up` through the real Pulumi engine,
then a streamed answer. It leaves the stack running; run it again for a no-op `up`.

1. the simulated cluster (`sim/`): created, or reused when it is already up with the stack's node
   count (sim: 3 nodes, sim-tp2: 2, sim-x2: 4, sim-team: 2);
2. a project-local state folder, `.dspark-demo/` in the project directory: a file backend, the
   Pulumi home, a passphrase file for the stack's secrets (0600), and `project/`, where the engine
   runs: Pulumi.yaml and the stack file copied (the stack's encrypted secrets are written there, so
   the checked-in Pulumi.<stack>.yaml stays as it is; it is copied again on every run, so an edit to
   it is what the next `up` applies), the code linked. The sim itself keeps its ssh key and
   known_hosts under ~/.local/state/deepseek-spark-sim/sim (the stack files point there);
3. the stack, once: `stack init` with the passphrase provider, a generated API key and the sim's
   ssh key as secret config;
4. `pulumi preview --diff`, then `pulumi up`, with the engine's own output as it runs;
5. the endpoint, one streamed answer, and the commands to use it.

`--down`: `pulumi destroy`, `stack rm`, and the simulated cluster deleted (images stay cached).

The CLI is the one .ci/setup built (also linked as .venv/bin/pulumi). The docker and command
plugins it finds are the sim's TEST DOUBLES (sim/providers/bin), put on PATH for the sim stacks
only; `preview`/`up` run __main__.py as an Automation API inline program (dspark/inline.py),
since pulumi-language-python cannot be built here. Ctrl-C is passed to the engine, which stops
cleanly and unlocks the stack. Exit: 0 answered (or torn down), 1 a step failed.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

from . import inline
from .stack import DsparkError

ROOT = Path(__file__).resolve().parents[1]
SIM_STACKS = {"sim": 3, "sim-tp2": 2, "sim-x2": 4, "sim-team": 2}  # stack -> nodes of the simulated cluster
CLUSTER = "sim"  # the cluster every sim stack file points at (its ssh key and known_hosts)
STATE = ".dspark-demo"
LINKED = ("__main__.py", "declared", "planning", "components", "programs", "dspark", "policy", "sim")  # the code the engine runs, linked
KEPT = ("encryptionsalt",)  # what the copied stack file keeps from the last run: its secrets' salt...
SECRETS = ("deepseek-spark:apiKey", "deepseek-spark:sshPrivateKey")  # ...and the secrets
ENGINE_VERSION = "v3.274.1"  # .ci/engine-setup's PULUMI_VERSION


def engine_dir() -> Path:
    """Where .ci/engine-setup put the Pulumi CLI."""
    if os.environ.get("DSPARK_ENGINE_DIR"):
        return Path(os.environ["DSPARK_ENGINE_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    found = cache / "deepseek-spark" / "engine" / f"pulumi-{ENGINE_VERSION}" / "bin"
    if not (found / "pulumi").exists():
        raise DsparkError(f"no Pulumi CLI at {found}: run `bash .ci/setup` first (it builds the CLI)")
    return found


def environment(project: Path, stack: str, engine: Path) -> dict[str, str]:
    """The CLI's environment: the project-local backend, Pulumi home and passphrase file."""
    state = project / STATE
    return inline.environment(engine, state / "backend", state / "pulumi-home",
                              {"PULUMI_CONFIG_PASSPHRASE_FILE": str(state / "passphrase")}, stack in SIM_STACKS)


class Demo:
    def __init__(self, project: Path, stack: str, out: TextIO, err: TextIO):
        if stack not in SIM_STACKS:
            raise DsparkError(f"demo runs the simulated stacks only ({', '.join(SIM_STACKS)}), not {stack!r}")
        self.project, self.stack, self.out, self.err = project, stack, out, err
        self.work = project / STATE / "project"  # where the engine runs (stack file copied, code linked)
        self.engine = engine_dir()
        self.env = environment(project, stack, self.engine)

    def say(self, msg: str) -> None:
        self.out.write(f"==> {msg}\n")
        self.out.flush()

    # ---------------------------------------------------------------- running the engine
    def stream(self, argv: list[str], stdin: str | None = None) -> int:
        """Run `argv`, its output passed through as it comes; Ctrl-C goes to the whole process group
        (the CLI cancels cleanly and unlocks the stack) and this waits for it to finish."""
        proc = subprocess.Popen(argv, cwd=self.work, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.PIPE if stdin is not None else None,
                                text=True, start_new_session=True)  # fmt: skip
        if stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.close()
        while True:
            try:
                for line in proc.stdout:
                    self.out.write(line)
                    self.out.flush()
                return proc.wait()
            except KeyboardInterrupt:
                self.err.write("\n==> interrupted: passing it to the Pulumi engine and waiting for it to stop\n")
                os.killpg(proc.pid, signal.SIGINT)

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.engine / "pulumi"), *args, "--non-interactive"], cwd=self.work,
                              env=self.env, input=stdin, capture_output=True, text=True)  # fmt: skip

    def inline(self, op: str, *extra: str) -> int:
        return self.stream([sys.executable, "-m", "dspark.inline", op, "--stack", self.stack,
                            "--work-dir", str(self.work), "--policy-pack", "policy/analyzer", *extra])  # fmt: skip

    # ---------------------------------------------------------------- steps
    def cluster(self) -> None:
        from sim import cluster as sim_cluster

        nodes = SIM_STACKS[self.stack]
        self.say(f"simulated cluster {CLUSTER!r} with {nodes} nodes (created once; images cached by .ci/setup)")
        try:
            sim_cluster.create(CLUSTER, nodes=nodes, log=lambda m: self.out.write(f"    {m}\n"))
        except sim_cluster.SimError as exc:
            raise DsparkError(f"{exc}; if another demo stack runs there, take it down first: "
                              "`.venv/bin/python -m dspark demo --down --stack <that stack>`") from None

    def state(self) -> None:
        state = self.project / STATE
        (state / "backend").mkdir(parents=True, exist_ok=True)
        (state / "pulumi-home").mkdir(exist_ok=True)
        passphrase = state / "passphrase"
        if not passphrase.exists():
            passphrase.write_text(secrets.token_urlsafe(24) + "\n")
            passphrase.chmod(0o600)
        self.work.mkdir(exist_ok=True)
        for name in LINKED:
            if not (self.work / name).is_symlink():
                (self.work / name).symlink_to(self.project / name)
        (self.work / "Pulumi.yaml").write_bytes((self.project / "Pulumi.yaml").read_bytes())
        self.sync_stack_file()
        self.say(f"state in ./{STATE} (file backend, Pulumi home, passphrase file; nothing in your home "
                 "but the sim's ssh key under ~/.local/state/deepseek-spark-sim)")

    def sync_stack_file(self) -> None:
        """The checked-in stack file, plus the secrets the last run put into its copy."""
        import yaml

        name = f"Pulumi.{self.stack}.yaml"
        fresh = yaml.safe_load((self.project / name).read_text())
        copy = self.work / name
        old = yaml.safe_load(copy.read_text()) if copy.exists() else {}
        for key in KEPT:
            if key in old:
                fresh[key] = old[key]
        for key in SECRETS:
            if key in (old.get("config") or {}):
                fresh.setdefault("config", {})[key] = old["config"][key]
        copy.write_text(yaml.safe_dump(fresh, sort_keys=False))

    def stack_init(self) -> None:
        if self.cli("stack", "select", self.stack).returncode == 0:
            self.say(f"stack {self.stack}: exists (re-running `up`: nothing should change)")
            return
        self.say(f"stack {self.stack}: init with the passphrase secrets provider, a generated API key and the sim's ssh key")
        for args, stdin in (
            (("stack", "init", self.stack, "--secrets-provider", "passphrase"), None),
            (("config", "set", "--secret", "deepseek-spark:apiKey", "--stack", self.stack), "sk-" + secrets.token_hex(24)),
            (("config", "set", "--secret", "deepseek-spark:sshPrivateKey", "--stack", self.stack),
             (Path.home() / ".local/state/deepseek-spark-sim" / CLUSTER / "id_ed25519").read_text()),
        ):  # fmt: skip
            r = self.cli(*args, stdin=stdin)
            if r.returncode != 0:
                raise DsparkError(f"`pulumi {' '.join(args[:2])}` failed: {r.stderr.strip()}")

    def answer(self) -> int:
        r = self.cli("stack", "output", "--json", "--show-secrets", "--stack", self.stack)
        if r.returncode != 0:
            raise DsparkError(f"`pulumi stack output` failed: {r.stderr.strip()}")
        outputs = json.loads(r.stdout)
        cc = outputs["client_config"]
        self.say(f"endpoint {outputs['endpoint']} (model {cc['model']}); one streamed answer:")
        import openai

        client = openai.OpenAI(base_url=cc["base_url"], api_key=cc["api_key"], timeout=60)
        t0 = time.monotonic()
        stream = client.chat.completions.create(model=cc["model"], stream=True, max_tokens=32,
                                                messages=[{"role": "user", "content": "What is 19 + 23?"}])  # fmt: skip
        self.out.write("    ")
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                self.out.write(chunk.choices[0].delta.content)
                self.out.flush()
        self.out.write(f"\n    ({time.monotonic() - t0:.1f} s)\n")
        # from the project directory, as the other commands below
        env = f"PULUMI_BACKEND_URL=file://$PWD/{STATE}/backend PULUMI_CONFIG_PASSPHRASE_FILE=$PWD/{STATE}/passphrase"
        self.say("the stack stays up. Use it:")
        for line in (
            f"export {env} PATH=$PWD/.venv/bin:$PATH   # this demo's backend and CLI",
            f"pulumi stack output --stack {self.stack} --json --show-secrets client_config",
            f".venv/bin/python -m dspark.clients --stack {self.stack} --format openai-env   # an .env for OpenAI SDKs",
            *([f".venv/bin/python -m dspark.clients --stack {self.stack} --member alice --format openai-env   "
               "# alice's own key, through the gateway"] if self.stack == "sim-team" else []),
            f".venv/bin/python -m dspark status --stack {self.stack}" + (" --group a" if self.stack == "sim-x2" else ""),
            f".venv/bin/python -m dspark logs --stack {self.stack} --tail 20" + (" --group a" if self.stack == "sim-x2" else ""),
            f".venv/bin/python -m dspark smoke --stack {self.stack}",
            f".venv/bin/python -m dspark demo --down --stack {self.stack}   # destroy it and delete the sim",
        ):  # fmt: skip
            self.out.write(f"    {line}\n")
        return 0

    def up(self) -> int:
        self.state()
        self.cluster()
        self.stack_init()
        self.say(f"pulumi preview --diff --stack {self.stack}")
        if self.inline("preview", "--diff") != 0:
            self.err.write("==> preview failed (above)\n")
            return 1
        self.say(f"pulumi up --stack {self.stack} (the first boot of a group takes ~20 s on the sim)")
        if self.inline("up") != 0:
            self.err.write("==> up failed (above); fix it and run the demo again\n")
            return 1
        return self.answer()

    def down(self) -> int:
        from sim import cluster as sim_cluster

        self.state()
        if self.cli("stack", "select", self.stack).returncode == 0:
            self.say(f"pulumi destroy --stack {self.stack}")
            if self.stream([str(self.engine / "pulumi"), "destroy", "--yes", "--stack", self.stack,
                            "--non-interactive"]) != 0:  # fmt: skip
                self.err.write("==> destroy failed (above); the sim is left as it is\n")
                return 1
            # --preserve-config: `stack rm` would delete Pulumi.<stack>.yaml, the checked-in stack file
            self.cli("stack", "rm", "--yes", "--preserve-config", self.stack)
        self.say(f"deleting the simulated cluster {CLUSTER!r} (images and the nodes' engines stay cached: "
                 f"`python -m sim delete --name {CLUSTER} --purge` removes those too)")
        sim_cluster.delete(CLUSTER, log=lambda m: self.out.write(f"    {m}\n"))
        return 0


def run(project_dir: str, stack: str, down: bool, out: TextIO, err: TextIO) -> int:
    demo = Demo(Path(project_dir).resolve(), stack, out, err)
    return demo.down() if down else demo.up()
