"""The conformance tier: the program's command lines against the REAL engines' parsers.

The environments are venvs with the real PyPI packages (tests/conformance/environments.txt), built
once by .ci/conformance-setup (part of .ci/setup) and cached. A test whose environment is missing is
skipped, saying which command builds it; in CI (CI=true) a missing environment fails instead, so the
tier can never pass by not running.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent
DRIVER = HERE / "driver.py"


def env_root() -> Path:
    return Path(os.environ.get("DSPARK_CONFORMANCE_DIR")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deepseek-spark" / "conformance")


def environments() -> dict[str, str]:
    """name -> pip requirements, from environments.txt."""
    out = {}
    for line in (HERE / "environments.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, reqs = line.split(None, 1)
            out[name] = reqs.strip()
    return out


def python_of(name: str) -> Path:
    py = env_root() / name / "bin" / "python"
    if not py.exists():
        msg = f"conformance environment {name} missing at {py.parent.parent}: run bash .ci/conformance-setup"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return py


def run_env(name: str, checks: list[tuple[str, list[str]]], dump: str | None = None,
            env_names: bool = False) -> dict:
    """One process in environment `name`: programs/argcheck.py's checks on `checks`, and the option
    table of `dump` and the packages' env names when asked (importing an engine takes seconds)."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    payload = json.dumps({"checks": checks, "dump": dump, "env_names": env_names})
    proc = subprocess.run([str(python_of(name)), str(DRIVER)], input=payload, capture_output=True,
                          text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise AssertionError(f"driver in {name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def site_packages(name: str) -> Path:
    py = python_of(name)
    return Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())


def run_script(name: str, script: Path, *args: str, timeout: float = 900) -> dict:
    """`script` (one of this folder's drivers) run with environment `name`'s python; its last stdout line as JSON."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(python_of(name)), str(script), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"{script.name} in {name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
