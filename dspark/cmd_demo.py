"""demo: the main job on the simulated cluster, in one command: `up` through the real Pulumi engine,
then a streamed answer. It leaves the stack running; run it again for a no-op `up`.

1. a simulated cluster of the demo's own (`sim/`), `<stack>-demo` on a subnet of its own (sim.cluster.SUBNETS):
   created, or reused when it is already up (sim: 3 nodes, sim-tp2: 2, sim-x2: 4, sim-team: 2). Each demo
   stack has its own, so several run side by side, and the tests (on clusters of their own) never touch them;
2. a project-local state folder, `.dspark-demo/` (git-ignored): a file backend, the Pulumi home, a
   passphrase file for the stack's secrets (0600), `env`, what a shell sources to use them, and `project/`,
   the demo's own project folder: the checkout's program linked (Pulumi.yaml, the code, `.venv`) beside the
   demo's stack files, so that no glob of the checkout's stacks takes them;
3. the demo's own stack, `<stack>-demo`, once: its stack file `project/Pulumi.<stack>-demo.yaml` is the
   checked-in `Pulumi.<stack>.yaml` moved onto the demo's cluster (its addresses and ssh state: sim.retarget),
   and holds the demo's encrypted secrets and salt, so the checked-in file is never written; `stack init` with
   the passphrase provider, a generated API key and the cluster's ssh key as secret config. From then on it is
   yours: `pulumi config set --stack <stack>-demo` changes it, a re-run of the demo applies it as it is;
4. `pulumi preview --diff --policy-pack policy`, then `pulumi up`, in the demo's project folder, with the
   engine's own output as it runs;
5. the endpoint, one streamed answer, and the commands to use it, each of which works as printed once
   the first of them (`cd .dspark-demo/project && source ../env`) ran.

`--down`: `pulumi destroy`, `stack rm` (its stack file with it), and the demo's simulated cluster deleted
(images stay cached); nothing of another demo stack.

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
from typing import Optional, TextIO

from . import engine as pulumi_engine
from .stack import DsparkError

SIM_STACKS = {"sim": 3, "sim-tp2": 2, "sim-x2": 4, "sim-team": 2}  # stack -> nodes of the simulated cluster
STATE = ".dspark-demo"
PROJECT = f"{STATE}/project"  # the demo's own project folder (its stack files beside the checkout's program, linked)
SUFFIX = "-demo"  # the demo's own stack: <stack>-demo, its file <PROJECT>/Pulumi.<stack>-demo.yaml


def demo_stack(stack: str) -> str:
    return stack + SUFFIX


def environment(project: Path, stack: str, engine: Path) -> dict[str, str]:
    """The CLI's environment: the project-local backend, Pulumi home and passphrase file."""
    state = project / STATE
    return pulumi_engine.environment(engine, state / "backend", state / "pulumi-home",
                                     {"PULUMI_CONFIG_PASSPHRASE_FILE": str(state / "passphrase")}, stack in SIM_STACKS)


def env_file() -> str:
    """`.dspark-demo/env`, for a shell: the demo's backend, home and passphrase, the CLI (.venv/bin/pulumi) and the
    sim's plugin doubles on PATH, found from the file's own place (it works sourced from any folder)."""
    return "\n".join([
        "# source me: the demo's backend and secrets, the Pulumi CLI, the sim's plugin doubles",
        'DSPARK_DEMO="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"',
        'export PULUMI_BACKEND_URL="file://$DSPARK_DEMO/backend"',
        'export PULUMI_HOME="$DSPARK_DEMO/pulumi-home"',
        'export PULUMI_CONFIG_PASSPHRASE_FILE="$DSPARK_DEMO/passphrase"',
        "export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true PULUMI_SKIP_UPDATE_CHECK=true",
        'export PATH="$DSPARK_DEMO/project/.venv/bin:$DSPARK_DEMO/project/sim/providers/bin:$PATH"',
        "",
    ])


