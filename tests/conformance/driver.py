"""Runs inside a conformance environment (a venv with the REAL engine packages, .ci/conformance-setup):
components/argcheck.py's checks on many argvs in one process (importing an engine takes seconds).

    <venv>/bin/python tests/conformance/driver.py < checks.json > results.json

stdin: [[engine, argv], ...]; stdout: [{"ok": bool, "flag": str, "message": str, "what": str}, ...].
The image checks (DSPARK draft weights, the adapter, Ray for the Ray backend) are off: a venv is not
an image; the e2e tier runs them in the sim's image.
"""
import contextlib
import importlib.util
import io
import json
import os
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "argcheck", Path(__file__).resolve().parents[2] / "components" / "argcheck.py")
argcheck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(argcheck)
argcheck.IMAGE_CHECKS = False

if sys.argv[1:2] == ["--dump-options"]:
    with contextlib.redirect_stdout(io.StringIO()):  # engines log while they import
        table = argcheck.dump_options(sys.argv[2])
    print(json.dumps(table, indent=1, sort_keys=True))
    sys.exit(0)

if sys.argv[1:2] == ["--env-names"]:
    # The environment variables the installed packages declare (names only).
    names = {}
    if importlib.util.find_spec("sglang"):
        from sglang.srt.environ import envs
        names["sglang"] = sorted(n for n in dir(type(envs)) if n.isupper())
    if importlib.util.find_spec("vllm"):
        import vllm.envs
        names["vllm"] = sorted(vllm.envs.environment_variables)
    print(json.dumps(names))
    sys.exit(0)

results = []
for engine, argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(err), contextlib.redirect_stderr(err):
            what = argcheck.CHECKS[engine](argv)
        results.append({"ok": True, "flag": "", "message": "", "what": what})
    except argcheck.Refused as e:
        results.append({"ok": False, "flag": e.flag, "message": e.message, "what": engine})
print(json.dumps(results))
