"""TEST DOUBLE of pulumi-command 1.2.1's resource plugin (`pulumi-resource-command`).

The real plugin is a Go module (github.com/pulumi/pulumi-command/provider) that the Go module proxy
reachable here refuses to serve (403 for every version and pseudo-version of it, and for its
pulumi-go-provider dependency's version list), so the engine runs this instead; sim/adaptations.py
lists it. It implements what the program uses, with the real provider's semantics (v1.2.1 source):

- `command:remote:Command` and `command:local:Command`;
- Diff: a change of `triggers` replaces; any other input change (create, update, delete, stdin,
  connection, environment, logging, ...) is an update, which runs `update` (nothing when it is ""), or
  `create` again when there is none;
- Create/Update run the command and return the inputs plus `stdout`/`stderr`; nothing runs at preview;
- Delete runs the *old* `delete` with the old connection; `PULUMI_COMMAND_STDOUT`/`_STDERR` hold the
  previous output unless `addPreviousOutputInEnv` is false;
- Read (refresh) changes nothing: commands have no live state to read;
- remote connection like pulumi-command's (provider/pkg/provider/remote/connection.go) over Go's x/crypto/ssh:
  auth methods in its order, the private key (`privateKey`), then `password` and keyboard-interactive, then
  the ssh agent's keys, each tried as x/crypto does (a method *name* once: with a private key the agent's
  keys are never offered); the agent socket (`agentSocketPath`, else a non-empty SSH_AUTH_SOCK) is dialled
  before any TCP dial, and a failure there fails at once, unretried, in Go's words (`dial unix <path>:
  connect: no such file or directory`); ~/.ssh/config, identity files and known_hosts are NOT read; the
  host key is checked only when `hostKey` is given (otherwise any key is accepted, as the real provider
  does), and a pin restricts the handshake to its type (an RSA pin: `ssh-rsa` only, which OpenSSH 8.8+
  refuses); every failed dial, auth failures and host key mismatches included, is retried until
  `dialErrorLimit`+1 dials (default 10; -1: no limit), waiting 100 ms x1.5 each time (at most 5 s), with
  an ephemeral `Dial 1/10 failed: retrying` status each time, and ends `after 10 failed attempts: <Go's
  error>`; `perDialTimeout` (default 15 s, 0: none) bounds each TCP connect only, not the handshake or
  auth; stdout and stderr are read together;
- a failure reports `running "<command>"` and the output, as the real provider does (which is why
  no secret may ever be part of a command string);
- every line of stdout and stderr goes to the engine as an ephemeral info message on the resource
  (`logging`: stdout, stderr, stdoutAndStderr (default) or none), so the event log holds it;
- a local command still running when its step's customTimeouts deadline passes is killed, and the
  step fails with a bare `signal: killed`.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import socket
import subprocess
import time

import paramiko
from paramiko.agent import AgentSSH

from .base import UNKNOWN, Diff, Provider, ProviderError, diff_inputs, has_unknown, reveal, serve

REMOTE = "command:remote:Command"
LOCAL = "command:local:Command"
OUTPUTS = ("stdout", "stderr")
KEY_CLASSES = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)


def load_private_key(text: str, password: str | None = None) -> paramiko.PKey:
    for cls in KEY_CLASSES:
        try:
            return cls.from_private_key(io.StringIO(text), password=password)
        except (paramiko.SSHException, ValueError):
            continue
    raise ProviderError("connection.privateKey: not an ed25519, ECDSA or RSA private key")


def parse_host_key(host_key: str) -> None:
    """SSHConfig's `ssh.ParseAuthorizedKey` of a pinned `hostKey` (pulumi-command provider/pkg/provider/remote/
    connection.go:88-92), its first check: a pin that is not `<type> <base64 key>` fails the command at once
    (not retried), `failed to parse host key: ssh: no key found`."""
    try:
        kind, blob = host_key.split()[:2]
        paramiko.PKey.from_type_string(kind, base64.b64decode(blob, validate=True))
    except (ValueError, binascii.Error, paramiko.SSHException, TypeError):
        raise ProviderError("failed to parse host key: ssh: no key found") from None


class PinnedHostKey(paramiko.MissingHostKeyPolicy):
    """Accept the server only if its key is the pinned `hostKey` ("<type> <base64>")."""

    def __init__(self, host_key: str | None):
        self.host_key = host_key.split()[:2] if host_key else None

    def missing_host_key(self, client, hostname, key):
        if self.host_key is None:
            return  # the real provider ignores host keys unless one is pinned
        if [key.get_name(), key.get_base64()] != self.host_key:
            raise ProviderError(
                f"ssh: host key mismatch for {hostname}: got {key.get_name()} {key.get_base64()[:16]}..., "
                f"pinned {self.host_key[0]} {self.host_key[1][:16]}..."
            )


def host_key_algorithms(host_key: str | None) -> dict | None:
    """paramiko's disabled_algorithms for a pin: like the real provider, a pinned key restricts the handshake
    to that key's type, and an RSA pin to `ssh-rsa` (SHA-1) only: x/crypto/ssh's FixedHostKey gives the
    client the key's Type(), "ssh-rsa", as its one host key algorithm (pulumi-command provider/pkg/provider/
    remote/connection.go, golang.org/x/crypto ssh/client.go), which OpenSSH 8.8+ servers refuse."""
    if not host_key:
        return None
    pinned = host_key.split()[0]
    return {"keys": [k for k in paramiko.Transport._preferred_keys if k != pinned]}


def _read_both(channel) -> tuple[bytes, bytes]:
    """stdout and stderr read at once (the real provider copies both streams concurrently): reading one to
    its end first would hang on a command that fills the other's window."""
    out, err = bytearray(), bytearray()
    while True:
        got = False
        if channel.recv_ready():
            out += channel.recv(65536)
            got = True
        if channel.recv_stderr_ready():
            err += channel.recv_stderr(65536)
            got = True
        if not got:
            if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                if channel.eof_received or channel.closed:
                    break
            time.sleep(0.01)
    return bytes(out), bytes(err)


