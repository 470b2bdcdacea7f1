"""The Pulumi CLI as this project runs it: where .ci/setup built it, its environment for a project-local file
backend, and a command run with its output passed through as it comes and Ctrl-C passed on.

The CLI runs the program as a user's `pulumi up` does: it starts the Python language host (a real
`pulumi-language-python` where one is installed; here, the TEST DOUBLE .ci/engine-setup links next to the CLI,
sim/languagehost), which runs __main__.py in the project's virtualenv (Pulumi.yaml: `.venv`) with the real
`pulumi-language-python-exec`. The docker plugin is the real one, built from Go modules by .ci/setup and linked
into the Pulumi home's plugin cache; the command plugin of the simulated stacks is the TEST DOUBLE in
sim/providers/bin (pulumi-command's cannot be built here), put on PATH for those stacks only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional, TextIO

ROOT = Path(__file__).resolve().parents[1]
SIM_PLUGINS = ROOT / "sim/providers/bin"  # the command plugin TEST DOUBLE (pulumi-command's cannot be built here)
VERSION = "v3.274.1"  # .ci/engine-setup's PULUMI_VERSION
DOCKER_PLUGIN = "5.2.0"  # the real docker plugin .ci/docker-provider-setup builds: pulumi_docker's version
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


def docker_plugin() -> Path:
    """The real docker resource plugin .ci/setup built (DSPARK_DOCKER_PROVIDER_DIR overrides its folder)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = Path(os.environ.get("DSPARK_DOCKER_PROVIDER_DIR") or cache / "deepseek-spark" / f"docker-provider-{DOCKER_PLUGIN}" / "bin")
    found = folder / "pulumi-resource-docker"
    if not found.exists():
        raise EngineMissing(f"no docker resource plugin at {found}: run `bash .ci/setup` first (it builds it)")
    return found


def install_docker_plugin(pulumi_home: Path) -> Path:
    """The real docker plugin in `pulumi_home`'s plugin cache, where the engine looks first (a link to the one
    .ci/setup built: the engine finds it with no download and no "from $PATH" warning)."""
    folder = pulumi_home / "plugins" / f"resource-docker-v{DOCKER_PLUGIN}"
    link = folder / "pulumi-resource-docker"
    target = docker_plugin()
    if not (link.is_symlink() and link.resolve() == target.resolve()):
        folder.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    return link


def environment(engine: Path, backend: Path, pulumi_home: Path, passphrase: dict[str, str],
                sim_plugins: bool) -> dict[str, str]:  # fmt: skip
    """The CLI's environment for a local file backend: the built CLI first on PATH, the real docker plugin in the
    Pulumi home's plugin cache (then the sim's command plugin test double on PATH, for the sim stacks only), no
    plugin downloads, no prompts. `passphrase`: PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE."""
    install_docker_plugin(pulumi_home)
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
