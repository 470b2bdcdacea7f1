"""TEST DOUBLE of what NCCL 2.30.7 does with its environment when a rank creates its communicator
(dspark-sim), stdlib only. This is NOT NCCL: no data moves. Both engine doubles call ``comm_init`` (and
``gloo_device``, torch's Gloo CPU group, first) where a real rank would init NCCL, and exit non-zero
when it fails.

What is reproduced (NVIDIA/nccl tag v2.30.7-1):

* logging (src/debug.cc): ``NCCL_DEBUG`` VERSION/WARN/INFO/TRACE, ``NCCL_DEBUG_SUBSYS`` (default
  INIT,BOOTSTRAP,ENV; ``^`` inverts), ``<host>:<pid>:<tid> [0] NCCL INFO ...``, WARNs with a leading empty
  line, a ``[%F %T]`` timestamp and ``file:line (func)``; ``NCCL version 2.30.7+cuda13.0`` (``nccl_debug``);
* socket interfaces (src/misc/socket.cc ncclFindInterfaces, src/os/linux.cc, src/misc/utils.cc
  parseStringList/matchIfList; getifaddrs and the matching: ``nccl_socket``): ``NCCL_SOCKET_IFNAME`` (prefix
  match, ``=`` exact, ``^`` exclude, only values longer than one character), ``NCCL_SOCKET_FAMILY``, only interfaces that are IFF_RUNNING; the
  automatic order ``ib`` -> ``^docker,lo,virbr`` -> ``docker`` -> ``lo`` -> ``virbr``; no interface:
  ``Bootstrap : no socket interface found`` (src/bootstrap.cc), ncclInvalidUsage;
* the NET plugins (src/plugin/net.cc): internal IB then Socket, ``NCCL_NET`` picks one by name
  (case-insensitive); none initialised: ``Failed to initialize any NET plugin``;
* IB devices (src/transport/net_ib/init.cc ncclIbInitDevices): ``NCCL_IB_DISABLE``; an OOB interface
  (same rules as above) else ``NET/IB : No IP interface found.``; the devices of
  /sys/class/infiniband_verbs + /sys/class/infiniband (rdma-core's list; the /dev/infiniband/uverbs<i>
  node must exist, else ``Unable to open device``); only ports in state ACTIVE; ``NCCL_IB_HCA``
  (``mlx5_0:1`` style, prefix/``=``/``^``); sorted by PCI address; ``NET/IB : Using [0]dev:1/RoCE ...
  [RO]; OOB if:ip<0>``;
* GID selection (src/transport/net_ib/connect.cc ncclIbGetGidIndex): ``NCCL_IB_GID_INDEX`` (-1: the
  automatic walk with ``NCCL_IB_ADDR_FAMILY``, ``NCCL_IB_ADDR_RANGE``, ``NCCL_IB_ROCE_VERSION_NUM``, reading
  ``ports/1/gids/<i>`` and ``gid_attrs/types/<i>``); an index with no GID fails the QP's move to RTR
  (``Call to ibv_modify_qp failed with 22 Invalid argument`` + NCCL's hints, src/misc/ibvwrap.cc).

Where the double is stricter or simpler than NCCL (sim/adaptations.py): a used GID that is not RoCE v2
fails (the simulated fabric carries RoCE v2 only) with the completion error NCCL logs for a transfer that
never arrives (``IBV_WC_RETRY_EXC_ERR``); peers' addresses are not exchanged, so remote GIDs/addresses
print ``N/A``; channels are a ring over the used NICs.
"""
from __future__ import annotations

import os
import socket

from .nccl_debug import BOOTSTRAP, ENV, INIT, NET, VERSION, Log, strtoll
from .nccl_socket import (AF_INET, AF_INET6, IFF_RUNNING, MAX_IFS, Iface, find_interfaces_with, getifaddrs, match_if_list,
                          parse_string_list)

