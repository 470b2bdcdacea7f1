"""The pulumi-command TEST DOUBLE (sim/providers/command.py): the real provider's diff and run rules."""

import io
import socket
import struct
import threading
import time

import paramiko
import pytest

from sim.providers.base import SECRET_SIG, SIG_KEY, UNKNOWN, ProviderError
from sim.providers.command import (LOCAL, REMOTE, CommandProvider, PinnedHostKey, _read_both, host_key_algorithms,
                                   run_remote)  # fmt: skip

URN = "urn:pulumi:sim::deepseek-spark::command:local:Command::probe"
RURN = "urn:pulumi:sim::deepseek-spark::command:remote:Command::node"


def secret(v):
    return {SIG_KEY: SECRET_SIG, "value": v}


@pytest.fixture
def p():
    return CommandProvider()


def test_only_triggers_replace_everything_else_updates(p):
    old = {"create": "echo a", "triggers": ["r1"], "stdout": "a", "stderr": ""}
    d = p.diff(LOCAL, "id", old, {"create": "echo b", "triggers": ["r1"]}, [])
    assert d.changed == ["create"] and d.replaces == []
    d = p.diff(LOCAL, "id", old, {"create": "echo a", "triggers": ["r2"]}, [])
    assert d.replaces == ["triggers"]
    assert p.diff(LOCAL, "id", old, {"create": "echo a", "triggers": [UNKNOWN]}, []).replaces == ["triggers"]


def test_the_same_value_as_a_secret_is_no_change_and_ignore_changes_is_honoured(p):
    old = {"create": "x", "stdin": "k"}
    assert p.diff(REMOTE, "id", old, {"create": "x", "stdin": secret("k")}, []).changed == []
    assert p.diff(REMOTE, "id", old, {"create": "y", "stdin": "k"}, ["create"]).changed == []


def test_preview_runs_nothing_and_leaves_outputs_unknown(p, tmp_path):
    marker = tmp_path / "ran"
    id_, out = p.create(LOCAL, URN, {"create": f"touch {marker}"}, preview=True)
    assert id_ == "" and out["stdout"] == UNKNOWN and not marker.exists()


def test_update_runs_update_or_create_again_with_the_previous_output(p):
    _, out = p.create(LOCAL, URN, {"create": "echo first"}, preview=False)
    assert out["stdout"] == "first"
    new = p.update(LOCAL, URN, "id", out, {"create": 'echo "again after $PULUMI_COMMAND_STDOUT"'}, preview=False)
    assert new["stdout"] == "again after first"
    quiet = {"create": 'echo "[$PULUMI_COMMAND_STDOUT]"', "addPreviousOutputInEnv": False}
    assert p.update(LOCAL, URN, "id", out, quiet, preview=False)["stdout"] == "[]"


def test_the_fabric_gates_update_keeps_the_last_measurement(p):
    """components/fabric.py KEEP_PREVIOUS: a new gate command alone re-prints the last figures, measuring nothing."""
    from components.fabric import KEEP_PREVIOUS

    _, out = p.create(LOCAL, URN, {"create": "echo 'pair spark1-spark2: 187 Gb/s'"}, preview=False)
    new = p.update(LOCAL, URN, "id", out, {"create": "exit 1", "update": KEEP_PREVIOUS}, preview=False)
    assert new["stdout"] == "pair spark1-spark2: 187 Gb/s"


def test_delete_runs_the_old_delete_and_a_failure_names_the_command_like_the_real_one(p, tmp_path):
    p.delete(LOCAL, URN, "id", {"create": "true", "delete": f"touch {tmp_path}/deleted", "stdout": ""})
    assert (tmp_path / "deleted").exists()
    with pytest.raises(ProviderError, match=r"probe: Process exited with status 3: running 'echo out; exit 3'"):
        p.create(LOCAL, URN, {"create": "echo out; exit 3"}, preview=False)


