"""Shared fixtures of the e2e tier: the simulated cluster, the real Pulumi CLI on a project per test
module, the nodes' docker events, the OpenAI client from `python -m dspark.clients`, timings."""

import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.pulumi_cli import ROOT, PulumiProject, engine_dir
from e2e.observing import AlertSink
from e2e.timings import TIMINGS

# The e2e tier's own simulated cluster (sim.cluster.SUBNETS: a name, networks, subnet and ssh state of its own): the
# tests never delete, recreate or change a cluster they did not make (the demo's `<stack>-demo`, a hand-made `sim`).
# Every module's stack file is the checked-in one moved onto it (sim.retarget), and so is every address a test
# expects: at("http://172.30.99.11:8888") reads like the stack file and names this cluster's head.
CLUSTER = os.environ.get("DSPARK_E2E_CLUSTER", "e2e")  # e2e-b: a second tier beside the first (sim.cluster.SUBNETS)
TEST_CLUSTERS = ("e2e", "e2e-b", "simtest")  # the tests' own clusters (tests/sim's is simtest)
# What the tier's clusters take of this machine's memory at most (the 4-node sim-x2 with Prometheus, measured: see
# docs/tests.md), with room to spare; below it the tier stops before touching anything.
NEEDS_GIB = 6.0


def at(text: str) -> str:
    """`text` (an address, a URL) of the cluster `sim` as it is on the e2e tier's cluster."""
    from sim.retarget import retarget

    return retarget(text, CLUSTER)


def require(what: str, ok: bool, fix: str) -> None:
    if ok:
        return
    reason = f"no {what}: {fix}"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def available_gib() -> float:
    """MemAvailable of this machine (what a new cluster can take without pushing anything out)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def others_running() -> list[str]:
    """The simulated clusters on this machine that are not the tests' (a demo's, a hand-made one)."""
    from sim import inventory

    return sorted(c for c in inventory.clusters() if c not in TEST_CLUSTERS)


def node_containers() -> dict[str, str]:
    """Every simulated node container on this machine that is not the tests': name -> ID."""
    from sim.backend import LABEL_CLUSTER

    out = subprocess.run(["docker", "ps", "-a", "--no-trunc", "--filter", f"label={LABEL_CLUSTER}", "--format",
                          f'{{{{.Names}}}} {{{{.ID}}}} {{{{.Label "{LABEL_CLUSTER}"}}}}'], capture_output=True, text=True)  # fmt: skip
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    return {name: cid for name, cid, cluster in rows if cluster not in TEST_CLUSTERS}


_OTHERS: dict[str, str] = {}  # what ran beside the tier when it began (a demo's nodes): it must be there at the end


def require_room() -> None:
    """Stop before touching anything when this machine cannot hold the tier's clusters beside what runs."""
    if not _OTHERS:
        _OTHERS.update(node_containers())
    free = available_gib()
    if free >= NEEDS_GIB:
        return
    others = others_running()
    beside = (f"; running beside it: {', '.join(others)} (`python -m dspark demo --down --stack <stack>` takes a "
              "demo down)") if others else ""
    reason = (f"this machine has {free:.1f} GiB available, the e2e tier's clusters need {NEEDS_GIB:.0f} GiB{beside}: "
              "nothing was touched")
    pytest.fail(reason) if os.environ.get("CI") == "true" else pytest.skip(reason)


@pytest.fixture(scope="session")
def engine() -> Path:
    """The Pulumi CLI built by .ci/engine-setup (cached)."""
    found = engine_dir()
    require("Pulumi CLI", found is not None and (found / "pulumi").exists(), "run `bash .ci/setup` (builds it)")
    return found


# A module with SHARE_WITH_NEXT = True leaves its cluster and brought-up stack to the next module that sets
# USES_PREVIOUS_STACK = True with the same STACK and SIM_NODES (test_engine_sim -> test_engine_sim_dspark):
# one cluster create, first `up` and destroy less. Whatever is left at the end of the session is deleted.
_SHARED: dict = {}


@pytest.fixture(scope="module")
def sim(request):
    """A fresh simulated cluster (SIM_NODES of the test module, default 3), deleted afterwards (or the one
    the previous module shared with this one)."""
    engine_up = subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    require("docker engine", engine_up, "run `bash .ci/setup` (installs docker.io, starts dockerd, builds the sim images)")
    from sim import cluster as sim_cluster

    nodes = getattr(request.module, "SIM_NODES", 3)
    shared = _SHARED.pop("sim", None)
    keep = getattr(request.module, "SHARE_WITH_NEXT", False)
    t0 = time.monotonic()
    try:
        if shared is not None and shared[0] == nodes and getattr(request.module, "USES_PREVIOUS_STACK", False):
            info = shared[1]
        else:
            _SHARED.clear()
            require_room()
            sim_cluster.delete(CLUSTER, log=lambda m: None)  # the tier's own, left by an earlier run
            sim_cluster.create(CLUSTER, nodes=nodes)
            TIMINGS.setdefault("sim create (images cached)", time.monotonic() - t0)
            info = sim_cluster.ssh_info(CLUSTER)
        yield info
    finally:
        if keep:
            _SHARED["sim"] = (nodes, info)
        else:
            sim_cluster.delete(CLUSTER, log=lambda m: None)


