"""The 2-group stack `sim-x2` through the real Pulumi engine: two SGLang test-double groups of 2 nodes
each behind the REAL sglang-router (PyPI 0.3.2, in the engine image), on a 4-node simulated cluster.

In order: preview -> up, answers through `python -m dspark.clients` (the router's endpoint, its
key check, both groups serving) -> no-op up -> a serving change rolled one group at a time while a
client keeps sending requests (zero failures; orders from the nodes' docker event timestamps) -> a rank
of group b killed: its guard heals it out of rotation while every request is answered by group a ->
the router moved to the docker engine where Pulumi runs (the groups stay up) -> destroy.
"""

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest

from e2e.conftest import (
    CLUSTER, ask, at, client_env, container_events, containers_of, first_event, monitoring_of, node_sh, openai_client,
)  # fmt: skip
from e2e import exposure, healing, observing
from e2e.conftest import dspark, resources_summary
from e2e.timings import TIMINGS

pytestmark = pytest.mark.e2e
STACK = "sim-x2"
SIM_NODES = 4
NODES = ("spark1", "spark2", "spark3", "spark4")
GROUPS = {"a": ("sim-x2-a-rank0", "sim-x2-a-rank1"), "b": ("sim-x2-b-rank0", "sim-x2-b-rank1")}
ROUTER_METRICS = at("http://172.30.99.11:29000/metrics")
HEADS = {"a": at("http://172.30.99.11:8888"), "b": at("http://172.30.99.13:8888")}


def all_containers() -> dict[str, str]:
    out = {}
    for label in (STACK, f"{STACK}-a", f"{STACK}-b"):
        out.update(containers_of(label, NODES))
    return out


