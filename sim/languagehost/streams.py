"""The double's io plumbing, after Go's os/exec and sdk/v3 go/common/util/rpcutil/writer.go.

`Cmd` is an exec.Cmd: argv, env (None: inherit this process's) and dir; `run()` starts it with each
stream going to a `Writer` (an io.Writer: a function over bytes, or a file descriptor the child
inherits as Go passes an *os.File), to this process's own fd (INHERIT, Go's `cmd.Stdout = os.Stdout`)
or captured. Errors read like Go's: `exit status 1`, `signal: killed`, `fork/exec <path>: no such
file or directory`.

`make_streams` is rpcutil.makeStreams: stdout/stderr writers over a gRPC stream's messages, or, for
a terminal, one pseudo-terminal whose output is copied to stdout (InstallDependencies' is_terminal).
`EngineLogWriter` is main.go's logWriter: each write an ephemeral engine Log message.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Callable

import grpc
from pulumi.runtime.proto import engine_pb2, engine_pb2_grpc

INHERIT = "inherit"
GRPC_OPTIONS = [("grpc.max_receive_message_length", 400 * 1024 * 1024),
                ("grpc.max_send_message_length", 400 * 1024 * 1024)]  # fmt: skip  # rpcutil: 400 MiB


def go_json(value) -> str:
    """Go's json.Marshal of a map[string]string or []string: sorted keys, compact, HTML characters escaped."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


class GoError(Exception):
    """An error whose text is what the Go host's error would print."""


class ExitError(GoError):
    """exec.ExitError: the process ran and exited non-zero (or was signalled: code -1, as WaitStatus says)."""

    def __init__(self, returncode: int, stderr: bytes = b""):
        self.returncode, self.stderr = returncode, stderr
        self.code = returncode if returncode >= 0 else -1
        text = f"exit status {returncode}" if returncode >= 0 else f"signal: {_signame(-returncode)}"
        super().__init__(text)


def _signame(num: int) -> str:
    names = {signal.SIGKILL: "killed", signal.SIGINT: "interrupt", signal.SIGTERM: "terminated"}
    try:
        return names.get(signal.Signals(num), signal.Signals(num).name.lower())
    except ValueError:
        return f"signal {num}"


def start_error(exc: OSError, path: str) -> GoError:
    """A failed start as Go's os/exec words it."""
    reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
    if exc.errno == errno.ENOENT:
        reason = "no such file or directory"
    return GoError(f"fork/exec {path}: {reason}")


