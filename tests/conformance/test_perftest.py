"""ib_write_bw against the REAL one: Debian bookworm's perftest 4.5+0.17-1, unpacked by
.ci/conformance-setup into $ROOT/perftest-4.5 and run with LD_LIBRARY_PATH on its own libraries.

There is no RDMA device on this machine, so the real tool parses its command line and then stops at the
device lookup (" Did not detect devices", perftest_resources.c:1046-1049): an argv it accepts ends
there, one it refuses ends in getopt's or parser()'s message and " Parser function exited with Error".
That is enough to hold programs/perftest.py's command lines to the real parser, and the simulator's
stand-in (sim/assets/node/ib_write_bw) to the real messages: both are started with the same argv[0]
(the stand-in's path), the stand-in with a link model without rails (no devices either)."""
from __future__ import annotations

import os
import shlex
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

from conformance.realenv import env_root
from programs import perftest

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "sim" / "assets" / "node" / "ib_write_bw"
NO_DEVICES = (" Did not detect devices \n If device exists, check if driver is up\n"
              " Unable to find the Infiniband/RoCE device\n")


def real_dir() -> Path:
    return env_root() / "perftest-4.5"


def real_binary() -> Path:
    exe = real_dir() / "usr" / "bin" / "ib_write_bw"
    if not exe.exists() or not (real_dir() / ".stamp").exists():
        msg = f"the real ib_write_bw (perftest 4.5+0.17-1) is missing at {exe}: run bash .ci/conformance-setup"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def env(model: Path | None = None, **extra) -> dict:
    libs = [str(d) for base in ("usr/lib", "lib") for d in sorted((real_dir() / base).glob("*-linux-gnu*"))
            if d.is_dir()]
    out = {k: v for k, v in os.environ.items() if k not in ("POSIXLY_CORRECT", "_STDBUF_O", "LD_PRELOAD")}
    out["LD_LIBRARY_PATH"] = ":".join(libs)
    if model is not None:
        out["DSPARK_SIM_FABRIC"] = str(model)
    out.update(extra)
    return out