def routed_successes() -> dict[str, float]:
    """Per worker URL, the requests the router completed there (its own Prometheus counters)."""
    with urllib.request.urlopen(ROUTER_METRICS, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("smg_worker_cb_outcomes_total{") and 'outcome="success"' in line:
            worker = line.split('worker="', 1)[1].split('"', 1)[0]
            out[worker] = out.get(worker, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def replaced_in_order(diff_text: str) -> list[str]:
    """The names of the resources a `preview --diff` replaces, in the order it lists them."""
    lines = diff_text.splitlines()
    names = []
    for i, line in enumerate(lines):
        if line.lstrip().startswith("+-"):
            urn = next((row for row in lines[i + 1 : i + 4] if "[urn=" in row), "")
            names.append(urn.rsplit("::", 1)[-1].rstrip("]").strip())
    return names


class Load:
    """Clients sending requests through the router until stopped: every outcome recorded (`stream`: every other
    request streams; False: none does)."""

    def __init__(self, env: dict[str, str], threads: int = 3, stream: bool = True):
        self.env, self.stream = env, stream
        self.ok = 0
        self.failures: list[str] = []
        self.latencies: list[float] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, i: int) -> None:
        client, model = openai_client(self.env)
        n = 0
        while not self.stop.is_set():
            n += 1
            t0 = time.monotonic()
            try:
                messages = [{"role": "user", "content": "What is 19 + 23?"}]
                if self.stream and (i + n) % 2:
                    stream = client.chat.completions.create(
                        model=model, messages=messages, max_tokens=24, stream=True,
                        extra_body={"ignore_eos": True, "min_tokens": 24},
                    )  # fmt: skip
                    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                else:
                    resp = client.chat.completions.create(model=model, messages=messages, max_tokens=24)
                    text = resp.choices[0].message.content or ""
                if not text:
                    raise RuntimeError("empty answer")
                self.ok += 1
                self.latencies.append(time.monotonic() - t0)
            except Exception as exc:  # every failure counts, whatever its kind
                self.failures.append(f"{time.strftime('%H:%M:%S')} {type(exc).__name__}: {exc}")

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


@pytest.fixture(scope="module")
def first(project, tmp_path_factory):
    preview = project.timed("sim-x2: preview --diff (policy pack)", project.preview())
    t0 = time.monotonic()
    up = project.up().check()
    env = client_env(project, tmp_path_factory.mktemp("client"))
    answer = ask(env)
    TIMINGS["sim-x2: first up to first answer (2 groups, one after the other)"] = time.monotonic() - t0
    return SimpleNamespace(preview=preview, up=up, env=env, answer=answer)


def test_preview_shows_the_router_and_both_groups(first, project):
    text = first.preview.check().text
    assert "to create" in resources_summary(text)
    assert "sim-x2-router-container" in text and "sim-x2-a-router-member" in text and "sim-x2-b-router-member" in text
    for group, ranks in GROUPS.items():
        for rank in range(2):
            assert f"sim-x2-{group}-sglang-rank{rank}" in text
    assert "deepseek-spark-guardrails" in text and project.api_key not in text


def test_up_answers_through_the_router_and_both_groups_serve(first, project):
    assert "42" in first.answer
    outputs = project.outputs()
    assert first.env["OPENAI_BASE_URL"] == outputs["endpoint"] == at("http://172.30.99.11:8889/v1")
    assert [(g["name"], g["endpoint"]) for g in outputs["groups"]] == [
        ("a", HEADS["a"] + "/v1"), ("b", HEADS["b"] + "/v1")
    ]  # fmt: skip
    assert sorted(all_containers()) == ["sim-x2-a-rank0", "sim-x2-a-rank1", "sim-x2-b-rank0", "sim-x2-b-rank1",
                                        "sim-x2-router"]  # fmt: skip
    before = routed_successes()
    for _ in range(6):
        assert "42" in ask(first.env)
    after = routed_successes()
    for head in HEADS.values():
        assert after.get(head, 0) - before.get(head, 0) >= 2, (before, after)  # round_robin: both groups
    client, model = openai_client(first.env)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}], max_tokens=32, stream=True
    )
    assert "42" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    bad = openai.OpenAI(base_url=first.env["OPENAI_BASE_URL"], api_key="sk-wrong-key-0123456789", max_retries=0,
                        timeout=10)  # fmt: skip
    with pytest.raises(openai.AuthenticationError):  # the router itself refuses it
        bad.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    no_key = urllib.request.Request(
        first.env["OPENAI_BASE_URL"] + "/chat/completions", method="POST", headers={"Content-Type": "application/json"},
        data=b'{"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}',
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(no_key, timeout=10)
    assert refused.value.code == 401
    inspect = node_sh("spark1", "docker inspect sim-x2-router")
    assert project.api_key not in inspect and project.api_key not in first.up.text


def test_every_prometheus_target_serves_the_series_the_dashboard_reads(first, project, tmp_path):
    from planning import monitoring

    for head in HEADS.values():  # a streamed answer of several tokens on each group: SGLang observes inter-token
        client = openai.OpenAI(base_url=head + "/v1", api_key=project.api_key, max_retries=0, timeout=30)
        stream = client.chat.completions.create(model="deepseek-v4.1-flash", max_tokens=16, stream=True,
                                                messages=[{"role": "user", "content": "Who are you?"}])  # fmt: skip
        assert "test double" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)  # latency then
    outputs = project.outputs()
    seen = []
    for job in outputs["prometheus"]["scrape_configs"]:
        for static in job["static_configs"]:
            labels = static["labels"]
            role = labels["role"]
            for i, target in enumerate(static["targets"]):
                if role == "guard":  # every guard: itself and its node's rails; the group's leader: the group's too
                    series = (*(monitoring.SERIES["guard"] if i == 0 else ("dspark_guard_up",)),
                              *monitoring.SERIES["fabric"][: 2 if i else 4])  # fmt: skip
                else:
                    series = monitoring.SERIES[role if role in ("router", "node") else labels["engine"]]
                with urllib.request.urlopen(f"http://{target}{job.get('metrics_path', '/metrics')}", timeout=10) as r:
                    names = {line.split("{")[0].split(" ")[0] for line in r.read().decode().splitlines()
                             if line and not line.startswith("#")}  # fmt: skip
                assert set(series) <= names, (target, set(series) - names)
                seen.append(target)
    nodes = [at(f"172.30.99.1{i}") for i in range(1, 5)]
    assert sorted(seen) == sorted([at("172.30.99.11:29000"), at("172.30.99.11:8888"), at("172.30.99.13:8888"),
                                   *(f"{n}:9850" for n in nodes), *(f"{n}:9100" for n in nodes)])  # fmt: skip
    out = tmp_path / "dashboard.json"
    proc = subprocess.run([sys.executable, "-m", "dspark.clients", "--stack", STACK, "--format", "grafana",
                           "--out", str(out)], cwd=project.work_dir, env=project.env, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert [p["title"] for p in doc["panels"] if p["type"] == "row"] == [
        "Router", "Engines (sglang)", "Self-healing guard", "Fabric", "Node memory"]
    # the REAL Prometheus the stack runs (monitoring.server) scrapes each of them, and each panel reads data there
    prom = observing.prometheus(outputs, CLUSTER)
    observing.wait_every_target_up(prom, outputs)
    observing.record_scrape_costs(prom, STACK)
    observing.wait_panels(prom, doc)


def test_from_outside_only_ssh_and_the_router_answer(first, project):
    """From a host on the management network that belongs to no stack: ssh on every node and the router on
    spark1, nothing else (both groups' engines, the rendezvous, the router's metrics, the guards, the exporters
    are the stack's own); no anonymous chat through the router."""
    exposure.check_closed(CLUSTER, STACK, project.outputs())


def test_second_up_changes_nothing(first, project):
    before = all_containers()
    run = project.timed("sim-x2: no-op up", project.up()).check()
    summary = resources_summary(run.text)
    assert "unchanged" in summary
    assert not any(word in summary for word in ("created", "updated", "replaced", "deleted")), summary
    assert all_containers() == before


def test_dspark_looks_at_one_group_and_smokes_the_router(first, project):
    code, out = dspark(project, "status", "--json")
    assert code == 3 and "pass --group; its groups are a, b" in out
    outputs = project.outputs()
    for group in outputs["groups"]:
        code, out = dspark(project, "status", "--json", "--group", group["name"])
        doc = json.loads(out)
        assert code == 0 and doc["verdict"] == "healthy", out
        assert doc["revision"]["expected"] == group["revision"] and doc["health"]["status"] == 200
        assert [r["node"] for r in doc["ranks"]] == group["nodes"]
    code, out = dspark(project, "smoke", "--json", "--group", "a")
    assert code == 0 and json.loads(out)["base_url"] == outputs["endpoint"], out  # through the router


def test_a_serving_change_rolls_one_group_at_a_time_with_zero_failed_requests(first, project):
    before = all_containers()
    project.set_config("cluster.serving.maxRunningRequests", "3")
    preview = project.preview().check()
    replaced = replaced_in_order(preview.text)
    order = [name for name in replaced if "-sglang-rank" in name]
    assert any("sim-x2-a-" in line for line in order) and any("sim-x2-b-" in line for line in order), replaced
    last_a = max(i for i, line in enumerate(order) if "sim-x2-a-" in line)
    first_b = min(i for i, line in enumerate(order) if "sim-x2-b-" in line)
    assert last_a < first_b, f"the preview lists group a before group b: {order}"
    assert "sim-x2-router-container" not in "".join(replaced), "the router stays up"

    t0 = time.time()
    with Load(first.env) as load:
        time.sleep(2)  # requests flowing before the roll begins
        run = project.timed("sim-x2: rolling serving change (2 groups), up", project.up())
        time.sleep(2)
    events = container_events(t0 - 1, time.time() + 1, NODES)
    run.check()
    total = load.ok + len(load.failures)
    TIMINGS["sim-x2: requests during the roll (count)"] = total
    TIMINGS["sim-x2: failed requests during the roll (count)"] = len(load.failures)
    TIMINGS["sim-x2: slowest request during the roll"] = max(load.latencies)
    assert load.failures == [], f"{len(load.failures)} of {total} requests failed: {load.failures[:5]}"
    assert load.ok >= 20, f"only {load.ok} requests during the roll"

    destroy = {n: first_event(events, "destroy", n).t for ranks in GROUPS.values() for n in ranks}
    start = {n: first_event(events, "start", n).t for ranks in GROUPS.values() for n in ranks}
    a_back, b_down = max(start[n] for n in GROUPS["a"]), min(destroy[n] for n in GROUPS["b"])
    assert a_back < b_down, "group b went down before group a was back"
    for ranks in GROUPS.values():
        assert max(destroy[n] for n in ranks) < min(start[n] for n in ranks)
    TIMINGS["sim-x2: group a down (first destroy to last start)"] = a_back - min(destroy[n] for n in GROUPS["a"])
    TIMINGS["sim-x2: group b down (first destroy to last start)"] = max(start[n] for n in GROUPS["b"]) - b_down
    assert "sim-x2-router" not in {e.name for e in events if e.action in ("destroy", "die")}, "router stayed up"
    after = all_containers()
    assert after["sim-x2-router"] == before["sim-x2-router"]
    assert not {v for k, v in after.items() if k != "sim-x2-router"} & set(before.values())
    assert "42" in ask(first.env)


def test_one_group_heals_out_of_rotation_while_the_other_answers_every_request(first, project):
    """A rank of group b SIGKILLed: b's guard takes b out of the router's rotation, restarts it and puts it back;
    meanwhile every request a client sends through the router is answered (the router retries a request b
    dropped on group a; a stream already running on b when it died could not be, so the load here does not stream)."""
    leader_b = at("http://172.30.99.13:9850")
    before = all_containers()
    with Load(first.env, stream=False) as load:
        time.sleep(2)
        h = healing.timed_heal("tp4x2: a rank of one group SIGKILLed", leader_b,
                               lambda: node_sh("spark4", "docker kill -s KILL sim-x2-b-rank1"),
                               lambda: healing.quick_ask(first.env), ("rank-exited",))  # fmt: skip
        b_back = time.time()
        time.sleep(3)
        served_by_b = routed_successes().get(HEADS["b"], 0)
        time.sleep(3)
    total = load.ok + len(load.failures)
    TIMINGS["sim-x2: requests while group b healed (count)"] = total
    assert load.failures == [], f"{len(load.failures)} of {total} requests failed: {load.failures[:5]}"
    assert load.ok >= 20, f"only {load.ok} requests while group b healed"
    assert routed_successes().get(HEADS["b"], 0) > served_by_b, "group b is back in the router's rotation"
    assert all_containers() == before, "the guard restarted the containers Pulumi created"
    events = container_events(h["detected_at"] - 1, b_back, NODES)
    assert not [e for e in events if e.action in ("die", "start") and e.name.startswith("sim-x2-a-")], \
        "group a was not touched"


def test_the_front_door_fronts_the_router_and_turning_it_off_again_restarts_nothing(first, project, tmp_path):
    """frontDoor.enabled on the two-group stack: one `up` puts the door on the router's node, restarting no rank and
    not the router; the client config is https and answers; sglang-router's own routes (/workers, /list_workers,
    /get_loads, /get_server_info, /flush_cache, /metrics) get 403/404 at the door. Then the door off again: one `up`
    removes it, the endpoint is the router's again, and still no group restarted."""
    import httpx
    import yaml

    before = all_containers()
    stack_file = project.work_dir / f"Pulumi.{STACK}.yaml"
    original = stack_file.read_text()
    doc = yaml.safe_load(original)
    doc["config"]["deepseek-spark:cluster"]["frontDoor"] = {"enabled": True}
    stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        project.timed("sim-x2: front door on", project.up()).check()
        host = at("172.30.99.11")
        assert project.outputs()["endpoint"] == f"https://{host}/v1"
        assert {k: v for k, v in all_containers().items() if k in before} == before
        env = client_env(project, tmp_path)
        assert "42" in ask(env)
        key = {"Authorization": f"Bearer {env['OPENAI_API_KEY']}"}
        for method, path in (("GET", "/workers"), ("POST", "/workers"), ("GET", "/list_workers"), ("GET", "/get_loads"),
                             ("GET", "/get_server_info"), ("POST", "/flush_cache"), ("GET", "/metrics")):  # fmt: skip
            status = httpx.request(method, f"https://{host}{path}", headers=key, verify=env["SSL_CERT_FILE"],
                                   timeout=10).status_code  # fmt: skip
            assert status in (403, 404), (method, path, status)
    finally:
        stack_file.write_text(original)
    project.timed("sim-x2: front door off", project.up()).check()
    assert all_containers() == before
    env = client_env(project, tmp_path)
    assert env["OPENAI_BASE_URL"] == at("http://172.30.99.11:8889/v1") and "SSL_CERT_FILE" not in env
    assert "42" in ask(env)


def local_router() -> str:
    out = subprocess.run(["docker", "ps", "-a", "--filter", f"label=deepseek-spark.stack={STACK}", "--format",
                          "{{.Names}} {{.ID}}"], capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip()


def test_the_router_moves_to_where_pulumi_runs_and_the_groups_stay(first, project, tmp_path):
    before = all_containers()
    project.set_config("cluster.router.node", "local")
    run = project.timed("sim-x2: router moved to where Pulumi runs, up", project.up()).check()
    assert project.api_key not in run.text
    env = client_env(project, tmp_path)
    assert env["OPENAI_BASE_URL"] == project.outputs()["endpoint"] == "http://127.0.0.1:8889/v1"
    assert local_router().startswith("sim-x2-router ")
    after = all_containers()
    assert "sim-x2-router" not in after, "the node's router is gone"
    assert after == {k: v for k, v in before.items() if k != "sim-x2-router"}, "the groups were not restarted"
    assert "42" in ask(env)
    key_file = Path.home() / ".local/state/deepseek-spark/sim-x2-router/api-key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"


def test_destroy_removes_the_router_groups_and_key_files(first, project):
    project.timed("sim-x2: destroy", project.destroy()).check()
    assert all_containers() == {} and local_router() == "" and monitoring_of(STACK, NODES) == {}
    assert "sim-x2-prometheus" in node_sh("spark1", "docker volume ls --format '{{.Name}}'").split()  # keepData
    node_sh("spark1", "docker volume rm sim-x2-prometheus")  # the next scenario starts from a fresh node
    assert not (Path.home() / ".local/state/deepseek-spark/sim-x2-router/api-key").exists()
    assert node_sh("spark1", "find /var/lib/deepseek-spark -type f 2>/dev/null | wc -l").strip() == "0", "key files left"
    for node in NODES:
        assert node_sh(node, "ls /srv/models/DS4.1 | grep -c safetensors").strip() == "4"
