"""perftest's `ib_write_bw` as the program runs it: the RDMA write bandwidth of one RoCE rail between two
nodes, a server on one node and a client on the other (standard library only; nothing else of this
project is imported).

    server:  ib_write_bw -d rocep1s0f1 -i 1 -p 18515 -F --report_gbits [-x 3]
    client:  ib_write_bw -d rocep1s0f1 -i 1 -p 18515 -F --report_gbits [-x 3] 10.0.0.1

The options are those of NVIDIA's DGX Spark playbook (connect-two-sparks: `-d <dev> -i 1 -p <port> -F
--report_gbits`, server first, then the client with the server's address): RC, one QP, 65536-byte
writes, the default 5000 iterations (about 30 ms of traffic at ~100 Gb/s; with the tool's own 1 s pause
after the TCP connection a run takes ~1-2 s). `-F` silences the CPU-frequency warning. The GID is the
tool's own pick (the RoCE v2 IPv4 entry) unless `gid_index` pins it (`-x`). The server's address goes
last, so the command line also parses with POSIXLY_CORRECT set (getopt then stops at the first operand).

Running it (perftest 4.5, src/write_bw.c, src/perftest_communication.c):
- the server prints SERVER_READY (write_bw.c:113-117) and only then binds and listens on the TCP port
  (perftest_communication.c:709-748, via establish_connection at write_bw.c:120): a client started the
  instant the banner is seen can still find the port closed ("Couldn't connect to H:P", exit 1) and
  may be retried; the server is still waiting then;
- stdout is C stdio, fully buffered when it is not a terminal (a pipe, ssh without -t): the banner then
  stays in the buffer until the run ends. Run the server under `stdbuf -oL` (STDBUF_PREFIX) or on a pty
  to see it in time;
- the server serves exactly one connection (listen(1), one accept): nothing else may connect to its port
  (a probe becomes "the client" and makes the server fail);
- a server whose client never comes waits forever: the caller bounds it;
- both sides print the result table; the server prints the client's figures. Exit 0 on success, 1 on
  every failure, with the reason on stderr.
"""

from __future__ import annotations

import re

PROGRAM = "ib_write_bw"
DEFAULT_PORT = 18515                       # perftest's DEF_PORT
SERVER_READY = "Waiting for client to connect..."
STDBUF_PREFIX = ("stdbuf", "-oL")          # coreutils: line-buffered stdout, so SERVER_READY is seen in time
MAX_GID_INDEX = 64                          # the real parser's range for -x (MIN_GID_IX..MAX_GID_IX)

_UNIT_TO_GBPS = {"Gb/sec": 1.0, "MB/sec": 1048576 * 8 / 1e9}   # perftest's MB/sec is MiB/s (2^20 bytes)
_AVG = re.compile(r"BW average\[(Gb/sec|MB/sec)\]")
_NUM = re.compile(r"^-?\d+(\.\d+)?$")


def bw_argv(hca: str, gid_index: int | None, port: int, server: str | None = None) -> list[str]:
    """The argv of one side: the server when `server` is None, else the client connecting to `server`."""
    if not isinstance(hca, str) or not hca or hca.startswith("-") or any(c.isspace() for c in hca):
        raise ValueError(f"bad RDMA device name {hca!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"bad TCP port {port!r}")
    if gid_index is not None and (isinstance(gid_index, bool) or not isinstance(gid_index, int)
                                  or not 0 <= gid_index <= MAX_GID_INDEX):
        raise ValueError(f"bad GID index {gid_index!r} (ib_write_bw takes 0..{MAX_GID_INDEX})")
    if server is not None and (not isinstance(server, str) or not server or server.startswith("-")
                               or any(c.isspace() for c in server)):
        raise ValueError(f"bad server address {server!r}")
    argv = [PROGRAM, "-d", hca, "-i", "1", "-p", str(port), "-F", "--report_gbits"]
    if gid_index is not None:
        argv += ["-x", str(gid_index)]
    if server is not None:
        argv.append(server)
    return argv


def _is_noise(line: str) -> bool:
    """The parts of ib_write_bw's stdout that are not messages: rules, banner, header, addresses."""
    s = line.strip()
    return (not s or set(s) <= {"-"} or set(s) <= {"*"} or s.startswith("* Waiting for client")
            or " : " in s or s.endswith("BW Test") or s.startswith(("local address:", "remote address:", "GID:"))
            or s.startswith("#bytes"))


def parse_bw(text: str) -> float:
    """BW average in Gb/s from ib_write_bw's output: the last result line under a `BW average[Gb/sec]`
    (--report_gbits) or `BW average[MB/sec]` (MiB/s, converted) header. Without one, ValueError with
    the tool's own message lines (give it stderr too, e.g. stdout + stderr, to get them)."""
    unit = col = None
    found = None
    for line in text.splitlines():
        m = _AVG.search(line)
        if m and "#bytes" in line:
            unit = m.group(1)
            cols = [c for c in re.split(r"\s{2,}", line.strip()) if c]
            col = next(i for i, c in enumerate(cols) if c.startswith("BW average["))
            continue
        if unit is None:
            continue
        fields = line.split()
        if len(fields) > col and all(_NUM.match(f) for f in fields) and fields[0].isdigit() and fields[1].isdigit():
            found = float(fields[col]) * _UNIT_TO_GBPS[unit]
    if found is not None:
        return found
    messages = [line.strip() for line in text.splitlines() if not _is_noise(line)]
    raise ValueError("ib_write_bw printed no result line" + (": " + " | ".join(messages) if messages else
                                                              " and no message"))
