"""The monitoring image ``deepseek-spark-monitoring:bookworm`` (``sim/images.py`` ``MONITORING``).

NOT a test double: Debian's REAL prometheus, prometheus-alertmanager and prometheus-node-exporter, registry
packages only. The pure tests check that the sim's recipe installs what ``programs/monitoring/Dockerfile``
installs on real nodes and is named what the config defaults to; the integration tests run the three
binaries on a simulated node (``create`` loads the image on every node).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sim_helpers import ssh

from declared.stack import MONITORING_IMAGE
from planning import prometheus
from sim import backend, images, rootfs

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "programs" / "monitoring"


def _apt_packages(dockerfile: str) -> set[str]:
    m = re.search(r"apt-get install -y --no-install-recommends ((?:[a-z0-9.+-]+\s*(?:\\\s*)?)+)", dockerfile)
    assert m, "no apt-get install line"
    return set(m.group(1).replace("\\", " ").split())


def test_monitoring_rootfs_is_the_dockerfiles_packages():
    text = (PROGRAM / "Dockerfile").read_text()
    assert images.MONITORING_IMAGE == MONITORING_IMAGE == "deepseek-spark-monitoring:bookworm"
    assert set(rootfs.MONITORING_ROOTFS.packages) == _apt_packages(text)
    assert {"prometheus", "prometheus-alertmanager", "prometheus-node-exporter"} <= _apt_packages(text)
    assert not rootfs.MONITORING_ROOTFS.wheels  # nothing from PyPI
    assert re.search(r"^FROM \$\{BASE\}$", text, re.M) and "ARG BASE=debian:bookworm-slim" in text
    assert re.search(r"^CMD \[\"/bin/sh\"\]$", text, re.M) and "ENTRYPOINT" not in text
    ov = images.MONITORING.overlay()
    assert ov.files == {} and 'CMD ["/bin/sh"]' in ov.changes
    label = next(c for c in ov.changes if c.startswith("LABEL "))
    assert "deepseek-spark.sim.test-double=false" in label and "registry-packages-only" in label
    ignore = [ln for ln in (PROGRAM / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ignore == ["*", "!Dockerfile"]
    assert images.MONITORING.tag().startswith("deepseek-spark-monitoring:sim-")
    assert images.MONITORING in images.PACKAGED


def test_the_binaries_the_plan_runs_are_the_packages():
    """The plan's entrypoints are the paths Debian's packages install (checked on a node below)."""
    ne = prometheus.exporter_container("s", prometheus.MonitoringConfig(), "10.0.0.1")
    assert ne.entrypoint == ("/usr/bin/prometheus-node-exporter",)


# ----------------------------------------------------------------------------- integration ----
@pytest.mark.integration
def test_every_node_holds_the_monitoring_image_and_it_runs(sim_cluster):
    want = backend.image_id(MONITORING_IMAGE)
    assert want
    for n in sim_cluster.nodes:
        out = ssh(sim_cluster, n, f"docker image inspect --format '{{{{.Id}}}}' {MONITORING_IMAGE}").stdout.strip()
        assert out == want, n.name
    n = sim_cluster.nodes[0]
    cfg = json.loads(ssh(sim_cluster, n, f"docker image inspect --format '{{{{json .Config}}}}' {MONITORING_IMAGE}").stdout)
    assert cfg["Cmd"] == ["/bin/sh"] and cfg["Labels"]["deepseek-spark.sim.test-double"] == "false"
    out = ssh(sim_cluster, n, f"docker run --rm {MONITORING_IMAGE} sh -c '/usr/bin/prometheus --version 2>&1; "
                              "/usr/bin/prometheus-alertmanager --version 2>&1; "
                              "/usr/bin/prometheus-node-exporter --version 2>&1'", timeout=120).stdout
    assert re.search(r"prometheus, version 2\.42\.", out), out
    assert re.search(r"alertmanager, version 0\.25\.", out), out
    assert re.search(r"node_exporter, version 1\.5\.", out), out
