"""The memory gate: on one node, right before its rank starts, is there the memory the plan needs?

On a DGX Spark the GPU's memory is the host's: CUDA sees what the kernel can hand out now, and the
page cache (a 400 GiB download, the NFS export, the engram pack) is not counted as free by it. So:
flush dirty pages, drop the page cache (`sysctl -w vm.drop_caches=3`, as root or through one narrow
sudo rule), then read MemAvailable and compare it with the node's need from the memory plan. A
shortfall exits 1 naming the node, the figures and what holds memory (largest processes and
containers), before any rank starts. Stdlib only: it runs with the node's python3, on stdin.

    python3 - --node spark2 --role worker --need-mib 116000 [--no-drop] [--report-only]

Prints `deepseek-spark memory: {json}` last (the figures `dspark doctor` and the stack show).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

REPORT_PREFIX = "deepseek-spark memory:"
SYSCTL = "/usr/sbin/sysctl"
DROP = [SYSCTL, "-w", "vm.drop_caches=3"]
TOP = 5


def sudoers_rule(user: str) -> str:
    """The narrowest sudo rule that lets `user` drop the page cache (and nothing else)."""
    return f"{user} ALL=(root) NOPASSWD: {' '.join(DROP)}"


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """The kB figures of /proc/meminfo, in MiB."""
    out = {}
    for line in Path(path).read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) // 1024
    return out


def drop_caches(run=subprocess.run, euid: int | None = None) -> tuple[bool, str]:
    """sync, then drop the page cache; (done, why not)."""
    try:
        run(["sync"], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False, "sync did not finish within 300 s: dirty pages are still being written, try again later"
    euid = os.geteuid() if euid is None else euid
    argv = DROP if euid == 0 else ["sudo", "-n", *DROP]
    try:
        r = run(argv, capture_output=True, text=True, timeout=300)
    except OSError as exc:
        return False, str(exc)
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip()
        return False, msg.splitlines()[-1] if msg else f"exit {r.returncode}"
    return True, ""


def processes(proc: str = "/proc") -> list[tuple[int, str, int]]:
    """(MiB resident, name, pid) of every process, largest first."""
    found = []
    for d in Path(proc).iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = dict(line.split(":", 1) for line in (d / "status").read_text().splitlines() if ":" in line)
        except OSError:
            continue
        rss = fields.get("VmRSS", "0 kB").split()[0]
        found.append((int(rss) // 1024 if rss.isdigit() else 0, fields.get("Name", "?").strip(), int(d.name)))
    return sorted(found, reverse=True)


def containers(run=subprocess.run) -> list[str]:
    """`name usage` of each running container (docker stats), largest first as docker reports them."""
    try:
        r = run(["docker", "stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}}"],
                capture_output=True, text=True, timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in r.stdout.splitlines() if line.strip()] if r.returncode == 0 else []


def holders(run=subprocess.run, proc: str = "/proc") -> str:
    top = ", ".join(f"{name} (pid {pid}) {mib} MiB" for mib, name, pid in processes(proc)[:TOP])
    running = "; ".join(containers(run)) or "none"
    return f"largest processes: {top or 'none readable'}; containers: {running}"


def main(argv: list[str] | None = None, run=subprocess.run, meminfo_path: str = "/proc/meminfo",
         proc: str = "/proc", euid: int | None = None) -> int:  # fmt: skip
    p = argparse.ArgumentParser(prog="memgate")
    p.add_argument("--node", required=True)
    p.add_argument("--role", default="rank")
    p.add_argument("--need-mib", type=int, required=True)
    p.add_argument("--no-drop", action="store_true", help="memory.dropCaches: false")
    p.add_argument("--report-only", action="store_true", help="figures only (dspark doctor): no drop, no verdict")
    a = p.parse_args(argv)
    before = meminfo(meminfo_path)
    dropped, why = False, ""
    if not (a.no_drop or a.report_only):
        dropped, why = drop_caches(run, euid)
        if not dropped:
            user = pwd.getpwuid(os.geteuid()).pw_name
            print(f"memory {a.node}: FAIL page-cache: cannot drop the page cache as {user} ({why}); a node that "
                  f"boots with its memory in page cache can fail or lock up. Fix: add the sudo rule "
                  f"'{sudoers_rule(user)}' (visudo -f /etc/sudoers.d/deepseek-spark), or set "
                  f"memory.dropCaches: false to skip the drop", file=sys.stderr)  # fmt: skip
            return 1
    after = meminfo(meminfo_path) if dropped else before
    figures = {
        "node": a.node, "role": a.role, "totalMiB": after.get("MemTotal", 0),
        "availableMiB": after.get("MemAvailable", 0), "freeMiB": after.get("MemFree", 0),
        "cachedBeforeMiB": before.get("Cached", 0), "cachedMiB": after.get("Cached", 0),
        "needMiB": a.need_mib, "dropped": dropped,
    }  # fmt: skip
    short = figures["availableMiB"] < a.need_mib
    figures["ok"] = not short
    if short and not a.report_only:
        print(f"memory {a.node}: FAIL available: {figures['availableMiB']} MiB available "
              f"({'after dropping' if dropped else 'without dropping'} the page cache: {figures['cachedBeforeMiB']} -> "
              f"{figures['cachedMiB']} MiB cached) of {figures['totalMiB']} MiB, the memory plan needs {a.need_mib} MiB "
              f"for the {a.role} rank; {holders(run, proc)}. Fix: stop what holds the memory (another model, a "
              f"leftover container, a copy still running) and run up again, or lower the plan (serving."
              f"memFractionStatic, maxTotalTokens)", file=sys.stderr)  # fmt: skip
    print(f"memory {a.node}: {figures['availableMiB']} MiB available, plan needs {a.need_mib} MiB"
          f"{', page cache dropped' if dropped else ''}")
    print(REPORT_PREFIX, json.dumps(figures, sort_keys=True))
    return 1 if short and not a.report_only else 0


if __name__ == "__main__":
    sys.exit(main())
