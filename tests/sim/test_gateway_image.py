"""The team gateway image ``deepseek-spark-gateway:litellm-1.110.2`` (``sim/images.py`` ``GATEWAY_IMAGE``).

NOT a test double: REAL LiteLLM 1.110.2 (its proxy's dependency set, ``programs/gateway/requirements.txt``)
and REAL PostgreSQL 15 (Debian's ``postgresql-15``), registry packages only. The pure tests check that the
sim's rootfs recipe takes its pins from the one requirements file and its image config from the Dockerfile
real nodes build; the integration tests run the image on a simulated node (``create`` loads it on every
node, next to the engine images).
"""
from __future__ import annotations

import base64
import json
import re
import shlex
from pathlib import Path

import pytest
from sim_helpers import ssh

from sim import backend, images, rootfs

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "programs" / "gateway"
IMAGE = "deepseek-spark-gateway:litellm-1.110.2"


def _pins() -> list[str]:
    lines = [ln.strip() for ln in (GATEWAY / "requirements.txt").read_text().splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def _name(req: str) -> str:
    return re.sub(r"[-_.]+", "-", req.split("==")[0]).lower()


# ------------------------------------------------------------------------------------ pure ----
def test_gateway_rootfs_wheels_are_the_requirements_pins():
    pins = _pins()
    assert images.GATEWAY_IMAGE == IMAGE
    assert rootfs.GATEWAY_ROOTFS.wheels == tuple(pins)
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+", p) for p in pins), pins
    names = [_name(p) for p in pins]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    raw = [p.split("==")[0].lower() for p in pins]
    assert raw == sorted(raw)  # pip freeze's order
    for want in ("litellm==1.110.2", "psycopg==3.3.9", "psycopg-binary==3.3.9"):
        assert want in pins
    assert "prometheus-client" in names and "websockets" in names
    assert "async-timeout" in names  # redis needs it below python 3.11.3: bookworm's python3 is 3.11.2
    assert not [n for n in names if n.startswith("litellm-")]  # litellm-proxy(-extras), litellm-enterprise
    assert not {"pip", "setuptools", "wheel"} & set(names)
    # Debian packages and the wheel platforms (litellm, numpy and tiktoken are manylinux_2_28 only)
    assert set(rootfs.GATEWAY_ROOTFS.packages) == {"python3", "postgresql-15", "ca-certificates"}
    assert "manylinux_2_28_x86_64" in rootfs.GATEWAY_ROOTFS.wheel_platform
    changed = rootfs.RootfsSpec("gateway", rootfs.GATEWAY_ROOTFS.packages, wheels=tuple(pins[:-1]),
                                wheel_platform=rootfs.GATEWAY_ROOTFS.wheel_platform)
    assert changed.key() != rootfs.GATEWAY_ROOTFS.key()  # the pins are part of the rootfs key


def test_gateway_overlay_matches_the_dockerfile():
    """Same ENV and CMD as programs/gateway/Dockerfile; no files of ours; labelled as real, not a double."""
    text = (GATEWAY / "Dockerfile").read_text()
    env = dict(kv.split("=", 1) for line in re.findall(r"^ENV (.+)$", text, re.M) for kv in shlex.split(line))
    assert env == {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONUNBUFFERED": "1"}
    assert re.search(r"^CMD \[\"/bin/sh\"\]$", text, re.M) and "ENTRYPOINT" not in text
    assert re.search(r"^FROM \$\{BASE\}$", text, re.M) and "ARG BASE=debian:bookworm-slim" in text
    assert "-r /tmp/requirements.txt" in text and "--no-deps" in text
    ov = images.GATEWAY.overlay()
    assert ov.files == {}
    sim_env = dict(c[4:].split("=", 1) for c in ov.changes if c.startswith("ENV "))
    assert {k: sim_env.get(k) for k in env} == env
    assert 'CMD ["/bin/sh"]' in ov.changes
    label = next(c for c in ov.changes if c.startswith("LABEL "))
    assert "deepseek-spark.sim.test-double=false" in label and "registry-packages-only" in label
    ignore = [ln for ln in (GATEWAY / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ignore == ["*", "!Dockerfile", "!requirements.txt"]
    assert images.GATEWAY.tag().startswith("deepseek-spark-gateway:sim-")


# ----------------------------------------------------------------------------- integration ----
def _run(info, node, args: str, timeout: float = 180) -> str:
    return ssh(info, node, f"docker run --rm {IMAGE} {args}", timeout=timeout).stdout


@pytest.mark.integration
def test_every_node_holds_the_gateway_image(sim_cluster):
    want = backend.image_id(IMAGE)
    assert want
    for n in sim_cluster.nodes:
        out = ssh(sim_cluster, n, f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}").stdout.strip()
        assert out == want, n.name
    cfg = json.loads(ssh(sim_cluster, sim_cluster.nodes[0],
                         f"docker image inspect --format '{{{{json .Config}}}}' {IMAGE}").stdout)
    assert "LITELLM_LOCAL_MODEL_COST_MAP=True" in cfg["Env"] and "PYTHONUNBUFFERED=1" in cfg["Env"]
    assert cfg["Cmd"] == ["/bin/sh"] and not cfg.get("Entrypoint")
    assert cfg["Labels"]["deepseek-spark.sim.test-double"] == "false"


@pytest.mark.integration
def test_gateway_image_is_litellm_and_postgres(sim_cluster):
    n = sim_cluster.nodes[1]
    assert "1.110.2" in _run(sim_cluster, n, "litellm --version")
    assert _run(sim_cluster, n, "python3 -c 'import litellm, importlib.metadata as m; "
                                "print(m.version(\"litellm\"))'").strip() == "1.110.2"
    out = _run(sim_cluster, n, "python3 -c 'import litellm.proxy.proxy_server, psycopg, prometheus_client; "
                               "print(\"imported\", psycopg.__version__)'")
    assert out.split()[-2:] == ["imported", "3.3.9"], out
    assert re.match(r"postgres \(PostgreSQL\) 15\.\d+", _run(sim_cluster, n, "/usr/lib/postgresql/15/bin/postgres --version"))
    assert "(postgres)" in _run(sim_cluster, n, "id postgres")
    assert _run(sim_cluster, n, "sh -c 'command -v runuser; command -v litellm'").split() == \
        ["/usr/sbin/runuser", "/usr/local/bin/litellm"]


PG_SCRIPT = r"""set -e
B=/usr/lib/postgresql/15/bin
runuser -u postgres -- $B/initdb -D /tmp/pg -U postgres --auth-local=peer --encoding=UTF8 --no-instructions >/dev/null
runuser -u postgres -- $B/pg_ctl -D /tmp/pg -l /tmp/pg.log -w -s -o "-c listen_addresses='' -k /tmp" start
runuser -u postgres -- python3 -c 'import psycopg; print(psycopg.connect("host=/tmp dbname=postgres user=postgres").execute("select version()").fetchone()[0])'
"""


@pytest.mark.integration
def test_gateway_image_runs_postgres_with_psycopg(sim_cluster):
    """initdb, a server on a unix socket, and psycopg (the image's) querying it: all the image's own."""
    out = _run(sim_cluster, sim_cluster.nodes[2], f"sh -c {shlex.quote(PG_SCRIPT)}")
    assert out.strip().startswith("PostgreSQL 15."), out


def _with_gateway_files(script: str) -> str:
    """`script` after the gateway's start-db and gateway_admin.py are written where the program mounts them."""
    lines = ["set -e", "mkdir -p /etc/dspark-gateway /run/dspark-gateway",
             "printf 'DSPARK_DB_PASSWORD=pw123\\nDSPARK_DB_PORT=5499\\n' > /run/dspark-gateway/secrets.env"]
    for name in ("start-db", "gateway_admin.py"):
        data = base64.b64encode((GATEWAY / name).read_bytes()).decode()
        lines.append(f"echo {data} | base64 -d > /etc/dspark-gateway/{name}")
    return "\n".join(lines) + "\n" + script


CONCURRENT_INITS = r"""
sh /etc/dspark-gateway/start-db 5499 > /tmp/db.log 2>&1 &
ADMIN="python3 /etc/dspark-gateway/gateway_admin.py"
$ADMIN --wait 60 init >/dev/null
failed=0
for round in 1 2 3 4 5; do
  runuser -u postgres -- psql -q -h /tmp -p 5499 -d dspark -c 'DROP TABLE dspark_keys; DROP TABLE dspark_usage'
  pids=""
  for i in 1 2 3 4 5 6; do $ADMIN --wait 5 init > /tmp/init$i.log 2>&1 & pids="$pids $!"; done
  for p in $pids; do wait $p || failed=$((failed + 1)); done
  [ $failed = 0 ] || cat /tmp/init*.log
done
echo "failed $failed of 30"
"""


@pytest.mark.integration
def test_members_registered_at_once_all_find_the_schema(sim_cluster):
    """The program registers every member at once, beside the gateway's own init: six `gateway_admin.py` at a
    time on a fresh database, five rounds; without the schema lock, PostgreSQL's catalog race
    (UniqueViolation on pg_type_typname_nsp_index) failed 13-14 of the 30."""
    out = _run(sim_cluster, sim_cluster.nodes[0], f"sh -c {shlex.quote(_with_gateway_files(CONCURRENT_INITS))}")
    assert out.strip().endswith("failed 0 of 30"), out