@pytest.fixture(scope="session")
def alert_sink():
    """Alertmanager's webhook, on this machine (the stacks with `monitoring.server` send their alerts here)."""
    sink = AlertSink()
    yield sink
    sink.close()


def has_monitoring_server(stack: str) -> bool:
    import yaml

    doc = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    return bool(((doc.get("config") or {}).get("deepseek-spark:cluster") or {}).get("monitoring", {}).get("server"))


@pytest.fixture(scope="module")
def project(sim, engine, tmp_path_factory, request, alert_sink):
    """The module's STACK as a user sets it up: stack init, a fresh API key and the sim's ssh key as
    secret config (and, with a monitoring server, the webhook as alertWebhook), a local file backend, the
    passphrase secrets provider (or the previous module's)."""
    from sim import cluster as sim_cluster

    stack = request.module.STACK
    shared = _SHARED.pop("project", None)
    if shared is not None and shared.stack == stack and getattr(request.module, "USES_PREVIOUS_STACK", False):
        p = shared
    else:
        api_key = "sk-e2e-" + secrets.token_hex(20)
        given = {"apiKey": api_key, "sshPrivateKey": Path(sim.private_key).read_text()}
        if has_monitoring_server(stack):  # the nodes reach this machine at their network's gateway
            given["alertWebhook"] = alert_sink.url(sim_cluster.plan(CLUSTER, len(sim.nodes)).gateway)
        p = PulumiProject.create(tmp_path_factory.mktemp(f"pulumi-{stack}"), stack, engine, secrets=given,
                                 cluster=CLUSTER)
        # this machine reads the guards', exporters' and engines' metrics as a team's Prometheus would (what the
        # config opens on purpose); the outsider (sim/outsider.py) stays outside every source
        p.set_config("cluster.firewall.scrapers[0]", sim_cluster.plan(CLUSTER, len(sim.nodes)).gateway)
        p.api_key, p.webhook = api_key, given.get("alertWebhook")
    yield p
    if getattr(request.module, "SHARE_WITH_NEXT", False):
        _SHARED["project"] = p


def pytest_sessionfinish(session):
    if _SHARED:  # a shared cluster no module took over (e.g. -k ran only the first one)
        from sim import cluster as sim_cluster

        sim_cluster.delete(CLUSTER, log=lambda m: None)
        _SHARED.clear()
    from e2e.observing import TUNNELS

    TUNNELS.close()
    if _OTHERS:  # the tier never deletes, recreates or restarts a cluster it did not make
        now = node_containers()
        gone = sorted(name for name, cid in _OTHERS.items() if now.get(name) != cid)
        if gone:
            sys.stderr.write(f"\nthe e2e tier removed or replaced node containers it did not make: {gone}\n")
            session.exitstatus = 1


def shard_mtimes(nodes=("spark1", "spark2", "spark3")) -> dict[str, str]:
    out = {}
    for node in nodes:
        for line in node_sh(node, "stat -c '%n %Y.%y' /srv/engram/engram-*.bin").splitlines():
            name, mtime = line.split(" ", 1)
            out[f"{node}:{name}"] = mtime
    return out


def node_sh(node: str, cmd: str, check: bool = True) -> str:
    out = subprocess.run(["docker", "exec", f"{CLUSTER}-{node}", "sh", "-c", cmd], capture_output=True, text=True)
    assert out.returncode == 0 or not check, out.stderr
    return out.stdout


MONITORING_ROLES = ("node-exporter", "prometheus", "alertmanager")  # the stack's monitoring (monitoring_of)


def containers_of(stack: str, nodes=("spark1", "spark2", "spark3"), roles=None) -> dict[str, str]:
    """This stack's containers on the nodes whose role is one of `roles` (default: all but the guards, which share
    one name on every node: guards_of, and the monitoring's: monitoring_of): name -> id."""
    out = {}
    for node in nodes:
        fmt = "'{{.Names}} {{.ID}} {{.Label \"deepseek-spark.role\"}}'"
        for line in node_sh(node, f"docker ps -a --filter label=deepseek-spark.stack={stack} --format {fmt}").splitlines():
            name, cid, role = (line.split() + [""])[:3]
            if role in roles if roles else role not in ("guard", *MONITORING_ROLES):
                out[name] = cid
    return out


def monitoring_of(stack: str, nodes=("spark1", "spark2", "spark3")) -> dict[str, str]:
    """`<node>:<name>` -> ID of the stack's monitoring containers (the node exporters share one name)."""
    out = {}
    for node in nodes:
        fmt = "'{{.Names}} {{.ID}} {{.Label \"deepseek-spark.role\"}}'"
        for line in node_sh(node, f"docker ps -a --filter label=deepseek-spark.stack={stack} --format {fmt}").splitlines():
            name, cid, role = (line.split() + [""])[:3]
            if role in MONITORING_ROLES:
                out[f"{node}:{name}"] = cid
    return out