def checkout_of(project_dir: Path) -> Path:
    """The checkout a demo command is about: `project_dir`, or the checkout whose demo folder it is (the printed
    commands run in `.dspark-demo/project`, `demo --down` among them)."""
    if project_dir.name == "project" and project_dir.parent.name == STATE:
        return project_dir.parent.parent
    return project_dir


class Demo:
    def __init__(self, checkout: Path, stack: str, out: TextIO, err: TextIO, cluster: Optional[str] = None):
        if stack not in SIM_STACKS:
            raise DsparkError(f"demo runs the simulated stacks only ({', '.join(SIM_STACKS)}), not {stack!r}")
        self.checkout, self.source, self.out, self.err = checkout, stack, out, err
        self.stack = demo_stack(stack)
        self.cluster_name = cluster or self.stack  # its own simulated cluster (the tests pass theirs)
        self.project = checkout / PROJECT
        try:
            self.engine = pulumi_engine.engine_dir()
        except pulumi_engine.EngineMissing as exc:
            raise DsparkError(str(exc)) from None
        self.env = environment(checkout, stack, self.engine)

    def say(self, msg: str) -> None:
        self.out.write(f"==> {msg}\n")
        self.out.flush()

    # ---------------------------------------------------------------- running the engine
    def pulumi(self, *args: str) -> int:
        """`pulumi <args> --stack <the demo's>` in the demo's project folder, its output as it comes (Ctrl-C passed
        on)."""
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
        p = sim_cluster.plan(self.cluster_name, nodes)
        self.say(f"simulated cluster {self.cluster_name!r}: {nodes} nodes on {p.subnet}, the demo's own (created once; "
                 "images cached by .ci/setup)")
        try:
            sim_cluster.create(self.cluster_name, nodes=nodes, log=lambda m: self.out.write(f"    {m}\n"))
        except SimError as exc:
            raise DsparkError(f"{exc}; `.venv/bin/python -m dspark demo --down --stack {self.source}` removes the "
                              "demo's cluster") from None

    def state(self) -> None:
        state = self.checkout / STATE
        (state / "backend").mkdir(parents=True, exist_ok=True)
        (state / "pulumi-home").mkdir(exist_ok=True)
        passphrase = state / "passphrase"
        if not passphrase.exists():
            passphrase.write_text(secrets.token_urlsafe(24) + "\n")
            passphrase.chmod(0o600)
        (state / "env").write_text(env_file())
        pulumi_engine.link_project(self.project, self.checkout)
        self.say(f"state in ./{STATE} (file backend, Pulumi home, passphrase file, `env`, and `project/`: the "
                 "checkout's program linked beside the demo's stack files; nothing in your home but the sim's ssh "
                 "key under ~/.local/state/deepseek-spark-sim)")  # fmt: skip

    def stack_init(self) -> None:
        left = self.checkout / f"Pulumi.{self.stack}.yaml"
        if left.exists():  # an earlier demo kept its stack file beside the checked-in ones, on the cluster `sim`
            raise DsparkError(f"{left.name} in the project folder is an earlier demo's stack (on the cluster 'sim'): "
                              f"`source {STATE}/env && pulumi destroy --yes --stack {self.stack} && pulumi stack rm "
                              f"--yes {self.stack}` in the project folder, `.venv/bin/python -m sim delete --name sim`, "
                              "then run the demo again")  # fmt: skip
        if self.cli("stack", "select", self.stack).returncode == 0:
            self.say(f"stack {self.stack}: exists (re-running `up`: nothing should change)")
            return
        from sim.inventory import state_dir
        from sim.retarget import retarget

        own = self.project / f"Pulumi.{self.stack}.yaml"
        own.write_text(f"# `dspark demo`'s own stack: Pulumi.{self.source}.yaml of the checkout, on the demo's "
                       f"simulated cluster {self.cluster_name!r}; it holds the demo's secrets and salt.\n# Yours to "
                       f"change (pulumi config set --stack {self.stack}); `dspark demo --down --stack {self.source}` "
                       "removes it.\n"
                       + retarget((self.checkout / f"Pulumi.{self.source}.yaml").read_text(), self.cluster_name))
        self.say(f"stack {self.stack}: {PROJECT}/{own.name} made from Pulumi.{self.source}.yaml on the cluster "
                 f"{self.cluster_name!r} (the checked-in file is never written); init with the passphrase secrets "
                 "provider, a generated API key and the cluster's ssh key")  # fmt: skip
        for args, stdin in (
            (("stack", "init", self.stack, "--secrets-provider", "passphrase"), None),
            (("config", "set", "--secret", "deepseek-spark:apiKey", "--stack", self.stack), "sk-" + secrets.token_hex(24)),
            (("config", "set", "--secret", "deepseek-spark:sshPrivateKey", "--stack", self.stack),
             (state_dir(self.cluster_name) / "id_ed25519").read_text()),
        ):  # fmt: skip
            r = self.cli(*args, stdin=stdin)
            if r.returncode != 0:
                raise DsparkError(f"`pulumi {' '.join(args[:2])}` failed: {r.stderr.strip()}")

    def answer(self) -> int:
        r = self.cli("stack", "output", "--json", "--show-secrets", "--stack", self.stack)
        if r.returncode != 0:
            raise DsparkError(f"`pulumi stack output` failed: {r.stderr.strip()}")
        outputs = json.loads(r.stdout)
        cc = outputs.get("client_config") or outputs["admin_config"]  # a gateway stack's: the admin's
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
        self.say("the stack stays up. Use it:")
        own = "" if self.cluster_name == self.stack else f" --cluster {self.cluster_name}"
        for line in printed_commands(self.source, self.stack, group, own):
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
        self.say(f"deleting the demo's simulated cluster {self.cluster_name!r} (images and the nodes' engines stay "
                 f"cached: `python -m sim delete --name {self.cluster_name} --purge` removes those too)")
        sim_cluster.delete(self.cluster_name, log=lambda m: self.out.write(f"    {m}\n"))
        return 0


