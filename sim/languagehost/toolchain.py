"""sdk/python/toolchain (github.com/pulumi/pulumi/sdk/v3@v3.274.1), the pip toolchain, ported.

    parse_options             main.go parseOptions (runtime options of Pulumi.yaml / PulumiPolicy.yaml)
    resolve_toolchain         toolchain.go ResolveToolchain (Auto: uv.lock, then poetry.lock, then pip)
    Pip                       pip.go: Command/ModuleCommand (ActivateVirtualEnv), ListPackages, ValidateVenv,
                              EnsureVenv, InstallDependencies, InstallPackage, About, VirtualEnvPath
    virtualenv_error          toolchain.go NewVirtualEnvError (the "run the following commands" message)
    install_dependencies      toolchain.go InstallDependencies (venv creation, pip upgrade, requirements.txt)

uv and poetry are refused (the double ports pip only); so are useLanguageVersionTools (pyenv) and
LinkPackages. Error texts are the Go ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sim.languagehost.streams import Cmd, ExitError, GoError, Writer, output, run

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None

TOOLCHAINS = ("auto", "pip", "poetry", "uv")  # toolchain.go: Auto, Pip, Poetry, Uv
TOOLCHAIN_NAMES = {"auto": "Auto", "pip": "Pip", "poetry": "Poetry", "uv": "Uv"}  # toolchain.Name
TYPECHECKER_NAMES = {"": "None", "mypy": "Mypy", "pyright": "Pyright"}  # toolchain.TypeCheckerName
DOUBLE_ONLY_PIP = ("the pulumi-language-python TEST DOUBLE (sim/languagehost) implements the pip toolchain only; "
                   "{what} needs the real pulumi-language-python")  # fmt: skip


@dataclass
class PythonOptions:
    root: str
    program_dir: str
    virtualenv: str = ""
    typechecker: str = ""  # "", "mypy", "pyright"
    toolchain: str = "auto"


def parse_options(root: str, program_dir: str, options: dict, is_plugin: bool) -> PythonOptions:
    """main.go parseOptions; plugins (not policy packs) default `virtualenv` to `venv` under pip/auto."""
    opts = PythonOptions(root=root, program_dir=program_dir)
    if "virtualenv" in options:
        if not isinstance(options["virtualenv"], str):
            raise GoError("virtualenv option must be a string")
        opts.virtualenv = options["virtualenv"]
    if "typechecker" in options:
        tc = options["typechecker"]
        if not isinstance(tc, str):
            raise GoError("typechecker option must be a string")
        if tc not in ("mypy", "pyright"):
            raise GoError(f"unsupported typechecker option: {tc}")
        opts.typechecker = tc
    if "toolchain" in options:
        tc = options["toolchain"]
        if not isinstance(tc, str):
            raise GoError("toolchain option must be a string")
        if tc not in ("pip", "poetry", "uv"):
            raise GoError(f"unsupported toolchain option: {tc}")
        opts.toolchain = tc
    if is_plugin and opts.toolchain in ("pip", "auto") and opts.virtualenv == "":
        opts.virtualenv = "venv"
    return opts


def searchup(current: str, name: str) -> str | None:
    d = Path(current)
    for cand in (d, *d.parents):
        if (cand / name).exists():
            return str(cand)
    return None


def resolve_toolchain(opts: PythonOptions) -> "Pip":
    """toolchain.go ResolveToolchain; uv and poetry (explicit or detected by a lock file) are refused."""
    tc = opts.toolchain
    if tc == "auto":
        if searchup(opts.program_dir, "uv.lock"):
            tc = "uv"
        elif searchup(opts.program_dir, "poetry.lock"):
            tc = "poetry"
        else:
            return Pip(opts.root, opts.virtualenv)
    if tc == "pip":
        return Pip(opts.root, opts.virtualenv)
    raise GoError(DOUBLE_ONLY_PIP.format(what=f"the {tc} toolchain"))


def resolve_virtual_environment_path(root: str, virtualenv: str) -> str:
    if not virtualenv:
        return ""
    return virtualenv if os.path.isabs(virtualenv) else os.path.join(root, virtualenv)


def activate_virtual_env(environ: dict[str, str], venv: str) -> dict[str, str]:
    """toolchain.go ActivateVirtualEnv: venv/bin first on PATH, VIRTUAL_ENV set, PYTHONHOME dropped."""
    venv_bin = os.path.join(venv, "bin")
    result, has_path = {}, False
    for key, value in environ.items():
        if key.upper() == "PATH":
            has_path = True
            result[key] = f"{venv_bin}{os.pathsep}{value}"
        elif key.upper() in ("PYTHONHOME", "VIRTUAL_ENV"):
            continue
        else:
            result[key] = value
    if not has_path:
        result["PATH"] = venv_bin
    result["VIRTUAL_ENV"] = venv
    return result


def is_virtual_env(directory: str) -> bool:
    """toolchain.go IsVirtualEnv: the directory has bin/python (a file)."""
    return os.path.isfile(os.path.join(directory, "bin", "python"))


def command_path() -> str:
    """toolchain.go CommandPath: $PULUMI_PYTHON_CMD, else python3, else python, on PATH."""
    cmds = [os.environ["PULUMI_PYTHON_CMD"]] if os.environ.get("PULUMI_PYTHON_CMD") else ["python3", "python"]
    for name in cmds:
        found = shutil.which(name)
        if found:
            return found
    quoted = " ".join(json.dumps(c) for c in cmds)
    raise GoError(f"failed to locate any of [{quoted}] on your PATH. Have you installed Python 3.10 or greater?")


def virtualenv_error(option: str, full_path: str) -> GoError:
    """toolchain.go NewVirtualEnvError, word for word."""
    venv_python = os.path.join(full_path, "bin", "python")
    message = "doesn't exist" if not os.path.exists(full_path) else "doesn't appear to be a virtual environment"
    commands = (f"    1. python3 -m venv {full_path}\n"
                f"    2. {venv_python} -m pip install --upgrade pip setuptools wheel\n"
                f"    3. {venv_python} -m pip install -r requirements.txt\n")  # fmt: skip
    return GoError(f"The 'virtualenv' option in Pulumi.yaml is set to {json.dumps(option)}, but "
                   f"{json.dumps(full_path)} {message}; run the following commands to create the virtual environment "
                   f"and install dependencies into it:\n\n{commands}\n\n"
                   "For more information see: https://www.pulumi.com/docs/intro/languages/python/#virtual-environments")


def normalize_package_name(name: str) -> str:
    """PEP 503, as toolchain.go normalizePythonPackageName."""
    return re.sub(r"[-_.]+", "-", name.lower())


def pip_error_is_transient(stderr: str) -> bool:
    return "because the GET request got Content-Type" in stderr


def install_dependencies(cwd: str, venv_dir: str, use_language_version_tools: bool, show_output: bool,
                         info: Writer, err: Writer) -> None:  # fmt: skip
    """toolchain.go InstallDependencies: `python3 -m venv`, pip/setuptools/wheel upgraded, then
    `pip install -r requirements.txt` (when the file exists) in `cwd`; up to 3 attempts on a transient
    PyPI error."""
    def printmsg(message: str) -> None:
        if show_output:
            info.write(message + "\n")

    if use_language_version_tools:
        raise GoError(DOUBLE_ONLY_PIP.format(what="useLanguageVersionTools (pyenv)"))
    if venv_dir:
        printmsg("Creating virtual environment...")
        if not os.path.isabs(venv_dir):
            raise GoError(f"virtual environment path must be absolute: {venv_dir}")
        try:
            output(Cmd([command_path(), "-m", "venv", venv_dir]), combined=True)
        except GoError as exc:
            if getattr(exc, "output", b""):
                err.write(exc.output + b"\n")
            raise GoError(f"creating virtual environment at '{venv_dir}': {exc}") from exc
        printmsg("Finished creating virtual environment")

    def run_pip_install(error_msg: str, *args: str) -> None:
        for attempt in range(3):
            argv = ["-m", "pip", "install", *args]
            cmd = Cmd([command_path(), *argv] if not venv_dir else [os.path.join(venv_dir, "bin", "python"), *argv],
                      env=activate_virtual_env(dict(os.environ), venv_dir), dir=cwd)  # fmt: skip
            buf = bytearray()
            try:
                if show_output:
                    run(cmd, info, err, stderr_tee=buf)
                else:
                    run(cmd, None, None, stderr_tee=buf)
                return
            except GoError as exc:
                stderr = buf.decode("utf-8", "replace").strip()
                last = GoError(f"{error_msg} via '{cmd.args_text()}': {exc}" + (f": {stderr}" if stderr else ""))
            if attempt < 2 and pip_error_is_transient(buf.decode("utf-8", "replace")):
                if show_output:
                    err.write(f"Retrying ({attempt + 1}/3)...\n")
                continue
            raise last

    printmsg("Updating pip, setuptools, and wheel in virtual environment...")
    run_pip_install("updating pip, setuptools, and wheel", "--upgrade", "pip", "setuptools", "wheel")
    printmsg("Finished updating")
    if not os.path.exists(os.path.join(cwd, "requirements.txt")):
        return
    printmsg("Installing dependencies in virtual environment...")
    run_pip_install("installing dependencies", "-r", "requirements.txt")
    printmsg("Finished installing dependencies")


class Pip:
    """pip.go's toolchain: the virtualenv option resolved against the project root (empty: ambient python)."""

    name = "pip"

    def __init__(self, root: str, virtualenv: str):
        self.virtualenv_option, self.root = virtualenv, root
        self.virtualenv_path = resolve_virtual_environment_path(root, virtualenv)

    def command(self, *args: str) -> Cmd:
        """pip.Command: the venv's python with the venv activated, or CommandPath()'s with env inherited."""
        if not self.virtualenv_path:
            return Cmd([command_path(), *args])
        return Cmd([os.path.join(self.virtualenv_path, "bin", "python"), *args],
                   env=activate_virtual_env(dict(os.environ), self.virtualenv_path))  # fmt: skip

    def module_command(self, module: str, *args: str) -> Cmd:
        return self.command("-m", module, *args)

    def list_packages(self, transitive: bool) -> list[tuple[str, str]]:
        """pip.ListPackages: `python -m pip list --format json [--not-required]`, names PEP 503-normalized."""
        cmd = self.module_command("pip", "list", "--format", "json", *([] if transitive else ["--not-required"]))
        try:
            out = output(cmd)
        except GoError as exc:
            raise GoError(f"calling `{cmd.args_text()}`: {exc}") from exc
        try:
            raw = json.JSONDecoder().raw_decode(out.decode().lstrip())[0]
        except ValueError as exc:
            raise GoError(f"parsing `python {cmd.args_text()}` output: {exc}") from exc
        return [(normalize_package_name(r["name"]), r["version"]) for r in raw]

    def validate_venv(self) -> None:
        """pip.ValidateVenv: a virtualenv option naming no virtualenv is NewVirtualEnvError."""
        if self.virtualenv_option and not is_virtual_env(self.virtualenv_path):
            raise virtualenv_error(self.virtualenv_option, self.virtualenv_path)

    def ensure_venv(self, cwd: str, use_language_version_tools: bool, show_output: bool, info: Writer,
                    err: Writer) -> None:  # fmt: skip
        """pip.EnsureVenv: a missing or empty virtualenv directory is created (InstallDependencies); an existing,
        non-empty directory that is no virtualenv is left for ValidateVenv to refuse."""
        if not self.virtualenv_option or is_virtual_env(self.virtualenv_path):
            return
        path = self.virtualenv_path
        if os.path.exists(path) and not os.path.isdir(path):
            raise GoError(f"the 'virtualenv' option in Pulumi.yaml is set to {json.dumps(path)} but it is not a directory")
        if not os.path.exists(path) or not os.listdir(path):
            self.install_dependencies(cwd, use_language_version_tools, show_output, info, err)

    def install_dependencies(self, cwd: str, use_language_version_tools: bool, show_output: bool, info: Writer,
                             err: Writer) -> None:  # fmt: skip
        install_dependencies(cwd, self.virtualenv_path, use_language_version_tools, show_output, info, err)

    def install_package(self, cwd: str, use_language_version_tools: bool, show_output: bool, info: Writer,
                        err: Writer) -> None:  # fmt: skip
        """pip.InstallPackage: EnsureVenv, then `pip install <cwd>`."""
        try:
            self.ensure_venv(cwd, use_language_version_tools, show_output, info, err)
        except GoError as exc:
            raise GoError(f"creating virtual environment: {exc}") from exc
        cmd = self.module_command("pip", "install", cwd)
        try:
            if show_output:
                run(cmd, info, err)
            else:
                output(cmd)
        except ExitError as exc:
            stderr = exc.stderr.decode("utf-8", "replace").strip()
            raise GoError(f"installing package: {exc}" + (f": {stderr}" if stderr else "")) from exc

    def virtual_env_path(self) -> str:
        return self.virtualenv_path

    def about(self) -> tuple[str, str, str]:
        """pip.About: (python executable, python version, pip version); versions "0.0.0" when unknown,
        as a zero semver.Version prints."""
        with ThreadPoolExecutor(3) as pool:  # errgroup: the three commands at once
            python = pool.submit(_version, self.command("--version"), parse_python_version)
            pip = pool.submit(_version, self.module_command("pip", "--version"), parse_pip_version)
            try:
                executable = output(self.command("-c", "import sys; print(sys.executable)")).decode().strip()
            except GoError as exc:
                raise GoError(f"failed to get python executable path: {exc}") from exc
            return executable, python.result(), pip.result()


