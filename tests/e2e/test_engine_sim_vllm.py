"""The vLLM + Ray stack `sim-tp2` (tp2's layout) through the real Pulumi engine on 2 simulated nodes.

preview -> up, Ray gate, answers through `python -m dspark.clients` -> no-op up -> the Ray worker killed:
the guard restarts the group, the Ray head first -> a serving change takes the group down (the Ray worker
first: it depends on its head) before the new Ray head starts, then the worker joins it -> the mp backend,
and its worker killed and healed -> destroy keeps the checkpoint.
"""

import json
import time
import urllib.request

import openai
import pytest

from e2e import exposure
from e2e.conftest import (
    CLUSTER, ask, at, client_env, container_events, containers_of, dspark, first_event, node_sh, openai_client, read_diagnose,
    resources_summary, secret_forms,
)  # fmt: skip
from e2e import healing
from e2e.timings import EXPOSURE, TIMINGS

pytestmark = pytest.mark.e2e
STACK = "sim-tp2"
SIM_NODES = 2  # tp2's layout: a 2-node simulated cluster
NODES = ("spark1", "spark2")
HEAD, WORKER = "sim-tp2-rank0", "sim-tp2-rank1"
LEADER = at("http://172.30.99.11:9850")  # the guard on the head's node


@pytest.fixture(scope="module")
def first(project, tmp_path_factory):
    preview = project.timed("sim-tp2: preview --diff (policy pack)", project.preview()).check()
    t0 = time.monotonic()
    project.up().check()
    env = client_env(project, tmp_path_factory.mktemp("client"))
    answer = ask(env)
    TIMINGS["sim-tp2: first up to first answer"] = time.monotonic() - t0
    return preview, env, answer


def test_first_up_serves_through_ray(first, project):
    preview, env, answer = first
    assert "to create" in resources_summary(preview.text) and project.api_key not in preview.text
    assert "42" in answer
    assert sorted(containers_of(STACK, NODES)) == [HEAD, WORKER]
    assert "2/2 nodes alive" in node_sh("spark1", f"docker logs {HEAD} 2>&1")
    boot = project.outputs()["boot"]["sim-tp2"]  # vLLM's KV cache lines, read from the head's log
    assert boot["kvTokens"] >= boot["expectedKvTokens"] > 0 and boot["maxConcurrency"] >= 1, boot
    assert boot["contextLength"] == boot["expectedKvTokens"] and boot["kvCacheGiB"] > 0 and not boot["shortfall"]
    # the ranks share the node's IPC namespace: Ray's object store gets the node's /dev/shm (64 MiB by
    # docker's default made the worker's raylet crash under load), now 1 GiB and no warning about it
    for node, rank in zip(NODES, (HEAD, WORKER)):
        kib = int(node_sh(node, f"docker exec {rank} df -k --output=size /dev/shm").split()[-1])
        assert kib >= 1024 * 1024, (rank, kib)
        assert "/dev/shm has only" not in node_sh(node, f"docker logs {rank} 2>&1"), rank


def test_from_outside_only_ssh_and_the_endpoint_answer_and_no_host_joins_ray(first, project):
    """A host on the management network that belongs to no stack: ssh and vLLM's port on the head, ssh on the
    worker, nothing else (Ray's GCS, raylets and workers, the rendezvous: the group's data plane only); `ray start
    --address=<head>:<rayPort>` from there does not join; what vLLM leaves unguarded on its port is recorded."""
    from sim import outsider

    outputs = project.outputs()
    exposure.check_closed(CLUSTER, STACK, outputs)
    code, text = outsider.ray_join(CLUSTER, at("172.30.99.11:6379"))
    assert "Ray runtime started" not in text, text
    alive = "import ray; ray.init(address='auto'); print(len([n for n in ray.nodes() if n['Alive']]))"
    joined = node_sh("spark1", f'docker exec {HEAD} python3 -c "{alive}"', check=False)
    assert joined.strip().splitlines()[-1:] == ["2"], joined  # the group's two nodes, no third
    base = outputs["endpoint"].removesuffix("/v1")
    chat = '{"model": "%s", "messages": [{"role": "user", "content": "What is 19 + 23?"}]}' % outputs["model"]
    status, text = outsider.http(CLUSTER, "POST", base + "/invocations", chat)
    EXPOSURE[f"{STACK} anonymous POST /invocations (vLLM straight to clients)"] = f"{status} {text[:60]}"