# ncclResult_t and the strings of ncclGetErrorString (src/init.cc) / torch's getNcclErrorDetailStr
ERRORS = {
    "ncclSystemError": ("unhandled system error (run with NCCL_DEBUG=INFO for details)",
                        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
                        "device error. "),
    "ncclInternalError": ("internal error - please report this issue to the NCCL developers",
                          "ncclInternalError: Internal check failed."),
    "ncclInvalidUsage": ("invalid usage (run with NCCL_DEBUG=WARN for details)",
                         "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."),
    "ncclRemoteError": ("remote process exited or there was a network error",
                        "ncclRemoteError: A call failed possibly due to a network error or a remote process "
                        "exiting prematurely."),
}

IB_PORT_ACTIVE = 4


class NcclError(RuntimeError):
    def __init__(self, result: str, last_error: str):
        super().__init__(f"{result}: {last_error}")
        self.result, self.last_error = result, last_error

    def torch_message(self) -> str:
        """What torch's ProcessGroupNCCL raises (DistBackendError) for this result."""
        short, detail = ERRORS.get(self.result, ("unknown result code", "Unknown NCCL error!"))
        return (f"torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp, {short}, "
                f"NCCL version {VERSION}\n{detail}\nLast error:\n{self.last_error}")


# ------------------------------------------------------------------------------- the comm ----
class Comm:
    """What ``comm_init`` chose (for the doubles' logs and the tests)."""

    def __init__(self):
        self.bootstrap: Iface | None = None
        self.net = ""
        self.devices: list[dict] = []
        self.socket_ifs: list[Iface] = []
        self.oob: Iface | None = None
        self.gid_index: dict[str, int] = {}


