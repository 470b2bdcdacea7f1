"""programs/fence.py against a node played by a fake ssh: it refuses a rule set that would cut this machine's ssh
before anything changes, applies with the rollback armed, confirms over a NEW connection only, and reports a
confirmation that did not get through as the ssh rule's fault (the node rolls back by itself)."""

from __future__ import annotations

import io
import subprocess

from programs import fence

OPTS = ["-o", "BatchMode=yes", "-i", "key", "-o", "ControlMaster=auto", "-o", "ControlPath=~/cm-%C",
        "-o", "ControlPersist=60"]  # fmt: skip


def args(operators=("0.0.0.0/0",)):
    return fence.parse(["apply", "--stack", "s", "--node", "spark1", "--target", "root@10.0.0.1", "--table",
                        "dspark_s", "--operators", *operators, "--confirm", "30", *(f"--ssh-opt={o}" for o in OPTS)])


class FakeSsh:
    """Answers the three calls a fence makes; records each argv and stdin."""

    def __init__(self, client="192.0.2.9 51234 10.0.0.1 22", confirm_code=0):
        self.client, self.confirm_code, self.calls = client, confirm_code, []

    def __call__(self, argv, input="", **kw):
        self.calls.append((argv, input))
        remote = argv[-1]
        if "SSH_CONNECTION" in remote:
            return subprocess.CompletedProcess(argv, 0, self.client + "\n", "")
        if "confirmed by a new ssh connection" in remote:
            return subprocess.CompletedProcess(argv, self.confirm_code, "confirmed", "" if not self.confirm_code
                                               else "ssh: connect to host 10.0.0.1 port 22: Connection timed out")
        return subprocess.CompletedProcess(argv, 0, "applied table inet dspark_s", "")


def test_a_fence_this_machine_passes_is_applied_then_confirmed_over_a_new_connection():
    ssh, out = FakeSsh(), io.StringIO()
    assert fence.apply(args(), "table inet dspark_s {}\n", out, run=ssh) == 0
    (seen, _), (applied, rules), (confirmed, _) = ssh.calls
    assert "ControlMaster=auto" in seen and "ControlMaster=auto" in applied  # the stack's usual connection
    assert rules == "table inet dspark_s {}\n" and '"$NFT" -c -f "$new"' in applied[-1]  # checked before it applies
    assert applied[-1].endswith("fence dspark_s s 30")  # the table, the stack, the rollback's seconds
    assert "ControlMaster=auto" not in confirmed and confirmed[confirmed.index("ControlPath=none") - 1] == "-o"
    assert "ControlPersist=60" not in confirmed and "-i" in confirmed and "key" in confirmed  # the rest kept
    assert "deepseek-spark-fence-s.service" in confirmed[-1] and "Before=network-pre.target docker.service" in confirmed[-1]
    assert "fence on spark1: confirmed" in out.getvalue()


def test_a_fence_that_would_cut_this_machines_ssh_is_refused_before_the_node_changes():
    ssh, out = FakeSsh(client="172.30.97.1 40000 172.30.97.11 22"), io.StringIO()
    assert fence.apply(args(operators=("10.250.0.0/16",)), "rules", out, run=ssh) == 1
    assert len(ssh.calls) == 1  # only the question: from where does this machine come
    text = out.getvalue()
    assert "refused, nothing changed on the node" in text and "reaches it from 172.30.97.1" in text
    assert "tcp dport 22 ip saddr @operators accept (firewall.operators: 10.250.0.0/16)" in text
    assert "add 172.30.97.1 to cluster.firewall.operators" in text


def test_a_confirmation_that_does_not_get_through_fails_naming_the_ssh_rule_and_the_rollback():
    ssh, out = FakeSsh(confirm_code=255), io.StringIO()
    assert fence.apply(args(), "rules", out, run=ssh) == 1
    text = out.getvalue()
    assert "a new ssh connection from here failed" in text and "restores its previous rules within 30s" in text


def test_an_ipv6_session_passes_only_when_the_operators_are_anywhere():
    assert fence.admitted("2001:db8::1", ["0.0.0.0/0"]) and not fence.admitted("2001:db8::1", ["10.0.0.0/8"])
    assert fence.admitted("10.1.2.3", ["10.0.0.0/8"]) and not fence.admitted("11.1.2.3", ["10.0.0.0/8"])
    assert fence.client_address("192.0.2.9 51234 10.0.0.1 22") == "192.0.2.9" and fence.client_address("") is None


def test_the_shared_connection_options_are_left_out_of_a_fresh_one():
    assert fence.without_master(OPTS) == ["-o", "BatchMode=yes", "-i", "key"]
    assert fence.without_master(["-oControlMaster=auto", "-oBatchMode=yes"]) == ["-oBatchMode=yes"]