def guards_of(stack: str, nodes=("spark1", "spark2", "spark3")) -> dict[str, str]:
    """node -> the ID of the group's guard container there (the guards share one name: `<group>-guard`)."""
    out = {}
    for node in nodes:
        cid = node_sh(node, f"docker ps -aq --no-trunc --filter name=^{stack}-guard$", check=False).strip()
        if cid:
            out[node] = cid
    return out


# Modules that share one brought-up stack (SHARE_WITH_NEXT / USES_PREVIOUS_STACK) run one after the other in this
# order, wherever pytest's file-name order would put them.
CHAINS = (("test_engine_sim", "test_engine_sim_heal", "test_engine_sim_dspark"),)


def pytest_collection_modifyitems(session, config, items):
    def module(item) -> str:
        return item.module.__name__.rsplit(".", 1)[-1]

    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(module(item), i)

    def rank(item) -> tuple[int, int]:
        mod = module(item)
        for chain in CHAINS:
            if mod in chain:
                return min(first.get(m, len(items)) for m in chain), chain.index(mod)
        return first[mod], 0

    items.sort(key=rank)  # stable: a module's own tests keep their order


@dataclass(frozen=True)
class Event:
    """One container event of a node's docker engine (its own clock: the nodes share the host's)."""

    t: float
    node: str
    action: str  # create, start, die, stop, destroy, ...
    name: str


def container_events(since: float, until: float, nodes=("spark1", "spark2", "spark3")) -> list[Event]:
    fmt = "'{{.TimeNano}} {{.Action}} {{.Actor.Attributes.name}}'"
    events = []
    for node in nodes:
        cmd = f"docker events --since {since:.3f} --until {until:.3f} --filter type=container --format {fmt}"
        for line in node_sh(node, cmd).splitlines():
            nano, action, name = line.split(" ", 2)
            events.append(Event(int(nano) / 1e9, node, action, name))
    return sorted(events, key=lambda e: e.t)


def first_event(events: list[Event], action: str, name: str, after: str | None = None) -> Event:
    """The first `action` of container `name` (after its first `after` event, when given: e.g. the start of
    the container a `create` made, not a restart-policy start of the one it replaced)."""
    since = first_event(events, after, name).t if after else float("-inf")
    return next(e for e in events if e.action == action and e.name == name and e.t >= since)


def dspark(project: PulumiProject, *args: str) -> tuple[int, str]:
    """`python -m dspark <args> --stack <the project's stack>` in the project; (exit code, stdout + stderr)."""
    proc = subprocess.run([sys.executable, "-m", "dspark", *args, "--stack", project.stack, "--project-dir",
                           str(project.work_dir)], cwd=project.work_dir, env=project.env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert project.api_key not in proc.stdout + proc.stderr
    return proc.returncode, proc.stdout + proc.stderr


def client_env(project: PulumiProject, tmp_path: Path) -> dict[str, str]:
    """`python -m dspark.clients --stack X --format openai-env`: the env file a user's tools read,
    made from the real `pulumi stack output --json --show-secrets`."""
    out = tmp_path / f"{project.stack}.env"
    proc = subprocess.run(
        [sys.executable, "-m", "dspark.clients", "--stack", project.stack, "--format", "openai-env",
         "--out", str(out)],
        cwd=project.work_dir, env=project.env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (out.stat().st_mode & 0o777) == 0o600
    return dict(line.split("=", 1) for line in out.read_text().splitlines() if line and not line.startswith("#"))


def openai_client(env: dict[str, str], key: str | None = None):
    import openai

    http_client = None
    if env.get("SSL_CERT_FILE"):  # the front door's CA, as the env file gives it (httpx reads it from os.environ)
        import ssl

        import httpx

        http_client = httpx.Client(verify=ssl.create_default_context(cafile=env["SSL_CERT_FILE"]), timeout=30)
    client = openai.OpenAI(base_url=env["OPENAI_BASE_URL"], api_key=key or env["OPENAI_API_KEY"], max_retries=0,
                           timeout=30, http_client=http_client)  # fmt: skip
    return client, env["OPENAI_MODEL"]


def ask(env: dict[str, str], key: str | None = None) -> str:
    client, model = openai_client(env, key)
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}], max_tokens=32
    )
    return resp.choices[0].message.content


def resources_summary(text: str) -> str:
    """The `Resources:` block of a preview or update: what a reviewer reads first."""
    return text.split("\nResources:", 1)[-1].split("\n\n", 1)[0] if "\nResources:" in text else ""


def read_diagnose(path: Path) -> dict[str, str]:
    """`dspark diagnose`'s file: member (without its top folder) -> text, in the file's order."""
    import tarfile

    with tarfile.open(path, "r:gz") as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


def secret_forms(secret: str) -> list[str]:
    """A secret as the support file must hold it in none of its forms: itself, a slice, base64."""
    import base64

    return [secret, secret[4:20], base64.b64encode(secret.encode()).decode()]
