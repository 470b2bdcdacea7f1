"""TEST DOUBLE of NCCL 2.30.7's logging and environment parameters (dspark-sim), stdlib only; part of the NCCL
double (``nccl``). What is reproduced (NVIDIA/nccl tag v2.30.7-1, src/debug.cc, src/misc/param.cc):
``NCCL_DEBUG`` VERSION/WARN/INFO/TRACE, ``NCCL_DEBUG_SUBSYS`` (default INIT,BOOTSTRAP,ENV; ``^`` inverts),
``<host>:<pid>:<tid> [0] NCCL INFO ...``, WARNs with a leading empty line, a ``[%F %T]`` timestamp and
``file:line (func)``; ``NCCL version 2.30.7+cuda13.0``; an ``NCCL_*`` parameter read through strtoll and
logged once when set.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time

VERSION = "2.30.7"
CUDA_VERSION = "13.0"
VERSION_STRING = f"NCCL version {VERSION}+cuda{CUDA_VERSION}"

# src/include/nccl_common.h
INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, ENV = 0x1, 0x2, 0x4, 0x8, 0x10, 0x20, 0x40, 0x80
ALLOC, CALL, PROXY, NVLS, BOOTSTRAP, REG, PROFILE, RAS = 0x100, 0x200, 0x400, 0x800, 0x1000, 0x2000, 0x4000, 0x8000
DESTROY, ALLOC_HOST, ALL = 0x10000, 0x20000, (1 << 64) - 1
SUBSYS = {"INIT": INIT, "COLL": COLL, "P2P": P2P, "SHM": SHM, "NET": NET, "GRAPH": GRAPH, "TUNING": TUNING,
          "ENV": ENV, "ALLOC": ALLOC, "CALL": CALL, "PROXY": PROXY, "NVLS": NVLS, "BOOTSTRAP": BOOTSTRAP,
          "REG": REG, "PROFILE": PROFILE, "RAS": RAS, "DESTROY": DESTROY, "ALLOC_HOST": ALLOC_HOST, "ALL": ALL}
LEVELS = {"VERSION": 1, "WARN": 2, "INFO": 3, "ABORT": 4, "TRACE": 5}
LOG_VERSION, LOG_WARN, LOG_INFO = 1, 2, 3


def strtoll(s: str) -> int:
    """C strtoll(s, NULL, 0): the leading integer (0x.. hex, 0.. octal), 0 when there is none."""
    s = s.strip()
    sign = -1 if s[:1] == "-" else 1
    s = s[1:] if s[:1] in "+-" else s
    base, digits = 10, "0123456789"
    if s[:2].lower() == "0x":
        base, digits, s = 16, "0123456789abcdef", s[2:]
    elif s[:1] == "0" and len(s) > 1:
        base, digits, s = 8, "01234567", s[1:]
    n = ""
    for c in s.lower():
        if c not in digits:
            break
        n += c
    return sign * int(n, base) if n else 0


def parse_subsys(value: str | None) -> int:
    if value is None:
        return INIT | BOOTSTRAP | ENV
    invert = value.startswith("^")
    value = value[1:] if invert else value
    mask = ALL if invert else 0
    for tok in value.split(","):
        tok = tok.strip().upper()
        if not tok:
            continue
        if tok not in SUBSYS:
            return INIT | BOOTSTRAP | ENV  # the parser refuses the value: the default stays
        mask = mask & ~SUBSYS[tok] if invert else mask | SUBSYS[tok]
    return mask


class Log:
    def __init__(self, env: dict, out=None, hostname: str | None = None):
        self.env = env
        self.level = LEVELS.get((env.get("NCCL_DEBUG") or "").strip().upper(), 0)
        self.mask = parse_subsys(env.get("NCCL_DEBUG_SUBSYS"))
        self.out = out or sys.stdout
        self.host = (hostname or socket.gethostname()).split(".")[0].replace("%", "-").replace("/", "-")
        self.pid = os.getpid()
        self.last_error = ""
        self.lines: list[str] = []
        self._shown: set[str] = set()

    def _emit(self, text: str) -> None:
        self.lines.append(text)
        self.out.write(text + "\n")
        self.out.flush()

    def _prefix(self) -> str:
        return f"{self.host}:{self.pid}:{threading.get_native_id()}"

    def info(self, flags: int, msg: str) -> None:
        if self.level >= LOG_INFO and flags & self.mask:
            self._emit(f"{self._prefix()} [0] NCCL INFO {msg}")

    def warn(self, where: str, func: str, msg: str) -> None:
        self.last_error = msg
        if self.level >= LOG_WARN:
            ts = time.strftime("[%Y-%m-%d %H:%M:%S] ")
            self._emit(f"\n{ts}{self._prefix()} [0] {where} ({func}) NCCL WARN {msg}")

    def version(self) -> None:
        if self.level in (LOG_VERSION, LOG_WARN):
            self._emit(VERSION_STRING)
        else:
            self.info(ALL, VERSION_STRING)

    def param(self, name: str, default: int) -> int:
        """NCCL_PARAM: the env value through strtoll, logged once when set (src/misc/param.cc)."""
        s = self.env.get(name)
        if s is None or s == "":
            return default
        v = strtoll(s)
        if name not in self._shown:
            self._shown.add(name)
            self.info(ENV, f"{name} set by environment to {v}.")
        return v
