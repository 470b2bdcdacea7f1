"""The REAL docker resource plugin against the pulumi_docker SDK the program is written with.

.ci/docker-provider-setup builds pulumi-resource-docker (pulumi-terraform-bridge over kreuzwerker's
terraform-provider-docker, with our own mapping in .ci/docker-provider/resources.go) from the Go module
proxy. The engine sends the program's inputs to it by the schema's names and reads back the schema's
outputs, so the plugin must agree with the installed SDK (pulumi_docker 5.2.0) on every token, property
name, shape (a list, a single object, a map) and required-ness the program relies on.

Here the plugin is asked itself, over gRPC as the engine asks it (GetPluginInfo, GetSchema). The SDK side
is read from the installed package: the tokens its resource classes register, its Args classes' keyword
arguments (no default: required) and their Pulumi names and types. What the program uses is read from
components/*.py: every `docker.X(...)` call and the keywords it passes, including those a
`**helper(...)` returns as `dict(...)`.

A plugin that is missing, or built from other inputs than the checkout's, skips these tests with the
command that builds it; in CI (CI=true) it fails instead, so the tier can never pass by not running.
"""

from __future__ import annotations

import ast
import collections.abc as cabc
import difflib
import inspect
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / ".ci" / "docker-provider-setup"
COMPONENTS = ROOT / "components"

# What the SDK has and this build does not, on purpose. Anything else that differs fails.
KNOWN_MISSING = {
    "docker:index/image:Image": "pulumi-docker's own buildkit resource (its Go code is not on the module proxy); "
    "the program builds images another way",
}

pulumi = pytest.importorskip("pulumi")
docker = pytest.importorskip("pulumi_docker")
from pulumi import _types as pulumi_types  # noqa: E402  (after the importorskip)


