"""The pulumi-command TEST DOUBLE (sim/providers/command.py): the real provider's diff and run rules."""

import paramiko
import pytest

from sim.providers.base import SECRET_SIG, SIG_KEY, UNKNOWN, ProviderError
from sim.providers.command import LOCAL, REMOTE, CommandProvider, PinnedHostKey, _read_both, host_key_algorithms

URN = "urn:pulumi:sim::deepseek-spark::command:local:Command::probe"


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
