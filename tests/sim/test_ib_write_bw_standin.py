"""The ib_write_bw stand-in (sim/assets/node/ib_write_bw), run here as plain subprocesses: a server and a
client on 127.0.0.1, each reading its own link model ($DSPARK_SIM_FABRIC). No docker.

What it must do is what perftest 4.5-0.17 does (the messages are quoted from its source: file:line in
the comments); tests/conformance/test_perftest.py holds it against the real binary's parser."""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import time
from pathlib import Path

import pytest

from programs import perftest

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "sim" / "assets" / "node" / "ib_write_bw"
TIMEOUT = 20


def rail(hca, netdev, pci, ip, gbps=93.5, state="ACTIVE", gid_index=3):
    return {"hca": hca, "netdev": netdev, "pci": pci, "ip": ip, "prefix": 24, "state": state,
            "speed_mbps": 200000, "gbps": gbps, "mtu": 9000, "gid_index": gid_index}


def model(tmp_path: Path, node: str, host: int, rail1: dict | None = None, rail2: dict | None = None) -> Path:
    rails = [rail("rocep1s0f1", "enp1s0f1np1", "0000:01:00.1", f"10.99.1.{host}", **(rail1 or {})),
             rail("roceP2p1s0f1", "enP2p1s0f1np1", "0002:01:00.1", f"10.99.2.{host}", **(rail2 or {}))]
    path = tmp_path / f"{node}.json"
    path.write_text(json.dumps({"node": node, "management": {"netdev": "enP7s7", "ip": f"172.30.99.{host}",
                                                              "prefix": 24, "speed_mbps": 10000},
                                "rails": rails}))
    return path


def env_for(model_path: Path | None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("POSIXLY_CORRECT", "_STDBUF_O")}
    env["DSPARK_SIM_FABRIC"] = str(model_path) if model_path else "/nonexistent/fabric.json"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args: list[str], model_path: Path | None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(STANDIN), *args], env=env_for(model_path), capture_output=True, text=True,
                          timeout=TIMEOUT, **kw)


class Server:
    """The server side, started as an orchestrator would: line-buffered stdout (what `stdbuf -oL` sets),
    and the client only once SERVER_READY has been printed."""

    def __init__(self, args: list[str], model_path: Path, line_buffered: bool = True):
        extra = {"_STDBUF_O": "L"} if line_buffered else {}
        self.proc = subprocess.Popen([str(STANDIN), *args], env=env_for(model_path, **extra),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.seen = b""

    def readable(self, seconds: float) -> bool:
        return bool(select.select([self.proc.stdout], [], [], seconds)[0])

    def wait_ready(self):
        deadline = time.monotonic() + TIMEOUT
        while perftest.SERVER_READY.encode() not in self.seen:
            assert time.monotonic() < deadline, self.seen
            assert self.readable(deadline - time.monotonic()), "server printed nothing"
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            assert chunk, f"server exited before it was ready: {self.seen!r}"
            self.seen += chunk

    def finish(self) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=TIMEOUT)
        return self.proc.returncode, (self.seen + out).decode(), err.decode()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


def client(args: list[str], model_path: Path) -> subprocess.CompletedProcess:
    """The client, retried while the port is not open yet: the real server prints its banner just before
    it binds (write_bw.c:113-120)."""
    for _ in range(50):
        done = run(args, model_path)
        if "Couldn't connect to" not in done.stderr:
            return done
        time.sleep(0.05)
    return done


def pair(tmp_path, server_args, client_args, server_model, client_model):
    port = free_port()
    server = Server([*server_args, "-p", str(port)], server_model)
    try:
        server.wait_ready()
        cli = client([*client_args, "-p", str(port), "127.0.0.1"], client_model)
        rc, out, err = server.finish()
    finally:
        server.kill()
    return (rc, out, err), (cli.returncode, cli.stdout, cli.stderr)


# --- the figure ------------------------------------------------------------------------------------