def test_stdin_and_environment_reach_a_local_command(p):
    _, out = p.create(LOCAL, URN, {"create": 'cat; echo "$X"', "stdin": secret("from-stdin\n"),
                                   "environment": {"X": "from-env"}}, preview=False)  # fmt: skip
    assert out["stdout"] == "from-stdin\nfrom-env"


def test_a_pinned_host_key_must_match_an_unpinned_one_is_accepted_like_the_real_provider():
    key = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else None
    if key is None:  # paramiko cannot generate ed25519 keys: use RSA, same check
        key = paramiko.RSAKey.generate(1024)
    PinnedHostKey(None).missing_host_key(None, "10.0.0.1", key)  # no pin: accepted
    PinnedHostKey(f"{key.get_name()} {key.get_base64()}").missing_host_key(None, "10.0.0.1", key)
    other = paramiko.RSAKey.generate(1024)
    with pytest.raises(ProviderError, match="host key mismatch for 10.0.0.1"):
        PinnedHostKey(f"{other.get_name()} {other.get_base64()}").missing_host_key(None, "10.0.0.1", key)


def test_other_resource_types_are_refused(p):
    with pytest.raises(ProviderError, match="does not implement command:remote:CopyToRemote"):
        p.check("command:remote:CopyToRemote", {}, {})


def test_an_empty_update_runs_nothing_a_missing_one_runs_create(p, tmp_path):
    marker = tmp_path / "ran"
    old = {"create": f"touch {marker}", "stdout": "", "stderr": ""}
    p.update(LOCAL, URN, "id", old, {"create": f"touch {marker}", "update": ""}, preview=False)
    assert not marker.exists()
    p.update(LOCAL, URN, "id", old, {"create": f"touch {marker}"}, preview=False)
    assert marker.exists()


def test_an_rsa_pin_offers_only_ssh_rsa_like_the_real_client():
    """The real client's only host key algorithm for an RSA pin is ssh-rsa (SHA-1): rsa-sha2-* are off."""
    rsa = host_key_algorithms("ssh-rsa AAAAB3NzaC1yc2E=")["keys"]
    assert "ssh-rsa" not in rsa and "rsa-sha2-256" in rsa and "rsa-sha2-512" in rsa and "ssh-ed25519" in rsa
    assert "ssh-ed25519" not in host_key_algorithms("ssh-ed25519 AAAA")["keys"]
    assert host_key_algorithms(None) is None


def test_a_remote_command_with_a_large_stderr_does_not_hang():
    """Both streams are drained at once: 1 MiB on stderr before anything on stdout."""
    import threading

    class Channel:
        def __init__(self):
            self.err, self.out, self.closed, self.eof_received = b"e" * (1 << 20), b"done", False, False

        def recv_ready(self):
            return not self.err and bool(self.out)  # stdout only after stderr was read: a full window

        def recv_stderr_ready(self):
            return bool(self.err)

        def recv(self, n):
            data, self.out = self.out[:n], self.out[n:]
            self.eof_received = not self.out
            return data

        def recv_stderr(self, n):
            data, self.err = self.err[:n], self.err[n:]
            return data

        def exit_status_ready(self):
            return not self.err and not self.out

    result = {}
    t = threading.Thread(target=lambda: result.setdefault("v", _read_both(Channel())), daemon=True)
    t.start()
    t.join(10)
    assert result["v"] == (b"done", b"e" * (1 << 20))


@pytest.mark.parametrize("logging, lines", [(None, ["out1", "out2", "err1"]), ("stdout", ["out1", "out2"]),
                                            ("stderr", ["err1"]), ("none", [])])
def test_every_line_goes_to_the_engine_unless_logging_says_otherwise(p, logging, lines):
    """pulumi-command logs each line of the streams `logging` names (ctx.LogStatus, info) on the resource."""
    logged = []
    p.log_status = lambda urn, message: logged.append((urn, message))
    inputs = {"create": "echo out1; echo out2; echo err1 >&2"}
    if logging:
        inputs["logging"] = logging
    p.create(LOCAL, URN, inputs, preview=False)
    assert logged == [(URN, line) for line in lines]