def test_streaming_auth_on_v1_only(first):
    _, env, _ = first
    client, model = openai_client(env)
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}], max_tokens=32, stream=True
    )
    assert "42" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    bad, _ = openai_client(env, key="sk-wrong-key-0123456789")
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    health = env["OPENAI_BASE_URL"].removesuffix("/v1") + "/health"
    with urllib.request.urlopen(health, timeout=10) as resp:  # vLLM leaves /health unauthenticated
        assert resp.status == 200


def test_second_up_changes_nothing(first, project):
    before = containers_of(STACK, NODES)
    run = project.timed("sim-tp2: no-op up", project.up()).check()
    summary = resources_summary(run.text)
    assert "unchanged" in summary and not any(w in summary for w in ("created", "updated", "replaced", "deleted"))
    assert containers_of(STACK, NODES) == before


def test_a_ray_worker_sigkilled_heals_the_group_head_first(first, project):
    """The guard restarts the group as Pulumi starts it: the Ray head (and vllm serve) first, the worker joining."""
    before = containers_of(STACK, NODES)
    t0 = time.time()
    healing.timed_heal("vLLM + Ray: the Ray worker SIGKILLed", LEADER,
                       lambda: node_sh("spark2", f"docker kill -s KILL {WORKER}"), lambda: healing.quick_ask(first[1]),
                       ("rank-exited",))  # fmt: skip
    events = container_events(t0, time.time() + 1, NODES)
    starts = {n: first_event(events, "start", n).t for n in (HEAD, WORKER)}
    assert starts[HEAD] < starts[WORKER], "the Ray head starts first, the worker joins it"
    assert containers_of(STACK, NODES) == before


def test_a_serving_change_takes_the_group_down_before_the_new_ray_head_starts(first, project):
    before = containers_of(STACK, NODES)
    project.set_config("cluster.serving.maxModelLen", "65536")
    preview = project.preview().check()
    # 2 ranks, generation, readiness, 2 preflights, fabric gate, 2 memory gates, the image agreement, 2 guards
    assert "+-12 to replace" in resources_summary(preview.text), resources_summary(preview.text)
    assert "131072" in preview.text and "65536" in preview.text
    t0 = time.time()
    project.timed("sim-tp2: serving change, up to answer", project.up()).check()
    events = container_events(t0 - 1, time.time() + 1, NODES)
    destroys = {n: first_event(events, "destroy", n).t for n in (HEAD, WORKER)}
    starts = {n: first_event(events, "start", n).t for n in (HEAD, WORKER)}
    assert max(destroys.values()) < min(starts.values()), events
    assert destroys[WORKER] < destroys[HEAD], "the Ray worker goes before its head"
    assert starts[HEAD] < starts[WORKER], "the Ray head starts first"
    assert not set(containers_of(STACK, NODES).values()) & set(before.values())
    assert "42" in ask(first[1])


