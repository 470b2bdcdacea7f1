"""The pulumi-language-python TEST DOUBLE (sim/languagehost) under the real Pulumi CLI, as a user types it.

A temp project (tests/unit/languagehost_fixture), a file backend, the passphrase provider and no
plugin downloads; `pulumi preview|up|about|install` are plain subprocesses that find the double on
PATH. The program runs in the virtualenv running these tests (it has pulumi and pulumi-policy); the
tests that need a virtualenv to be created keep pip offline (PIP_NO_INDEX), so they see the real
toolchain's messages without touching PyPI. Skipped without the CLI (.ci/engine-setup); a failure on CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from sim import languagehost
from sim.languagehost import execscript, packages
from sim.languagehost.toolchain import Pip, virtualenv_error

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "languagehost_fixture"
ENGINE = Path(os.environ.get("DSPARK_ENGINE_DIR") or Path.home() / ".cache/deepseek-spark/engine/pulumi-v3.274.1/bin")
VENV = Path(sys.prefix) if sys.prefix != sys.base_prefix else ROOT / ".venv"  # has pulumi and pulumi-policy
LAUNCHER = languagehost.BIN_DIR / "pulumi-language-python"
NOISE = ("program exited with non-zero exit code", "bail")


def _missing() -> str | None:
    if not (ENGINE / "pulumi").exists():
        return f"no Pulumi CLI at {ENGINE}/pulumi (bash .ci/engine-setup builds it)"
    try:
        execscript.find_exec()
    except execscript.ExecNotFound as exc:
        return str(exc)
    return None


def _need_cli() -> None:
    reason = _missing()
    if reason and os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the language host tests: {reason}")
    if reason:
        pytest.skip(reason)


class Project:
    """A project directory with stack `dev`, config greeting=hello and the secret token=abcdef."""

    def __init__(self, base: Path, virtualenv: str):
        self.dir = base / "project"
        self.dir.mkdir()
        shutil.copy(FIXTURE / "program/__main__.py", self.dir / "__main__.py")
        (self.dir / "Pulumi.yaml").write_text(
            f"name: lhfixture\nruntime:\n  name: python\n  options:\n    toolchain: pip\n    virtualenv: {virtualenv}\n")
        (base / "state").mkdir()
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PULUMI_CONFIG")},
            "PATH": os.pathsep.join([str(ENGINE), str(languagehost.BIN_DIR), os.environ.get("PATH", "")]),
            "PULUMI_HOME": str(base / "home"),
            "PULUMI_BACKEND_URL": (base / "state").as_uri(),
            "PULUMI_CONFIG_PASSPHRASE": "unit-test-only",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "NO_COLOR": "1",
            "DSPARK_PYTHON": sys.executable,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        self.pulumi("stack", "init", "dev").check()
        self.pulumi("config", "set", "greeting", "hello").check()
        self.pulumi("config", "set", "--secret", "token", "abcdef").check()

    def pulumi(self, *args: str, env: dict | None = None, timeout: float = 300) -> "Result":
        t0 = time.monotonic()
        proc = subprocess.run([str(ENGINE / "pulumi"), *args, "--non-interactive"], cwd=self.dir,
                              env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout)
        return Result(args, proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0)

    def outputs(self, show_secrets: bool = True) -> dict:
        r = self.pulumi("stack", "output", "--json", *(["--show-secrets"] if show_secrets else [])).check()
        return json.loads(r.text[r.text.index("{"):r.text.rindex("}") + 1])


class Result:
    def __init__(self, args, code: int, text: str, seconds: float):
        self.args, self.code, self.text, self.seconds = args, code, text, seconds

    def check(self) -> "Result":
        assert self.code == 0, f"pulumi {' '.join(self.args)} failed ({self.code}):\n{self.text}"
        return self


@pytest.fixture
def project(tmp_path) -> Project:
    _need_cli()
    return Project(tmp_path, str(VENV))


# ---------------------------------------------------------------------- through the CLI


def test_preview_and_up_run_the_program_with_its_config_and_secrets(project):
    preview = project.pulumi("preview").check()
    assert re.search(r'greeting\s*: "hello"', preview.text) and re.search(r"secret_len\s*: \[secret\]", preview.text)
    assert not any(n in preview.text for n in NOISE), preview.text

    project.pulumi("up", "--yes").check()
    out = project.outputs()
    assert out["greeting"] == "hello" and out["secret_len"] == 6
    # main.go constructArguments/Run: stack and project flags, --dry_run false on up, the program run from the
    # project directory by the virtualenv's python with the virtualenv activated, the secret keys in the env
    assert (out["stack"], out["project"], out["dry_run"]) == ("dev", "lhfixture", False)
    assert Path(out["cwd"]) == project.dir
    assert out["python"] == str(VENV / "bin/python") and out["virtual_env"] == str(VENV)
    assert json.loads(out["secret_keys"]) == ["lhfixture:token"]
    assert project.outputs(show_secrets=False)["secret_len"] == "[secret]"


def test_a_program_that_raises_shows_its_traceback_and_fails_without_bail_noise(project):
    project.pulumi("config", "set", "explode", "true").check()
    r = project.pulumi("preview")
    assert r.code != 0
    assert "Program failed with an unhandled exception:" in r.text
    assert 'raise ValueError("boom from the fixture program")' in r.text
    assert "ValueError: boom from the fixture program" in r.text
    assert not any(n in r.text for n in NOISE), r.text  # exit 32: RunResponse.bail, the CLI adds nothing


def test_a_missing_virtualenv_is_created_and_one_without_pulumi_is_refused(tmp_path):
    """GetRequiredPackages' EnsureVenv creates a missing virtualenv (pip kept offline: its upgrade of wheel fails
    with the toolchain's error); the next preview runs the exec script in it, which finds no pulumi SDK."""
    _need_cli()
    p = Project(tmp_path, "venv")
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    r = p.pulumi("preview", env=offline)
    assert r.code != 0
    assert "Creating virtual environment..." in r.text and "Finished creating virtual environment" in r.text
    venv_python = p.dir / "venv/bin/python"
    assert venv_python.is_file()
    assert (f"error: failed to discover package requirements: updating pip, setuptools, and wheel via "
            f"'{venv_python} -m pip install --upgrade pip setuptools wheel': exit status 1") in r.text

    r = p.pulumi("preview", env=offline)
    assert r.code != 0
    assert "It looks like the Pulumi SDK has not been installed. Have you run pip install?" in r.text
    assert "ModuleNotFoundError: No module named 'pulumi'" in r.text
    assert "program exited with non-zero exit code: 1" in r.text


