"""The gRPC plumbing every provider TEST DOUBLE here shares (see sim/adaptations.py).

The Pulumi engine starts a resource plugin `pulumi-resource-<name>` found on PATH, reads the port it
prints on its first stdout line and speaks the ResourceProvider service to it. This module turns
that service into a few plain Python methods over dicts:

    check(type, olds, news) -> inputs          diff(type, olds, news) -> Diff
    create(type, inputs, preview) -> (id, outputs)
    read(type, id, state) -> state | None       update(type, id, olds, news, preview) -> outputs
    delete(type, id, state)

Values are the JSON form of the engine's property Structs: secrets are `{sig: secret, value: ...}`
objects and unknowns (preview) the engine's unknown sentinel. Providers work on `reveal()`ed values
and hand back the engine's own structures (`outputs = {**inputs, ...}`), so secretness survives.
"""

from __future__ import annotations

import sys
import threading
import traceback
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import any_pb2, empty_pb2, json_format, struct_pb2
from google.rpc import status_pb2  # googleapis-common-protos, a dependency of pulumi's gRPC stack
from pulumi.runtime import rpc
from pulumi.runtime.proto import engine_pb2, engine_pb2_grpc, plugin_pb2, provider_pb2, provider_pb2_grpc

UNKNOWN = rpc.UNKNOWN  # the engine's sentinel for a value not known yet (preview)
SECRET_SIG = rpc._special_secret_sig
SIG_KEY = rpc._special_sig_key
Kind = provider_pb2.PropertyDiff.Kind


class ProviderError(Exception):
    """A failure to report to the engine as the step's error message."""


class InitFailed(ProviderError):
    """A Create/Update that left the resource behind without it working: the engine keeps it in the state,
    with `reasons` as its init errors, and the step fails. This is the ErrorResourceInitFailed detail of the
    gRPC status (pulumi sdk proto/pulumi/provider.proto; the engine's plugin.parseError turns it into a
    StatusPartialFailure), which the Terraform bridge returns for a Create that set an ID and then failed
    (pulumi-terraform-bridge pkg/tfbridge/provider.go Create: initializationError). On the next `up` the
    engine sends the resource an Update even when Diff finds no change (deploy/step_generator.go:
    "resource was unchanged, but there were initialization errors")."""

    def __init__(self, id_: str, properties: dict, reasons: list[str], inputs: dict | None = None):
        super().__init__("; ".join(reasons))
        self.id, self.properties, self.reasons, self.inputs = id_, properties, reasons, inputs


STATUS_DETAILS_KEY = "grpc-status-details-bin"  # where gRPC carries a google.rpc.Status with details


def init_failed_status(exc: InitFailed, message: str) -> bytes:
    """The serialized google.rpc.Status that carries `exc` as an ErrorResourceInitFailed detail (what
    grpc-go's status.WithDetails sends and rpcerror.Convert reads on the engine's side)."""
    detail = provider_pb2.ErrorResourceInitFailed(id=exc.id, properties=to_struct(exc.properties), reasons=exc.reasons)
    if exc.inputs is not None:
        detail.inputs.CopyFrom(to_struct(exc.inputs))
    packed = any_pb2.Any()
    packed.Pack(detail)
    return status_pb2.Status(code=grpc.StatusCode.UNKNOWN.value[0], message=message, details=[packed]).SerializeToString()


def from_struct(s: struct_pb2.Struct | None) -> dict:
    return json_format.MessageToDict(s) if s is not None else {}


