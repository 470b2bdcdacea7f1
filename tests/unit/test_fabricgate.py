"""programs/fabricgate.py end to end on this machine: a stand-in `ssh` on PATH runs each node's side
locally with that node's link model, against the simulator's ib_write_bw stand-in (sim/assets/node),
so the gate's orchestration (server first, then the client, all rails at once, pairs in turn) and its
verdicts are what is tested, over real TCP."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from programs import fabricgate

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "sim" / "assets" / "node" / "ib_write_bw"

# `ssh [opts] -p PORT TARGET REMOTE`: the rails lookup answers from $FAKE_DIR/<target>.rails.json, any
# other command runs here with DSPARK_SIM_FABRIC pointing at $FAKE_DIR/<target>.json.
FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in -o|-i|-p) shift 2 ;; -*) shift ;; *) break ;; esac
done
target=$1; shift
case "$*" in
  "python3 - "*) cat > /dev/null; cat "$FAKE_DIR/$target.rails.json"; exit 0 ;;
esac
export DSPARK_SIM_FABRIC="$FAKE_DIR/$target.json"
exec /bin/sh -c "$*"
"""


def _rail(hca, netdev, pci, ip, gbps=93.5, state="ACTIVE"):
    return {"hca": hca, "netdev": netdev, "pci": pci, "ip": ip, "prefix": 8, "state": state,
            "speed_mbps": 200000, "gbps": gbps, "mtu": 9000, "gid_index": 3}  # fmt: skip


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """Two nodes, both twins of the cabled port each; `set(node, twin, **changes)` edits a model."""
    if shutil.which("stdbuf") is None:
        pytest.skip("coreutils stdbuf is missing")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    os.symlink(STANDIN, bin_dir / "ib_write_bw")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    models = {}
    for node in ("root@spark1", "root@spark2"):
        models[node] = [_rail("rocep1s0f1", "enp1s0f1np1", "0000:01:00.1", "127.0.0.1"),
                        _rail("roceP2p1s0f1", "enP2p1s0f1np1", "0002:01:00.1", "127.0.0.1")]  # fmt: skip

    def write():
        for node, rails in models.items():
            (tmp_path / f"{node}.json").write_text(json.dumps({"node": node, "rails": rails}))
            found = {"rails": [{k: r[k] for k in ("hca", "netdev", "pci", "ip", "state", "gid_index")} for r in rails],
                     "ports": {"127.0.0.1": [r["hca"] for r in rails]}, "problems": []}  # fmt: skip
            (tmp_path / f"{node}.rails.json").write_text(json.dumps(found))

    def set_(node, twin, **changes):
        models[f"root@{node}"][twin].update(changes)
        write()

    write()
    return set_


SPEC = {"floor": 175, "nodes": [{"name": "spark1", "target": "root@spark1", "port": 22, "rails_args": []},
                                {"name": "spark2", "target": "root@spark2", "port": 22, "rails_args": []}],
        "links": [{"a": "spark1", "b": "spark2", "a_ip": "127.0.0.1", "b_ip": "127.0.0.1"}]}  # fmt: skip


def test_a_healthy_pair_carries_both_twins(cluster, capsys):
    result = fabricgate.gate(json.loads(json.dumps(SPEC)), ["-o", "BatchMode=yes"])
    assert result["failures"] == []
    (pair,) = result["report"]["pairs"]
    assert [(r["client"], r["server"], r["gbps"]) for r in pair["rails"]] == [
        ("rocep1s0f1", "rocep1s0f1", 93.5), ("roceP2p1s0f1", "roceP2p1s0f1", 93.5)]
    assert pair["totalGbps"] == 187.0 and pair["ok"] and result["report"]["minGbps"] == 187.0
    assert "fabric-gate spark1<->spark2: 187 Gb/s over 2 rail(s)" in capsys.readouterr().out


def test_a_link_that_negotiated_200g_and_carries_13_fails_naming_pair_rails_floor_and_fix(cluster):
    cluster("spark2", 0, gbps=6.5)
    cluster("spark2", 1, gbps=6.5)
    result = fabricgate.gate(json.loads(json.dumps(SPEC)), [])
    (message,) = result["failures"]
    assert message.startswith("spark1<->spark2 carried 13 Gb/s over 2 rail(s) (rocep1s0f1<->rocep1s0f1 6.5, "
                              "roceP2p1s0f1<->roceP2p1s0f1 6.5), below fabric.minBandwidthGbps 175")
    assert "autonegotiation off" in message and not result["report"]["ok"]


def test_a_rail_the_peer_cannot_use_shows_its_error_and_halves_the_pair(cluster):
    cluster("spark2", 1, state="DOWN")  # (preflight fails on this first; the gate still says what it saw)
    result = fabricgate.gate(json.loads(json.dumps(SPEC)), [])
    (pair,) = result["report"]["pairs"]
    assert pair["totalGbps"] == 93.5 and len(pair["rails"]) == 1  # only the rail active on both nodes
    assert result["failures"] and "over 1 rail(s)" in result["failures"][0]


def test_main_prints_the_report_line_last_and_exits_1_on_failure(cluster, capsys):
    cluster("spark1", 0, gbps=40.0)
    code = fabricgate.main(["--spec", json.dumps(SPEC), "--ssh-opt=-oBatchMode=yes"])
    out = capsys.readouterr()
    assert code == 1 and "fabric gate: FAIL spark1<->spark2 carried 133.5 Gb/s" in out.err
    last = out.out.strip().splitlines()[-1]
    assert last.startswith(fabricgate.REPORT_PREFIX) and json.loads(last[len(fabricgate.REPORT_PREFIX):])["ok"] is False
