"""sdk/v3 policy_proxy.go (PolicyProxy), ported: the Analyzer server RunPlugin puts in front of a Python
policy pack.

The engine starts a pack through the language host (RunPlugin, kind "analyzer") and reads a port
from its stdout: the proxy's. The proxy answers Handshake itself, waits for ConfigureStack (or any
other call: then "no configuration"), and only then does RunPlugin start `python -m pulumi.policy`
with that configuration in the environment (PULUMI_PROJECT, PULUMI_STACK, PULUMI_CONFIG, ...), as
pulumi-policy's old entry point expects. Attach reads the pack's own port from its stdout, forwards
the stack configuration to it and from then on relays every call.
"""

from __future__ import annotations

import re
import threading
from concurrent import futures

import grpc
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from sim.languagehost.streams import GRPC_OPTIONS, GoError, Writer, _pump, wait


class Completion:
    """promise.CompletionSource: the first Fulfill/Reject wins."""

    def __init__(self):
        self._done, self._lock = threading.Event(), threading.Lock()
        self._value, self._error = None, None

    def fulfill(self, value) -> None:
        with self._lock:
            if not self._done.is_set():
                self._value = value
                self._done.set()

    def reject(self, error: Exception) -> None:
        with self._lock:
            if not self._done.is_set():
                self._error = error
                self._done.set()

    def try_result(self):
        return self._value, self._error, self._done.is_set()

    def result(self, alive=lambda: True):
        """Promise.Result(ctx): waits while `alive()` (the request's context) holds."""
        while not self._done.wait(0.2):
            if not alive():
                raise GoError("context canceled")
        if self._error is not None:
            raise self._error
        return self._value


class PolicyProxy(analyzer_pb2_grpc.AnalyzerServicer):
    def __init__(self, stdout: Writer):
        self.stack_configuration, self.client = Completion(), Completion()
        self.stdout = stdout
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=GRPC_OPTIONS)
        analyzer_pb2_grpc.add_AnalyzerServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self._channel = None

    def stop(self) -> None:
        """The RunPlugin request ended: no new calls; calls waiting for the pack get its error (abort) first."""
        self.server.stop(grace=2.0)
        if self._channel is not None:
            self._channel.close()

    def await_configuration(self, alive) -> analyzer_pb2.AnalyzerStackConfigureRequest | None:
        """AwaitConfiguration: the proxy's port on the plugin's stdout, then the engine's ConfigureStack."""
        self.stdout.write(f"{self.port}\n")
        return self.stack_configuration.result(alive)

    def attach(self, cmd, threads: list) -> None:
        """Attach: the pack's port from its stdout (the rest of its stdout relayed), a client to it, the stack
        configuration forwarded (Unimplemented is fine), then wait for the pack to exit (its ExitError raised)."""
        line = cmd.proc.stdout.readline()
        m = re.match(rb"\s*(\d+)\s*$", line) if line.endswith(b"\n") else None
        if m is None:
            err = GoError("could not read policy pack port: " + ("EOF" if not line else "expected integer"))
            self.client.reject(err)
            # the rest of stdout still goes to the engine, then the exit status is collected
            relay = threading.Thread(target=_pump, args=(cmd.proc.stdout, [self.stdout]), daemon=True)
            relay.start()
            if line:
                self.stdout.write(line)
            raise err
        relay = threading.Thread(target=_pump, args=(cmd.proc.stdout, [self.stdout]), daemon=True)
        relay.start()
        self._channel = grpc.insecure_channel(f"127.0.0.1:{int(m[1])}", options=GRPC_OPTIONS)
        client = analyzer_pb2_grpc.AnalyzerStub(self._channel)
        stkcfg, _, has = self.stack_configuration.try_result()
        if has and stkcfg is not None:
            try:
                client.ConfigureStack(stkcfg)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    err = GoError(f"policy pack configuration failed: rpc error: code = {_code(exc)} "
                                  f"desc = {exc.details()}")  # fmt: skip
                    self.client.reject(err)
                    raise err from exc
        self.client.fulfill(client)
        wait(cmd, threads + [relay])

    def abort(self, err: Exception) -> None:
        """Abort (3.274): the pack did not start; callers waiting for it get the error."""
        self.client.reject(GoError(f"policy pack failed to start: {err}"))

    # ------------------------------------------------------------------ Analyzer service

    def _await_client(self, context):
        # The engine sometimes calls other methods before ConfigureStack (`policy publish`): no configuration.
        self.stack_configuration.fulfill(None)
        try:
            return self.client.result(context.is_active)
        except GoError as exc:
            context.abort(grpc.StatusCode.UNKNOWN, f"policy pack not started: {exc}")

    def _relay(self, method: str, request, context):
        client = self._await_client(context)
        try:
            return getattr(client, method)(request)
        except grpc.RpcError as exc:
            trailing = [(k, v) for k, v in (exc.trailing_metadata() or ()) if k == "grpc-status-details-bin"]
            if trailing:
                context.set_trailing_metadata(trailing)
            context.abort(exc.code(), exc.details() or "")

    def ConfigureStack(self, request, context):
        self.stack_configuration.fulfill(request)
        return analyzer_pb2.AnalyzerStackConfigureResponse()

    def Handshake(self, request, context):
        return analyzer_pb2.AnalyzerHandshakeResponse()

    def Analyze(self, request, context):
        return self._relay("Analyze", request, context)

    def AnalyzeStack(self, request, context):
        return self._relay("AnalyzeStack", request, context)

    def Remediate(self, request, context):
        return self._relay("Remediate", request, context)

    def GetAnalyzerInfo(self, request, context):
        return self._relay("GetAnalyzerInfo", request, context)

    def GetPluginInfo(self, request, context):
        return self._relay("GetPluginInfo", request, context)

    def Configure(self, request, context):
        return self._relay("Configure", request, context)

    def Cancel(self, request, context):
        return self._relay("Cancel", request, context)


def _code(exc: grpc.RpcError) -> str:
    """A status code as grpc-go prints it (`Unknown`, `Unavailable`, ...)."""
    return "".join(part.capitalize() for part in exc.code().name.split("_"))
