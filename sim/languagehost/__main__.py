"""main.go main(): `pulumi-language-python [-tracing X] [-use-executor PATH] [-version] [ENGINE_ADDRESS]`.

Serves LanguageRuntime on a free 127.0.0.1 port and prints the port on its first stdout line; with an
engine address, health-checks the engine every 5 minutes and stops when it is gone (rpcutil.Healthcheck).
The executor is the REAL pulumi-language-python-exec (execscript.find_exec), or -use-executor's.
Run by bin/pulumi-language-python as a script (its directory is not a package path entry: the repo
root is put on sys.path here, not in the environment, so programs do not inherit it).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

if __package__ in (None, ""):  # run as a file by the launcher
    _root = str(Path(__file__).resolve().parents[2])
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)  # this directory's modules must not shadow anything a child would import
    sys.path.insert(0, _root)

# gRPC's fork handlers break the children this server starts; set for this process only.
_fork = os.environ.get("GRPC_ENABLE_FORK_SUPPORT")
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
import grpc  # noqa: E402
from concurrent import futures  # noqa: E402

if _fork is None:
    os.environ.pop("GRPC_ENABLE_FORK_SUPPORT", None)
else:
    os.environ["GRPC_ENABLE_FORK_SUPPORT"] = _fork

from pulumi.runtime.proto import language_pb2_grpc  # noqa: E402

from sim.languagehost.execscript import ExecNotFound, find_exec, sdk_version  # noqa: E402
from sim.languagehost.host import PythonLanguageHost  # noqa: E402
from sim.languagehost.streams import GRPC_OPTIONS  # noqa: E402

HEALTH_INTERVAL = 5 * 60.0


def parse_flags(argv: list[str]) -> tuple[dict, list[str]]:
    """Go's flag package: -name / --name, `-name value` or `-name=value`, up to the first non-flag argument.
    The logging flags the CLI may pass (--logtostderr, -v=N, --logflow) are accepted and ignored."""
    flags = {"tracing": "", "use-executor": "", "version": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        name, _, value = arg.lstrip("-").partition("=")
        if name in ("tracing", "use-executor"):
            if not _:
                i += 1
                if i >= len(argv):
                    sys.exit(f"flag needs an argument: -{name}")
                value = argv[i]
            flags[name] = value
        elif name in ("version", "logtostderr", "logflow", "alsologtostderr"):
            flags[name] = value.lower() not in ("false", "0") if _ else True
        elif name in ("v", "verbose"):
            if not _:
                i += 1
        else:
            sys.exit(f"flag provided but not defined: -{name}")
        i += 1
    return flags, argv[i:]


def healthcheck(address: str, stop: threading.Event, interval: float = HEALTH_INTERVAL) -> None:
    """rpcutil.Healthcheck: grpc.health.v1.Health/Check on the engine; any failure but Unimplemented stops us."""
    channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
    check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)  # fmt: skip

    def loop():
        while not stop.wait(interval):
            try:
                check(b"", timeout=60)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    stop.set()
                    return
    threading.Thread(target=loop, daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    flags, args = parse_flags(sys.argv[1:] if argv is None else argv)
    version = sdk_version()
    if flags["version"]:
        print(version)
        return 0
    try:
        exec_path = flags["use-executor"] or str(find_exec(version))
    except ExecNotFound as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    engine_address = args[0] if args else ""
    stop = threading.Event()
    if engine_address:
        healthcheck(engine_address, stop)
    host = PythonLanguageHost(exec_path, engine_address, flags["tracing"],
                              os.environ.get("PULUMI_OTEL_EXPORTER_OTLP_ENDPOINT", ""), version)  # fmt: skip
    host.on_engine_address = lambda address: healthcheck(address, stop)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=GRPC_OPTIONS)
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(host, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    signal.signal(signal.SIGINT, lambda *_: stop.set())  # main.go: os.Interrupt cancels the server
    stop.wait()
    server.stop(grace=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