def plugin_path() -> Path:
    """The plugin built from this checkout's inputs (`.ci/docker-provider-setup --check`), else skip/fail."""
    proc = subprocess.run(["bash", str(SETUP), "--check"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip() or "docker-provider-setup --check failed")
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return Path(proc.stdout.strip().splitlines()[-1]) / "pulumi-resource-docker"


@pytest.fixture(scope="module")
def served() -> dict:
    """What the plugin answers the engine: its version and its schema."""
    import grpc
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

    proc = subprocess.Popen([str(plugin_path())], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        port = proc.stdout.readline().strip()  # a plugin's first line: its gRPC port
        assert port.isdigit(), f"the plugin printed {port!r}, not a port; stderr:\n{proc.stderr.read()[-3000:]}"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            version = stub.GetPluginInfo(empty_pb2.Empty(), timeout=60).version
            schema = json.loads(stub.GetSchema(provider_pb2.GetSchemaRequest(version=0), timeout=60).schema)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"version": version, "schema": schema}


# ---- the SDK side ----------------------------------------------------------------------------------------

SCALARS = {str: "string", int: "integer", bool: "boolean", float: "number"}


def sdk_shape(t: typing.Any) -> str:
    """An SDK annotation as a shape: pulumi.Input[Optional[Sequence[pulumi.Input['ContainerMountArgs']]]]
    -> 'array<ContainerMount>' (Input's Awaitable and Output members and Optional dropped)."""
    if isinstance(t, (typing.ForwardRef, str)):
        name = t.__forward_arg__ if isinstance(t, typing.ForwardRef) else t
        return name.removesuffix("Args")
    if t in SCALARS:
        return SCALARS[t]
    if t is typing.Any:
        return "any"
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Union:
        keep = [a for a in args if a is not type(None) and typing.get_origin(a) is not cabc.Awaitable
                and not (isinstance(a, typing.ForwardRef) and a.__forward_arg__.startswith("Output["))]  # fmt: skip
        return sdk_shape(keep[0]) if len(keep) == 1 else "union<" + ",".join(map(sdk_shape, keep)) + ">"
    if origin is cabc.Sequence:
        return f"array<{sdk_shape(args[0])}>"
    if origin is cabc.Mapping:
        return f"map<{sdk_shape(args[1])}>"
    return repr(t)


def sdk_inputs(args_cls: type) -> dict[str, tuple[str, bool, str]]:
    """Pulumi name -> (Python name, required, shape) of an SDK Args class's keyword arguments."""
    names = pulumi_types.input_type_py_to_pulumi_names(args_cls)
    out = {}
    for p in inspect.signature(args_cls.__init__).parameters.values():
        if p.kind is p.KEYWORD_ONLY:
            out[names.get(p.name, p.name)] = (p.name, p.default is inspect.Parameter.empty, sdk_shape(p.annotation))
    return out


def sdk_token(cls: type) -> str:
    """The type token a resource class registers with the engine."""
    if cls is docker.Provider:
        return "pulumi:providers:docker"
    m = re.search(r"__init__\(\s*'(docker:[^']+)'", inspect.getsource(cls))
    assert m, f"no type token found in the source of pulumi_docker.{cls.__name__}"
    return m.group(1)


def sdk_resources() -> dict[str, type]:
    """token -> class, for every resource of the SDK (the provider included)."""
    out = {}
    for name in dir(docker):
        obj = getattr(docker, name)
        if (inspect.isclass(obj) and issubclass(obj, pulumi.CustomResource)
                and obj.__module__.startswith("pulumi_docker")):  # fmt: skip
            out[sdk_token(obj)] = obj
    return out


def args_class(resource_cls: type) -> type:
    return getattr(sys.modules[resource_cls.__module__], resource_cls.__name__ + "Args")


# ---- the plugin side -------------------------------------------------------------------------------------


def schema_shape(spec: dict) -> str:
    """A schema property's shape in sdk_shape's terms."""
    if "$ref" in spec:
        ref = spec["$ref"]
        return ref.rsplit("/", 1)[-1].lower() if ref.startswith("pulumi.json#/") else ref.rsplit(":", 1)[-1]
    kind = spec.get("type")
    if kind == "array":
        return f"array<{schema_shape(spec['items'])}>"
    if kind == "object":
        return f"map<{schema_shape(spec.get('additionalProperties', {'type': 'string'}))}>"
    return kind


def resource_spec(schema: dict, token: str) -> dict | None:
    return schema["provider"] if token == "pulumi:providers:docker" else schema["resources"].get(token)


def type_spec(schema: dict, name: str) -> dict | None:
    """The object type the SDK calls `<name>Args`, found by the last part of its token."""
    found = [spec for token, spec in schema["types"].items() if token.rsplit(":", 1)[-1] == name]
    return found[0] if len(found) == 1 else None


def compare(where: str, props: dict, required: set[str], sdk: dict[str, tuple[str, bool, str]],
            only: set[str] | None = None) -> list[str]:  # fmt: skip
    """Differences between schema properties and an SDK Args class (for the Python names in `only`, if given)."""
    diffs = []
    by_py = {py: (pname, req, shape) for pname, (py, req, shape) in sdk.items()}
    for py in sorted(only if only is not None else by_py):
        if py not in by_py:
            diffs.append(f"{where}: the SDK has no argument {py!r}")
            continue
        pname, req, shape = by_py[py]
        if pname not in props:
            near = difflib.get_close_matches(pname, props, n=3)
            diffs.append(f"{where}.{py}: the plugin's schema has no property {pname!r} (nearest: {near})")
            continue
        if (pname in required) != req:
            diffs.append(f"{where}.{py}: required by the plugin: {pname in required}, by the SDK: {req}")
        if schema_shape(props[pname]) != shape:
            diffs.append(f"{where}.{py}: the plugin says {schema_shape(props[pname])}, the SDK {shape}")
    if only is None:
        diffs += [f"{where}: the plugin's property {p!r} is not in the SDK" for p in sorted(set(props) - set(sdk))]
    return diffs


# ---- what the program uses -------------------------------------------------------------------------------


def dict_keys_returned(fn: ast.FunctionDef) -> set[str] | None:
    """The keys of the `dict(k=...)` / `{"k": ...}` a helper returns, or None if it returns something else."""
    keys: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and node.value is not None:
            v = node.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "dict" and not v.args:
                if any(k.arg is None for k in v.keywords):
                    return None
                keys |= {k.arg for k in v.keywords}
            elif isinstance(v, ast.Dict) and all(isinstance(k, ast.Constant) for k in v.keys):
                keys |= {k.value for k in v.keys}
            else:
                return None
    return keys or None


def program_uses() -> dict[str, set[str]]:
    """pulumi_docker class name -> the keywords components/*.py pass to it (`opts` aside)."""
    uses: dict[str, set[str]] = {}
    for path in sorted(COMPONENTS.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                   for a in n.names if a.name == "pulumi_docker"}  # fmt: skip
        helpers = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in aliases):  # fmt: skip
                continue
            name, kwargs = node.func.attr, uses.setdefault(node.func.attr, set())
            for kw in node.keywords:
                if kw.arg is not None:
                    kwargs.add(kw.arg)
                    continue
                value = kw.value  # **something: only a same-module helper returning dict(...) is understood
                named = isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                fn = helpers.get(value.func.id) if named else None
                keys = dict_keys_returned(fn) if fn else None
                assert keys is not None, (f"{path.name}:{node.lineno}: can't see the keywords `**` passes to "
                                          f"docker.{name}: pass them by name or from a helper that returns "
                                          "dict(...)")  # fmt: skip
                kwargs |= keys
    for kwargs in uses.values():
        kwargs.discard("opts")
    return uses