class DialError(Exception):
    """One failed `ssh.Dial` (TCP connect, handshake or auth) in x/crypto's (Go's) words: retried."""


AUTH_FAILURE, AUTH_PARTIAL, AUTH_SUCCESS = range(3)  # golang.org/x/crypto ssh/client_auth.go:16-22 authResult
DIAL_DELAY, DIAL_BACKOFF, DIAL_MAX_DELAY = 0.1, 1.5, 5.0  # pulumi sdk/go/common/util/retry/until.go:39-43
SLOW_TIMEOUT = 300.0  # paramiko's banner/handshake timers (x/crypto has none; paramiko needs a number)


def _go_errno(exc: OSError) -> str:
    """Go's text for a syscall errno (syscall.Errno.Error(): glibc's strerror with a lower-case first letter)."""
    if exc.errno:
        text = os.strerror(exc.errno)
        return text[:1].lower() + text[1:]
    return str(exc)


def _go_addr(addr: tuple) -> str:
    return f"[{addr[0]}]:{addr[1]}" if ":" in addr[0] else f"{addr[0]}:{addr[1]}"


def agent_socket_path(conn: dict) -> str | None:
    """`agentSocketPath` when given, else SSH_AUTH_SOCK when set and non-empty, else none (pulumi-command
    provider/pkg/provider/remote/connection.go:131-136; connection_unix.go:12-17 tryGetDefaultAgentSocket)."""
    if conn.get("agentSocketPath") is not None:
        return conn["agentSocketPath"]
    return os.environ.get("SSH_AUTH_SOCK") or None


def dial_agent(path: str) -> socket.socket:
    """The ssh agent's socket, dialled as SSHConfig does while it builds the client config, before any TCP dial
    (connection.go:138-145; connection_unix.go:19-21 dialAgent: `net.Dial("unix", path)`). A failure fails the
    command at once, not retried (Dial returns SSHConfig's error, connection.go:191-194), in Go's *net.OpError
    words: `dial unix /tmp/gone.sock: connect: no such file or directory`, `...: connect: connection refused`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise ProviderError(f"dial unix {path}: connect: {_go_errno(exc)}") from None
    return sock


class SocketAgent(AgentSSH):
    """paramiko's agent client over the socket `dial_agent` opened (paramiko.Agent dials only SSH_AUTH_SOCK and
    hides a failure). Like x/crypto's `agent.NewClient(conn).Signers` (ssh/agent/client.go:406-436, 756-759)
    it lists the keys (SSH2_AGENTC_REQUEST_IDENTITIES) each time the publickey method asks for them."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self._conn = sock

    def signers(self) -> list:
        try:
            self._connect(self._conn)
        except paramiko.SSHException as exc:
            lost = "lost" in str(exc)
            raise DialError("agent: client error: EOF" if lost else "agent: failed to list keys") from None
        except OSError as exc:
            raise DialError(f"agent: client error: {_go_errno(exc)}") from None
        return list(self.get_keys())

    def close(self) -> None:
        self._close()