def test_a_failing_command_logs_its_output_too(p):
    logged = []
    p.log_status = lambda urn, message: logged.append(message)
    with pytest.raises(ProviderError):
        p.create(LOCAL, URN, {"create": "echo before-failing; exit 4"}, preview=False)
    assert logged == ["before-failing"]


def test_a_local_command_past_its_custom_timeout_is_killed_with_a_bare_message(p, tmp_path):
    """The engine's deadline (customTimeouts) kills the process: the step fails with Go's `signal: killed`,
    none of what the command would have said. A probe's own timeout must be shorter to be heard."""
    p._step.timeout = 0.5
    try:
        with pytest.raises(ProviderError) as err:
            p.create(LOCAL, URN, {"create": "exec sleep 5"}, preview=False)
        assert str(err.value) == "signal: killed"
    finally:
        p._step.timeout = None
    _, out = p.create(LOCAL, URN, {"create": "echo in-time"}, preview=False)
    assert out["stdout"] == "in-time"


# ---------------------------------------------------------------------- the ssh connection (connection.go)

HOST_KEY = paramiko.ECDSAKey.generate()  # an RSA pin would mean ssh-rsa (SHA-1), which paramiko 5 refuses
CLIENT_KEY = paramiko.RSAKey.generate(1024)


def key_text(key: paramiko.PKey) -> str:
    buf = io.StringIO()
    key.write_private_key(buf)
    return buf.getvalue()


