"""`python -m dspark demo`, the README's main-job command, end to end on a copy of the project: the simulated
cluster up through the real engine (the CLI's own path: `pulumi preview --diff --policy-pack policy` and
`pulumi up` in the project folder, the language host running __main__.py) and a streamed answer; a re-run is a
no-op `up`; then a newcomer's session: every command the demo printed, and every fix `dspark` advised on the
way, run as printed from the project folder; `--down` leaves no container, network or stack behind, and the
checked-in stack file was never written."""

import os
import re
import subprocess
import sys
import time

import pytest

from e2e.conftest import CLUSTER, require, require_room
from e2e.pulumi_cli import ROOT
from e2e.timings import TIMINGS

from declared.stackfiles import project_stacks
from dspark import cmd_demo
from dspark import engine as pulumi_engine

STACK = "sim-demo"  # the demo's own stack (.dspark-demo/project/Pulumi.sim-demo.yaml)
ON = ("--cluster", CLUSTER)  # the demo on the tier's own cluster: a user's demo (on `sim-demo`) runs on untouched


def _project(tmp_path):
    """A checkout: the project's code linked, its checked-in sim stack file copied."""
    work = tmp_path / "checkout"
    pulumi_engine.link_project(work, ROOT)
    (work / "Pulumi.sim.yaml").write_bytes((ROOT / "Pulumi.sim.yaml").read_bytes())
    return work


def _clean_env(engine) -> dict[str, str]:
    """A newcomer's shell: none of the Pulumi settings the tests use, the CLI where .ci/setup put it."""
    env = {**os.environ, "DSPARK_ENGINE_DIR": str(engine), "PYTHONPATH": str(ROOT)}
    for k in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE", "PULUMI_HOME",
              "PULUMI_SKIP_CONFIRMATIONS"):
        env.pop(k, None)
    return env


def _demo(work, engine, *args, label):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dspark", "demo", "--project-dir", str(work), *ON, *args],
                          cwd=work, env=_clean_env(engine), capture_output=True, text=True, timeout=900)  # fmt: skip
    TIMINGS[label] = time.monotonic() - t0
    return proc.returncode, proc.stdout + proc.stderr


def _cluster_containers():
    out = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    return [n for n in out.split() if n.startswith(f"{CLUSTER}-")]


class Shell:
    """The newcomer's shell in the checkout: the demo's first printed line (`cd .dspark-demo/project && source
    ../env`), then each command as printed. A confirmation Pulumi would ask in a terminal is answered yes
    (PULUMI_SKIP_CONFIRMATIONS: what the person typing does)."""

    def __init__(self, work, engine, first: str):
        self.work, self.env = work, {**_clean_env(engine), "PULUMI_SKIP_CONFIRMATIONS": "true"}
        self.first = first.split("   # ", 1)[0].strip()
        self.ran: list[tuple[str, int]] = []

    def run(self, line: str, timeout: float = 600) -> tuple[int, str]:
        command = line.split("   # ", 1)[0].strip()  # the printed comment is not typed
        proc = subprocess.run(["bash", "-c", f"{self.first} && {command}"], cwd=self.work,
                              env=self.env, capture_output=True, text=True, timeout=timeout)  # fmt: skip
        self.ran.append((command, proc.returncode))
        return proc.returncode, proc.stdout + proc.stderr


def advised(text: str) -> list[str]:
    """The commands a `dspark status` text advises (`...` spans that are commands)."""
    return [c for c in re.findall(r"`([^`]+)`", text) if c.startswith(("pulumi ", "python -m dspark"))]