# ---- the tests -------------------------------------------------------------------------------------------


def test_the_program_uses_docker_resources():
    """The parser above sees the program's docker calls (else the tests below check nothing)."""
    uses = program_uses()
    assert {"Container", "RemoteImage", "Volume", "Provider", "ContainerMountArgs"} <= set(uses), sorted(uses)
    assert {"image", "command", "mounts", "must_run"} <= uses["Container"], sorted(uses["Container"])


def test_the_plugin_reports_the_sdks_version(served):
    """The engine loads the plugin whose version the SDK asks for (pulumi_docker/pulumi-plugin.json)."""
    wanted = json.loads((Path(docker.__file__).parent / "pulumi-plugin.json").read_text())
    assert wanted["name"] == "docker"
    assert served["version"] == wanted["version"], (served["version"], wanted)
    assert served["schema"]["name"] == "docker"


def test_every_resource_the_program_uses_has_the_sdks_token(served):
    schema, uses = served["schema"], program_uses()
    resources = {cls.__name__: token for token, cls in sdk_resources().items()}
    used = sorted(name for name in uses if name in resources)
    assert used, sorted(uses)
    missing = [f"docker.{name} ({resources[name]})" for name in used if resource_spec(schema, resources[name]) is None]
    assert not missing, f"resources the program uses that the plugin does not serve: {missing}"


def test_every_property_the_program_sets_matches_the_sdk(served):
    """Each keyword the program passes: in the plugin's schema under the SDK's Pulumi name, with the SDK's
    shape and required-ness; each Args class the program builds: the plugin's type of the same name."""
    schema, uses, diffs, checked = served["schema"], program_uses(), [], 0
    resources = {cls.__name__: (token, cls) for token, cls in sdk_resources().items()}
    for name, kwargs in sorted(uses.items()):
        if name in resources:
            token, cls = resources[name]
            spec = resource_spec(schema, token)
            if spec is None:
                diffs.append(f"docker.{name}: no resource {token} in the plugin's schema")
                continue
            props, required = spec.get("inputProperties", {}), set(spec.get("requiredInputs", []))
            diffs += compare(f"docker.{name}", props, required, sdk_inputs(args_class(cls)), only=kwargs)
            # the required inputs the program leaves out would fail at `up`
            req = {py for py, r, _ in sdk_inputs(args_class(cls)).values() if r} - kwargs
            diffs += [f"docker.{name}: the program leaves out {py!r}, which the SDK requires" for py in sorted(req)]
        elif name.endswith("Args"):
            spec = type_spec(schema, name.removesuffix("Args"))
            if spec is None:
                diffs.append(f"docker.{name}: no object type {name.removesuffix('Args')} in the plugin's schema")
                continue
            diffs += compare(f"docker.{name}", spec.get("properties", {}), set(spec.get("required", [])),
                             sdk_inputs(getattr(docker, name)), only=kwargs)  # fmt: skip
        else:
            diffs.append(f"docker.{name}: neither a resource nor an Args class of the SDK")
        checked += len(kwargs)
    assert checked >= 40, f"only {checked} keywords seen in components/: is program_uses() still right?"
    assert not diffs, "the plugin disagrees with the SDK on what the program uses:\n" + "\n".join(diffs)


