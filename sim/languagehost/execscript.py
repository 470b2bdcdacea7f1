"""Where the REAL `pulumi-language-python-exec` is: the Go module cache's github.com/pulumi/pulumi/sdk/v3.

The real host finds the script next to its own binary (main.go main(): `pythonDefaultExec` in
filepath.Dir(os.Executable()), or `-use-executor`). Both are shipped by the same release; here the
script comes from the sdk/v3 module the CLI build downloads (`.ci/engine-setup`), at the version
.ci/engine/go.mod pins, so script and CLI are the same release.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GO_MOD = ROOT / ".ci/engine/go.mod"
MODULE = "github.com/pulumi/pulumi/sdk/v3"
SCRIPT = "python/cmd/pulumi-language-python-exec"
FALLBACK_VERSION = "v3.274.1"


class ExecNotFound(Exception):
    pass


def sdk_version(go_mod: Path = GO_MOD) -> str:
    """The sdk/v3 version the CLI is built with (.ci/engine/go.mod's require line)."""
    try:
        text = go_mod.read_text()
    except OSError:
        return FALLBACK_VERSION
    m = re.search(r"^\s*(?:require\s+)?" + re.escape(MODULE) + r"\s+(v\S+)", text, re.M)
    return m.group(1) if m else FALLBACK_VERSION


def gomodcache() -> Path:
    """$GOMODCACHE, else `go env GOMODCACHE`, else $GOPATH/pkg/mod, else ~/go/pkg/mod (Go's own order)."""
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if go:
        try:
            out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30).stdout.strip()
            if out:
                return Path(out)
        except (OSError, subprocess.SubprocessError):
            pass
    gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0] or str(Path.home() / "go")
    return Path(gopath) / "pkg/mod"


def find_exec(version: str | None = None) -> Path:
    """The exec script's path; ExecNotFound (naming the fix) when the module is not in the cache."""
    version = version or sdk_version()
    path = gomodcache() / f"{MODULE}@{version}" / SCRIPT
    if not path.is_file():
        raise ExecNotFound(
            f"missing executor {path}: the pulumi-language-python TEST DOUBLE runs the real "
            f"pulumi-language-python-exec from the Go module {MODULE}@{version}, which is not in the Go module "
            f"cache; run `bash .ci/engine-setup` (it downloads the module while building the CLI)")
    return path