@pytest.mark.parametrize("server_gbps, client_gbps", [(93.5, 93.5), (93.5, 6.5), (6.5, 93.5)])
def test_bw_is_the_min_of_both_rails_and_parses(tmp_path, server_gbps, client_gbps):
    spark1 = model(tmp_path, "spark1", 11, rail2={"gbps": server_gbps})
    spark2 = model(tmp_path, "spark2", 12, rail2={"gbps": client_gbps})
    (src, sout, serr), (crc, cout, cerr) = pair(
        tmp_path, ["-d", "roceP2p1s0f1", "-F", "--report_gbits"], ["-d", "roceP2p1s0f1", "-F", "--report_gbits", "-x", "3"],
        spark1, spark2)
    assert (src, crc) == (0, 0), (serr, cerr)
    want = min(server_gbps, client_gbps)
    assert perftest.parse_bw(cout) == pytest.approx(want)
    assert perftest.parse_bw(sout) == pytest.approx(want)          # the server prints the client's figures
    assert " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n" in cout
    assert "Device         : roceP2p1s0f1" in cout and " GID index       : 3\n" in cout
    assert " GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:99:02:12\n" in cout   # its own rail's IPv4 GID
    assert sout.startswith("\n************************************\n* Waiting for client to connect... *\n")
    assert " TX depth        : 128\n" in cout and "TX depth" not in sout
    assert serr == cerr == ""


def test_bw_argv_as_built_runs_end_to_end(tmp_path):
    """The exact argv programs.perftest builds, server and client (port and address included)."""
    spark1, spark2 = model(tmp_path, "spark1", 11), model(tmp_path, "spark2", 12)
    port = free_port()
    server = Server(perftest.bw_argv("rocep1s0f1", None, port)[1:], spark1)
    try:
        server.wait_ready()
        cli = client(perftest.bw_argv("rocep1s0f1", 3, port, "127.0.0.1")[1:], spark2)
        rc, out, _ = server.finish()
    finally:
        server.kill()
    assert (rc, cli.returncode) == (0, 0), cli.stderr
    assert perftest.parse_bw(cli.stdout) == perftest.parse_bw(out) == pytest.approx(93.5)


def test_mib_per_second_without_report_gbits(tmp_path):
    spark1, spark2 = model(tmp_path, "spark1", 11), model(tmp_path, "spark2", 12, rail1={"gbps": 6.5})
    (src, sout, _), (crc, cout, _) = pair(tmp_path, ["-d", "rocep1s0f1"], ["-d", "rocep1s0f1"], spark1, spark2)
    assert (src, crc) == (0, 0)
    assert "BW average[MB/sec]" in cout and " 774.86 " in cout      # 6.5e9 / 8 / 2^20
    assert perftest.parse_bw(cout) == pytest.approx(6.5, abs=0.001)


# --- failures: as the real tool fails -------------------------------------------------------------

DOWN = (" Port number 1 state is Down\n"                # perftest_parameters.c:1941 (portStates[1])
        " Couldn't set the link layer\n"                # perftest_parameters.c:3118
        " Couldn't get context for the device\n")       # write_bw.c:103


def test_down_rail_fails_as_a_port_that_is_not_active(tmp_path):
    spark1 = model(tmp_path, "spark1", 11, rail2={"state": "DOWN"})
    port = free_port()
    done = run(["-d", "roceP2p1s0f1", "-F", "--report_gbits", "-p", str(port)], spark1)   # a server
    assert (done.returncode, done.stdout, done.stderr) == (1, "", DOWN)   # before the banner, never listens
    done = run(["-d", "roceP2p1s0f1", "-p", str(port), "127.0.0.1"], spark1)               # a client
    assert (done.returncode, done.stdout, done.stderr) == (1, "", DOWN)   # before it connects


def test_down_rail_on_the_client_leaves_the_server_waiting(tmp_path):
    spark1 = model(tmp_path, "spark1", 11)
    spark2 = model(tmp_path, "spark2", 12, rail1={"state": "DOWN"})
    port = free_port()
    server = Server(["-d", "rocep1s0f1", "-p", str(port)], spark1)
    try:
        server.wait_ready()
        done = run(["-d", "rocep1s0f1", "-p", str(port), "127.0.0.1"], spark2)
        assert (done.returncode, done.stderr) == (1, DOWN)
        time.sleep(0.3)
        assert server.proc.poll() is None          # still waiting for a client, as the real one would
    finally:
        server.kill()