class Writer:
    """An io.Writer: `send(bytes)`; with `fd`, a file the child can inherit (a pty's terminal side)."""

    def __init__(self, send: Callable[[bytes], None], fd: int | None = None):
        self.send, self.fd = send, fd

    def write(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        if data:
            self.send(data)


def fd_writer(fd: int) -> Writer:
    def send(data: bytes) -> None:
        while data:
            data = data[os.write(fd, data):]
    return Writer(send, fd)


@dataclass
class Cmd:
    argv: list[str]
    env: dict[str, str] | None = None
    dir: str | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def args_text(self) -> str:
        return " ".join(self.argv)


def _pump(src, writers: list) -> None:
    try:
        while chunk := os.read(src.fileno(), 65536):
            for w in writers:
                w.write(chunk) if isinstance(w, Writer) else w.extend(chunk)
    except OSError:
        pass
    finally:
        src.close()


def _target(w, tee: bytearray | None, fd: int):
    """Popen's argument for one stream and the writers a pump feeds (Go: an *os.File is passed as is,
    any other writer gets a pipe and a copying goroutine)."""
    if tee is None:
        if w == INHERIT:
            return None, []
        if w is None:
            return subprocess.DEVNULL, []
        if w.fd is not None:
            return w.fd, []
        return subprocess.PIPE, [w]
    return subprocess.PIPE, [tee] + ([fd_writer(fd)] if w == INHERIT else [] if w is None else [w])


def start(cmd: Cmd, stdout=None, stderr=None, stdout_tee: bytearray | None = None,
          stderr_tee: bytearray | None = None, stdout_pipe: bool = False) -> list[threading.Thread]:  # fmt: skip
    """Start `cmd` (sets cmd.proc); stdout/stderr: a Writer, INHERIT, or None (discarded, Go's nil).
    A `*_tee` buffer also collects that stream (io.MultiWriter); `stdout_pipe` leaves proc.stdout to the
    caller. Returns the pump threads to join once the process exited."""
    out_target, out_writers = (subprocess.PIPE, []) if stdout_pipe else _target(stdout, stdout_tee, 1)
    err_target, err_writers = _target(stderr, stderr_tee, 2)
    try:
        cmd.proc = subprocess.Popen(cmd.argv, env=cmd.env, cwd=cmd.dir, stdin=subprocess.DEVNULL,
                                    stdout=out_target, stderr=err_target)  # fmt: skip
    except OSError as exc:
        raise start_error(exc, cmd.argv[0]) from exc
    threads = []
    for stream, writers in ((None if stdout_pipe else cmd.proc.stdout, out_writers), (cmd.proc.stderr, err_writers)):
        if stream is not None:
            t = threading.Thread(target=_pump, args=(stream, writers), daemon=True)
            t.start()
            threads.append(t)
    return threads


def wait(cmd: Cmd, threads: list[threading.Thread], stderr: bytes = b"") -> None:
    """cmd.Wait(): ExitError on a non-zero exit."""
    code = cmd.proc.wait()
    for t in threads:
        t.join()
    if code != 0:
        raise ExitError(code, stderr)


def run(cmd: Cmd, stdout=None, stderr=None, stdout_tee: bytearray | None = None,
        stderr_tee: bytearray | None = None) -> None:  # fmt: skip
    """cmd.Run()."""
    wait(cmd, start(cmd, stdout, stderr, stdout_tee, stderr_tee))


def output(cmd: Cmd, combined: bool = False) -> bytes:
    """cmd.Output() (stderr kept on the ExitError) or cmd.CombinedOutput(); GoError: the error and the output
    so far as `.output`."""
    out, err = bytearray(), bytearray()
    sink = Writer(out.extend)
    try:
        threads = start(cmd, sink, sink if combined else None, stderr_tee=None if combined else err)
    except GoError as exc:
        exc.output = b""
        raise
    try:
        wait(cmd, threads, bytes(err))
    except ExitError as exc:
        exc.output = bytes(out)
        raise
    return bytes(out)


def interrupt_then_kill(proc: subprocess.Popen, delay: float = 5.0) -> None:
    """main.go Run's cmd.Cancel: os.Interrupt, and a kill once cmd.WaitDelay (5 s) has passed."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGINT)
    except OSError:
        proc.kill()
        return
    timer = threading.Timer(delay, lambda: proc.poll() is None and proc.kill())
    timer.daemon = True
    timer.start()


# ---------------------------------------------------------------------- gRPC streams (rpcutil/writer.go)


class StreamCloser:
    """makeStreams' closer: nothing to do, or the pty's (close the terminal, drain the copy, close the pty)."""

    def __init__(self, master: int | None = None, slave: int | None = None, copier: threading.Thread | None = None):
        self.master, self.slave, self.copier = master, slave, copier

    def close(self) -> None:
        if self.slave is None:
            return
        os.close(self.slave)
        self.copier.join()
        os.close(self.master)
        self.master = self.slave = self.copier = None


def make_streams(send_stdout: Callable[[bytes], None], send_stderr: Callable[[bytes], None],
                 is_terminal: bool) -> tuple[StreamCloser, Writer, Writer]:  # fmt: skip
    """rpcutil.makeStreams: plain writers, or for a terminal a pty whose output goes to stdout (stdout ==
    stderr); a pty that cannot be opened is reported as the Go code's warning and the plain pipes are used."""
    stdout, stderr = Writer(send_stdout), Writer(send_stderr)
    if is_terminal:
        try:
            master, slave = os.openpty()
        except OSError as exc:
            stderr.write(f"\x1b[33mwarning: could not open pty: {exc}\x1b[0m\n")
        else:
            def copy() -> None:
                while True:
                    try:
                        chunk = os.read(master, 65536)
                    except OSError:  # EIO once the terminal side is closed: the end, as ptyCloser says
                        return
                    if not chunk:
                        return
                    stdout.write(chunk)
            copier = threading.Thread(target=copy, daemon=True)
            copier.start()
            tty = fd_writer(slave)
            return StreamCloser(master, slave, copier), tty, tty
    return StreamCloser(), stdout, stderr


class EngineLogWriter(Writer):
    """main.go logWriter: every write is one ephemeral engine Log message (one stream id per writer pair)."""

    def __init__(self, engine: engine_pb2_grpc.EngineStub, stream_id: int, severity: int):
        def send(data: bytes) -> None:
            engine.Log(engine_pb2.LogRequest(message=data.decode("utf-8", "replace"), urn="", ephemeral=True,
                                             streamId=stream_id, severity=severity))  # fmt: skip
        super().__init__(send)


def engine_writers(engine_address: str) -> tuple[Writer, Writer]:
    """main.go createEngineWriters: an info and an error writer logging to the engine, one random stream id."""
    channel = grpc.insecure_channel(engine_address, options=GRPC_OPTIONS)
    engine = engine_pb2_grpc.EngineStub(channel)
    stream_id = random.randint(0, 2**31 - 1)
    return EngineLogWriter(engine, stream_id, engine_pb2.INFO), EngineLogWriter(engine, stream_id, engine_pb2.ERROR)
