"""programs/perftest.py: ib_write_bw's command lines and the parsing of its output.

The samples are built from perftest 4.5-0.17's own format strings (src/perftest_parameters.h,
src/perftest_parameters.c ctx_print_test_info() and print_full_bw_report(), src/write_bw.c), with
C's printf conversions written as Python's %-formats: what the real tool prints."""
from __future__ import annotations

import pytest

from programs import perftest

RESULT_LINE = "-" * 87 + "\n"                                                   # perftest_parameters.h:194
RESULT_FMT = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"   # :200
RESULT_FMT_G = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"  # :204
REPORT_FMT = " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f"        # :225
REPORT_FMT_EXT = " %-7d    %d           %-7.6f            %-7.6f            %-7.6f"  # :229, bw < 0.1 Gb/s
BANNER = ("\n************************************\n"                                # write_bw.c:114-116
          "* Waiting for client to connect... *\n"
          "************************************\n")


def header(machine: str = "client", dev: str = "rocep1s0f1") -> str:
    """ctx_print_test_info() (perftest_parameters.c:3158-3299) for RC, one QP, RoCE, GID index 3."""
    return (RESULT_LINE + " " * 20 + "RDMA_Write BW Test\n"
            + " Dual-port       : OFF\t\tDevice         : %s\n" % dev
            + " Number of qps   : 1\t\tTransport type : IB\n"
            + " Connection type : RC\t\tUsing SRQ      : OFF\n"
            + " PCIe relax order: ON\n ibv_wr* API     : ON\n"
            + (" TX depth        : 128\n" if machine == "client" else "")
            + " CQ Moderation   : 1\n Mtu             : 4096[B]\n Link type       : Ethernet\n"
            + " GID index       : 3\n Max inline data : 0[B]\n rdma_cm QPs\t : OFF\n"
            + " Data ex. method : Ethernet\n" + RESULT_LINE)


ADDRESSES = (" local address: LID 0000 QPN 0x0129 PSN 0x57279d RKey 0x184300 VAddr 0x00ec99bedad000\n"
             " GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:99:01:11\n"
             " remote address: LID 0000 QPN 0x0129 PSN 0x0531b7 RKey 0x184300 VAddr 0x00ffeec955d000\n"
             " GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:99:01:12\n")


def run_output(avg: float, gbits: bool = True, machine: str = "client", size: int = 65536,
               iters: int = 5000) -> str:
    """A whole successful run's stdout (write_bw.c:177-245, 386-391; the server: 113-117, 255-268)."""
    peak = avg * 1.0015
    msg_rate = (avg * 1e9 / 8 if gbits else avg * 1048576) / size / 1e6
    line = (REPORT_FMT_EXT if gbits and avg < 0.1 else REPORT_FMT) % (size, iters, peak, avg, msg_rate) + "\n"
    return ((BANNER if machine == "server" else "") + header(machine) + ADDRESSES + RESULT_LINE
            + (RESULT_FMT_G if gbits else RESULT_FMT) + "\n" + line + RESULT_LINE)


# --- bw_argv ----------------------------------------------------------------------------------------

def test_server_argv_is_the_playbooks():
    assert perftest.bw_argv("rocep1s0f1", None, 18515) == [
        "ib_write_bw", "-d", "rocep1s0f1", "-i", "1", "-p", "18515", "-F", "--report_gbits"]


def test_client_argv_names_the_server_last():
    argv = perftest.bw_argv("roceP2p1s0f1", 3, 18516, "10.99.2.12")
    assert argv == ["ib_write_bw", "-d", "roceP2p1s0f1", "-i", "1", "-p", "18516", "-F", "--report_gbits",
                    "-x", "3", "10.99.2.12"]
    assert argv[-1] == "10.99.2.12" and "--report_gbits" in argv and "-F" in argv


def test_server_and_client_differ_only_by_the_address():
    server = perftest.bw_argv("rocep1s0f1", 3, 18515)
    client = perftest.bw_argv("rocep1s0f1", 3, 18515, "spark2")
    assert client == server + ["spark2"]


@pytest.mark.parametrize("hca, gid, port, server", [
    ("", None, 18515, None), ("-x", None, 18515, None), ("roce p1", None, 18515, None),
    ("rocep1s0f1", None, 0, None), ("rocep1s0f1", None, 65536, None), ("rocep1s0f1", None, True, None),
    ("rocep1s0f1", None, "18515", None), ("rocep1s0f1", -1, 18515, None), ("rocep1s0f1", 65, 18515, None),
    ("rocep1s0f1", True, 18515, None), ("rocep1s0f1", None, 18515, ""), ("rocep1s0f1", None, 18515, "-p"),
    ("rocep1s0f1", None, 18515, "10.0.0.1 -d x"),
])
def test_bw_argv_refuses_what_the_real_parser_would_misread(hca, gid, port, server):
    with pytest.raises(ValueError):
        perftest.bw_argv(hca, gid, port, server)


def test_gid_index_bounds_are_the_real_parsers():
    assert perftest.bw_argv("rocep1s0f1", 0, 1)[-2:] == ["-x", "0"]
    assert perftest.bw_argv("rocep1s0f1", 64, 65535)[-2:] == ["-x", "64"]