def wait_for(cond, timeout=3.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


class _Iface(paramiko.ServerInterface):
    def __init__(self, server):
        self.server, self.command, self.exec_event = server, None, threading.Event()

    def get_allowed_auths(self, username):
        return self.server.methods

    def check_auth_publickey(self, username, key):
        self.server.auth.append(("publickey", key.get_base64()))
        ok = key.get_base64() in self.server.keys
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_auth_password(self, username, password):
        self.server.auth.append(("password", password))
        return paramiko.AUTH_SUCCESSFUL if password == self.server.password else paramiko.AUTH_FAILED

    def check_auth_interactive(self, username, submethods):
        return paramiko.InteractiveQuery("", "", ("Password: ", False))

    def check_auth_interactive_response(self, responses):
        self.server.auth.append(("keyboard-interactive", list(responses)))
        return paramiko.AUTH_SUCCESSFUL if list(responses) == [self.server.password] else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        self.command = command.decode()
        self.exec_event.set()
        return True


class SSHServer:
    """A minimal ssh server on 127.0.0.1 (paramiko's ServerInterface). It closes the first `drop` connections
    as soon as it accepts them (as sshd's MaxStartups does), waits `delay` s before its banner, records every
    accepted connection and auth request, and answers an exec with `ran <command>`, status 0."""

    def __init__(self, drop=0, keys=(), password=None, methods="publickey,password,keyboard-interactive", delay=0.0):
        self.drop, self.keys, self.password, self.methods, self.delay = drop, set(keys), password, methods, delay
        self.accepted, self.auth, self.transports = 0, [], []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted <= self.drop:
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        time.sleep(self.delay)
        t = paramiko.Transport(conn)
        t.add_server_key(HOST_KEY)
        self.transports.append(t)
        iface = _Iface(self)
        try:
            t.start_server(server=iface)
        except (paramiko.SSHException, EOFError, OSError):
            return
        chan = t.accept(10)
        if chan is None or not iface.exec_event.wait(10):
            return
        chan.sendall(f"ran {iface.command}\n".encode())
        chan.send_exit_status(0)
        chan.close()

    def conn(self, **extra):
        return {"host": "127.0.0.1", "port": self.port, "user": "root", **extra}

    def close(self):
        self.sock.close()
        for t in self.transports:
            t.close()


class AgentServer:
    """A tiny ssh-agent on a unix socket: SSH2_AGENTC_REQUEST_IDENTITIES (11) is answered with
    SSH2_AGENT_IDENTITIES_ANSWER (12) and no key; it records connections and requests."""

    def __init__(self, path):
        self.path, self.accepted, self.requests = str(path), 0, []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(4)
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            while (head := conn.recv(4)) and len(head) == 4:
                body = conn.recv(struct.unpack(">I", head)[0])
                self.requests.append(body[0])
                conn.sendall(struct.pack(">IBI", 5, 12, 0) if body[0] == 11 else struct.pack(">IB", 1, 5))

    def close(self):
        self.sock.close()


@pytest.fixture
def servers(monkeypatch):
    """SSHServer/AgentServer factories, all closed afterwards; no ssh agent from the environment."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    made = []

    def make(cls, *args, **kwargs):
        made.append(cls(*args, **kwargs))
        return made[-1]

    yield make
    for server in made:
        server.close()


def remote(p, conn, create="echo hi"):
    logged = []
    p.log_status = lambda urn, message: logged.append(message)
    try:
        _, out = p.create(REMOTE, RURN, {"create": create, "connection": conn}, preview=False)
    except ProviderError as exc:
        return exc, logged
    return out, logged


def test_a_stale_ssh_auth_sock_fails_at_once_before_any_tcp_dial(p, servers, tmp_path, monkeypatch):
    """connection.go:131-145 + connection_unix.go:19-21: SSHConfig dials the agent before ssh.Dial; a failure
    is the command's, unretried, in Go's words, even though a private key is given."""
    server = servers(SSHServer, keys=[CLIENT_KEY.get_base64()])
    gone = tmp_path / "gone.sock"
    monkeypatch.setenv("SSH_AUTH_SOCK", str(gone))
    start = time.monotonic()
    err, logged = remote(p, server.conn(privateKey=key_text(CLIENT_KEY)))
    assert isinstance(err, ProviderError)
    assert str(err) == f"dial unix {gone}: connect: no such file or directory"
    assert time.monotonic() - start < 1.0 and logged == []  # no retry
    time.sleep(0.2)
    assert server.accepted == 0  # no TCP dial was made
    monkeypatch.setenv("SSH_AUTH_SOCK", "")  # set but empty: no agent (tryGetDefaultAgentSocket)
    out, _ = remote(p, server.conn(privateKey=key_text(CLIENT_KEY)))
    assert out["stdout"] == "ran echo hi" and server.accepted == 1


def test_an_agent_socket_nobody_listens_on_is_refused_and_agent_socket_path_wins_over_the_env(p, servers, tmp_path,
                                                                                              monkeypatch):  # fmt: skip
    server = servers(SSHServer, keys=[CLIENT_KEY.get_base64()])
    dead = tmp_path / "dead.sock"
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(dead))  # a socket file, no listen(): connect() gets ECONNREFUSED
    try:
        monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "other.sock"))
        err, _ = remote(p, server.conn(privateKey=key_text(CLIENT_KEY), agentSocketPath=str(dead)))
        assert str(err) == f"dial unix {dead}: connect: connection refused"
        assert server.accepted == 0
    finally:
        bound.close()


def test_a_proxy_connection_is_refused_not_bypassed(servers):
    server = servers(SSHServer, keys=[CLIENT_KEY.get_base64()])
    conn = server.conn(privateKey=key_text(CLIENT_KEY), proxy={"host": "127.0.0.1", "port": server.port})
    with pytest.raises(ProviderError, match="does not implement connection.proxy"):
        run_remote(conn, "true", None, {})
    assert server.accepted == 0


def test_every_failed_dial_is_retried_with_the_real_backoff_until_the_limit(servers):
    """dialErrorLimit 3: 4 dials, waits 0.1 + 0.15 + 0.225 s (retry.Until's defaults), a status per retry, and
    the last error with the 0-based try index, as connection.go:159-171 words them."""
    server = servers(SSHServer, drop=1000)
    logged = []
    start = time.monotonic()
    with pytest.raises(ProviderError) as err:
        run_remote(server.conn(dialErrorLimit=3), "true", None, {}, logged.append)
    elapsed = time.monotonic() - start
    assert f"ssh root@127.0.0.1:{server.port}: after 3 failed attempts: ssh: handshake failed: " in str(err.value)
    assert logged == ["Dial 1/3 failed: retrying", "Dial 2/3 failed: retrying", "Dial 3/3 failed: retrying"]
    assert elapsed >= 0.4
    wait_for(lambda: server.accepted >= 4)
    time.sleep(0.2)
    assert server.accepted == 4


def test_a_server_that_drops_the_first_dials_is_reached_with_the_default_limit(p, servers):
    server = servers(SSHServer, drop=2, keys=[CLIENT_KEY.get_base64()])
    out, logged = remote(p, server.conn(privateKey=key_text(CLIENT_KEY)))
    assert out["stdout"] == "ran echo hi" and server.accepted == 3
    assert logged == ["Dial 1/10 failed: retrying", "Dial 2/10 failed: retrying", "ran echo hi"]


def test_an_auth_failure_is_retried_too_and_reads_like_x_crypto(servers):
    """x/crypto's clientAuthenticate error, wrapped by NewClientConn, retried like any dial error."""
    server = servers(SSHServer, keys=[])
    logged = []
    with pytest.raises(ProviderError) as err:
        run_remote(server.conn(privateKey=key_text(CLIENT_KEY), dialErrorLimit=1), "true", None, {}, logged.append)
    assert str(err.value) == (
        f"ssh root@127.0.0.1:{server.port}: after 1 failed attempts: ssh: handshake failed: ssh: unable to "
        "authenticate, attempted methods [none publickey], no supported methods remain"
    )
    assert server.accepted == 2 and logged == ["Dial 1/1 failed: retrying"]


def test_a_host_key_mismatch_is_a_retried_handshake_failure(servers):
    server = servers(SSHServer, keys=[CLIENT_KEY.get_base64()])
    other = paramiko.ECDSAKey.generate()
    conn = server.conn(privateKey=key_text(CLIENT_KEY), hostKey=f"{other.get_name()} {other.get_base64()}",
                       dialErrorLimit=1)  # fmt: skip
    with pytest.raises(ProviderError, match=r"after 1 failed attempts: ssh: handshake failed: ssh: host key mismatch"):
        run_remote(conn, "true", None, {})
    assert server.accepted == 2
    pinned = server.conn(privateKey=key_text(CLIENT_KEY), hostKey=f"{HOST_KEY.get_name()} {HOST_KEY.get_base64()} c")
    assert run_remote(pinned, "true", None, {})[0] == 0 and server.accepted == 3
    with pytest.raises(ProviderError, match="^failed to parse host key: ssh: no key found$"):
        run_remote(server.conn(hostKey="ssh-rsa not-base64!"), "true", None, {})
    assert server.accepted == 3  # refused before any dial


def test_with_a_private_key_and_an_agent_the_key_goes_first_and_the_agent_keys_never(servers, tmp_path):
    """connection.go:106-145 order (key, password + keyboard-interactive, agent) and x/crypto's rule of one try
    per method name (client_auth.go:98-110): the agent is dialled, but with a private key its keys are never
    listed; without one they are (here: none, so publickey fails and password is what is left)."""
    server = servers(SSHServer, keys=[], password="pw")
    agent = servers(AgentServer, tmp_path / "agent.sock")
    conn = server.conn(privateKey=key_text(CLIENT_KEY), password="pw", agentSocketPath=agent.path)
    assert run_remote(conn, "echo hi", None, {})[0] == 0
    assert server.auth == [("publickey", CLIENT_KEY.get_base64()), ("password", "pw")]
    assert wait_for(lambda: agent.accepted == 1) and agent.requests == []
    server.auth.clear()
    conn = server.conn(password="wrong", agentSocketPath=agent.path, dialErrorLimit=0)
    with pytest.raises(ProviderError) as err:
        run_remote(conn, "true", None, {})
    assert server.auth == [("password", "wrong"), ("keyboard-interactive", ["wrong"])]
    assert agent.requests == [11]  # the agent's turn: REQUEST_IDENTITIES, zero keys
    assert str(err.value).endswith(
        "after 0 failed attempts: ssh: handshake failed: ssh: unable to authenticate, attempted methods "
        "[none password keyboard-interactive publickey], no supported methods remain"
    )


def test_per_dial_timeout_bounds_the_tcp_connect_only(servers):
    """perDialTimeout is x/crypto's ClientConfig.Timeout (net.DialTimeout): a slow banner is waited for, a
    connect that gets no answer times out with Go's `i/o timeout`."""
    slow = servers(SSHServer, keys=[CLIENT_KEY.get_base64()], delay=1.3)
    assert run_remote(slow.conn(privateKey=key_text(CLIENT_KEY), perDialTimeout=1), "true", None, {})[0] == 0
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)  # never accepts: one connection fills the queue, the kernel drops the SYNs of the next
    port = full.getsockname()[1]
    held = socket.create_connection(("127.0.0.1", port))
    try:
        start = time.monotonic()
        with pytest.raises(ProviderError) as err:
            run_remote({"host": "127.0.0.1", "port": port, "perDialTimeout": 1, "dialErrorLimit": 0}, "true", None, {})
        assert str(err.value) == (
            f"ssh root@127.0.0.1:{port}: after 0 failed attempts: dial tcp 127.0.0.1:{port}: i/o timeout"
        )
        assert 0.9 <= time.monotonic() - start < 5
    finally:
        held.close()
        full.close()


def test_a_step_deadline_ends_the_retries_with_context_deadline_exceeded(servers):
    """retry.Until returns when the context (the step's customTimeouts, pulumi-go-provider's cancel middleware)
    is done during a wait: Go's `context deadline exceeded`, even with dialErrorLimit -1 (unlimited)."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: connection refused
    port = closed.getsockname()[1]
    logged, result = [], {}

    def dial():
        try:
            run_remote({"host": "127.0.0.1", "port": port, "dialErrorLimit": -1}, "true", None, {}, logged.append, 0.5)
        except ProviderError as exc:
            result["error"] = str(exc)

    try:
        start = time.monotonic()
        t = threading.Thread(target=dial, daemon=True)
        t.start()
        t.join(5)
        assert result.get("error") == f"ssh root@127.0.0.1:{port}: context deadline exceeded"
        assert 0.45 <= time.monotonic() - start < 3
        assert logged[:2] == ["Dial 1/inf failed: retrying", "Dial 2/inf failed: retrying"]
        with pytest.raises(ProviderError) as err:
            run_remote({"host": "127.0.0.1", "port": port, "dialErrorLimit": 0}, "true", None, {})
        refused = f"after 0 failed attempts: dial tcp 127.0.0.1:{port}: connect: connection refused"
        assert str(err.value).endswith(refused)
    finally:
        closed.close()


def test_a_generated_key_survives_a_changed_generator_and_only_a_replace_makes_a_new_one(p):
    # components/keys.py: a credential's generator is `create`; its `update` re-prints the kept value, so a change
    # of the command (a new generator in a new release) keeps every member's key; only `triggers` replace it.
    from components.keys import KEEP
    gen = "python3 -c 'import secrets; print(\"sk-\" + secrets.token_urlsafe(32))'"
    inputs = {"create": gen, "update": KEEP, "triggers": ["r1"], "addPreviousOutputInEnv": True, "logging": "none"}
    _, made = p.create(LOCAL, URN, inputs, False)
    assert made["stdout"].startswith("sk-") and len(made["stdout"]) > 40
    changed = {**inputs, "create": gen.replace("32", "48")}
    d = p.diff(LOCAL, "id", made, changed, [])
    assert d.changed == ["create"] and d.replaces == []
    assert p.update(LOCAL, URN, "id", made, changed, False)["stdout"] == made["stdout"]
    assert p.diff(LOCAL, "id", made, {**inputs, "triggers": ["r2"]}, []).replaces == ["triggers"]
    _, rotated = p.create(LOCAL, URN, {**inputs, "triggers": ["r2"]}, False)
    assert rotated["stdout"] != made["stdout"]
