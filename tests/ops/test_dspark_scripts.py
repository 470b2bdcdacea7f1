"""dspark's remote scripts run by a real POSIX shell (as ssh hands them to the login shell), with
stand-ins for docker / nvidia-smi / ethtool on PATH: nothing touches docker or a GPU here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import harness
from planning import commands
from declared.cluster import parse_cluster
from dspark import nodes as dnodes
from dspark.cmd_doctor import _stat_result


def login_shell(remote: str, path: str) -> subprocess.CompletedProcess:
    """What `ssh host <remote>` does on the node: the login shell runs the string."""
    return subprocess.run(["/bin/sh", "-c", remote], capture_output=True, text=True, timeout=60,
                          env={"PATH": path, "HOME": "/nonexistent"})  # fmt: skip


def stub(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    (bindir / name).write_text("#!/bin/sh\n" + body)
    (bindir / name).chmod(0o755)


def test_files_script_reports_present_and_missing(tmp_path):
    (tmp_path / "engram-l1-r0of3.bin").write_text("x")
    odd = tmp_path / "it's $(odd) name.bin"
    odd.write_text("x")
    paths = [str(tmp_path / "engram-l1-r0of3.bin"), str(tmp_path / "engram-l14-r0of3.bin"), str(odd)]
    r = login_shell(dnodes.files_cmd(paths), "/usr/bin:/bin")
    assert r.returncode == 0, r.stderr
    present, missing = dnodes.parse_files(r.stdout)
    assert present == [paths[0], paths[2]] and missing == [paths[1]]


def test_volume_probe_script_ok_missing_and_failing_stat(tmp_path):
    bindir = tmp_path / "bin"
    mp = tmp_path / "vol data"
    mp.mkdir()
    stub(bindir, "docker", f'[ "$1 $2" = "volume inspect" ] || exit 9\n'
                           f'case "$5" in tp3-checkpoint) echo "{mp}" ;; *) echo "Error: No such volume: $5" >&2; exit 1 ;; esac\n')  # fmt: skip
    path = f"{bindir}:/usr/bin:/bin"

    def probe(volume: str) -> dict:
        r = login_shell(dnodes.volume_probe_cmd(volume), path)
        assert r.returncode == 0, r.stderr
        lines = {}
        for line in r.stdout.splitlines():
            word, _, rest = line.partition(" ")
            lines[word] = rest
        return lines

    ok = probe("tp3-checkpoint")
    assert ok["mountpoint"] == str(mp) and ok["mounted"] == "no" and ok["stat"] == "ok"
    assert _stat_result(ok) == "ok"
    gone = probe("other-volume")
    assert "no such volume" in gone["volume"].lower()
    mp.rmdir()  # stat -f fails now (like a mount that went away)
    failed = probe("tp3-checkpoint")
    assert failed["stat"].startswith("fail 1 ")
    assert _stat_result(failed) == "failed"
    stub(bindir, "timeout", "exit 124\n")  # what timeout(1) reports when stat hangs on a dead NFS server
    assert _stat_result(probe("tp3-checkpoint")) == "hung"


def test_the_programs_preflight_output_is_parsed(tmp_path):
    """Run the program's own preflight script (tp3 head) with failing stand-ins: every check it
    names is reported, the failures with their messages, as doctor reads them."""
    cfg = parse_cluster(harness.group_of("tp3"))
    script = commands.preflight(cfg, "tp3", 0)
    bindir = tmp_path / "bin"
    stub(bindir, "docker", "exit 1\n")
    stub(bindir, "nvidia-smi", "exit 1\n")
    stub(bindir, "ethtool", "exit 1\n")
    stub(bindir, "sudo", "exit 1\n")
    r = login_shell(dnodes.preflight_cmd(script), f"{bindir}:/usr/bin:/bin")
    ok, failed = dnodes.parse_preflight(r.stdout + r.stderr)
    assert r.returncode == 1
    names = [c for c, _ in failed]
    assert {"docker", "gpu", "fabric-ip", "checkpoint-config"} <= set(names)  # no 10.0.22.1 here
    notes = dnodes.parse_preflight_notes(r.stdout + r.stderr)  # no earlyoom/systemd-oomd here: a note, not a failure
    assert set(ok) | set(names) | {n.split(": note ")[1].split(":")[0] for n in notes} == set(dnodes.preflight_checks(script))
    assert "oom-guard" not in names
    docker_msg = dict(failed)["docker"]
    assert "; install docker" in docker_msg
