"""The LanguageRuntime servicer: sdk/python/cmd/pulumi-language-python/main.go's pythonLanguageHost.

Each method follows the Go method of the same name (v3.260 source; the toolchain and policy proxy are
the v3.274.1 module's). Errors are gRPC UNKNOWN with the Go error's text, as grpc-go sends a plain
error. Unimplemented, with grpc-go's own status: GetRequiredPlugins (as in main.go), and in this double
GenerateProgram, GenerateProject, GeneratePackage, Pack and Link (codegen lives in the Go host).
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import threading

import grpc
from google.protobuf import empty_pb2, json_format
from pulumi.runtime.proto import language_pb2, language_pb2_grpc, plugin_pb2

from sim.languagehost import packages
from sim.languagehost.policyproxy import PolicyProxy
from sim.languagehost.streams import (INHERIT, ExitError, GoError, engine_writers, go_json, interrupt_then_kill,
                                      make_streams, output, start, wait)  # fmt: skip
from sim.languagehost.toolchain import (DOUBLE_ONLY_PIP, TOOLCHAIN_NAMES, TYPECHECKER_NAMES, PythonOptions,
                                        is_buildable_package, parse_options, parse_python_version, pyproject_name,
                                        resolve_toolchain)  # fmt: skip

BAIL_EXIT_CODE = 32  # main.go pythonProcessExitedAfterShowingUserActionableMessage
MINIMUM_PYTHON = (3, 7, 0)  # main.go minimumSupportedPythonVersion (and eolPythonVersion)
ANALYZER = "analyzer"  # apitype.AnalyzerPlugin


def options_of(info: language_pb2.ProgramInfo) -> dict:
    return json_format.MessageToDict(info.options) if info.HasField("options") else {}


def parse(info: language_pb2.ProgramInfo, is_plugin: bool = False) -> PythonOptions:
    return parse_options(info.root_directory, info.program_directory, options_of(info), is_plugin)


def go_errors(method):
    """A GoError (or any failure) becomes the UNKNOWN status grpc-go sends for a returned error."""
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except GoError as exc:
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


def streamed(work, context):
    """A server-streaming method: `work(send)` runs on its own thread, its messages are yielded in order and
    a GoError it raises ends the stream with that error (after the messages sent before it)."""
    q: queue.Queue = queue.Queue()
    end = object()

    def worker():
        try:
            work(q.put)
        except GoError as exc:
            q.put(exc)
        except Exception as exc:  # noqa: BLE001 - a bug in the double: say so, as an error
            q.put(GoError(f"pulumi-language-python TEST DOUBLE: {type(exc).__name__}: {exc}"))
        finally:
            q.put(end)

    threading.Thread(target=worker, daemon=True).start()
    while (item := q.get()) is not end:
        if isinstance(item, GoError):
            context.abort(grpc.StatusCode.UNKNOWN, str(item))
        yield item


class PythonLanguageHost(language_pb2_grpc.LanguageRuntimeServicer):
    def __init__(self, exec_path: str, engine_address: str, tracing: str, otel_endpoint: str, version: str):
        self.exec, self.engine_address, self.tracing = exec_path, engine_address, tracing
        self.otel_endpoint, self.version = otel_endpoint, version
        self.on_engine_address = lambda address: None  # main's health check, started by Handshake
        self._running: set = set()  # Run's programs, interrupted by Cancel (host.cancelCtx)
        self._lock = threading.Lock()

    def _need_engine(self) -> None:
        """connectToEngine's precondition."""
        if not self.engine_address:
            raise GoError("when debugging or running explicitly, must call Handshake before Run")

    # ------------------------------------------------------------------ plugin basics

    @go_errors
    def Handshake(self, request, context):
        """Handshake: remember the engine, health-check it every 5 minutes."""
        self.engine_address = request.engine_address
        self.on_engine_address(self.engine_address)
        return language_pb2.LanguageHandshakeResponse()

    def GetPluginInfo(self, request, context):
        return plugin_pb2.PluginInfo(version=self.version)

    @go_errors
    def Cancel(self, request, context):
        """Cancel: every running program gets os.Interrupt, then a kill 5 s later (Run's cmd.Cancel/WaitDelay)."""
        with self._lock:
            for proc in list(self._running):
                interrupt_then_kill(proc)
        return empty_pb2.Empty()

    # ------------------------------------------------------------------ dependencies

    @go_errors
    def GetRequiredPackages(self, request, context):
        """GetRequiredPackages: EnsureVenv (a missing virtualenv is created, its output as ephemeral engine
        messages), validateVersion, then a PackageDependency per installed Pulumi package."""
        opts = parse(request.info)
        tc = resolve_toolchain(opts)
        info, err = engine_writers(self.engine_address)
        tc.ensure_venv(request.info.program_directory, False, True, info, err)
        validate_version(opts)
        deps = []
        for name, version, plugin_json in packages.list_pulumi_package_infos(tc):
            dep = packages.package_dependency_from_plugin_json(name, version, plugin_json)
            if dep is not None:
                deps.append(dep)
        return language_pb2.GetRequiredPackagesResponse(packages=deps)

    def InstallDependencies(self, request, context):
        """InstallDependencies: the toolchain's venv creation and `pip install -r requirements.txt`, streamed
        (a pty when is_terminal); a plugin that is a buildable package is also `pip install`ed itself."""
        def work(send):
            opts = parse(request.info, request.is_plugin)
            closer, stdout, stderr = make_streams(lambda b: send(language_pb2.InstallDependenciesResponse(stdout=b)),
                                                  lambda b: send(language_pb2.InstallDependenciesResponse(stderr=b)),
                                                  request.is_terminal)  # fmt: skip
            try:
                stdout.write("Installing dependencies...\n\n")
                tc = resolve_toolchain(opts)
                program_dir = request.info.program_directory
                if request.is_plugin:
                    try:
                        buildable = is_buildable_package(program_dir)
                    except GoError as exc:
                        raise GoError(f"checking if plugin is a buildable package: {exc}") from exc
                    if buildable:
                        tc.install_package(program_dir, request.use_language_version_tools, True, stdout, stderr)
                tc.install_dependencies(program_dir, request.use_language_version_tools, True, stdout, stderr)
                stdout.write("Finished installing dependencies\n\n")
            finally:
                closer.close()
        return streamed(work, context)

    @go_errors
    def GetProgramDependencies(self, request, context):
        tc = resolve_toolchain(parse(request.info))
        try:
            deps = tc.list_packages(request.transitiveDependencies)
        except GoError as exc:
            raise GoError(f"failed to get python dependencies: {exc}") from exc
        return language_pb2.GetProgramDependenciesResponse(
            dependencies=[language_pb2.DependencyInfo(name=n, version=v) for n, v in deps])

    @go_errors
    def About(self, request, context):
        """About: the toolchain's python (executable, version) and pip version."""
        opts = parse(request.info) if request.HasField("info") else PythonOptions("", "", toolchain="pip")
        tc = resolve_toolchain(opts)
        executable, version, toolchain_version = tc.about()
        return language_pb2.AboutResponse(executable=executable, version=version, metadata={
            "toolchain": TOOLCHAIN_NAMES[opts.toolchain], "toolchainVersion": toolchain_version,
            "typechecker": TYPECHECKER_NAMES[opts.typechecker]})

    @go_errors
    def RuntimeOptionsPrompts(self, request, context):
        """RuntimeOptionsPrompts: `toolchain` (pip, then poetry/uv, found ones first) and, for pip, `virtualenv`."""
        raw, prompts = options_of(request.info), []
        Prompt = language_pb2.RuntimeOptionPrompt
        string = Prompt.RuntimeOptionType.Value("STRING")
        if "toolchain" not in raw:
            pip = Prompt.RuntimeOptionValue(promptType=string, stringValue="pip", displayName="pip")
            found = {name: bool(shutil.which(name)) for name in ("poetry", "uv")}
            others = sorted(("poetry", "uv"), key=lambda n: not found[n])  # stable: found ones first
            choices = [pip] + [Prompt.RuntimeOptionValue(promptType=string, stringValue=n,
                                                         displayName=n if found[n] else f"{n} [not found]")
                               for n in others]  # fmt: skip
            prompts.append(Prompt(key="toolchain", promptType=string, choices=choices, default=pip,
                                  description="The toolchain to use for installing dependencies and running the program"))
        elif raw.get("toolchain") == "pip" and "virtualenv" not in raw:
            venv = Prompt.RuntimeOptionValue(promptType=string, stringValue="venv")
            prompts.append(Prompt(key="virtualenv", description="The virtualenv to use", promptType=string,
                                  choices=[venv], default=venv))  # fmt: skip
        return language_pb2.RuntimeOptionsResponse(prompts=prompts)

    @go_errors
    def Template(self, request, context):
        resolve_toolchain(parse(request.info))  # pip's PrepareProject does nothing
        return language_pb2.TemplateResponse()

    # ------------------------------------------------------------------ running programs

    @go_errors
    def Run(self, request, context):
        """Run: `<venv>/bin/python pulumi-language-python-exec <constructArguments>` with PULUMI_CONFIG and
        PULUMI_CONFIG_SECRET_KEYS, its stdout/stderr this process's own (the CLI shows them); exit 32 is a bail."""
        self._need_engine()
        opts = parse(request.info)
        if request.attach_debugger:
            return language_pb2.RunResponse(error=DOUBLE_ONLY_PIP.format(what="attaching a debugger (debugpy)"))
        args = [self.exec, *self.construct_arguments(request)]
        config = go_json(dict(request.config)) if request.config else ""
        secret_keys = go_json(list(request.configSecretKeys)) if request.configSecretKeys else "[]"
        tc = resolve_toolchain(opts)
        tc.validate_venv()
        cmd = tc.command(*args)
        env = cmd.env if cmd.env is not None else dict(os.environ)
        if config:
            env["PULUMI_CONFIG"] = config
        if secret_keys:
            env["PULUMI_CONFIG_SECRET_KEYS"] = secret_keys
        if self.otel_endpoint:
            env["PULUMI_OTEL_EXPORTER_OTLP_ENDPOINT"] = self.otel_endpoint
        cmd.env = env
        if opts.typechecker:
            self.typecheck(tc, opts, request.info.program_directory)
        try:
            threads = start(cmd, INHERIT, INHERIT)
        except GoError as exc:
            return language_pb2.RunResponse(error=f"problem executing program (could not run language executor): {exc}")
        with self._lock:
            self._running.add(cmd.proc)
        context.add_callback(lambda: interrupt_then_kill(cmd.proc))  # the request ended (cancelled) first
        try:
            wait(cmd, threads)
        except ExitError as exc:
            sys.stdout.flush(), sys.stderr.flush()
            if exc.code == BAIL_EXIT_CODE:
                return language_pb2.RunResponse(error="", bail=True)
            return language_pb2.RunResponse(error=f"program exited with non-zero exit code: {exc.code}")
        finally:
            with self._lock:
                self._running.discard(cmd.proc)
        return language_pb2.RunResponse(error="")

    def construct_arguments(self, request) -> list[str]:
        """constructArguments: the exec script's flags (empty ones left out), the entry point, the args."""
        args = []
        for key, value in (("monitor", request.monitor_address), ("engine", self.engine_address),
                           ("project", request.project), ("root_directory", request.info.root_directory),
                           ("stack", request.stack), ("pwd", request.pwd),
                           ("dry_run", "true" if request.dryRun else "false"), ("parallel", str(request.parallel)),
                           ("tracing", self.tracing), ("organization", request.organization)):  # fmt: skip
            if value:
                args += [f"--{key}", value]
        return [*args, request.info.entry_point, *request.args]

    def typecheck(self, tc, opts: PythonOptions, program_dir: str) -> None:
        """Run's typechecker step: `python -m mypy|pyright <program dir>` before the program, output shown."""
        args = ["-m", opts.typechecker]
        if opts.typechecker == "mypy":
            args += ["--exclude", os.path.relpath(tc.virtual_env_path(), program_dir)]
        cmd = tc.command(*args, program_dir)
        cmd.dir = program_dir
        if opts.typechecker not in {n for n, _ in tc.list_packages(True)}:
            raise GoError(f"The typechecker option is set to {opts.typechecker}, but {opts.typechecker} is not "
                          f"installed. Please add an entry for {opts.typechecker} to requirements.txt and run "
                          f"`{opts.virtualenv}/bin/pip install -r requirements.txt`")  # fmt: skip
        buf = bytearray()
        try:
            wait(cmd, start(cmd, INHERIT, INHERIT, stdout_tee=buf, stderr_tee=buf))
        except GoError as exc:
            text = buf.decode("utf-8", "replace")
            raise GoError(f"{opts.typechecker} failed: {exc}" + (f"\n{text}" if text else "")) from exc

    def RunPlugin(self, request, context):
        """RunPlugin: a policy pack (kind analyzer) as `python -u -m pulumi.policy <args> <pack dir>` behind the
        PolicyProxy; another plugin as `python <dir> <args>` or `python -m pulumi.run.plugin <name> <args>`."""
        return streamed(lambda send: self._run_plugin(request, context, send), context)

    def _run_plugin(self, request, context, send) -> None:
        self._need_engine()
        info, analyzer = request.info, request.kind == ANALYZER
        opts = parse(info, not analyzer)
        tc = resolve_toolchain(opts)
        has_main = os.path.exists(os.path.join(opts.root, "__main__.py"))
        has_run_module = True
        try:
            output(tc.command("-c", "import pulumi.run.plugin"), combined=True)
        except GoError as exc:
            if b"ModuleNotFoundError" in getattr(exc, "output", b""):
                has_run_module = False
        if request.attach_debugger:
            raise GoError(DOUBLE_ONLY_PIP.format(what="attaching a debugger (debugpy)"))
        if has_run_module and not has_main:
            try:
                buildable = is_buildable_package(opts.root)
            except GoError as exc:
                raise GoError(f"checking if plugin is a buildable package: {exc}") from exc
            if not buildable:
                raise GoError("plugin is not runnable, it provides neither __main__.py nor a buildable pyproject.toml")
            cmd = tc.module_command("pulumi.run.plugin", pyproject_name(opts.root), *request.args)
        elif analyzer:
            cmd = tc.command("-u", "-m", "pulumi.policy", *request.args, info.program_directory)
        else:
            cmd = tc.command(info.program_directory, *request.args)
        closer, stdout, stderr = make_streams(lambda b: send(language_pb2.RunPluginResponse(stdout=b)),
                                              lambda b: send(language_pb2.RunPluginResponse(stderr=b)), False)  # fmt: skip
        cmd.dir = info.program_directory if analyzer else request.pwd
        env = list(cmd.env.items()) if cmd.env is not None else []  # Go: cmd.Env, nil without a virtualenv
        proxy = None
        context.add_callback(lambda: cmd.proc is not None and cmd.proc.poll() is None and cmd.proc.kill())
        try:
            if analyzer:
                proxy = PolicyProxy(stdout)
                context.add_callback(proxy.stop)
                config = proxy.await_configuration(context.is_active)
                if config is not None:
                    env += [(k, v) for k, v in (("PULUMI_ORGANIZATION", config.organization),
                                                ("PULUMI_PROJECT", config.project), ("PULUMI_STACK", config.stack),
                                                ("PULUMI_DRY_RUN", "true" if config.dry_run else "false"),
                                                ("PULUMI_CONFIG", go_json(dict(config.config)) if config.config else ""))
                            if v]  # fmt: skip
            env += [tuple(kv.split("=", 1)) for kv in request.env if "=" in kv]
            cmd.env = dict(env) if env else None
            if proxy is not None:
                threads = start(cmd, None, stderr, stdout_pipe=True)
                try:
                    proxy.attach(cmd, threads)
                except GoError as exc:
                    raise GoError(f"could not attach policy pack proxy: {exc}") from exc
            else:
                wait(cmd, start(cmd, stdout, stderr))
        except GoError as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, ExitError) else exc
            if isinstance(cause, ExitError):
                send(language_pb2.RunPluginResponse(exitcode=cause.code))
                return
            if proxy is not None:
                proxy.abort(exc)
            raise GoError(f"problem executing plugin program (could not run language executor): {exc}") from exc
        finally:
            closer.close()

    # ------------------------------------------------------------------ not in this double

    def GetRequiredPlugins(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "method GetRequiredPlugins not implemented")

    def GenerateProgram(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "method GenerateProgram not implemented")

    def GenerateProject(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "method GenerateProject not implemented")

    def GeneratePackage(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "method GeneratePackage not implemented")

    def Pack(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "method Pack not implemented")

    def Link(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "method Link not implemented")


def validate_version(opts: PythonOptions) -> None:
    """main.go validateVersion: problems go to this process's stderr, which the CLI shows as a diagnostic."""
    try:
        tc = resolve_toolchain(opts)
    except GoError as exc:
        print(f"Failed to configure python toolchain: {exc}", file=sys.stderr, flush=True)
        return
    try:
        out = output(tc.command("--version")).decode()
    except GoError as exc:
        print(f"Failed to resolve python version command: {exc}", file=sys.stderr, flush=True)
        return
    text = out.strip().removeprefix("Python ")
    try:
        parsed = tuple(int(p) for p in parse_python_version(text).split("-")[0].split("."))
    except ValueError:
        print(f"Failed to parse python version: '{text}'", file=sys.stderr, flush=True)
        return
    if parsed < MINIMUM_PYTHON:
        print(f"Pulumi does not support Python {'.'.join(map(str, parsed))}. Please upgrade to at least 3.7.0",
              file=sys.stderr, flush=True)  # fmt: skip
