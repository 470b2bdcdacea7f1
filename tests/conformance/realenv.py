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
import sys
from functools import lru_cache
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


@lru_cache(maxsize=None)
def _run(name: str, payload: str, *args: str) -> str:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(python_of(name)), str(DRIVER), *args], input=payload, capture_output=True,
                          text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"driver in {name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def check_all(name: str, checks: list[tuple[str, list[str]]]) -> list[dict]:
    """Run components/argcheck.py's checks in environment `name`, in one process."""
    out = _run(name, json.dumps(checks))
    return json.loads(out.strip().splitlines()[-1])


def dump_options(name: str, engine: str) -> dict:
    return json.loads(_run(name, "", "--dump-options", engine))


def env_names(name: str) -> dict[str, list[str]]:
    return json.loads(_run(name, "", "--env-names").strip().splitlines()[-1])


def site_packages(name: str) -> Path:
    py = python_of(name)
    return Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())