def printed_commands(source: str, stack: str, group: str, cluster: str = "") -> list[str]:
    """What the demo prints to use the stack: the first from the checkout, then each in the demo's project folder as
    printed (a test runs them). `cluster`: ` --cluster <name>` when the demo ran on a cluster not its own."""
    team = source == "sim-team"  # a gateway stack: its clients are its members (no client_config)
    return [
        f"cd {PROJECT} && source ../env   # the demo's project folder; its backend, secrets, CLI and plugins",
        f"pulumi stack output --stack {stack} --json --show-secrets {'member_configs' if team else 'client_config'}",
        *([f".venv/bin/python -m dspark.clients --stack {stack} --member alice --format openai-env   "
           "# alice's own key, through the gateway"] if team else
          [f".venv/bin/python -m dspark.clients --stack {stack} --format openai-env   # an .env for OpenAI SDKs"]),
        f".venv/bin/python -m dspark status --stack {stack}{group}",
        f".venv/bin/python -m dspark logs --stack {stack}{group} --tail 20",
        f".venv/bin/python -m dspark smoke --stack {stack}{group}",
        f"pulumi preview --diff --stack {stack}   # after a change: pulumi config set --path deepseek-spark:cluster.<field> <value> --stack {stack}",
        f"pulumi up --stack {stack}",
        f".venv/bin/python -m dspark demo --down --stack {source}{cluster}   # destroy it and delete the demo's cluster",
    ]  # fmt: skip


def run(project_dir: str, stack: str, down: bool, out: TextIO, err: TextIO, cluster: Optional[str] = None) -> int:
    demo = Demo(checkout_of(Path(project_dir).resolve()), stack, out, err, cluster)
    return demo.down() if down else demo.up()