def test_unknown_device(tmp_path):
    done = run(["-d", "mlx5_0", "-F", "--report_gbits"], model(tmp_path, "spark1", 11))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == ("IB device mlx5_0 not found\n"                       # perftest_resources.c:1068
                           " Unable to find the Infiniband/RoCE device\n")      # write_bw.c:82


def test_no_model_means_no_devices():
    done = run(["-d", "rocep1s0f1"], None)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (" Did not detect devices \n If device exists, check if driver is up\n"  # resources.c:1047
                           " Unable to find the Infiniband/RoCE device\n")


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unrecognized option '--bogus'"),
    (["--report"], "option '--report' is ambiguous; possibilities: '--report-cycles' '--report-histogrm' "
                   "'--report-unsorted' '--report-counters' '--report_gbits' '--report-both' '--report-per-port'"),
    (["-G"], "invalid option -- 'G'"),               # --use_rss exists, -G is not in the option string
    (["-d"], "option requires an argument -- 'd'"),
    (["--report_gbits=1"], "option '--report_gbits' doesn't allow an argument"),
])
def test_refused_option_fails_as_getopt_and_the_parser_do(tmp_path, args, message):
    done = run(args, model(tmp_path, "spark1", 11))
    assert done.returncode == 1
    assert done.stderr == (f"{STANDIN}: {message}\n"
                           " Invalid Command or flag.\n Please check command line and run again.\n\n"  # :2843-2844
                           " Parser function exited with Error\n")                                    # write_bw.c:71
    assert done.stdout.startswith(f"Usage:\n  {STANDIN}            start a server and wait for connection\n"
                                  f"  {STANDIN} <host>     connect to server at <host>\n")


def test_value_checks_are_the_parsers(tmp_path):
    done = run(["-x", "65"], model(tmp_path, "spark1", 11))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == " Gid index should be between 0 and 64\n Parser function exited with Error\n"
    done = run(["-p", "12ab"], model(tmp_path, "spark1", 11))
    assert done.stderr == " Port argument 12ab should be int\n Parser function exited with Error\n"


def test_client_without_a_listening_server(tmp_path):
    port = free_port()
    done = run(["-d", "rocep1s0f1", "-F", "--report_gbits", "-p", str(port), "127.0.0.1"],
               model(tmp_path, "spark2", 12))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"Couldn't connect to 127.0.0.1:{port}\n"              # perftest_communication.c:698
                           "Unable to open file descriptor for socket connection"  # :1370, no newline
                           " Unable to init the socket connection\n")              # write_bw.c:121
    with pytest.raises(ValueError, match="Couldn't connect to"):
        perftest.parse_bw(done.stdout + done.stderr)


def test_wrong_gid_index_fails_both_sides(tmp_path):
    spark1, spark2 = model(tmp_path, "spark1", 11), model(tmp_path, "spark2", 12)
    (src, sout, serr), (crc, cout, cerr) = pair(tmp_path, ["-d", "rocep1s0f1"], ["-d", "rocep1s0f1", "-x", "1"],
                                                spark1, spark2)
    incompatible = "\n Found Incompatibility issue with GID types.\n Please Try to use a different IP version.\n\n"
    assert (src, serr) == (1, incompatible) and (crc, cerr) == (1, incompatible)   # write_bw.c:188-191
    assert " GID index       : 1\n" in cout and "address:" not in cout   # failed before the address lines
    with pytest.raises(ValueError, match="Incompatibility"):
        perftest.parse_bw(cout + cerr)


