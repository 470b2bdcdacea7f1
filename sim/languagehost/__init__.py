"""TEST DOUBLE of Pulumi's Python language host plugin, `pulumi-language-python` (see sim/adaptations.py).

The real host is a Go gRPC server (github.com/pulumi/pulumi sdk/python/cmd/pulumi-language-python,
main.go) that the module proxy refuses to serve here (403). Its Python half, the
`pulumi-language-python-exec` script that runs a program, ships in the Go module
github.com/pulumi/pulumi/sdk/v3 that the CLI build already downloads: this double serves the same
LanguageRuntime service and runs that REAL script, with main.go's arguments and environment, in the
project's virtualenv (toolchain: the pip toolchain of sdk/python/toolchain, ported).

    host.py        the LanguageRuntime servicer (main.go's methods, one by one)
    toolchain.py   sdk/python/toolchain: options, the pip toolchain, virtualenv errors and creation
    packages.py    GetRequiredPackages: installed packages' pulumi-plugin.json -> plugin dependencies
    policyproxy.py sdk/v3 policy_proxy.go: the Analyzer proxy RunPlugin puts in front of a policy pack
    streams.py     io plumbing: child processes, gRPC output streams, the engine's Log, pty
    execscript.py  where the real pulumi-language-python-exec is (the Go module cache)
    __main__.py    main.go's main(): flags, engine health check, port on stdout

bin/pulumi-language-python is the launcher the CLI finds on PATH. That directory goes on PATH only
when no real `pulumi-language-python` is installed (`bin_dir_if_needed()`): a real host always wins.
Or, without the CLI's "using pulumi-language-python from $PATH" warning: `link_next_to_cli(engine_dir)`.

This module imports nothing beyond the standard library, so environment builders can use it cheaply.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

BIN_DIR = Path(__file__).resolve().parent / "bin"
PLUGIN_NAME = "pulumi-language-python"


def _is_ours(path: str | os.PathLike) -> bool:
    return Path(path).resolve() == (BIN_DIR / PLUGIN_NAME).resolve()


def real_host(path: str | None = None) -> str | None:
    """The first `pulumi-language-python` on `path` (default: $PATH) that is not this double's launcher
    (a symlink to the launcher is the double too)."""
    for entry in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        if not entry:
            continue
        found = shutil.which(PLUGIN_NAME, path=entry)
        if found and not _is_ours(found):
            return found
    return None


def bin_dir_if_needed(path: str | None = None, engine_dir: str | os.PathLike | None = None) -> Path | None:
    """The double's bin directory to append to PATH, or None when PATH needs no entry: a real
    `pulumi-language-python` is on `path` (default: $PATH), or any one, real or `link_next_to_cli`'s, is next
    to the CLI in `engine_dir` (where the CLI also looks, "bundled"; a PATH entry besides would only add
    the warning below).

    The CLI warns `using pulumi-language-python from $PATH at ...` for a language host found on PATH that is
    not next to its own binary (sdk workspace/plugins.go getPluginInfoAndPath); `link_next_to_cli` avoids that.
    """
    if real_host(path):
        return None
    if engine_dir is not None and os.access(Path(engine_dir) / PLUGIN_NAME, os.X_OK):
        return None
    return BIN_DIR


def link_next_to_cli(engine_dir: str | os.PathLike) -> Path | None:
    """Optional, instead of PATH: a symlink to the launcher next to the CLI binary, where the CLI looks for
    its bundled language hosts (no warning). Returns the link, or None when a real host is there already."""
    link = Path(engine_dir) / PLUGIN_NAME
    if link.is_symlink() and _is_ours(link):
        return link
    if os.path.lexists(link):
        return None
    link.symlink_to(BIN_DIR / PLUGIN_NAME)
    return link