def _version(cmd: Cmd, parse) -> str:
    try:
        return parse(output(cmd).decode())
    except (GoError, ValueError):
        return "0.0.0"


def parse_python_version(text: str) -> str:
    """toolchain.go ParsePythonVersion."""
    text = text.strip().removeprefix("Python ")
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:(a|b|rc|dev)(\d+))?", text)
    if not m:
        raise ValueError(f"invalid Python version format: {text!r}")
    version = f"{int(m[1])}.{int(m[2])}.{int(m[3] or 0)}"
    if m[4]:
        version += {"a": "-alpha.", "b": "-beta.", "rc": "-rc.", "dev": "-dev."}[m[4]] + m[5]
    return version


def parse_pip_version(text: str) -> str:
    """pip.go ParsePipVersion (`pip 25.3 from ...`), as semver.ParseTolerant prints it."""
    m = re.match(r"^pip\s+(\d+(?:\.\d+)*)", text.strip())
    if not m:
        raise ValueError(f"unexpected output from pip --version: {text!r}")
    parts = [str(int(p)) for p in m[1].split(".")][:3]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def is_buildable_package(directory: str) -> bool:
    """pyproject.go IsBuildablePackage: a pyproject.toml with project.name and build-system.build-backend."""
    path = os.path.join(directory, "pyproject.toml")
    if not os.path.exists(path):
        return False
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise GoError(f"parsing pyproject.toml: unmarshaling pyproject.toml: {exc}") from exc
    return bool((data.get("project") or {}).get("name")) and bool((data.get("build-system") or {}).get("build-backend"))


def pyproject_name(directory: str) -> str:
    return tomllib.loads(Path(directory, "pyproject.toml").read_text())["project"]["name"]
