"""demo: the main job on the simulated cluster, in one command: `up` through the real Pulumi engine,
then a streamed answer. It leaves the stack running; run it again for a no-op `up`.

1. the simulated cluster (`sim/`): created, or reused when it is already up with the stack's node
   count (sim: 3 nodes, sim-tp2: 2, sim-x2: 4, sim-team: 2);
2. a project-local state folder, `.dspark-demo/` (git-ignored): a file backend, the Pulumi home, a
   passphrase file for the stack's secrets (0600), and `env`, what a shell sources to use them;
3. the demo's own stack, `<stack>-demo`, once: its stack file `Pulumi.<stack>-demo.yaml` (git-ignored) is
   a copy of the checked-in `Pulumi.<stack>.yaml`, and holds the demo's encrypted secrets and salt, so
   the checked-in file is never written; `stack init` with the passphrase provider, a generated API
   key and the sim's ssh key as secret config. From then on it is yours: `pulumi config set --stack
   <stack>-demo` changes it, a re-run of the demo applies it as it is;
4. `pulumi preview --diff --policy-pack policy`, then `pulumi up`, in the project folder, with the
   engine's own output as it runs;
5. the endpoint, one streamed answer, and the commands to use it, each of which works as printed from
   the project folder once `.dspark-demo/env` is sourced.

`--down`: `pulumi destroy`, `stack rm` (its stack file with it), and the simulated cluster deleted
(images stay cached).

The CLI is the one .ci/setup built (also linked as .venv/bin/pulumi); it runs __main__.py through the
Python language host, as a user's `pulumi up` does (dspark/engine.py). The docker and command plugins
it finds are the sim's TEST DOUBLES (sim/providers/bin), put on PATH for the sim stacks only. Ctrl-C
is passed to the engine, which stops cleanly and unlocks the stack. Exit: 0 answered (or torn down),
1 a step failed.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path
from typing import TextIO

from . import engine as pulumi_engine
from .stack import DsparkError

SIM_STACKS = {"sim": 3, "sim-tp2": 2, "sim-x2": 4, "sim-team": 2}  # stack -> nodes of the simulated cluster
CLUSTER = "sim"  # the cluster every sim stack file points at (its ssh key and known_hosts)
STATE = ".dspark-demo"
SUFFIX = "-demo"  # the demo's own stack: <stack>-demo, its file Pulumi.<stack>-demo.yaml (git-ignored)


def demo_stack(stack: str) -> str:
    return stack + SUFFIX


def environment(project: Path, stack: str, engine: Path) -> dict[str, str]:
    """The CLI's environment: the project-local backend, Pulumi home and passphrase file."""
    state = project / STATE
    return pulumi_engine.environment(engine, state / "backend", state / "pulumi-home",
                                     {"PULUMI_CONFIG_PASSPHRASE_FILE": str(state / "passphrase")}, stack in SIM_STACKS)


def env_file() -> str:
    """`.dspark-demo/env`, for a shell in the project folder: the demo's backend, home and passphrase, the CLI
    (.venv/bin/pulumi) and the sim's plugin doubles on PATH (relative to the project folder, where every printed
    command runs)."""
    return "\n".join([
        "# source me from the project folder: the demo's backend and secrets, the Pulumi CLI, the sim's plugin doubles",
        f'export PULUMI_BACKEND_URL="file://$PWD/{STATE}/backend"',
        f'export PULUMI_HOME="$PWD/{STATE}/pulumi-home"',
        f'export PULUMI_CONFIG_PASSPHRASE_FILE="$PWD/{STATE}/passphrase"',
        "export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true PULUMI_SKIP_UPDATE_CHECK=true",
        'export PATH="$PWD/.venv/bin:$PWD/sim/providers/bin:$PATH"',
        "",
    ])


