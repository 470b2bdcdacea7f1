"""The Pulumi CLI as this project runs it: where .ci/setup built it, its environment for a project-local file
backend, and a command run with its output passed through as it comes and Ctrl-C passed on.

The CLI runs the program as a user's `pulumi up` does: it starts the Python language host (a real
`pulumi-language-python` where one is installed; here, the TEST DOUBLE .ci/engine-setup links next to the CLI,
sim/languagehost), which runs __main__.py in the project's virtualenv (Pulumi.yaml: `.venv`) with the real
`pulumi-language-python-exec`. The docker and command plugins of the simulated stacks are the TEST DOUBLES in
sim/providers/bin, put on PATH for those stacks only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional, TextIO

ROOT = Path(__file__).resolve().parents[1]
SIM_PLUGINS = ROOT / "sim/providers/bin"  # the docker and command plugin TEST DOUBLES
VERSION = "v3.274.1"  # .ci/engine-setup's PULUMI_VERSION
# What a project folder of its own (the demo's, a test's) links from the checkout: the program's code, the policy
# pack, the sim and the virtualenv (Pulumi.yaml: `.venv`). Its stack files are its own.
PROJECT_LINKS = ("Pulumi.yaml", "__main__.py", "declared", "planning", "components", "programs", "dspark", "policy",
                 "sim", ".venv")


class EngineMissing(Exception):
    """No Pulumi CLI where .ci/setup builds it."""


def engine_dir() -> Path:
    """Where .ci/engine-setup put the Pulumi CLI (DSPARK_ENGINE_DIR overrides)."""
    if os.environ.get("DSPARK_ENGINE_DIR"):
        return Path(os.environ["DSPARK_ENGINE_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    found = cache / "deepseek-spark" / "engine" / f"pulumi-{VERSION}" / "bin"
    if not (found / "pulumi").exists():
        raise EngineMissing(f"no Pulumi CLI at {found}: run `bash .ci/setup` first (it builds the CLI)")
    return found


def environment(engine: Path, backend: Path, pulumi_home: Path, passphrase: dict[str, str],
                sim_plugins: bool) -> dict[str, str]:  # fmt: skip
    """The CLI's environment for a local file backend: the built CLI first on PATH (then the sim's plugin test
    doubles, for the sim stacks only), no plugin downloads, no prompts. `passphrase`: PULUMI_CONFIG_PASSPHRASE or
    PULUMI_CONFIG_PASSPHRASE_FILE."""
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


def link_project(folder: Path, checkout: Path) -> None:
    """Make `folder` a project folder running `checkout`'s program (PROJECT_LINKS; existing links are kept)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_LINKS:
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(checkout / name)


def stream(argv: list[str], cwd: Path, env: Optional[dict[str, str]], out: TextIO, err: TextIO) -> int:
    """Run `argv` with its output (stdout and stderr) passed to `out` line by line as it comes. Ctrl-C is passed to
    its whole process group (the CLI cancels cleanly and unlocks the stack) and this waits for it to end: a CLI
    left running would hold the stack's lock."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip
    while True:
        try:
            for line in proc.stdout:
                out.write(line)
                out.flush()
            return proc.wait()
        except KeyboardInterrupt:
            err.write("\n==> interrupted: passing it to the Pulumi engine and waiting for it to stop\n")
            os.killpg(proc.pid, signal.SIGINT)
