"""`python -m dspark demo`, the README's main-job command, end to end on a copy of the project:
the simulated cluster up through the real engine and a streamed answer; a re-run is a no-op `up`;
`--down` leaves no container, network or stack behind."""

import os
import re
import subprocess
import sys
import time

import pytest

from e2e.conftest import require
from e2e.pulumi_cli import LINKED, ROOT
from e2e.timings import TIMINGS

from dspark import cmd_demo


def _project(tmp_path):
    work = tmp_path / "checkout"
    work.mkdir()
    for name in ("Pulumi.yaml", "Pulumi.sim.yaml"):
        (work / name).write_bytes((ROOT / name).read_bytes())
    for name in LINKED:
        (work / name).symlink_to(ROOT / name)
    return work


def _demo(work, engine, *args, label):
    env = {**os.environ, "DSPARK_ENGINE_DIR": str(engine), "PYTHONPATH": str(ROOT)}
    for k in ("PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE", "PULUMI_HOME"):
        env.pop(k, None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dspark", "demo", "--project-dir", str(work), *args],
                          cwd=work, env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    TIMINGS[label] = time.monotonic() - t0
    return proc.returncode, proc.stdout + proc.stderr


def _sim_containers():
    out = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True).stdout
    return [n for n in out.split() if n.startswith("sim-")]


def test_demo_up_answer_noop_rerun_and_down(engine, tmp_path):
    require("docker engine", subprocess.run(["docker", "info"], capture_output=True).returncode == 0,
            "run `bash .ci/setup`")
    from sim import cluster as sim_cluster

    sim_cluster.delete(cmd_demo.CLUSTER, log=lambda m: None)  # a fresh machine has none
    work = _project(tmp_path)
    try:
        code, text = _demo(work, engine, label="demo: first run (sim create, preview, up, answer)")
        assert code == 0, text[-4000:]
        assert "pulumi preview --diff --stack sim" in text and " created" in text
        answer = text.split("one streamed answer:", 1)[1].splitlines()[1]
        assert "42" in answer, text[-2000:]
        for cmd in ("python -m dspark.clients --stack sim", "python -m dspark status --stack sim",
                    "python -m dspark logs --stack sim", "python -m dspark demo --down"):
            assert cmd in text, cmd
        assert (work / ".dspark-demo/passphrase").stat().st_mode & 0o077 == 0
        api_key = re.search(r"sk-[0-9a-f]{48}", text)
        assert api_key is None  # the key never reaches the output

        code, text = _demo(work, engine, label="demo: re-run (no-op up, answer)")
        assert code == 0, text[-4000:]
        assert "stack sim: exists" in text and text.count(" unchanged") >= 2 and " created" not in text
        assert "42" in text.split("one streamed answer:", 1)[1]
    finally:
        code, text = _demo(work, engine, "--down", label="demo: --down (destroy, delete the sim)")
    assert code == 0, text[-4000:]
    # the checked-in stack file is never written (secrets go to the demo's copy), nor deleted by `stack rm`
    assert (work / "Pulumi.sim.yaml").read_bytes() == (ROOT / "Pulumi.sim.yaml").read_bytes()
    assert _sim_containers() == []
    nets = subprocess.run(["docker", "network", "ls", "--format", "{{.Name}}"], capture_output=True, text=True)
    assert "dspark-sim" not in nets.stdout.split()
    assert f"python -m sim delete --name {cmd_demo.CLUSTER} --purge" in text  # what removes the cached engines
    ls = subprocess.run([str(engine / "pulumi"), "stack", "ls", "--json", "--non-interactive"], cwd=work,
                        env={**os.environ, **cmd_demo.environment(work, "sim", engine)}, capture_output=True, text=True)  # fmt: skip
    assert ls.returncode == 0 and ls.stdout.strip() == "[]", ls.stdout + ls.stderr


def test_demo_refuses_a_real_stack():
    with pytest.raises(SystemExit):
        from dspark.__main__ import build_parser

        build_parser().parse_args(["demo", "--stack", "tp4"])