def test_the_whole_sdk_surface_matches(served):
    """Every resource of the SDK (but KNOWN_MISSING), every input of it and of every object type reached from
    one (name, shape, required-ness), and every output's name and optionality; every function's token."""
    schema, diffs = served["schema"], []
    reached: set[str] = set()
    for token, cls in sorted(sdk_resources().items()):
        spec = resource_spec(schema, token)
        if spec is None:
            if token not in KNOWN_MISSING:
                diffs.append(f"{token} (docker.{cls.__name__}): not served by the plugin")
            continue
        props = spec.get("inputProperties", {})
        diffs += compare(cls.__name__, props, set(spec.get("requiredInputs", [])), sdk_inputs(args_class(cls)))
        reached |= {re.sub(r"^(array|map)<(.*)>$", r"\2", schema_shape(p)) for p in props.values()}
        if cls is docker.Provider:
            continue
        outputs = pulumi_types.resource_py_to_pulumi_names(cls)
        hints = {py: typing.get_type_hints(getattr(cls, py).fget, vars(sys.modules[cls.__module__]))["return"]
                 for py in outputs}  # fmt: skip
        state, required = spec.get("properties", {}), set(spec.get("required", []))
        for py, pname in sorted(outputs.items()):
            if pname not in state:
                diffs.append(f"{cls.__name__}.{py}: an output of the SDK, not of the plugin")
                continue
            optional = type(None) in typing.get_args(typing.get_args(hints[py])[0])
            if optional == (pname in required):
                diffs.append(f"{cls.__name__}.{py}: output required by the plugin: {pname in required}, "
                             f"by the SDK: {not optional}")  # fmt: skip
        extra = sorted(set(state) - set(outputs.values()))
        diffs += [f"{cls.__name__}: the plugin's output {p!r} is not in the SDK" for p in extra]
    for token in sorted(set(schema["resources"]) - set(sdk_resources())):
        diffs.append(f"{token}: served by the plugin, not in the SDK")
    done: set[str] = set()
    while todo := sorted(t for t in reached - done if t[:1].isupper()):
        name = todo[0]
        done.add(name)
        spec, args = type_spec(schema, name), getattr(docker, name + "Args", None)
        if spec is None or args is None:
            diffs.append(f"type {name}: in the plugin's schema: {spec is not None}, "
                         f"docker.{name}Args in the SDK: {args is not None}")  # fmt: skip
            continue
        props = spec.get("properties", {})
        diffs += compare(f"{name}Args", props, set(spec.get("required", [])), sdk_inputs(args))
        reached |= {re.sub(r"^(array|map)<(.*)>$", r"\2", schema_shape(p)) for p in props.values()}
    assert len(done) >= 20, sorted(done)
    invoked = set()
    for name in dir(docker):
        fn = getattr(docker, name)
        if name.startswith("get") and inspect.isfunction(fn):
            invoked |= set(re.findall(r"invoke(?:_output)?\('(docker:[^']+)'", inspect.getsource(fn)))
    assert invoked, "no functions found in the SDK"
    diffs += [f"function {t}: in the SDK, not served by the plugin" for t in sorted(invoked - set(schema["functions"]))]
    assert not diffs, "the plugin and the SDK differ:\n" + "\n".join(diffs)