def test_the_mp_backend_serves_without_ray(first, project):
    """distributedExecutorBackend: mp: every node runs `vllm serve` (node 1 --headless), joined by vLLM's
    own launcher at the head's distPort; no Ray process anywhere."""
    project.set_config("cluster.serving.distributedExecutorBackend", "mp")
    project.timed("sim-tp2: switch to the mp backend, up to answer", project.up()).check()
    assert "42" in ask(first[1])
    for i, node in enumerate(NODES):
        run = node_sh(node, f"docker inspect -f '{{{{json .Config.Entrypoint}}}} {{{{json .Args}}}}' sim-tp2-rank{i}")
        assert "ray start" not in run and '"serve"' in run and "--master-addr" in run, run
        assert ("--headless" in run) == (i == 1), run
    healing.timed_heal("vLLM mp: the headless worker SIGKILLed", LEADER,
                       lambda: node_sh("spark2", f"docker kill -s KILL {WORKER}"), lambda: healing.quick_ask(first[1]),
                       ("rank-exited",))  # fmt: skip
    project.cli("config", "rm", "--path", "deepseek-spark:cluster.serving.distributedExecutorBackend").check()
    project.up().check()
    assert "42" in ask(first[1])


def test_diagnose_holds_both_ranks_boot_logs_and_no_secret(first, project, tmp_path):
    code, text = dspark(project, "diagnose", "--out", str(tmp_path / "d.tar.gz"))
    assert code == 0, text
    m = read_diagnose(tmp_path / "d.tar.gz")
    assert [n["engine"] for n in json.loads(m["versions.json"])["nodes"]][:1] == ["vllm"]
    for i, node in enumerate(NODES):
        assert m[f"logs/rank{i}-{node}.log"].strip(), f"rank {i}'s log"
    assert json.loads(m["status.json"])["verdict"] == "healthy"
    blob = "\n".join(m.values())
    assert not any(form in blob for form in secret_forms(project.api_key)), "the API key in the support file"


def test_behind_the_front_door_vllms_unguarded_routes_are_closed_and_the_endpoint_is_https(first, project, tmp_path):
    """frontDoor.enabled: one `up` restarts neither rank; the client config's https endpoint answers, plain and
    streamed; vLLM's routes that answer without a key (/invocations, /tokenize, /pause, /scale_elastic_ep, /metrics)
    get 404 at the door, with a key too; from outside only ssh and 443 answer, and port 8000 is an inner one."""
    import httpx
    import yaml

    from sim import outsider

    ranks = containers_of(STACK, NODES)
    stack_file = project.work_dir / f"Pulumi.{STACK}.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    doc["config"]["deepseek-spark:cluster"]["frontDoor"] = {"enabled": True}
    stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    project.timed("sim-tp2: front door on", project.up()).check()
    assert {k: v for k, v in containers_of(STACK, NODES).items() if k in ranks} == ranks
    out = project.outputs()
    host = at("172.30.99.11")
    assert out["endpoint"] == f"https://{host}/v1"
    env = client_env(project, tmp_path)
    assert "42" in ask(env)
    client, model = openai_client(env)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}],
                                            max_tokens=32, stream=True)  # fmt: skip
    assert "42" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    chat = {"model": model, "messages": [{"role": "user", "content": "What is 19 + 23?"}]}
    for key in (None, env["OPENAI_API_KEY"]):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        for path in ("/invocations", "/tokenize", "/pause", "/scale_elastic_ep", "/metrics", "/v1/load_lora_adapter"):
            status = httpx.post(f"https://{host}{path}", json=chat, headers=headers, verify=env["SSL_CERT_FILE"],
                                timeout=10).status_code  # fmt: skip
            assert status in (403, 404), (path, key is not None, status)
    exposure.check_closed(CLUSTER, STACK, out)
    status, text = outsider.http(CLUSTER, "POST", f"http://{host}:8000/invocations", json.dumps(chat))
    assert status == 0, (status, text[:200])  # vLLM's own port: dropped for whoever is not the stack's


def test_destroy_keeps_the_checkpoint(first, project):
    project.timed("sim-tp2: destroy", project.destroy()).check()
    assert containers_of(STACK, NODES) == {}
    for node in NODES:
        assert "sim-tp2-checkpoint" not in node_sh(node, "docker volume ls --format '{{.Name}}'")
        assert node_sh(node, "ls /srv/models/DS4.1 | grep -c safetensors").strip() == "4"