def to_struct(value: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    json_format.ParseDict(value, s)
    return s


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG


def reveal(value: Any) -> Any:
    """The plain value: secret wrappers removed, all the way down."""
    if is_secret(value):
        return reveal(value.get("value"))
    if isinstance(value, dict):
        return {k: reveal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [reveal(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def has_unknown(value: Any) -> bool:
    if value == UNKNOWN:
        return True
    if isinstance(value, dict):
        return any(has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(has_unknown(v) for v in value)
    return False


@dataclass
class Diff:
    """A provider's answer to Diff: which top-level inputs changed and which of them replace."""

    changed: list[str] = field(default_factory=list)
    replaces: list[str] = field(default_factory=list)
    delete_before_replace: bool = False
    added: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    # {property path: kind name}, e.g. {"labels[2].value": "UPDATE_REPLACE"}; None: one entry per changed key
    detailed: dict[str, str] | None = None

    def response(self) -> provider_pb2.DiffResponse:
        detailed = {}
        for path, kind in (self.detailed or {}).items():
            detailed[path] = provider_pb2.PropertyDiff(kind=Kind.Value(kind), inputDiff=False)
        for key in self.changed if self.detailed is None else []:
            replace = key in self.replaces
            if key in self.added:
                kind = Kind.ADD_REPLACE if replace else Kind.ADD
            elif key in self.removed:
                kind = Kind.DELETE_REPLACE if replace else Kind.DELETE
            else:
                kind = Kind.UPDATE_REPLACE if replace else Kind.UPDATE
            detailed[key] = provider_pb2.PropertyDiff(kind=kind, inputDiff=True)
        return provider_pb2.DiffResponse(
            changes=provider_pb2.DiffResponse.DIFF_SOME if self.changed else provider_pb2.DiffResponse.DIFF_NONE,
            diffs=self.changed,
            replaces=self.replaces,
            deleteBeforeReplace=self.delete_before_replace and bool(self.replaces),
            detailedDiff=detailed,
            hasDetailedDiff=True,
        )


def diff_inputs(olds: dict, news: dict, force_new: set[str], ignore: list[str] = ()) -> Diff:
    """Top-level input diff; a change to a key in `force_new` (or, with `"*"`, to any key) replaces."""
    d = Diff()
    for key in sorted(set(olds) | set(news)):
        if key in ignore or olds.get(key) == news.get(key):
            continue
        # A secret wrapper alone (same value) is no change.
        if key in olds and key in news and reveal(olds[key]) == reveal(news[key]) and not has_unknown(news[key]):
            continue
        d.changed.append(key)
        if key not in olds:
            d.added.add(key)
        elif key not in news:
            d.removed.add(key)
        if "*" in force_new or key in force_new:
            d.replaces.append(key)
    return d


def type_of(urn: str) -> str:
    """The resource type token of a URN (urn:pulumi:stack::project::parent$type::name)."""
    return urn.split("::")[2].split("$")[-1]


class Provider(provider_pb2_grpc.ResourceProviderServicer):
    """Subclasses set `name`/`version` and override configure/check/diff/create/read/update/delete."""

    name = "test-double"
    version = "0.0.0"
    engine: engine_pb2_grpc.EngineStub | None = None  # the engine's Log service (its address: Handshake, argv[1])
    _step = threading.local()  # per gRPC worker thread: the step being served (its timeout)

    def log_status(self, urn: str, message: str) -> None:
        """An ephemeral info message on the resource, as pulumi-go-provider's ctx.LogStatus sends it (the CLI
        shows it on the resource's row; the event log keeps it as a diagnostic event)."""
        if self.engine is None:
            return
        try:
            self.engine.Log(engine_pb2.LogRequest(severity=engine_pb2.INFO, message=message, urn=urn, ephemeral=True))
        except grpc.RpcError:
            pass  # an engine that went away while a command ran: nothing to tell

    def connect_engine(self, address: str) -> None:
        if address and self.engine is None:
            self.engine = engine_pb2_grpc.EngineStub(grpc.insecure_channel(address))

    # ------------------------------------------------------------------ what subclasses implement

    def configure(self, config: dict) -> None:
        pass

    def check(self, type_: str, olds: dict, news: dict) -> dict:
        return news

    def diff(self, type_: str, id_: str, olds: dict, news: dict, ignore: list[str]) -> Diff:
        return diff_inputs(olds, news, {"*"}, ignore)

    def create(self, type_: str, urn: str, inputs: dict, preview: bool) -> tuple[str, dict]:
        raise ProviderError(f"{self.name}: cannot create {type_}")

    def read(self, type_: str, urn: str, id_: str, state: dict, inputs: dict) -> tuple[dict, dict] | None:
        return state, inputs

    def update(self, type_: str, urn: str, id_: str, olds: dict, news: dict, preview: bool) -> dict:
        """`olds` is the old state (outputs), `news` the checked new inputs."""
        return news

    def delete(self, type_: str, urn: str, id_: str, state: dict) -> None:
        pass

    # ------------------------------------------------------------------ gRPC

    def _fail(self, context, what: str, exc: BaseException):
        message = str(exc) if isinstance(exc, ProviderError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, ProviderError):
            traceback.print_exc(file=sys.stderr)
        if isinstance(exc, InitFailed):
            context.set_trailing_metadata(((STATUS_DETAILS_KEY, init_failed_status(exc, message)),))
        context.abort(grpc.StatusCode.UNKNOWN, f"{what}: {message}")

    def GetPluginInfo(self, request, context):
        return plugin_pb2.PluginInfo(version=self.version)

    def Handshake(self, request, context):
        self.connect_engine(request.engine_address)
        return provider_pb2.ProviderHandshakeResponse(accept_secrets=True, accept_resources=True)

    def GetSchema(self, request, context):
        return provider_pb2.GetSchemaResponse(schema="{}")

    def CheckConfig(self, request, context):
        return provider_pb2.CheckResponse(inputs=request.news)

    def DiffConfig(self, request, context):
        olds, news = from_struct(request.old_inputs or request.olds), from_struct(request.news)
        return diff_inputs(olds, news, set()).response()

    def Configure(self, request, context):
        config = {k.split(":")[-1]: v for k, v in request.variables.items()}
        config.update(reveal(from_struct(request.args)))
        try:
            self.configure(config)
        except Exception as exc:  # noqa: BLE001 - reported to the engine
            self._fail(context, "configure", exc)
        return provider_pb2.ConfigureResponse(acceptSecrets=True, supportsPreview=True, acceptResources=True)

    def Check(self, request, context):
        try:
            inputs = self.check(type_of(request.urn), from_struct(request.olds), from_struct(request.news))
        except Exception as exc:  # noqa: BLE001
            self._fail(context, f"check {request.urn}", exc)
        return provider_pb2.CheckResponse(inputs=to_struct(inputs))

    def Diff(self, request, context):
        olds = from_struct(request.old_inputs) if request.HasField("old_inputs") else from_struct(request.olds)
        try:
            d = self.diff(type_of(request.urn), request.id, olds, from_struct(request.news), list(request.ignoreChanges))
        except Exception as exc:  # noqa: BLE001
            self._fail(context, f"diff {request.urn}", exc)
        return d.response()

    def step_timeout(self) -> float | None:
        """The running step's customTimeouts deadline in seconds (the engine's `timeout` field), None without one."""
        return getattr(self._step, "timeout", None)

    def _start_step(self, request) -> None:
        self._step.timeout = getattr(request, "timeout", 0) or None

    def Create(self, request, context):
        self._start_step(request)
        try:
            id_, outputs = self.create(type_of(request.urn), request.urn, from_struct(request.properties), request.preview)
        except Exception as exc:  # noqa: BLE001
            self._fail(context, "create", exc)
        return provider_pb2.CreateResponse(id=id_, properties=to_struct(outputs))

    def Read(self, request, context):
        try:
            got = self.read(
                type_of(request.urn), request.urn, request.id, from_struct(request.properties), from_struct(request.inputs)
            )
        except Exception as exc:  # noqa: BLE001
            self._fail(context, "read", exc)
        if got is None:  # gone: the engine drops it from the state
            return provider_pb2.ReadResponse(id="")
        state, inputs = got
        return provider_pb2.ReadResponse(id=request.id, properties=to_struct(state), inputs=to_struct(inputs))

    def Update(self, request, context):
        self._start_step(request)
        olds = from_struct(request.olds)  # the old state (outputs): commands hand their old stdout on
        try:
            outputs = self.update(
                type_of(request.urn), request.urn, request.id, olds, from_struct(request.news), request.preview
            )
        except Exception as exc:  # noqa: BLE001
            self._fail(context, "update", exc)
        return provider_pb2.UpdateResponse(properties=to_struct(outputs))

    def Delete(self, request, context):
        self._start_step(request)
        try:
            self.delete(type_of(request.urn), request.urn, request.id, from_struct(request.properties))
        except Exception as exc:  # noqa: BLE001
            self._fail(context, "delete", exc)
        return empty_pb2.Empty()

    def Cancel(self, request, context):
        return empty_pb2.Empty()


def serve(provider: Provider) -> None:
    """Serve `provider` on a free loopback port; the port goes on the first stdout line, as the engine expects."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16),
        options=[("grpc.max_receive_message_length", 400 * 1024 * 1024)],
    )
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):  # the engine passes its address first
        provider.connect_engine(sys.argv[1])
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(provider, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()
