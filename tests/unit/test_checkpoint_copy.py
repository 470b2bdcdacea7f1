"""The checkpoint downloaded once on the head and copied to a worker over its data-plane link: the
head's read-only rsync daemon and the worker's copy, run here with real rsync on two loopback
addresses (the head 127.0.0.1, the worker 127.0.0.2, one /24 link)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from declared.cluster import parse_cluster
from harness import cluster_of
from planning import commands

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is missing (.ci/sim-setup installs it)")


def _cfg(tmp_path, side):
    raw = cluster_of("tp2")
    raw["nodes"][0].update(host="127.0.0.1", fabricIp="127.0.0.1")
    raw["nodes"][1].update(host="127.0.0.2", fabricIp="127.0.0.2")
    raw["model"].update(checkpointDir=str(tmp_path / side), expectedShards=3)
    raw["stateDir"] = str(tmp_path / "state")
    return parse_cluster(raw)


def sh(script):
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)


@pytest.fixture
def seeded(tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    for i in range(1, 4):
        (head / f"model-0000{i}-of-00003.safetensors").write_bytes(bytes([i]) * 100_000)
    (head / "config.json").write_text("{}")
    (head / ".deepseek-spark-download").write_text("main\n")  # the head's own stamp is not copied
    head_cfg, worker_cfg = _cfg(tmp_path, "head"), _cfg(tmp_path, "worker")
    started = sh(commands.seed_start(head_cfg, "tp2"))
    assert started.returncode == 0, started.stderr
    assert "seeding" in started.stdout and "to 127.0.0.2" in started.stdout
    yield head_cfg, worker_cfg, tmp_path
    sh(commands.seed_stop(head_cfg, "tp2"))


def test_the_worker_copies_the_heads_checkpoint_verifies_it_and_stamps_the_revision(seeded):
    head_cfg, worker_cfg, tmp_path = seeded
    out = sh(commands.checkpoint_copy(worker_cfg, 1))
    assert out.returncode == 0, out.stderr
    worker = tmp_path / "worker"
    assert sorted(p.name for p in worker.iterdir()) == sorted(
        ["config.json", ".deepseek-spark-download", *(f"model-0000{i}-of-00003.safetensors" for i in range(1, 4))])
    assert (worker / "model-00002-of-00003.safetensors").read_bytes() == bytes([2]) * 100_000
    assert (worker / ".deepseek-spark-download").read_text() == "main\n"
    again = sh(commands.checkpoint_copy(worker_cfg, 1))
    assert again.returncode == 0 and "already in" in again.stdout


def test_an_interrupted_copy_resumes(seeded):
    head_cfg, worker_cfg, tmp_path = seeded
    worker = tmp_path / "worker"
    worker.mkdir()
    (worker / "model-00001-of-00003.safetensors").write_bytes(bytes([1]) * 40_000)  # a partial file, no stamp
    out = sh(commands.checkpoint_copy(worker_cfg, 1))
    assert out.returncode == 0, out.stderr
    assert (worker / "model-00001-of-00003.safetensors").read_bytes() == bytes([1]) * 100_000


def test_a_head_with_too_few_shards_fails_the_copy_without_a_stamp(seeded):
    head_cfg, worker_cfg, tmp_path = seeded
    (tmp_path / "head" / "model-00003-of-00003.safetensors").unlink()
    out = sh(commands.checkpoint_copy(worker_cfg, 1))
    assert out.returncode == 1 and "2 of 3 safetensors files" in out.stderr
    assert not (tmp_path / "worker" / ".deepseek-spark-download").exists()


def test_the_daemon_answers_only_the_workers_address_and_stops(seeded):
    head_cfg, worker_cfg, tmp_path = seeded
    other = sh("rsync --address 127.0.0.3 rsync://127.0.0.1:8730/checkpoint/config.json /dev/null")
    assert other.returncode != 0 and "unknown module" in other.stderr.lower()  # hidden from other hosts
    assert sh(commands.seed_stop(head_cfg, "tp2")).returncode == 0
    gone = sh(commands.checkpoint_copy(worker_cfg, 1))
    assert gone.returncode != 0 and not (tmp_path / "worker" / ".deepseek-spark-download").exists()
