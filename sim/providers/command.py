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
- remote connection like Go's x/crypto/ssh as the provider uses it: `privateKey`, `password` or the
  ssh agent; ~/.ssh/config, identity files and known_hosts are NOT read; the host key is checked
  only when `hostKey` is given (otherwise any key is accepted, as the real provider does), and a pin
  restricts the handshake to its type (an RSA pin: `ssh-rsa` only, which OpenSSH 8.8+ refuses);
  stdout and stderr are read together;
  `dialErrorLimit` dials (default 10) of `perDialTimeout` seconds (default 15) each;
- a failure reports `running "<command>"` and the output, as the real provider does (which is why
  no secret may ever be part of a command string);
- every line of stdout and stderr goes to the engine as an ephemeral info message on the resource
  (`logging`: stdout, stderr, stdoutAndStderr (default) or none), so the event log holds it;
- a local command still running when its step's customTimeouts deadline passes is killed, and the
  step fails with a bare `signal: killed`.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import time

import paramiko

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


def run_remote(conn: dict, script: str, stdin: str | None, env: dict[str, str]) -> tuple[int, str, str]:
    host, port, user = conn["host"], int(conn.get("port", 22)), conn.get("user", "root")
    pkey = load_private_key(conn["privateKey"], conn.get("privateKeyPassword")) if conn.get("privateKey") else None
    attempts = int(conn.get("dialErrorLimit", 10))
    per_dial = float(conn.get("perDialTimeout", 15))
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(PinnedHostKey(conn.get("hostKey")))
    disabled = host_key_algorithms(conn.get("hostKey"))
    last: Exception | None = None
    for attempt in range(attempts if attempts > 0 else 1_000_000):
        try:
            client.connect(
                host, port=port, username=user, pkey=pkey, password=conn.get("password"),
                timeout=per_dial, banner_timeout=per_dial, auth_timeout=per_dial,
                allow_agent=pkey is None and not conn.get("password"), look_for_keys=False,
                disabled_algorithms=disabled,
            )  # fmt: skip
            break
        except ProviderError:
            raise
        except (OSError, socket.timeout, paramiko.SSHException) as exc:
            last = exc
            if isinstance(exc, paramiko.AuthenticationException):
                raise ProviderError(f"ssh {user}@{host}:{port}: authentication failed: {exc}") from None
            time.sleep(min(1.0 * (attempt + 1), 5.0))
    else:
        raise ProviderError(f"ssh {user}@{host}:{port}: failed to dial after {attempts} attempts: {last}")
    try:
        channel = client.get_transport().open_session()
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
        client.close()


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
            code, out, err = run_remote(plain["connection"], script, stdin, env)
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
