"""TEST DOUBLE of how NCCL 2.30.7 finds its socket interfaces (dspark-sim), stdlib only; part of the NCCL double
(``nccl``). What is reproduced (NVIDIA/nccl tag v2.30.7-1, src/misc/socket.cc ncclFindInterfaces, src/os/linux.cc,
src/misc/utils.cc parseStringList/matchIfList): the interfaces libc getifaddrs(3) lists, in its order; a
``NCCL_SOCKET_IFNAME``-style list (prefix match, ``=`` exact, ``^`` exclude), only interfaces that are IFF_RUNNING.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import socket

from .nccl_debug import strtoll

AF_INET, AF_INET6 = socket.AF_INET, socket.AF_INET6
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40
MAX_IFS = 16


# ------------------------------------------------------------------------ interfaces (getifaddrs) ----
class Iface:
    def __init__(self, name: str, family: int, addr: str, flags: int, prefixlen: int = 24):
        self.name, self.family, self.addr, self.flags, self.prefixlen = name, family, addr, flags, prefixlen

    def __repr__(self) -> str:
        return f"Iface({self.name!r}, {self.family}, {self.addr!r}, {self.flags:#x})"

    def sockstr(self) -> str:  # ncclSocketToString, numeric host, port 0
        return f"{self.addr}<0>"


class _sockaddr(ctypes.Structure):
    _fields_ = [("sa_family", ctypes.c_ushort), ("sa_data", ctypes.c_ubyte * 14)]


class _sockaddr_in6(ctypes.Structure):
    _fields_ = [("sin6_family", ctypes.c_ushort), ("sin6_port", ctypes.c_uint16),
                ("sin6_flowinfo", ctypes.c_uint32), ("sin6_addr", ctypes.c_ubyte * 16),
                ("sin6_scope_id", ctypes.c_uint32)]


class _ifaddrs(ctypes.Structure):
    pass


_ifaddrs._fields_ = [("ifa_next", ctypes.POINTER(_ifaddrs)), ("ifa_name", ctypes.c_char_p),
                     ("ifa_flags", ctypes.c_uint), ("ifa_addr", ctypes.POINTER(_sockaddr)),
                     ("ifa_netmask", ctypes.POINTER(_sockaddr)), ("ifa_ifu", ctypes.POINTER(_sockaddr)),
                     ("ifa_data", ctypes.c_void_p)]


def _addr_bytes(sa, family: int) -> bytes:
    if family == AF_INET:
        return bytes(sa.contents.sa_data[2:6])
    return bytes(ctypes.cast(sa, ctypes.POINTER(_sockaddr_in6)).contents.sin6_addr)


def getifaddrs() -> list[Iface]:
    """libc getifaddrs(3), in its order (what NCCL and Gloo iterate)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    head = ctypes.POINTER(_ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        raise OSError(ctypes.get_errno(), "getifaddrs")
    out = []
    try:
        p = head
        while p:
            ifa = p.contents
            if ifa.ifa_addr:
                fam = ifa.ifa_addr.contents.sa_family
                if fam in (AF_INET, AF_INET6):
                    addr = socket.inet_ntop(fam, _addr_bytes(ifa.ifa_addr, fam))
                    plen = 0
                    if ifa.ifa_netmask:
                        plen = sum(bin(b).count("1") for b in _addr_bytes(ifa.ifa_netmask, fam))
                    out.append(Iface(ifa.ifa_name.decode(), fam, addr, ifa.ifa_flags, plen))
            p = ifa.ifa_next
    finally:
        libc.freeifaddrs(head)
    return out


def parse_string_list(s: str | None) -> list[tuple[str, int]]:
    """parseStringList: comma-separated ``prefix[:port[:rail[:plane]]]`` (port -1 when absent)."""
    out = []
    for entry in (s or "").split(","):
        if not entry:
            continue
        parts = entry.split(":")
        if not parts[0]:
            continue
        port = strtoll(parts[1]) if len(parts) > 1 and parts[1] else -1
        out.append((parts[0], port))
    return out


def match_if_list(name: str, port: int, ifs: list[tuple[str, int]], exact: bool) -> bool:
    if not ifs:
        return True
    for prefix, p in ifs:
        ok = name == prefix if exact else name.startswith(prefix)
        if ok and (port == -1 or p == -1 or port == p):
            return True
    return False


def find_interfaces_with(prefix_list: str, ifaddrs: list[Iface], family: int, max_ifs: int) -> list[Iface]:
    """ncclOsFindInterfaces (src/os/linux.cc)."""
    search_not = prefix_list.startswith("^")
    prefix_list = prefix_list[1:] if search_not else prefix_list
    exact = prefix_list.startswith("=")
    prefix_list = prefix_list[1:] if exact else prefix_list
    user = parse_string_list(prefix_list)
    found: list[Iface] = []
    for ifa in ifaddrs:
        if len(found) >= max_ifs:
            break
        if ifa.family not in (AF_INET, AF_INET6) or not ifa.flags & IFF_RUNNING:
            continue
        if family != -1 and ifa.family != family:
            continue
        if ifa.family == AF_INET6 and ifa.addr == "::1":
            continue
        if not (match_if_list(ifa.name, -1, user, exact) ^ search_not):
            continue
        if any(f.name == ifa.name for f in found):
            continue
        found.append(ifa)
    return found