def test_a_virtualenv_option_naming_a_directory_that_is_no_virtualenv(tmp_path):
    """An existing, non-empty directory is not replaced (EnsureVenv): listing its packages fails to start."""
    _need_cli()
    p = Project(tmp_path, "notavenv")
    (p.dir / "notavenv").mkdir()
    (p.dir / "notavenv/README").write_text("not a virtualenv\n")
    r = p.pulumi("preview")
    assert r.code != 0
    bad = p.dir / "notavenv/bin/python"
    assert (f"error: failed to discover package requirements: calling `{bad} -m pip list --format json`: "
            f"fork/exec {bad}: no such file or directory") in r.text


def test_install_streams_the_toolchain_steps(tmp_path):
    """`pulumi install`: InstallDependencies streams "Installing dependencies...", the venv creation and pip's own
    output; pip offline, its failure is the CLI's error."""
    _need_cli()
    p = Project(tmp_path, "venv")
    (p.dir / "requirements.txt").write_text("pulumi==3.272.0\n")
    r = p.pulumi("install", env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""})
    assert r.code != 0
    steps = ["Installing dependencies...", "Creating virtual environment...", "Finished creating virtual environment",
             "Updating pip, setuptools, and wheel in virtual environment...", "Requirement already satisfied: pip",
             "error: installing dependencies: updating pip, setuptools, and wheel via"]
    at = [r.text.find(s) for s in steps]
    assert -1 not in at and at == sorted(at), r.text


def test_a_policy_pack_runs_through_run_plugin_and_its_mandatory_violation_fails_the_preview(project, tmp_path):
    pack = tmp_path / "pack"
    shutil.copytree(FIXTURE / "policy", pack)
    (pack / "PulumiPolicy.yaml").write_text((pack / "PulumiPolicy.yaml").read_text().replace("VENV", str(VENV)))

    ok = project.pulumi("preview", "--policy-pack", str(pack)).check()
    assert "fixture-pack" in ok.text and "no-forbidden" not in ok.text

    project.pulumi("config", "set", "makeForbidden", "true").check()
    r = project.pulumi("preview", "--policy-pack", str(pack))
    assert r.code != 0
    assert "[mandatory]  no-forbidden  (lhfixture:index:Forbidden: bad-box)" in r.text
    # the pack got the stack and its config from the policy proxy (PULUMI_STACK, PULUMI_CONFIG)
    assert "bad-box is forbidden (stack dev, greeting hello)" in r.text


def test_about_lists_the_python_runtime(project):
    r = project.pulumi("about").check()
    assert f"This project is written in python: executable='{VENV}/bin/python' version='" \
           f"{'.'.join(map(str, sys.version_info[:3]))}'" in r.text
    assert "toolchain='Pip'" in r.text and "typechecker='None'" in r.text
    assert any(line.split() == ["language", "python", execscript.sdk_version().lstrip("v")]
               for line in r.text.splitlines()), r.text


# ---------------------------------------------------------------------- the double alone


