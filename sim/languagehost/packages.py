"""GetRequiredPackages' helpers, from main.go: which installed Python packages are Pulumi packages and
which plugin each needs.

    list_pulumi_package_infos         listPulumiPackageInfos + readAllPulumiPluginJSONPaths (the same script)
    package_dependency_from_plugin_json  packageDependencyFromPluginJSON
    determine_plugin_version          determinePluginVersion (PEP 440 -> semver)
"""

from __future__ import annotations

import base64
import json

from pulumi.runtime.proto import plugin_pb2

from sim.languagehost.streams import GoError, output
from sim.languagehost.toolchain import Pip

# main.go packagesWithoutPlugins
PACKAGES_WITHOUT_PLUGINS = {"pulumi-policy", "pulumi-esc-sdk"}

# main.go pulumiPluginJSONPathsScript, verbatim (tabs included)
PLUGIN_JSON_PATHS_SCRIPT = """import importlib.metadata, importlib.util, os, sys, json
result = {}
for pkg_name in sys.argv[1:]:
\ttry:
\t\tdist = importlib.metadata.distribution(pkg_name)
\t\tmodule = dist.metadata['Name'].replace('-', '_')
\t\tspec = importlib.util.find_spec(module)
\t\tlocs = list(spec.submodule_search_locations or []) if spec else []
\t\tfound = [p for l in locs for p in [os.path.join(str(l), 'pulumi-plugin.json')] if os.path.isfile(p)]
\t\tresult[pkg_name] = found[0] if found else ''
\texcept Exception:
\t\tresult[pkg_name] = ''
print(json.dumps(result))"""


def read_all_plugin_json_paths(tc: Pip, packages: list[tuple[str, str]]) -> dict[str, str]:
    """readAllPulumiPluginJSONPaths: a failed script run means "none found"; unparsable output is an error."""
    if not packages:
        return {}
    try:
        out = output(tc.command("-c", PLUGIN_JSON_PATHS_SCRIPT, *[name for name, _ in packages]))
    except GoError:
        return {}
    try:
        return json.loads(out)
    except ValueError as exc:
        raise GoError(f"failed to parse pulumi-plugin.json paths: {exc}") from exc


def list_pulumi_package_infos(tc: Pip) -> list[tuple[str, str, dict | None]]:
    """listPulumiPackageInfos: (name, version, pulumi-plugin.json or None) of each package that has a
    pulumi-plugin.json or whose name starts with `pulumi-`, except the known plugin-less ones."""
    packages = tc.list_packages(True)
    paths = read_all_plugin_json_paths(tc, packages)
    result = []
    for name, version in packages:
        if name in PACKAGES_WITHOUT_PLUGINS:
            continue
        plugin_json = None
        if paths.get(name):
            try:
                with open(paths[name], "rb") as f:
                    data = f.read()
            except OSError:
                data = None
            if data is not None:
                try:
                    plugin_json = json.loads(data)
                except ValueError as exc:
                    raise GoError(f"failed to parse pulumi-plugin.json for {name}: {exc}") from exc
        if plugin_json is None and not name.startswith("pulumi-"):
            continue
        result.append((name, version, plugin_json))
    return result


def _parameterization(p: dict | None) -> plugin_pb2.PackageParameterization | None:
    if not p:
        return None
    value = base64.b64decode(p.get("value") or "")  # Go's []byte in JSON is base64
    return plugin_pb2.PackageParameterization(name=p.get("name", ""), version=p.get("version", ""), value=value)


def package_dependency_from_plugin_json(name: str, version: str, p: dict | None) -> plugin_pb2.PackageDependency | None:
    """packageDependencyFromPluginJSON: None for `resource: false` or an undeterminable plugin version."""
    plugin_name = plugin_version = server = ""
    parameterization = extension = None
    if p is not None:
        if not p.get("resource", False):
            return None
        parameterization = _parameterization(p.get("parameterization"))
        extension = _parameterization(p.get("extensionParameterization"))
        plugin_name, plugin_version, server = p.get("name", ""), p.get("version", ""), p.get("server", "")
    if not plugin_name:
        plugin_name = name.removeprefix("pulumi-")
    if not plugin_version:
        try:
            plugin_version = determine_plugin_version(version)
        except ValueError:
            return None
    if not plugin_version.startswith("v"):
        plugin_version = "v" + plugin_version
    dep = plugin_pb2.PackageDependency(name=plugin_name, version=plugin_version, kind="resource", server=server)
    if parameterization is not None:
        dep.parameterization.CopyFrom(parameterization)
    if extension is not None:
        dep.extension.CopyFrom(extension)
    return dep


def _number(s: str) -> tuple[str, str]:
    i = 0
    while i < len(s) and s[i].isdigit() and s[i].isascii():
        i += 1
    return s[:i], s[i:]


def determine_plugin_version(package_version: str) -> str:
    """main.go determinePluginVersion: `N(.N)*[{a|b|rc}N][.postN][.devN]` -> semver; ValueError otherwise."""
    if not package_version:
        raise ValueError("cannot parse empty string")
    if not package_version.isascii():
        raise ValueError("not ascii")
    num, rest = _number(package_version)
    if num and rest.startswith("!"):
        raise ValueError("epochs are not supported")
    segments, rest, found_dot = [], package_version, False
    while True:
        num, rest = _number(rest)
        if not num:
            break
        found_dot = False
        segments.append(num)
        if rest.startswith("."):
            rest, found_dot = rest[1:], True
        else:
            break
    if found_dot:
        rest = "." + rest
    segments += ["0"] * (3 - len(segments))
    if rest == "":
        return ".".join(segments)
    pre = post = dev = ""
    if rest[0] == "a":
        pre, rest = _number(rest[1:])
        pre = "-alpha." + pre
    elif rest[0] == "b":
        pre, rest = _number(rest[1:])
        pre = "-beta." + pre
    elif rest.startswith("rc"):
        pre, rest = _number(rest[2:])
        pre = "-rc." + pre
    if rest.startswith(".post"):
        post, rest = _number(rest[5:])
        post = "+post" + post
    if rest.startswith(".dev"):
        dev, rest = _number(rest[4:])
        dev = ("" if post else "+") + "dev" + dev
    if rest:
        raise ValueError(f"'{rest}' still unparsed")
    return ".".join(segments) + pre + post + dev