@pytest.fixture(scope="module")
def no_rails(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fabric") / "fabric.json"
    path.write_text('{"node": "conformance", "rails": []}')
    return path


def run(exe: Path, argv0: str, args: list[str], model: Path | None = None, merged: bool = False,
        **extra) -> tuple[int, str, str]:
    try:
        done = subprocess.run([argv0, *args], executable=str(exe), env=env(model, **extra), timeout=20,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merged else subprocess.PIPE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{exe} {args} did not stop: an RDMA device exists here and it is waiting for a peer")
    return done.returncode, done.stdout.decode(), (done.stderr or b"").decode()


@lru_cache(maxsize=None)
def machine_has_no_rdma_device() -> bool:
    return run(real_binary(), "ib_write_bw", ["-d", "no_such_device"])[2] == NO_DEVICES


def need_no_device():
    if not machine_has_no_rdma_device():
        pytest.skip("this machine has RDMA devices: the real ib_write_bw does not stop at the device lookup")


# --- programs/perftest.py's command lines ---------------------------------------------------------

BW_ARGVS = [perftest.bw_argv(hca, gid, port, server)
            for hca in ("rocep1s0f1", "roceP2p1s0f1")
            for gid in (None, 3, 0, 64)
            for port, server in ((perftest.DEFAULT_PORT, None), (18516, None), (18515, "10.99.1.12"),
                                 (65535, "spark2"))]


@pytest.mark.parametrize("argv", BW_ARGVS, ids=[" ".join(a[1:]) for a in BW_ARGVS])
def test_every_bw_argv_is_accepted_by_the_real_parser(argv):
    real_binary()
    need_no_device()
    rc, out, err = run(real_binary(), argv[0], argv[1:])
    assert "Parser function exited with Error" not in err and "Invalid Command" not in err, err
    assert (rc, out, err) == (1, "", NO_DEVICES)            # past the parser: stopped at the device lookup


@pytest.mark.parametrize("argv", BW_ARGVS[:3], ids=[" ".join(a[1:]) for a in BW_ARGVS[:3]])
def test_bw_argv_also_parses_with_posixly_correct(argv):
    real_binary()
    need_no_device()
    assert run(real_binary(), argv[0], argv[1:], POSIXLY_CORRECT="1") == (1, "", NO_DEVICES)


def test_a_refused_argv_is_told_apart():
    """The check above can fail: the same argv with one option too many is a usage error."""
    real_binary()
    rc, out, err = run(real_binary(), "ib_write_bw", [*perftest.bw_argv("rocep1s0f1", 3, 18515)[1:], "--bogus"])
    assert rc == 1 and out.startswith("Usage:\n")
    assert err.startswith("ib_write_bw: unrecognized option '--bogus'\n")
    assert err.endswith(" Parser function exited with Error\n")


# --- the stand-in against the real tool ------------------------------------------------------------

def test_unknown_option_first_error_line(no_rails):
    need_no_device()
    real = run(real_binary(), str(STANDIN), ["-d", "rocep1s0f1", "--bogus"])
    standin = run(STANDIN, str(STANDIN), ["-d", "rocep1s0f1", "--bogus"], no_rails)
    assert real[2].splitlines()[0] == f"{STANDIN}: unrecognized option '--bogus'"
    assert standin[2].splitlines()[0] == real[2].splitlines()[0]
    assert standin == real                                   # and everything else: usage, messages, status


def test_device_that_does_not_exist_first_error_line(no_rails):
    need_no_device()
    real = run(real_binary(), str(STANDIN), ["-d", "mlx5_0", "-F", "--report_gbits"])
    standin = run(STANDIN, str(STANDIN), ["-d", "mlx5_0", "-F", "--report_gbits"], no_rails)
    assert real == (1, "", NO_DEVICES)
    assert standin[2].splitlines()[0] == real[2].splitlines()[0] == " Did not detect devices "
    assert standin == real


def test_refused_option_with_stdout_and_stderr_on_one_pipe(no_rails):
    """The usage text is longer than a stdio block (4096 bytes): where it is cut by the messages on the
    unbuffered stderr shows the stand-in's stdout is buffered as C's."""
    need_no_device()
    args = ["--ib", "x"]
    real = run(real_binary(), str(STANDIN), args, merged=True)
    assert len(real[1]) > 4096
    assert run(STANDIN, str(STANDIN), args, no_rails, merged=True) == real


PARSER_CASES = """
--report_gbits -F -d rocep1s0f1 -x 3
-d rocep1s0f1 10.0.0.1
a b
-V
--version
-h
--he
--report
--rep
--report_g
--report_gbits=1
--ib
--ip
-Fa
-aN
-d
-dfoo
-x3
-x
-x 65
-x -1
-x 300
-x abc
-x 0x10
-x 08
-p abc
-p 0x10
-p ''
-p ' '
--port
--port=
--port=5=6
--iters 7 --iters=8
-n 4
-n 30000
--size=abc
-s 0
-s 4K
-s 1M
-s 2147483648
-s 2097152K
-s -1
-- a
-- a b
a -- b
x -- -y
-- -d
-d -- x
-
- -
-W
-W foo
-Q
-Q 2000
-Q 10
-G
--use_rss
-Y 0x0800
--ethertype=0x0800
--ethertype=800
--force-link=XX
--force-link=ib
-c XX
-c UD
-c SRD
-c XRC
-c DC
-c DC --use_old_post_send
-c RawEth
-c RawEth -h
-c RawEth --bogus
-c RawEth -B 00:11:22:33:44:55 -Z -K 5
-A x
-e
-X 1
-C
-H
-U
-g
-o 3
-r 5
-I 1000
-q 0
-S 16
-i 0
-T 3
-R -T 3
-L 3
-t 0
-w -1
-l 3
-l 4 -n 100
-b -c UC -R
--use_cuda=1
--use_ooo
--raw_ipv6
--sniffer
--aes_xts
--aes_xts --kek_path=a --data_enc_key_app_path=b --credentials_path=c
--kek_path=x
--log_dci_streams=1
--disable_pcie_relaxed
--use-srq
--burst_size=3
--rate_limit=5
--rate_limit=7
--rate_limit=7 --rate_units=p
--rate_limit=10 --rate_limit_type=SW
--rate_limit=5 --rate_limit_type=PP
--rate_limit=5 --run_infinitely
--report-per-port
--cpu_util
-D 0
-D 1 -f 1
-a -D 2
--output=bandwidth
--output=latency
--latency_gap=3
--typical_pkt_size=10
--source_ip 1.2.3.4
--source_ip bogus
--source_i=1.2.3.4
--local_ip bogus
--local_ip 1.2.3.4 -B 00:11:22:33:44:55
-B zz
-B 00:11:22:33:44:5g
-B 00:11:22:33:44:1ff
-J bogus
--vlan_pcp=9
--flows=0
--dlid=70000
--dont_xchg_versions
--CPU
--cpu
"""


@pytest.mark.parametrize("args", [shlex.split(line) for line in PARSER_CASES.strip().splitlines()],
                         ids=[line for line in PARSER_CASES.strip().splitlines()])
def test_standin_parses_as_the_real_one(args, no_rails):
    """Same status, stdout and stderr, byte for byte, up to the device lookup."""
    need_no_device()
    assert run(STANDIN, str(STANDIN), args, no_rails) == run(real_binary(), str(STANDIN), args)


def test_standin_parses_as_the_real_one_with_posixly_correct(no_rails):
    need_no_device()
    for args in (["10.0.0.1", "-d", "x"], ["-d", "x", "10.0.0.1"]):
        assert (run(STANDIN, str(STANDIN), args, no_rails, POSIXLY_CORRECT="1")
                == run(real_binary(), str(STANDIN), args, POSIXLY_CORRECT="1"))