def test_run_refuses_a_directory_that_is_no_virtualenv_with_the_toolchain_message(tmp_path):
    """Run's ValidateVenv (reached directly over gRPC: the CLI asks GetRequiredPackages first)."""
    _need_cli()
    from pulumi.runtime.proto import language_pb2, language_pb2_grpc
    from google.protobuf import struct_pb2

    (tmp_path / "notavenv").mkdir()
    (tmp_path / "notavenv/README").write_text("x\n")
    proc = subprocess.Popen([str(LAUNCHER), "127.0.0.1:1"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        stub = language_pb2_grpc.LanguageRuntimeStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        options = struct_pb2.Struct()
        options.update({"toolchain": "pip", "virtualenv": "notavenv"})
        info = language_pb2.ProgramInfo(root_directory=str(tmp_path), program_directory=str(tmp_path),
                                        entry_point=".", options=options)
        with pytest.raises(grpc.RpcError) as err:
            stub.Run(language_pb2.RunRequest(info=info, project="p", stack="s", pwd=str(tmp_path)), timeout=60)
        assert err.value.code() == grpc.StatusCode.UNKNOWN
        assert err.value.details() == str(virtualenv_error("notavenv", str(tmp_path / "notavenv")))
        assert err.value.details().startswith(
            f"The 'virtualenv' option in Pulumi.yaml is set to \"notavenv\", but \"{tmp_path}/notavenv\" doesn't "
            "appear to be a virtual environment; run the following commands")
        with pytest.raises(grpc.RpcError) as err:
            stub.GetRequiredPlugins(language_pb2.GetRequiredPluginsRequest(info=info), timeout=60)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # parseOptions' refusals, and what the double does not port (another toolchain)
        for opts, message in (({"toolchain": "conda"}, "unsupported toolchain option: conda"),
                              ({"virtualenv": 3}, "virtualenv option must be a string"),
                              ({"typechecker": "pytype"}, "unsupported typechecker option: pytype"),
                              ({"toolchain": "uv"}, "implements the pip toolchain only; the uv toolchain needs")):
            bad = struct_pb2.Struct()
            bad.update(opts)
            with pytest.raises(grpc.RpcError) as err:
                stub.About(language_pb2.AboutRequest(info=language_pb2.ProgramInfo(
                    root_directory=str(tmp_path), program_directory=str(tmp_path), entry_point=".", options=bad)),
                    timeout=60)
            assert message in err.value.details()
    finally:
        proc.terminate()
        proc.wait(10)


def test_required_packages_come_from_the_installed_pulumi_plugin_json_files():
    deps = [packages.package_dependency_from_plugin_json(n, v, p)
            for n, v, p in packages.list_pulumi_package_infos(Pip(str(ROOT), str(VENV)))]
    got = {(d.name, d.version, d.kind) for d in deps if d is not None}
    assert {("command", "v1.2.1", "resource"), ("docker", "v5.2.0", "resource")} <= got
    assert not any(d.name == "policy" for d in deps if d is not None)  # pulumi-policy: no plugin


@pytest.mark.parametrize("pep440, semver", [("1.0", "1.0.0"), ("1.2.3a4", "1.2.3-alpha.4"), ("1.2.3rc4", "1.2.3-rc.4"),
                                            ("1.2.3.post4", "1.2.3+post4"), ("1.2.3.post4.dev5", "1.2.3+post4dev5"),
                                            ("1.2.3.dev5", "1.2.3+dev5")])
def test_plugin_versions_follow_determine_plugin_version(pep440, semver):
    assert packages.determine_plugin_version(pep440) == semver


def test_the_launcher_names_the_fix_when_the_exec_script_is_not_in_the_module_cache(tmp_path):
    proc = subprocess.run([str(LAUNCHER)], env={**os.environ, "GOMODCACHE": str(tmp_path)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "pulumi-language-python-exec" in proc.stderr and "bash .ci/engine-setup" in proc.stderr


def test_the_bin_dir_goes_on_path_only_without_a_real_language_host(tmp_path):
    assert languagehost.bin_dir_if_needed(path=str(tmp_path)) == languagehost.BIN_DIR
    assert languagehost.bin_dir_if_needed(path=str(languagehost.BIN_DIR)) == languagehost.BIN_DIR  # ours is no real one
    real = tmp_path / "real"
    real.mkdir()
    (real / "pulumi-language-python").write_text("#!/bin/sh\n")
    (real / "pulumi-language-python").chmod(0o755)
    assert languagehost.bin_dir_if_needed(path=os.pathsep.join([str(tmp_path), str(real)])) is None
    assert languagehost.bin_dir_if_needed(path=str(tmp_path), engine_dir=real) is None


def test_a_link_next_to_the_cli_is_the_double_not_a_real_host(tmp_path):
    link = languagehost.link_next_to_cli(tmp_path)
    assert link == tmp_path / "pulumi-language-python" and link.resolve() == LAUNCHER.resolve()
    assert languagehost.link_next_to_cli(tmp_path) == link  # idempotent
    assert languagehost.real_host(str(tmp_path)) is None  # the link is the double
    assert languagehost.bin_dir_if_needed(path=str(tmp_path), engine_dir=tmp_path) is None  # and needs no PATH entry
    other = tmp_path / "other"
    other.mkdir()
    (other / "pulumi-language-python").write_text("#!/bin/sh\n")
    assert languagehost.link_next_to_cli(other) is None  # never replaces a real one
