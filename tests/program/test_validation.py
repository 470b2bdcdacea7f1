"""Bad input fails before any resource is registered, with a message naming field and fix."""

import pulumi
import pytest

from harness import cluster_of, run_program


def test_missing_api_key_gives_the_exact_command():
    with pytest.raises(pulumi.RunError) as err:
        run_program("tp4", api_key=None)
    assert 'pulumi config set --secret deepseek-spark:apiKey "$(openssl rand -hex 32)" --stack tp4' in str(err.value)


def test_plain_text_api_key_is_refused():
    with pytest.raises(pulumi.RunError, match="stored in plain text"):
        run_program("tp4", plain=("apiKey",))


@pytest.mark.parametrize("weak", ["", "none", "dummy", "0"])
def test_no_auth_keys_are_refused(weak):
    with pytest.raises(pulumi.RunError, match="no authentication"):
        run_program("tp4", api_key=weak)


def test_plain_text_ssh_key_is_refused():
    with pytest.raises(pulumi.RunError, match="sshPrivateKey is stored in plain text"):
        run_program("tp4", plain=("sshPrivateKey",))


def test_no_ssh_key_uses_the_agent():
    rec = run_program("tp4", ssh_key=None)
    conn = rec.named("tp4-spark1-preflight").inputs["connection"]
    assert "privateKey" not in str(conn)


def test_bad_config_registers_nothing_and_lists_every_problem():
    raw = cluster_of("tp4")
    raw["serving"]["offloadMode"] = "ram"
    raw["serving"]["distPort"] = 8888
    with pytest.raises(pulumi.RunError) as err:
        run_program("tp4", cluster=raw)
    text = str(err.value)
    assert "2 problem(s)" in text and "nothing was changed" in text
    assert "cluster.serving.offloadMode = 'ram'" in text and "fix: set serving.offloadMode: nvme" in text
    assert "cluster.serving.distPort = 8888" in text
    assert pulumi.runtime.settings.SETTINGS.monitor.recording.resources == []


def test_memory_overcommit_registers_nothing():
    raw = cluster_of("tp4")
    raw["serving"]["maxTotalTokens"] = 50_000_000
    with pytest.raises(pulumi.RunError, match=r"cluster\.serving\.maxTotalTokens = 50000000"):
        run_program("tp4", cluster=raw)
    assert pulumi.runtime.settings.SETTINGS.monitor.recording.resources == []


def test_unknown_field_fails_at_preview():
    raw = cluster_of("tp3")
    raw["serving"]["kvPool"] = 1
    with pytest.raises(pulumi.RunError, match=r"cluster\.serving\.kvPool: unknown field"):
        run_program("tp3", cluster=raw, preview=True)


def test_api_key_with_a_newline_is_refused():
    with pytest.raises(pulumi.RunError, match="printable ASCII without spaces"):
        run_program("tp4", api_key="sk-0123456789abcdef\n")