class Demo:
    def __init__(self, project: Path, stack: str, out: TextIO, err: TextIO):
        if stack not in SIM_STACKS:
            raise DsparkError(f"demo runs the simulated stacks only ({', '.join(SIM_STACKS)}), not {stack!r}")
        self.project, self.source, self.out, self.err = project, stack, out, err
        self.stack = demo_stack(stack)
        try:
            self.engine = pulumi_engine.engine_dir()
        except pulumi_engine.EngineMissing as exc:
            raise DsparkError(str(exc)) from None
        self.env = environment(project, stack, self.engine)

    def say(self, msg: str) -> None:
        self.out.write(f"==> {msg}\n")
        self.out.flush()

    # ---------------------------------------------------------------- running the engine
    def pulumi(self, *args: str) -> int:
        """`pulumi <args> --stack <the demo's>` in the project folder, its output as it comes (Ctrl-C passed on)."""
        return pulumi_engine.stream([str(self.engine / "pulumi"), *args, "--stack", self.stack], self.project,
                                    self.env, self.out, self.err)  # fmt: skip

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.engine / "pulumi"), *args, "--non-interactive"], cwd=self.project,
                              env=self.env, input=stdin, capture_output=True, text=True)  # fmt: skip

    # ---------------------------------------------------------------- steps
    def cluster(self) -> None:
        from sim import cluster as sim_cluster
        from sim.inventory import SimError

        nodes = SIM_STACKS[self.source]
        self.say(f"simulated cluster {CLUSTER!r} with {nodes} nodes (created once; images cached by .ci/setup)")
        try:
            sim_cluster.create(CLUSTER, nodes=nodes, log=lambda m: self.out.write(f"    {m}\n"))
        except SimError as exc:
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
        (state / "env").write_text(env_file())
        self.say(f"state in ./{STATE} (file backend, Pulumi home, passphrase file, `env`; nothing in your home "
                 "but the sim's ssh key under ~/.local/state/deepseek-spark-sim)")

    def stack_init(self) -> None:
        if self.cli("stack", "select", self.stack).returncode == 0:
            self.say(f"stack {self.stack}: exists (re-running `up`: nothing should change)")
            return
        own = self.project / f"Pulumi.{self.stack}.yaml"
        own.write_text(f"# `dspark demo`'s own stack (git-ignored): made from Pulumi.{self.source}.yaml, it holds the "
                       "demo's secrets and salt.\n# Yours to change (pulumi config set --stack "
                       f"{self.stack}); `dspark demo --down --stack {self.source}` removes it.\n"
                       + (self.project / f"Pulumi.{self.source}.yaml").read_text())  # fmt: skip
        self.say(f"stack {self.stack}: Pulumi.{self.stack}.yaml made from Pulumi.{self.source}.yaml (git-ignored; "
                 "the checked-in file is never written); init with the passphrase secrets provider, a generated API "
                 "key and the sim's ssh key")  # fmt: skip
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
        group = " --group a" if self.source == "sim-x2" else ""
        self.say("the stack stays up. Use it, from the project folder:")
        for line in printed_commands(self.source, self.stack, group):
            self.out.write(f"    {line}\n")
        return 0

    def up(self) -> int:
        self.state()
        self.cluster()
        self.stack_init()
        preview = ("preview", "--diff", "--policy-pack", "policy")
        self.say(f"pulumi {' '.join(preview)} --stack {self.stack}")
        if self.pulumi(*preview) != 0:
            self.err.write("==> preview failed (above)\n")
            return 1
        up = ("up", "--yes", "--skip-preview", "--policy-pack", "policy")
        self.say(f"pulumi {' '.join(up)} --stack {self.stack} (the first boot of a group takes ~20 s on the sim)")
        if self.pulumi(*up) != 0:
            self.err.write("==> up failed (above); fix it and run the demo again\n")
            return 1
        return self.answer()

    def down(self) -> int:
        from sim import cluster as sim_cluster

        self.state()
        if self.cli("stack", "select", self.stack).returncode == 0:
            self.say(f"pulumi destroy --yes --stack {self.stack}")
            if self.pulumi("destroy", "--yes", "--non-interactive") != 0:
                self.err.write("==> destroy failed (above); the sim is left as it is\n")
                return 1
            self.cli("stack", "rm", "--yes", self.stack)  # and its stack file, the demo's own (never a checked-in one)
        self.say(f"deleting the simulated cluster {CLUSTER!r} (images and the nodes' engines stay cached: "
                 f"`python -m sim delete --name {CLUSTER} --purge` removes those too)")
        sim_cluster.delete(CLUSTER, log=lambda m: self.out.write(f"    {m}\n"))
        return 0


def printed_commands(source: str, stack: str, group: str) -> list[str]:
    """What the demo prints to use the stack: each works as printed from the project folder (a test runs them)."""
    return [
        f"source {STATE}/env   # this demo's backend, secrets, CLI and plugin doubles",
        f"pulumi stack output --stack {stack} --json --show-secrets client_config",
        f".venv/bin/python -m dspark.clients --stack {stack} --format openai-env   # an .env for OpenAI SDKs",
        *([f".venv/bin/python -m dspark.clients --stack {stack} --member alice --format openai-env   "
           "# alice's own key, through the gateway"] if source == "sim-team" else []),
        f".venv/bin/python -m dspark status --stack {stack}{group}",
        f".venv/bin/python -m dspark logs --stack {stack}{group} --tail 20",
        f".venv/bin/python -m dspark smoke --stack {stack}{group}",
        f"pulumi preview --diff --stack {stack}   # after a change: pulumi config set --path deepseek-spark:cluster.<field> <value> --stack {stack}",
        f"pulumi up --stack {stack}",
        f".venv/bin/python -m dspark demo --down --stack {source}   # destroy it and delete the sim",
    ]  # fmt: skip


def run(project_dir: str, stack: str, down: bool, out: TextIO, err: TextIO) -> int:
    demo = Demo(Path(project_dir).resolve(), stack, out, err)
    return demo.down() if down else demo.up()
