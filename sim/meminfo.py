#!/usr/bin/python3
"""SIMULATOR STAND-IN: the unified memory of a dspark-sim node as /proc/meminfo shows it (stdlib only).

A DGX Spark has 128 GB shared by the CPU and the GPU; the OS shows ~121.7 GiB. A sim node is a container
on a machine with far less, so its memory is a model, and the node's ``/proc/meminfo`` is a file rendered
from it, bind-mounted over the real one at boot (``sim-meminfo boot``) and rewritten in place whenever the
figures move (``sim-meminfo daemon``, every 0.5 s). One file, two uses: on the host
``sim.meminfo`` (the pure ``render`` the unit tests call), on a node ``/usr/local/sbin/sim-meminfo``.

What moves the figures:

* **page cache**: every file under ``/srv`` (checkpoints, the engram shards) or in a docker volume written
  since the last drop (its ctime, which a copy cannot preserve) counts as cached, scaled by ``cache_scale``
  (2**18: the 1.9 MB fake checkpoint stands for ~460 GiB), capped by what is free, as the kernel does.
  So a download, a copy from the head and a pack fill the cache; a reboot empties it.
* **drops**: ``sim-meminfo drop`` (what the node's ``sysctl -w vm.drop_caches=3`` stand-in runs) empties
  it to ``base_cached_mib``.
* **held memory**: ``sim-meminfo hold NAME MIB`` starts a real process named NAME (its comm, as ps and
  /proc/<pid>/status show it) that really touches ``HOLD_REAL_MIB`` and is counted as holding MIB;
  ``release [NAME]`` ends it. A hold whose process is gone is dropped from the model.

Model (``/etc/dspark-sim/memory.json``)::

    {"total_mib": 124620, "os_mib": 2400, "base_cached_mib": 600, "cache_scale": 262144,
     "holds": {"sim-memory-hold": {"mib": 118000, "pid": 4242}}, "dropped_at": 1764640000.0}

MemAvailable = MemFree + the reclaimable part of the cache (all but its dirty/mapped tenth).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

MODEL_PATH = "/etc/dspark-sim/memory.json"
RENDERED = "/run/dspark-sim/meminfo"
TARGET = "/proc/meminfo"
VOLUMES = "/var/lib/docker/volumes"
HOLD_REAL_MIB = 128
LOG = "/var/log/sim-meminfo.log"

DEFAULT_MODEL = {"total_mib": 124620, "os_mib": 2400, "base_cached_mib": 600, "cache_scale": 2**18,
                 "holds": {}, "dropped_at": 0.0}  # fmt: skip


def figures(model: dict, written_bytes: int) -> dict[str, int]:
    """MiB figures from the model and the bytes written since the last drop (pure)."""
    total = model["total_mib"]
    used = model["os_mib"] + sum(h["mib"] for h in model.get("holds", {}).values())
    used = min(used, total - 256)
    cached = model["base_cached_mib"] + written_bytes * model["cache_scale"] // 2**20
    cached = max(0, min(cached, total - used - 256))
    free = total - used - cached
    return {"total": total, "free": free, "available": free + cached * 9 // 10, "cached": cached,
            "used": used}  # fmt: skip


def render(f: dict[str, int]) -> str:
    """/proc/meminfo text (kB, the kernel's layout) for the figures."""
    kb = {k: v * 1024 for k, v in f.items()}
    rows = [("MemTotal", kb["total"]), ("MemFree", kb["free"]), ("MemAvailable", kb["available"]),
            ("Buffers", 2048), ("Cached", kb["cached"]), ("SwapCached", 0),
            ("Active", kb["used"] // 2 + kb["cached"] // 3), ("Inactive", kb["cached"] - kb["cached"] // 3),
            ("Unevictable", 0), ("Mlocked", 0), ("SwapTotal", 0), ("SwapFree", 0), ("Dirty", 0),
            ("Writeback", 0), ("AnonPages", kb["used"]), ("Mapped", kb["cached"] // 10), ("Shmem", 4096),
            ("HugePages_Total", 0), ("HugePages_Free", 0), ("Hugepagesize", 2048)]  # fmt: skip
    out = []
    for key, value in rows:
        out.append(f"{key + ':':<16}{value:>8}" + ("" if key.startswith("HugePages_") else " kB"))
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ on a node (side effects) ----
def log(msg: str) -> None:
    with open(LOG, "a") as f:
        f.write(f"[sim-meminfo {time.strftime('%H:%M:%S')}] {msg}\n")


def load() -> dict:
    try:
        with open(MODEL_PATH) as f:
            return {**DEFAULT_MODEL, **json.load(f)}
    except FileNotFoundError:
        return dict(DEFAULT_MODEL)


def save(model: dict) -> None:
    os.makedirs(os.path.dirname(MODEL_PATH), exist_ok=True)
    tmp = MODEL_PATH + ".tmp"
    with open(tmp, "w") as f:
        json.dump(model, f, sort_keys=True, indent=1)
    os.replace(tmp, MODEL_PATH)


def _tops() -> list[str]:
    """/srv, and the data directory of every docker volume (not docker's own metadata next to them)."""
    tops = ["/srv"]
    try:
        tops += [os.path.join(VOLUMES, v, "_data") for v in sorted(os.listdir(VOLUMES))]
    except OSError:
        pass
    return tops


def written_since(t: float) -> int:
    total = 0
    for top in _tops():
        for root, _dirs, files in os.walk(top):
            for name in files:
                try:
                    st = os.lstat(os.path.join(root, name))
                except OSError:
                    continue
                if st.st_ctime > t:
                    total += st.st_size
    return total


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return bool(f.read())
    except OSError:
        return False


def refresh() -> str:
    """Render the model into /proc/meminfo (in place: it is a bind mount of RENDERED)."""
    model = load()
    holds = {k: h for k, h in model.get("holds", {}).items() if _alive(h["pid"])}
    if holds != model.get("holds", {}):
        model["holds"] = holds
        save(model)
    text = render(figures(model, written_since(model["dropped_at"])))
    # rewritten in place: the bind mount over /proc/meminfo shows this same inode
    with open(RENDERED, "r+" if os.path.exists(RENDERED) else "w") as f:
        if f.read() != text:
            f.seek(0)
            f.write(text)
            f.truncate()
    return text


def _bound() -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == TARGET for line in f)


def boot() -> None:
    """At node start: the cache is empty (a reboot), then /proc/meminfo becomes the rendered file."""
    model = load()
    model["dropped_at"] = time.time()
    model["holds"] = {}
    save(model)
    os.makedirs(os.path.dirname(RENDERED), exist_ok=True)
    with open(RENDERED, "w") as f:
        f.write(render(figures(model, 0)))
    if not _bound():
        subprocess.run(["mount", "--bind", RENDERED, TARGET], check=True)
    log("bound " + RENDERED + " over " + TARGET)


def hold(name: str, mib: int) -> int:
    """A real process named `name` (15 characters at most, the kernel's comm) holding `mib` in the model."""
    code = ("import sys,time\nopen('/proc/self/comm','w').write(sys.argv[1])\n"
            f"b=bytearray({HOLD_REAL_MIB}<<20)\nfor i in range(0,len(b),4096): b[i]=1\n"
            "while True: time.sleep(3600)\n")  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", code, name[:15]], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    model = load()
    model.setdefault("holds", {})[name[:15]] = {"mib": mib, "pid": p.pid}
    save(model)
    log(f"hold {name} {mib} MiB (pid {p.pid})")
    return p.pid


def release(name: str | None = None) -> list[str]:
    model = load()
    gone = [k for k in model.get("holds", {}) if name in (None, k)]
    for k in gone:
        try:
            os.kill(model["holds"][k]["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
        del model["holds"][k]
    save(model)
    log(f"released {', '.join(gone) or 'nothing'}")
    return gone


def drop() -> None:
    model = load()
    model["dropped_at"] = time.time()
    save(model)
    log("page cache dropped")


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "show"
    if cmd == "boot":
        boot()
    elif cmd == "daemon":
        while True:
            try:
                refresh()
            except Exception as exc:  # keep rendering: a bad moment must not freeze the figures
                log(f"refresh failed: {exc}")
            time.sleep(0.5)
    elif cmd == "drop":
        drop()
        refresh()
    elif cmd == "hold" and len(argv) == 3:
        print(hold(argv[1], int(argv[2])))
        refresh()
    elif cmd == "release":
        print(" ".join(release(argv[1] if len(argv) > 1 else None)))
        refresh()
    elif cmd == "show":
        sys.stdout.write(refresh())
    else:
        print("usage: sim-meminfo boot|daemon|drop|hold NAME MIB|release [NAME]|show", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