class _Init:
    def __init__(self, env: dict, sysfs: str, dev_root: str, ifaddrs: list[Iface], log: Log):
        self.env, self.sysfs, self.dev_root, self.ifaddrs, self.log = env, sysfs, dev_root, ifaddrs, log
        self._shown_ifname = False

    def fail(self, result: str) -> NcclError:
        return NcclError(result, self.log.last_error)

    # src/misc/socket.cc
    def socket_family(self) -> int:
        v = self.env.get("NCCL_SOCKET_FAMILY")
        if v is None:
            return -1
        self.log.info(ENV, f"NCCL_SOCKET_FAMILY set by environment to {v}")
        return {"AF_INET": AF_INET, "AF_INET6": AF_INET6}.get(v, -1)

    def find_interfaces(self, max_ifs: int) -> list[Iface]:
        fam = self.socket_family()
        env = self.env.get("NCCL_SOCKET_IFNAME")
        if env and len(env) > 1:
            self.log.info(ENV, f"NCCL_SOCKET_IFNAME set by environment to {env}")
            if not self._shown_ifname:
                self._shown_ifname = True
                self.log.info(NET, f"NCCL_SOCKET_IFNAME set to {env}")
            return find_interfaces_with(env, self.ifaddrs, fam, max_ifs)
        found = find_interfaces_with("ib", self.ifaddrs, fam, max_ifs)
        comm_id = self.env.get("NCCL_COMM_ID")
        if not found and comm_id and len(comm_id) > 1:
            self.log.info(ENV, f"NCCL_COMM_ID set by environment to {comm_id}")
            host = comm_id.rsplit(":", 1)[0]
            try:
                import ipaddress
                ip = ipaddress.ip_address(socket.gethostbyname(host))
                found = [f for f in self.ifaddrs if f.family == AF_INET and f.flags & IFF_RUNNING and
                         ip in ipaddress.ip_network(f"{f.addr}/{f.prefixlen}", strict=False)][:1]
            except (OSError, ValueError):
                found = []
        for prefixes in ("^docker,lo,virbr", "docker", "lo", "virbr"):
            if found:
                break
            found = find_interfaces_with(prefixes, self.ifaddrs, fam, max_ifs)
        return found

    # src/bootstrap.cc bootstrapNetInit
    def bootstrap(self) -> Iface:
        found = self.find_interfaces(1)
        if not found:
            self.log.warn("bootstrap.cc:126", "bootstrapNetInit", "Bootstrap : no socket interface found")
            raise self.fail("ncclInvalidUsage")
        self.log.info(BOOTSTRAP, f"Bootstrap: Using {found[0].name}:{found[0].sockstr()}")
        return found[0]

    # rdma-core's device list: /sys/class/infiniband_verbs/uverbs<i>/ibdev naming a /sys/class/infiniband dir
    def ibv_devices(self) -> list[tuple[str, str]]:
        verbs = os.path.join(self.sysfs, "class/infiniband_verbs")
        ib = os.path.join(self.sysfs, "class/infiniband")
        if not os.path.isfile(os.path.join(verbs, "abi_version")):
            return []
        out = []
        for uv in sorted((d for d in os.listdir(verbs) if d.startswith("uverbs")), key=lambda d: int(d[6:] or 0)):
            name = (_read(os.path.join(verbs, uv, "ibdev")) or "").strip()
            if name and os.path.isdir(os.path.join(ib, name)):
                out.append((name, uv))
        return out

    def port_dir(self, dev: str, port: int = 1) -> str:
        return os.path.join(self.sysfs, "class/infiniband", dev, "ports", str(port))

    # src/transport/net_ib/init.cc ncclIbInitDevices
    def ib_init(self, comm: Comm) -> bool:
        if self.log.param("NCCL_IB_DISABLE", 0):
            return False
        oob = self.find_interfaces(1)
        if len(oob) != 1:
            self.log.warn("transport/net_ib/init.cc:307", "ncclIbInitDevices", "NET/IB : No IP interface found.")
            return False
        comm.oob = oob[0]
        user_env = self.env.get("NCCL_IB_HCA")
        if user_env is not None:
            self.log.info(NET | ENV, f"NCCL_IB_HCA set to {user_env}")
        spec = user_env or ""
        search_not = spec.startswith("^")
        spec = spec[1:] if search_not else spec
        exact = spec.startswith("=")
        spec = spec[1:] if exact else spec
        user = parse_string_list(spec)
        devs = []
        for d, (name, uverbs) in enumerate(self.ibv_devices()):
            if not os.path.exists(os.path.join(self.dev_root, "infiniband", uverbs)):
                self.log.warn("transport/net_ib/init.cc:334", "ncclIbInitDevices", f"NET/IB : Unable to open device {name}")
                continue
            pdir = os.path.join(self.sysfs, "class/infiniband", name, "ports")
            nports = len([p for p in os.listdir(pdir) if p.isdigit()]) if os.path.isdir(pdir) else 0
            for port in range(1, nports + 1):
                st = (_read(os.path.join(pdir, str(port), "state")) or "0").split(":")[0].strip()
                if strtoll(st) != IB_PORT_ACTIVE:
                    continue
                ll = (_read(os.path.join(pdir, str(port), "link_layer")) or "").strip()
                if ll not in ("InfiniBand", "Ethernet"):
                    continue
                if not (match_if_list(name, port, user, exact) ^ search_not):
                    continue
                link = "IB" if ll == "InfiniBand" else "RoCE"
                rate = (_read(os.path.join(pdir, str(port), "rate")) or "0").split()[0]
                speed = int(float(rate) * 1000) if rate.replace(".", "", 1).isdigit() else 0
                devpath = os.path.join(self.sysfs, "class/infiniband", name, "device")
                full = os.path.realpath(devpath) if os.path.exists(devpath) else ""
                if not full:
                    self.log.warn("transport/net_ib/init.cc:67", "ncclIbGetPciPath",
                                  f"Could not find real path of {name} ({devpath})")
                    merged = "(null)"
                else:
                    p = list(full)
                    p[-1] = "0"
                    if self.log.param("NCCL_IB_MERGE_VFS", 1):
                        p[-3] = p[-4] = "0"
                    merged = "".join(p)
                ctx = 0x5500_0000_0000 + (os.getpid() << 12) + d * 0x1000
                self.log.info(NET, f"NET/IB: [{d}] {name}:{uverbs}:{port}/{link} provider=Mlx5 speed={speed} "
                                   f"context={ctx:#x} pciPath={merged} ar=0 oooRqSize=0")
                devs.append({"name": name, "port": port, "link": link, "speed": speed, "pci": full,
                             "uverbs": uverbs})
        if not devs:
            self.log.info(INIT | NET, "NET/IB : No device found.")
        devs.sort(key=lambda x: (x["pci"] == "", _pci_int(x["pci"])))
        line = "".join(f" [{i}]{x['name']}:{x['port']}/{x['link']}" for i, x in enumerate(devs))
        ro = "[RO]" if self.log.param("NCCL_IB_PCI_RELAXED_ORDERING", 2) in (1, 2) else ""
        self.log.info(INIT | NET, f"NET/IB : Using{line} {ro}; OOB {comm.oob.name}:{comm.oob.sockstr()}")
        comm.devices = devs
        return bool(devs)

    # src/transport/net_socket.cc ncclNetSocketInit
    def socket_init(self, comm: Comm) -> bool:
        ifs = self.find_interfaces(MAX_IFS)
        if not ifs:
            self.log.warn("transport/net_socket.cc:64", "ncclNetSocketInit", "NET/Socket : no interface found")
            return False
        line = "".join(f" [{i}]{f.name}:{f.sockstr()}" for i, f in enumerate(ifs))
        self.log.info(INIT | NET, f"NET/Socket : Using{line}")
        comm.socket_ifs = ifs
        return True

    # src/plugin/net.cc ncclNetInit
    def net_init(self, comm: Comm) -> None:
        want = self.env.get("NCCL_NET")
        for name, init in (("IB", self.ib_init), ("Socket", self.socket_init)):
            if want is not None and want.lower() != name.lower():
                continue
            if init(comm):
                self.log.info(INIT | NET, f"Initialized NET plugin {name}")
                self.log.info(INIT | NET, f"Assigned NET plugin {name} to comm")
                comm.net = name
                return
            self.log.info(INIT | NET, f"Failed to initialize NET plugin {name}")
        self.log.warn("plugin/net.cc:349", "ncclNetInit", "Failed to initialize any NET plugin")
        raise self.fail("ncclInvalidUsage")

    # src/transport/net_ib/connect.cc ncclIbGetGidIndex (RoCE)
    def gid(self, dev: str, port: int, idx: int) -> bytes:
        txt = (_read(os.path.join(self.port_dir(dev, port), "gids", str(idx))) or "").strip()
        try:
            return bytes.fromhex(txt.replace(":", "")) if txt else bytes(16)
        except ValueError:
            return bytes(16)

    def roce_version(self, dev: str, port: int, idx: int) -> int | None:
        t = _read(os.path.join(self.port_dir(dev, port), "gid_attrs/types", str(idx)))
        if t is None:
            return None  # an empty slot: the kernel answers EINVAL and NCCL moves on
        if t.startswith("IB/RoCE v1") or t.startswith("RoCE v1"):
            return 1
        if t.startswith("RoCE v2"):
            return 2
        return None

    def gid_table_len(self, dev: str, port: int) -> int:
        d = os.path.join(self.port_dir(dev, port), "gids")
        return len([x for x in os.listdir(d) if x.isdigit()]) if os.path.isdir(d) else 0

    def gid_index(self, dev: dict) -> int:
        forced = self.log.param("NCCL_IB_GID_INDEX", -1)
        if forced >= 0:
            return forced
        fam_env = self.env.get("NCCL_IB_ADDR_FAMILY")
        fam = AF_INET
        if fam_env:
            self.log.info(ENV, f"NCCL_IB_ADDR_FAMILY set by environment to {fam_env}")
            fam = AF_INET6 if fam_env == "AF_INET6" else AF_INET
        roce = self.log.param("NCCL_IB_ROCE_VERSION_NUM", 2)
        prefix, plen = None, 0
        rng = self.env.get("NCCL_IB_ADDR_RANGE")
        if rng:
            self.log.info(ENV, f"NCCL_IB_ADDR_RANGE set by environment to {rng}")
            if "/" in rng:
                a, m = rng.split("/", 1)
                try:
                    prefix, plen = socket.inet_pton(fam, a), strtoll(m)
                    if plen > (32 if fam == AF_INET else 128):
                        prefix, plen = None, 0
                except OSError:
                    prefix, plen = None, 0
        name, port = dev["name"], dev["port"]
        idx = 0
        for cand in range(1, self.gid_table_len(name, port)):
            g, c = self.gid(name, port, idx), self.gid(name, port, cand)
            cfam, gfam = _gid_family(c), _gid_family(g)
            match = _match_prefix(fam, prefix, plen, c)
            if cfam != gfam and cfam == fam and match:
                idx = cand
                continue
            if cfam != fam or not _valid_gid(c) or not match:
                continue
            v, vc = self.roce_version(name, port, idx), self.roce_version(name, port, cand)
            if (v != vc or not _valid_gid(g)) and vc == roce:
                idx = cand
        return idx

    def connect(self, comm: Comm) -> None:
        """The QPs of every used NIC: the GID they use must exist (RTR), and be RoCE v2 (first transfer)."""
        for dev in comm.devices:
            if dev["link"] != "RoCE":
                continue
            idx = self.gid_index(dev)
            comm.gid_index[dev["name"]] = idx
            n = self.gid_table_len(dev["name"], dev["port"])
            g = self.gid(dev["name"], dev["port"], idx) if idx < n else bytes(16)
            if not _configured_gid(g):
                self.log.warn("misc/ibvwrap.cc:376", "wrap_ibv_modify_qp",
                              f"Call to ibv_modify_qp failed with 22 Invalid argument, on dev {dev['name']}:"
                              f"{dev['port']}, curr state INIT, next state RTR, local GID index {idx}, "
                              f"local GID {socket.inet_ntop(AF_INET6, g)}, remote GID N/A")
                for hint in ("HINT: In many cases this error occurs when the incorrect GID index is forced by "
                             "NCCL_IB_GID_INDEX",
                             "HINT: To confirm and fix the problem, you can set NCCL_IB_GID_INDEX=-1 to enable "
                             "automatic detection.",
                             "HINT: See https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
                             "#nccl-ib-gid-index for more information."):
                    self.log.info(NET, hint)
                raise self.fail("ncclSystemError")
            if self.roce_version(dev["name"], dev["port"], idx) != 2:
                self.log.warn("transport/net_ib/p2p.cc:688", "ncclIbLogCompletionWithError",
                              f"NET/IB: Got completion from peer N/A with status=IBV_WC_RETRY_EXC_ERR(12) "
                              f"opcode=IBV_WC_RDMA_WRITE(1) vendor_err=129  localGid "
                              f"{socket.inet_ntop(AF_INET6, g)} remoteGidsN/A hca {dev['name']}")
                for hint in ("HINT: In many cases this error occurs when the NCCL_IB_TIMEOUT is set too short.",
                             "HINT: Default value is 20, which is ~30 seconds before error.",
                             "HINT: To confirm, try increasing the value of NCCL_IB_TIMEOUT and see if the error "
                             "persists.",
                             "HINT: See https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
                             "#nccl-ib-timeout for more information."):
                    self.log.info(NET, hint)
                raise self.fail("ncclRemoteError")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _pci_int(path: str) -> int:
    """pciPathToInt64: the hex digits of the path's last component (0000:01:00.1 -> 0x0000010001)."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    digits = "".join(c for c in last if c not in ":.")
    try:
        return int(digits, 16)
    except ValueError:
        return 0


def _gid_family(g: bytes) -> int:
    mapped = g[:10] == bytes(10) and g[10:12] == b"\xff\xff"
    mapped_mc = g[:4] == b"\xff\x0e\x00\x00" and g[4:10] == bytes(6) and g[10:12] == b"\xff\xff"
    return AF_INET if mapped or mapped_mc else AF_INET6


def _configured_gid(g: bytes) -> bool:
    trailer = any(g[4:16])
    return not ((not any(g[0:4]) and not trailer) or (g[0:4] == b"\xfe\x80\x00\x00" and not trailer))


def _link_local_gid(g: bytes) -> bool:
    return g[0:4] == b"\xfe\x80\x00\x00" and not any(g[4:8])


def _valid_gid(g: bytes) -> bool:
    return _configured_gid(g) and not _link_local_gid(g)


def _match_prefix(fam: int, prefix: bytes | None, plen: int, g: bytes) -> bool:
    if prefix is None or plen <= 0:
        return True
    if fam == AF_INET:
        mask = (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
        return int.from_bytes(prefix, "big") & mask == int.from_bytes(g[12:16], "big") & mask
    mask = ((1 << 128) - 1) ^ ((1 << (128 - plen)) - 1)
    return int.from_bytes(prefix, "big") & mask == int.from_bytes(g, "big") & mask


# ----------------------------------------------------------------------------- entry points ----
def comm_init(rank: int, nranks: int, nnodes: int | None = None, env: dict | None = None, sysfs: str = "/sys",
              dev_root: str = "/dev", ifaddrs: list[Iface] | None = None, out=None,
              hostname: str | None = None) -> Comm:
    """ncclCommInitRank for ``rank`` of ``nranks`` (one GPU per node); raises NcclError like NCCL fails."""
    env = dict(os.environ if env is None else env)
    log = Log(env, out, hostname)
    it = _Init(env, sysfs, dev_root, getifaddrs() if ifaddrs is None else ifaddrs, log)
    comm = Comm()
    comm.bootstrap = it.bootstrap()
    log.version()
    it.net_init(comm)
    nnodes = nnodes or nranks
    cp = 0x5600_0000_0000 + (os.getpid() << 12)
    log.info(INIT, f"comm {cp:#x} rank {rank} nRanks {nranks} nNodes {nnodes} localRanks 1 localRank 0 MNNVL 0")
    ndev = len(comm.devices) if comm.net == "IB" else len(comm.socket_ifs)
    if nranks > 1:
        if comm.net == "IB":
            it.connect(comm)
        nxt, prv = (rank + 1) % nranks, (rank - 1) % nranks
        nch = max(2, ndev)
        maxch = log.param("NCCL_MAX_NCHANNELS", 0) if "NCCL_MAX_NCHANNELS" in env else 0
        if maxch > 0:
            nch = min(nch, maxch)
        for c in range(nch):
            dev = c % max(1, ndev)
            log.info(INIT | NET, f"Channel {c:02d}/0 : {prv}[0] -> {rank}[0] [receive] via NET/{comm.net}/{dev}")
            log.info(INIT | NET, f"Channel {c:02d}/0 : {rank}[0] -> {nxt}[0] [send] via NET/{comm.net}/{dev}")
    log.info(INIT, f"ncclCommInitRank comm {cp:#x} rank {rank} nranks {nranks} cudaDev 0 nvmlDev 0 busId f01000 "
                   f"commId {abs(hash((nranks, nnodes))):#x} - Init COMPLETE")
    return comm


def gloo_device(env: dict | None = None, ifaddrs: list[Iface] | None = None) -> list[Iface]:
    """torch's Gloo device for the CPU group: every name in GLOO_SOCKET_IFNAME must hold an address
    (gloo/transport/tcp/device.cc lookupAddrForIface; no IFF_RUNNING check there)."""
    env = dict(os.environ if env is None else env)
    names = [n for n in (env.get("GLOO_SOCKET_IFNAME") or "").split(",") if n]
    ifaddrs = getifaddrs() if ifaddrs is None else ifaddrs
    out = []
    for n in names:
        hit = next((i for i in ifaddrs if i.name == n and i.family in (AF_INET, AF_INET6)), None)
        if hit is None:
            raise RuntimeError(f"[enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc] "
                               f"ifa != nullptr. Unable to find address for: {n}")
        out.append(hit)
    return out


def rank_init(rank: int, nranks: int, nnodes: int | None = None, log=print, **kw) -> int:
    """What a double calls once its rank group formed: Gloo, then NCCL. 0, or 1 after logging the error
    as the engine would (the NCCL WARN lines were already printed by NCCL itself)."""
    try:
        gloo_device(kw.get("env"), kw.get("ifaddrs"))
        comm_init(rank, nranks, nnodes, **kw)
    except NcclError as e:
        log(e.torch_message())
        return 1
    except RuntimeError as e:  # Gloo
        log(f"RuntimeError: {e}")
        return 1
    return 0