def test_gid_index_is_the_tools_own_choice(tmp_path):
    """Without -x: get_best_gid_index() (perftest_communication.c:594-653), the IPv4 RoCE v2 entry, which
    sim/fabric.py puts at gid_index (5 here: an IPv6 pair before it)."""
    spark1 = model(tmp_path, "spark1", 11, rail1={"gid_index": 5})
    spark2 = model(tmp_path, "spark2", 12, rail1={"gid_index": 5})
    (src, sout, _), (crc, cout, _) = pair(tmp_path, ["-d", "rocep1s0f1", "--report_gbits"],
                                          ["-d", "rocep1s0f1", "--report_gbits"], spark1, spark2)
    assert (src, crc) == (0, 0)
    assert " GID index       : 5\n" in sout and " GID index       : 5\n" in cout
    assert perftest.parse_bw(cout) == pytest.approx(93.5)


def test_empty_gid_on_both_sides_fails_at_rtr(tmp_path):
    spark1, spark2 = model(tmp_path, "spark1", 11), model(tmp_path, "spark2", 12)
    (src, sout, serr), (crc, cout, cerr) = pair(tmp_path, ["-d", "rocep1s0f1", "-x", "9"],
                                                ["-d", "rocep1s0f1", "-x", "9"], spark1, spark2)
    for rc, err in ((src, serr), (crc, cerr)):                  # perftest_resources.c:2730, write_bw.c:197
        assert rc == 1 and err.startswith("Failed to modify QP ") and err.endswith(
            " to RTR\n Unable to Connect the HCA's through the link\n"), err


def test_roce_v1_gid_does_not_reach_a_roce_v2_peer(tmp_path):
    spark1, spark2 = model(tmp_path, "spark1", 11), model(tmp_path, "spark2", 12)
    (src, _, serr), (crc, cout, cerr) = pair(tmp_path, ["-d", "rocep1s0f1"], ["-d", "rocep1s0f1", "-x", "2"],
                                             spark1, spark2)
    assert " GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:99:01:12\n" in cout   # -x 2: IPv4-mapped, v1
    assert crc == 1 and cerr.startswith(" Completion with error at client\n Failed status 12:")
    assert src == 1 and serr.startswith("ethernet_read_keys: Couldn't read remote address\n")


def test_rails_in_different_subnets_cannot_reach_each_other(tmp_path):
    """A crossed cable: the client's rail 1 (10.99.1.0/24) against the server's rail 2 (10.99.2.0/24)."""
    spark1, spark2 = model(tmp_path, "spark1", 11), model(tmp_path, "spark2", 12)
    t0 = time.monotonic()
    (src, sout, serr), (crc, cout, cerr) = pair(tmp_path, ["-d", "roceP2p1s0f1", "--report_gbits"],
                                                ["-d", "rocep1s0f1", "--report_gbits"], spark1, spark2)
    assert time.monotonic() - t0 < 10
    assert crc == 1 and cerr == (" Completion with error at client\n"              # perftest_resources.h:101-103
                                 " Failed status 12: wr_id 0 syndrom 0x81\nscnt=128, ccnt=0\n"
                                 " Failed to complete run_iter_bw function successfully\n")  # write_bw.c:350
    assert src == 1 and serr == ("ethernet_read_keys: Couldn't read remote address\n"  # communication.c:341
                                 " Unable to read to socket/rdma_cm\n"
                                 " Failed to exchange data between server and clients\n")  # write_bw.c:251
    for out in (sout, cout):
        with pytest.raises(ValueError):
            perftest.parse_bw(out)


def test_server_stdout_on_a_pipe_is_block_buffered_like_c_stdio(tmp_path):
    """Not line-buffered, the server's banner stays in its stdio buffer until the run ends (perftest
    never flushes it), so an orchestrator must run it under `stdbuf -oL` (or a pty) to see SERVER_READY."""
    spark1, spark2 = model(tmp_path, "spark1", 11), model(tmp_path, "spark2", 12)
    port = free_port()
    server = Server(["-d", "rocep1s0f1", "-p", str(port), "--report_gbits"], spark1, line_buffered=False)
    try:
        assert not server.readable(0.5)
        cli = client(["-d", "rocep1s0f1", "-p", str(port), "--report_gbits", "127.0.0.1"], spark2)
        rc, out, _ = server.finish()
    finally:
        server.kill()
    assert (rc, cli.returncode) == (0, 0)
    assert perftest.SERVER_READY in out and perftest.parse_bw(out) == pytest.approx(93.5)