def test_demo_up_answer_noop_rerun_a_newcomers_session_and_down(engine, tmp_path):
    require("docker engine", subprocess.run(["docker", "info"], capture_output=True).returncode == 0,
            "run `bash .ci/setup`")
    from sim import cluster as sim_cluster

    require_room()
    sim_cluster.delete(CLUSTER, log=lambda m: None)  # the tier's own, left by an earlier module or run
    work = _project(tmp_path)
    checked_in = (work / "Pulumi.sim.yaml").read_bytes()
    try:
        code, text = _demo(work, engine, label="demo: first run (sim create, preview, up, answer)")
        assert code == 0, text[-4000:]
        assert f"pulumi preview --diff --policy-pack policy --stack {STACK}" in text and " created" in text
        assert "Policies:" in text or "deepseek-spark-guardrails" in text  # the pack ran, through the language host
        answer = text.split("one streamed answer:", 1)[1].splitlines()[1]
        assert "42" in answer, text[-2000:]
        printed = [ln.strip() for ln in text.split("Use it:", 1)[1].splitlines() if ln.strip()]
        assert printed == cmd_demo.printed_commands("sim", STACK, "", f" --cluster {CLUSTER}")
        assert (work / ".dspark-demo/passphrase").stat().st_mode & 0o077 == 0
        assert re.search(r"sk-[0-9a-f]{48}", text) is None  # the key never reaches the output
        assert (work / cmd_demo.PROJECT / f"Pulumi.{STACK}.yaml").exists()
        assert (work / "Pulumi.sim.yaml").read_bytes() == checked_in
        assert project_stacks(work) == ["sim"]  # no glob of the checkout's stacks takes the demo's

        code, text = _demo(work, engine, label="demo: re-run (no-op up, answer)")
        assert code == 0, text[-4000:]
        assert f"stack {STACK}: exists" in text and text.count(" unchanged") >= 2 and " created" not in text
        assert "42" in text.split("one streamed answer:", 1)[1]

        # a newcomer's session: every printed command, as printed (the last one, --down, in `finally`)
        sh = Shell(work, engine, printed[0])
        t0 = time.monotonic()
        for line in printed[1:-1]:
            if line.startswith("pulumi up"):  # something to apply first: the change the preview line suggests
                code, out = sh.run(f"pulumi config set --path deepseek-spark:cluster.serving.generation 1 --stack {STACK}")
                assert code == 0, out
            code, out = sh.run(line)
            assert code == 0, (line, out[-3000:])
            if line.startswith("pulumi up"):
                assert " replaced" in out or " updated" in out, out[-2000:]
        # ... and what dspark advises when a rank is down (the guard paused so that it stays down)
        code, out = sh.run(f".venv/bin/python -m dspark guard pause --stack {STACK} --reason newcomer")
        assert code == 0, out
        node = f"{CLUSTER}-spark2"
        subprocess.run(["docker", "exec", node, "docker", "stop", f"{STACK}-rank1"], check=True, capture_output=True)
        code, out = sh.run(f".venv/bin/python -m dspark status --stack {STACK}")
        assert code == 2, out
        fixes = advised(out)
        assert f"pulumi up --refresh --stack {STACK}" in fixes, out
        code, out = sh.run(f"pulumi up --refresh --stack {STACK}")
        assert code == 0, out[-3000:]
        for line in (f".venv/bin/python -m dspark restart --stack {STACK} --yes",
                     f".venv/bin/python -m dspark repair --stack {STACK}",
                     f"pulumi refresh --stack {STACK}",
                     f".venv/bin/python -m dspark guard resume --stack {STACK}",
                     f".venv/bin/python -m dspark status --stack {STACK}",
                     f"pulumi destroy --stack {STACK}",
                     f"pulumi up --stack {STACK}",
                     f".venv/bin/python -m dspark smoke --stack {STACK}"):  # fmt: skip
            code, out = sh.run(line)
            assert code == 0, (line, out[-3000:])
        TIMINGS["demo: a newcomer's session (every printed and advised command)"] = time.monotonic() - t0
        assert all(code == 0 for _, code in sh.ran[-8:])
        assert (work / "Pulumi.sim.yaml").read_bytes() == checked_in  # no command of ours rewrote it
    finally:
        code, text = _demo(work, engine, "--down", label="demo: --down (destroy, delete the sim)")
    assert code == 0, text[-4000:]
    assert (work / "Pulumi.sim.yaml").read_bytes() == checked_in
    assert not (work / cmd_demo.PROJECT / f"Pulumi.{STACK}.yaml").exists()  # the demo's own, removed with its stack
    assert _cluster_containers() == []
    nets = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True)
    assert f"dspark-{CLUSTER}" not in nets.stdout.split()
    assert f"python -m sim delete --name {CLUSTER} --purge" in text  # what removes the cached engines
    ls = subprocess.run([str(engine / "pulumi"), "stack", "ls", "--json", "--non-interactive"], cwd=work / cmd_demo.PROJECT,
                        env={**os.environ, **cmd_demo.environment(work, "sim", engine)}, capture_output=True, text=True)  # fmt: skip
    assert ls.returncode == 0 and ls.stdout.strip() == "[]", ls.stdout + ls.stderr


def test_demo_refuses_a_real_stack():
    with pytest.raises(SystemExit):
        from dspark.__main__ import build_parser

        build_parser().parse_args(["demo", "--stack", "tp4"])
