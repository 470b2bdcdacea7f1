"""Runs inside a conformance environment (a venv with the REAL engine packages, .ci/conformance-setup):
programs/argcheck.py's checks on many argvs in one process (importing an engine takes seconds).

    <venv>/bin/python tests/conformance/driver.py < request.json > reply.json

stdin: {"checks": [[engine, argv], ...], "dump": engine or null, "env_names": bool}
stdout: {"results": [{"ok", "flag", "message", "what"}, ...], "dump": the option table (argcheck
--dump-options), "env_names": {"sglang": [...], "vllm": [...]}}; one process per environment.
The image checks (DSPARK draft weights, the adapter, Ray for the Ray backend) are off: a venv is not
an image; the e2e tier runs them in the sim's image.
"""
import contextlib
import importlib.util
import io
import json
import re
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "argcheck", Path(__file__).resolve().parents[2] / "programs" / "argcheck.py")
argcheck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(argcheck)
argcheck.IMAGE_CHECKS = False


def env_names() -> dict:
    """The environment variables the installed packages declare (names only)."""
    names = {}
    if importlib.util.find_spec("sglang"):
        from sglang.srt.environ import envs
        table = {n for n in dir(type(envs)) if n.isupper()}
        # and the few it reads with os.getenv outside the table (SGLANG_HOST_IP: srt/utils/network.py)
        src = Path(importlib.util.find_spec("sglang").origin).parent
        read = {m for f in src.rglob("*.py") for m in re.findall(r"getenv\(\s*[\"'](SGLANG_[A-Z0-9_]+)[\"']",
                                                                  f.read_text(errors="replace"))}  # fmt: skip
        names["sglang"] = sorted(table | read)
    if importlib.util.find_spec("vllm"):
        import vllm.envs
        names["vllm"] = sorted(vllm.envs.environment_variables)
    return names


def check(engine: str, argv: list[str]) -> dict:
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(err), contextlib.redirect_stderr(err):
            what = argcheck.CHECKS[engine](argv)
        return {"ok": True, "flag": "", "message": "", "what": what}
    except argcheck.Refused as e:
        return {"ok": False, "flag": e.flag, "message": e.message, "what": engine}


request = json.load(sys.stdin)
with contextlib.redirect_stdout(io.StringIO()):  # engines log while they import
    reply = {
        "results": [check(engine, argv) for engine, argv in request.get("checks", [])],
        "dump": argcheck.dump_options(request["dump"]) if request.get("dump") else None,
        "env_names": env_names() if request.get("env_names") else None,
    }
print(json.dumps(reply, sort_keys=True))