def dial_tcp(host: str, port: int, timeout: float) -> socket.socket:
    """x/crypto ssh.Dial's `net.DialTimeout("tcp", addr, config.Timeout)` (golang.org/x/crypto ssh/client.go:
    177-178) with pulumi-command's `Timeout: perDialTimeout` seconds (connection.go:100-105; 0: no maximum).
    It bounds the TCP connect only: the handshake and auth after it have no deadline. In Go's words:
    `dial tcp 10.0.0.1:22: connect: connection refused`, `dial tcp 10.0.0.1:22: i/o timeout`."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        why = "no such host" if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None)) else exc.strerror
        raise DialError(f"dial tcp: lookup {host}: {why}") from None
    deadline = time.monotonic() + timeout if timeout else None
    first = None
    for family, kind, proto, _, addr in infos:  # like Go's dialSerial: each address in turn, the first error
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            first = first or f"dial tcp {_go_addr(addr)}: i/o timeout"
            break
        sock = socket.socket(family, kind, proto)
        sock.settimeout(remaining)
        try:
            sock.connect(addr)
        except OSError as exc:
            sock.close()
            timed_out = isinstance(exc, TimeoutError) and exc.errno is None
            why = "i/o timeout" if timed_out else f"connect: {_go_errno(exc)}"
            first = first or f"dial tcp {_go_addr(addr)}: {why}"
            continue
        sock.settimeout(None)
        return sock
    raise DialError(first or f"dial tcp {host}:{port}: no suitable address")


def _handshake_text(exc: BaseException | None, names: tuple) -> str:
    """x/crypto's words for what paramiko saw: the server closed (`EOF`) or reset the connection (`read tcp
    L->R: read: connection reset by peer`); anything else in paramiko's words."""
    seen = exc
    while seen is not None:
        if isinstance(seen, EOFError):
            return "EOF"
        if isinstance(seen, ConnectionResetError):
            return f"read tcp {_go_addr(names[0])}->{_go_addr(names[1])}: read: connection reset by peer"
        seen = seen.__cause__ or seen.__context__
    return str(exc) if exc is not None else "EOF"


def client_authenticate(t: paramiko.Transport, user: str, pkey: paramiko.PKey | None, password: str | None,
                        agent: SocketAgent | None, names: tuple) -> None:  # fmt: skip
    """x/crypto's clientAuthenticate (ssh/client_auth.go:66-118) over pulumi-command's auth methods in their
    order (connection.go:106-145): the private key, then password and keyboard-interactive, then the agent's
    keys. "none" goes first; then, each round, the first of them whose method the server lists and whose
    method *name* was not tried yet. So with a private key the agent's keys are never offered (both are
    "publickey"; the agent socket was dialled all the same). When none is left: `ssh: unable to authenticate,
    attempted methods [none publickey], no supported methods remain` (client_auth.go:118)."""

    def attempt(call):
        """One auth request: (result, the methods the server lists or None, error text or None)."""
        try:
            remaining = call()
        except paramiko.BadAuthenticationType as exc:  # a method the server does not list (always: "none")
            result = (AUTH_FAILURE, list(exc.allowed_types), None)
        except paramiko.AuthenticationException:
            result = (AUTH_FAILURE, None, None)
        except (paramiko.SSHException, OSError) as exc:
            result = (AUTH_FAILURE, None, _handshake_text(exc, names))
        else:  # paramiko: [] on success, the methods still needed on partial success
            result = (AUTH_PARTIAL, list(remaining), None) if remaining else (AUTH_SUCCESS, None, None)
        if not t.is_active():  # the server went away: x/crypto's next read fails, and that is the error
            raise DialError(_handshake_text(t.get_exception() or EOFError(), names))
        return result

    def publickey(signers):  # client_auth.go:294-386: each signer in turn
        def run():
            try:
                keys = signers()
            except DialError as exc:
                return AUTH_FAILURE, None, str(exc)
            methods = None
            for key in keys:
                result, got, err = attempt(lambda: t.auth_publickey(user, key))
                if err:
                    return AUTH_FAILURE, None, err
                methods = methods if got is None else got
                if result == AUTH_SUCCESS or (methods is not None and "publickey" not in methods):
                    return result, methods, None
            return AUTH_FAILURE, methods, None

        return run

    auths: list[tuple[str, object]] = []
    if pkey is not None:
        auths.append(("publickey", publickey(lambda: [pkey])))
    if password is not None:
        auths.append(("password", lambda: attempt(lambda: t.auth_password(user, password, fallback=False))))
        answer = lambda title, instructions, prompts: [password] * len(prompts)  # noqa: E731
        auths.append(("keyboard-interactive", lambda: attempt(lambda: t.auth_interactive(user, answer))))
    if agent is not None:
        auths.append(("publickey", publickey(agent.signers)))

    tried: list[str] = []
    last: list[str] = []
    name, auth = "none", (lambda: attempt(lambda: t.auth_none(user)))
    while auth is not None:
        result, methods, err = auth()
        if result == AUTH_SUCCESS:
            return
        if result == AUTH_FAILURE and name not in tried:
            tried.append(name)
        methods = last if methods is None else methods
        last = methods
        name, auth = next(((n, a) for n, a in auths if n not in tried and n in methods), (None, None))
        if auth is None and err:
            raise DialError(err)
    raise DialError(f"ssh: unable to authenticate, attempted methods [{' '.join(tried)}], no supported methods remain")


def ssh_dial(conn: dict, pkey: paramiko.PKey | None, agent: SocketAgent | None) -> paramiko.Transport:
    """One `ssh.Dial("tcp", endpoint, config)` (connection.go:199-201; x/crypto ssh/client.go:71-86, 177-186):
    the TCP connect (`dial_tcp`), then the handshake: version exchange and key exchange, the host key check
    (`hostKey` pinned: its type only, and a mismatch is `ssh: host key mismatch`, connection.go:86-98) and
    auth; a failure after the connect is `ssh: handshake failed: <why>`. Any failure raises DialError."""
    host, port, user = conn["host"], int(conn.get("port", 22)), conn.get("user", "root")
    sock = dial_tcp(host, port, float(conn.get("perDialTimeout", 15)))
    names = (sock.getsockname(), sock.getpeername())
    t = paramiko.Transport(sock, disabled_algorithms=host_key_algorithms(conn.get("hostKey")))
    t.banner_timeout = t.handshake_timeout = SLOW_TIMEOUT
    t.auth_timeout = None  # x/crypto bounds neither (ClientConfig.Timeout is the TCP connect's only)
    try:
        try:
            t.start_client(timeout=None)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise DialError(_handshake_text(t.get_exception() or exc, names)) from None
        try:
            PinnedHostKey(conn.get("hostKey")).missing_host_key(None, host, t.get_remote_server_key())
        except ProviderError as exc:
            raise DialError(str(exc)) from None
        client_authenticate(t, user, pkey, conn.get("password"), agent, names)
    except DialError as exc:
        t.close()
        raise DialError(f"ssh: handshake failed: {exc}") from None
    except BaseException:
        t.close()
        raise
    return t


def dial_with_retry(dial, limit: int, status=lambda message: None, deadline: float | None = None, sleep=time.sleep):
    """pulumi-command's dialWithRetry (connection.go:150-187) over pulumi's retry.Until (sdk/go/common/util/
    retry/until.go:63-113, its defaults: 100 ms, x1.5 after each wait, each wait at most 5 s): every failure
    (DialError: any error ssh.Dial returns, auth failures too) is retried until `dials > dialErrorLimit`
    (reachedDialingErrorLimit, connection.go:252-255: dialErrorLimit+1 dials in all; -1 or less: no limit).
    Each retry is announced as an ephemeral info status `Dial 1/10 failed: retrying` (the limit "inf" for -1,
    connection.go:164-171); the last failure is `after {try} failed attempts: {error}`, `try` being the last
    attempt's 0-based index (connection.go:159-162: it says 10 after 11 dials). A step deadline (the engine's
    customTimeouts: pulumi-go-provider middleware/cancel) that passes during a wait ends it with Go's
    `context deadline exceeded` (until.go:103-108, connection.go:181-186)."""
    delay, try_ = DIAL_DELAY, 0
    while True:
        delay = min(delay, DIAL_MAX_DELAY)
        try:
            return dial()
        except DialError as exc:
            dials = try_ + 1
            if limit > -1 and dials > limit:
                raise DialError(f"after {try_} failed attempts: {exc}") from None
            status(f"Dial {dials}/{'inf' if limit == -1 else limit} failed: retrying")
        if deadline is not None and time.monotonic() + delay >= deadline:
            sleep(max(0.0, deadline - time.monotonic()))
            raise ProviderError("context deadline exceeded")
        sleep(delay)
        delay *= DIAL_BACKOFF
        try_ += 1


def run_remote(conn: dict, script: str, stdin: str | None, env: dict[str, str], status=lambda message: None,
               timeout: float | None = None) -> tuple[int, str, str]:  # fmt: skip
    """`script` on `conn` as pulumi-command's CommandOutputs.run does (provider/pkg/provider/remote/
    commandOutputs.go:30-): Connection.Dial (connection.go:190-201: SSHConfig, then dialWithRetry of ssh.Dial),
    a session, its environment, the command. `status` gets the retry messages (the provider's LogStatus on the
    resource); `timeout` is the step's customTimeouts deadline in seconds. A dial failure names the node:
    `ssh root@10.0.0.1:22: after 10 failed attempts: ssh: handshake failed: EOF`."""
    host, port, user = conn["host"], int(conn.get("port", 22)), conn.get("user", "root")
    if conn.get("proxy") is not None:  # connection.go:204-242: not modelled; dialling the host directly would
        raise ProviderError("the command test double does not implement connection.proxy")  # hide the bastion
    deadline = time.monotonic() + timeout if timeout else None
    # SSHConfig (connection.go:85-148), before any TCP dial: the host key pin and the private key are parsed,
    # then the agent is dialled; a failure of any is the command's, at once
    if conn.get("hostKey") is not None:
        parse_host_key(conn["hostKey"])
    pkey = None
    if conn.get("privateKey") is not None:
        pkey = load_private_key(conn["privateKey"], conn.get("privateKeyPassword"))
    path = agent_socket_path(conn)
    agent = SocketAgent(dial_agent(path)) if path is not None else None
    try:
        try:
            transport = dial_with_retry(lambda: ssh_dial(conn, pkey, agent), int(conn.get("dialErrorLimit", 10)),
                                        status, deadline)  # fmt: skip
        except (DialError, ProviderError) as exc:
            raise ProviderError(f"ssh {user}@{host}:{port}: {exc}") from None
        try:
            channel = transport.open_session()
            for k, v in env.items():  # like ssh Setenv: the node's sshd may refuse these
                channel.update_environment({k: v})
            channel.exec_command(script)
            try:
                if stdin:
                    channel.sendall(stdin.encode())
                channel.shutdown_write()
            except OSError:
                pass  # the command finished without reading its stdin (e.g. `rm -f` on delete): not an error
            out, err = _read_both(channel)
            return channel.recv_exit_status(), out.decode(errors="replace"), err.decode(errors="replace")
        finally:
            transport.close()
    finally:
        if agent is not None:
            agent.close()


KILLED = -9  # what run_local reports for a command its step's deadline killed


def run_local(inputs: dict, script: str, stdin: str | None, env: dict[str, str],
              timeout: float | None = None) -> tuple[int, str, str]:  # fmt: skip
    """The command under `interpreter`; past `timeout` (the step's customTimeouts) it is killed, as the real
    provider's exec.CommandContext kills it when the engine's deadline passes."""
    interpreter = inputs.get("interpreter") or ["/bin/sh", "-c"]
    proc = subprocess.Popen(
        [*interpreter, script],
        cwd=inputs.get("dir") or os.getcwd(),
        env={**os.environ, **(inputs.get("environment") or {}), **env},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(stdin or "", timeout=timeout)
    except subprocess.TimeoutExpired:
        # like Go's exec.CommandContext: the process itself is killed (not what it started), and the output
        # is read until its pipes close
        proc.kill()
        out, err = proc.communicate()
        return KILLED, out, err
    return proc.returncode, out, err


class CommandProvider(Provider):
    name = "command"
    version = "1.2.1"

    def check(self, type_: str, olds: dict, news: dict) -> dict:
        if type_ not in (REMOTE, LOCAL):
            raise ProviderError(f"the command test double does not implement {type_}")
        return news

    def diff(self, type_: str, id_: str, olds: dict, news: dict, ignore: list[str]) -> Diff:
        olds = {k: v for k, v in olds.items() if k not in OUTPUTS}
        return diff_inputs(olds, news, {"triggers"}, ignore)

    def _run(self, type_: str, urn: str, inputs: dict, script: str | None, previous: dict | None) -> dict:
        """Run `script` (if any); the command's outputs."""
        plain = reveal(inputs)
        if not script:
            return {"stdout": "", "stderr": ""}
        env: dict[str, str] = {}
        if previous is not None and plain.get("addPreviousOutputInEnv", True):
            env = {"PULUMI_COMMAND_STDOUT": previous.get("stdout", ""), "PULUMI_COMMAND_STDERR": previous.get("stderr", "")}
        stdin = plain.get("stdin")
        if type_ == REMOTE:
            status = lambda message: self.log_status(urn, message)  # noqa: E731
            code, out, err = run_remote(plain["connection"], script, stdin, env, status, self.step_timeout())
        else:
            code, out, err = run_local(plain, script, stdin, env, self.step_timeout())
        self._log_output(urn, plain.get("logging") or "stdoutAndStderr", out, err)
        if code == KILLED:  # Go's exec error for a process the context killed: nothing more
            raise ProviderError("signal: killed")
        if code != 0:
            name = urn.rsplit("::", 1)[-1]
            raise ProviderError(
                f"{name}: Process exited with status {code}: running {script!r}:\n{(out + err)[-4000:]}"
            )
        return {"stdout": out.rstrip("\n"), "stderr": err.rstrip("\n")}

    def _log_output(self, urn: str, logging: str, out: str, err: str) -> None:
        """Every line of the streams `logging` names, to the engine, as the real provider logs them
        (provider/pkg/provider/util: ctx.LogStatus(diag.Info, line) per line; `none` logs nothing). The
        double sends them once the command ended, stdout's lines before stderr's; the real one as they come."""
        streams = {"stdout": [out], "stderr": [err], "stdoutAndStderr": [out, err], "none": []}.get(logging, [out, err])
        for text in streams:
            for line in text.splitlines():
                self.log_status(urn, line)

    def create(self, type_: str, urn: str, inputs: dict, preview: bool) -> tuple[str, dict]:
        if preview:
            return "", {**inputs, "stdout": UNKNOWN, "stderr": UNKNOWN}
        if has_unknown(inputs):
            raise ProviderError(f"{urn}: inputs still unknown at create")
        outputs = self._run(type_, urn, inputs, reveal(inputs.get("create")), None)
        return urn.rsplit("::", 1)[-1] + "-" + os.urandom(4).hex(), {**inputs, **outputs}

    def update(self, type_: str, urn: str, id_: str, olds: dict, news: dict, preview: bool) -> dict:
        if preview:
            return {**news, "stdout": UNKNOWN, "stderr": UNKNOWN}
        # `update` when given, even empty (then nothing runs), else `create` (provider/pkg/provider/common: a
        # nil Update falls back to Create, an empty one is an empty command)
        script = reveal(news["update"]) if news.get("update") is not None else reveal(news.get("create"))
        previous = {k: reveal(olds.get(k, "")) for k in OUTPUTS}
        return {**news, **self._run(type_, urn, news, script, previous)}

    def delete(self, type_: str, urn: str, id_: str, state: dict) -> None:
        previous = {k: reveal(state.get(k, "")) for k in OUTPUTS}
        self._run(type_, urn, state, reveal(state.get("delete")), previous)

    def read(self, type_: str, urn: str, id_: str, state: dict, inputs: dict) -> tuple[dict, dict]:
        return state, inputs  # nothing to observe: the real provider's Read is a no-op too


def main() -> None:
    serve(CommandProvider())


if __name__ == "__main__":
    main()
