"""Docker backend of the simulator: every engine call goes through the ``docker`` CLI here.

The simulator keeps no state outside docker: nodes and networks are found by label.
"""
from __future__ import annotations

import json
import shutil
import subprocess

NS = "deepseek-spark.sim"
LABEL_CLUSTER = f"{NS}.cluster"
LABEL_NODE = f"{NS}.node"
LABEL_IP = f"{NS}.ip"


class DockerError(RuntimeError):
    pass


def docker_bin() -> str:
    b = shutil.which("docker")
    if not b:
        raise DockerError("docker CLI not found (run .ci/sim-setup)")
    return b


def docker(*args: str, input: bytes | str | None = None, check: bool = True, timeout: float | None = 600,
           text: bool = True) -> subprocess.CompletedProcess:
    if isinstance(input, str):
        input = input.encode()
    r = subprocess.run([docker_bin(), *args], input=input, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    if text:
        r.stdout = r.stdout.decode(errors="replace")
        r.stderr = r.stderr.decode(errors="replace")
    if check and r.returncode != 0:
        err = r.stderr if text else r.stderr.decode(errors="replace")
        raise DockerError(f"docker {' '.join(args[:3])} ... failed ({r.returncode}): {str(err).strip()}")
    return r


def engine_available() -> tuple[bool, str]:
    """(True, server version) when a docker engine answers, else (False, reason)."""
    try:
        r = docker("version", "--format", "{{.Server.Version}}", check=False, timeout=20)
    except (DockerError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    if r.returncode != 0:
        return False, (r.stderr or r.stdout).strip()
    return True, r.stdout.strip()


def image_id(ref: str) -> str | None:
    r = docker("image", "inspect", "--format", "{{.Id}}", ref, check=False, timeout=60)
    return r.stdout.strip() if r.returncode == 0 else None


def inspect(ref: str, kind: str = "container") -> dict | None:
    r = docker(kind, "inspect", ref, check=False, timeout=60)
    if r.returncode != 0:
        return None
    data = json.loads(r.stdout or "[]")
    return data[0] if data else None


def containers_by_label(label: str, value: str) -> list[dict]:
    r = docker("ps", "-a", "--no-trunc", "--filter", f"label={label}={value}", "--format", "{{json .}}", timeout=60)
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    out = []
    for row in rows:  # exact match on the label value (docker's filter already is exact; be safe)
        labels = dict(kv.split("=", 1) for kv in row.get("Labels", "").split(",") if "=" in kv)
        if labels.get(label) == value:
            out.append(row)
    return out


def networks_by_label(label: str, value: str) -> list[str]:
    r = docker("network", "ls", "--filter", f"label={label}={value}", "--format", "{{.Name}}", timeout=60)
    return [n for n in r.stdout.split() if n]


def exec_in(container: str, *cmd: str, input: bytes | str | None = None, check: bool = False,
            timeout: float = 120, interactive: bool = False) -> subprocess.CompletedProcess:
    args = ["exec"] + (["-i"] if interactive or input is not None else []) + [container, *cmd]
    return docker(*args, input=input, check=check, timeout=timeout)


def logs_tail(container: str, n: int = 30) -> str:
    r = docker("logs", "--tail", str(n), container, check=False, timeout=30)
    return (r.stdout + r.stderr).strip()