def test_server_ready_is_in_the_real_banner():
    assert perftest.SERVER_READY in BANNER
    assert perftest.SERVER_READY not in header("server") + ADDRESSES   # only the banner says it
    assert perftest.DEFAULT_PORT == 18515
    assert perftest.STDBUF_PREFIX == ("stdbuf", "-oL")


# --- parse_bw ---------------------------------------------------------------------------------------

def test_client_result():
    assert perftest.parse_bw(run_output(93.5)) == pytest.approx(93.5)


def test_server_result_is_the_clients_figure():
    out = run_output(92.57, machine="server")
    assert out.startswith(BANNER)
    assert perftest.parse_bw(out) == pytest.approx(92.57)


def test_degraded_rail():
    assert perftest.parse_bw(run_output(6.5)) == pytest.approx(6.5)


def test_below_a_tenth_of_a_gigabit_uses_the_six_decimal_format():
    out = run_output(0.0421)
    assert "0.042100" in out
    assert perftest.parse_bw(out) == pytest.approx(0.0421)


def test_mib_per_second_is_converted():
    """Without --report_gbits the table is in MB/sec, i.e. MiB/s (perftest's format_factor 0x100000)."""
    out = run_output(774.86, gbits=False)
    assert "BW average[MB/sec]" in out
    assert perftest.parse_bw(out) == pytest.approx(774.86 * 1048576 * 8 / 1e9)
    assert perftest.parse_bw(out) == pytest.approx(6.5, abs=0.001)


def test_the_last_result_line_counts():
    """-a prints one line per size; --run_infinitely one per interval: the last one is the answer."""
    lines = "".join(REPORT_FMT % (1 << i, 5000, 90.0 + i / 10, 90.0 + i / 100, 0.1) + "\n" for i in range(1, 24))
    out = header() + ADDRESSES + RESULT_LINE + RESULT_FMT_G + "\n" + lines + RESULT_LINE
    assert perftest.parse_bw(out) == pytest.approx(90.23)


def test_cpu_util_column():
    out = (header() + RESULT_LINE + RESULT_FMT_G + "    CPU_Util[%]\n"
           + REPORT_FMT % (65536, 881234, 0.0, 92.5, 0.176) + "\t    %-3.2f\n" % 3.5 + RESULT_LINE)
    assert perftest.parse_bw(out) == pytest.approx(92.5)


def test_stdout_and_stderr_together():
    out = run_output(93.5) + " Setting burst size to tx depth = 128\n"
    assert perftest.parse_bw(out) == pytest.approx(93.5)


@pytest.mark.parametrize("text, message", [
    # the client with nothing listening (perftest_communication.c:698, :1370, write_bw.c:121)
    ("Couldn't connect to 10.99.1.12:18515\nUnable to open file descriptor for socket connection"
     " Unable to init the socket connection\n", "Couldn't connect to 10.99.1.12:18515"),
    # a DOWN port (perftest_parameters.c:1941, :3118, write_bw.c:103)
    (" Port number 1 state is Down\n Couldn't set the link layer\n Couldn't get context for the device\n",
     "Port number 1 state is Down"),
    # an unknown device (perftest_resources.c:1068, write_bw.c:82)
    ("IB device mlx5_0 not found\n Unable to find the Infiniband/RoCE device\n", "IB device mlx5_0 not found"),
    # a refused option: glibc's message, then parser()'s (perftest_parameters.c:2843-2849, write_bw.c:71)
    ("ib_write_bw: unrecognized option '--bogus'\n Invalid Command or flag.\n Please check command line"
     " and run again.\n\n Parser function exited with Error\n", "unrecognized option '--bogus'"),
])
def test_no_result_line_raises_with_the_tools_lines(text, message):
    with pytest.raises(ValueError) as exc:
        perftest.parse_bw(text)
    assert message in str(exc.value)


def test_a_run_that_failed_after_the_header_names_the_failure():
    """Retry exceeded on the client (perftest_resources.h:100-103, write_bw.c:349-351)."""
    out = (header() + ADDRESSES + RESULT_LINE + RESULT_FMT_G + "\n"
           + " Completion with error at client\n Failed status 12: wr_id 0 syndrom 0x81\nscnt=128, ccnt=0\n"
           + " Failed to complete run_iter_bw function successfully\n")
    with pytest.raises(ValueError) as exc:
        perftest.parse_bw(out)
    msg = str(exc.value)
    assert "Completion with error at client" in msg and "Failed status 12" in msg
    assert "Dual-port" not in msg and "GID:" not in msg and "#bytes" not in msg


def test_the_server_waiting_is_not_a_result():
    with pytest.raises(ValueError) as exc:
        perftest.parse_bw(BANNER)
    assert "no result line" in str(exc.value)


def test_empty_output():
    with pytest.raises(ValueError, match="no result line"):
        perftest.parse_bw("")


def test_a_number_without_the_table_header_is_not_a_result():
    """--output=bandwidth prints a bare number: no unit, so no answer."""
    with pytest.raises(ValueError):
        perftest.parse_bw("93.500000\n")
