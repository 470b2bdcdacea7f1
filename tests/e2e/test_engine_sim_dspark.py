"""The operator CLI (`python -m dspark`) against the `sim` stack brought up by the real Pulumi engine: the
one test_engine_sim's scenario left (run alone, this module brings up its own).

up -> status healthy, plan matches what runs, smoke answers, doctor finds nothing, bench writes its
files -> a rank stopped:
status says down and how to repair, doctor and logs name it -> the repair it suggests
(`pulumi refresh` + `up`) makes status healthy again -> `dspark repair` (the timer's command) repairs a
stopped rank by itself and refuses a config change nobody applied -> a rank that never starts (the GPU
hook refuses it) is down at once and `dspark restart` starts the whole group over -> `dspark diagnose` writes its
support file (every part, no secret), and completes naming a stopped node -> destroy keeps the checkpoint, the
shards and the compile caches, and no API key was in any output or event log of the whole scenario.
"""

import json
import time
from pathlib import Path

import pytest

from e2e import healing
from e2e.conftest import (
    CLUSTER, ask, at, client_env, container_events, containers_of, dspark, first_event, monitoring_of, node_sh,
    openai_client, read_diagnose, resources_summary, secret_forms, shard_mtimes,
)  # fmt: skip
from sim import cluster as sim_cluster
from e2e.timings import TIMINGS

pytestmark = pytest.mark.e2e
STACK = "sim"
USES_PREVIOUS_STACK = True  # test_engine_sim's cluster and stack, when it ran just before
NODES = ("spark1", "spark2", "spark3")
RANKS = ("sim-rank0", "sim-rank1", "sim-rank2")


@pytest.fixture(scope="module")
def up(project):
    project.up().check()
    return project.outputs()


def test_status_of_a_healthy_group(up, project):
    t0 = time.monotonic()
    code, out = dspark(project, "status", "--json")
    TIMINGS["dspark status (3 nodes)"] = time.monotonic() - t0
    doc = json.loads(out)
    assert code == 0 and doc["verdict"] == "healthy", out
    assert [r["state"] for r in doc["ranks"]] == ["running"] * 3
    assert all(r["revision_ok"] for r in doc["ranks"]) and doc["revision"]["expected"] == up["group_revision"]
    assert doc["health"]["status"] == 200
    assert doc["boot"]["kvTokens"] == 750_000 and doc["boot"]["speculative"] == "DSPARK"
    code, out = dspark(project, "status")
    assert "boot (rank 0, last up): KV pool 750,000 tokens (plan 750,000, 100%), speculative DSPARK, " \
           "context 262,144" in out, out


def test_plan_is_what_runs(up, project):
    code, out = dspark(project, "plan", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["group_revision"] == up["group_revision"]
    for node in doc["nodes"]:
        name = node["container"]["name"]
        cmd = node_sh(node["name"], f"docker inspect --format '{{{{json .Config.Cmd}}}}' {name}")
        assert json.loads(cmd) == node["container"]["args"], name


def test_smoke_and_doctor_on_a_healthy_group(up, project):
    code, out = dspark(project, "smoke", "--json")
    doc = json.loads(out)
    assert code == 0 and "42" in doc["chat"]["answer"] and "42" in doc["stream"]["answer"]
    assert 0 < doc["stream"]["ttft_s"] <= doc["stream"]["total_s"]
    code, out = dspark(project, "doctor", "--json")
    assert code == 0 and json.loads(out)["findings"] == [], out


def test_bench_writes_results_a_plot_and_the_table(up, project, tmp_path):
    """llama-benchy for real against the sim's endpoint (the test double's figures mean nothing)."""
    out = tmp_path / "bench"
    t0 = time.monotonic()
    code, text = dspark(project, "bench", "--concurrency", "1,2", "--pp", "256", "--tg", "32", "--runs", "1",
                        "--out", str(out))  # fmt: skip
    TIMINGS["dspark bench (concurrency 1,2)"] = time.monotonic() - t0
    assert code == 0, text[-3000:]
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert sorted({r["concurrency"] for r in summary["results"]}) == [1, 2], summary
    assert json.loads((out / "llama-benchy.json").read_text())
    assert "no reference (test double)" in text


def test_a_stopped_rank_is_found_and_the_suggested_repair_works(up, project):
    assert dspark(project, "guard", "pause", "--reason", "the repair's own tests")[0] == 0  # or it heals at once
    node_sh("spark2", "docker stop sim-rank1 >/dev/null")
    code, out = dspark(project, "status")
    assert code == 2 and "DOWN" in out and "rank 1" in out, out
    assert f"pulumi up --refresh --stack {STACK}" in out
    code, out = dspark(project, "doctor", "--json")
    findings = json.loads(out)["findings"]
    assert code != 0 and any(f["rank"] == 1 and "refresh" in f["fix"] for f in findings), findings
    code, out = dspark(project, "logs", "--rank", "1", "--tail", "20")
    assert code == 0 and "[rank1 spark2]" in out
    before = containers_of(STACK)
    project.refresh().check()
    project.up().check()
    assert not set(containers_of(STACK).values()) & set(before.values())
    code, out = dspark(project, "status", "--json")
    assert code == 0 and json.loads(out)["verdict"] == "healthy", out


def wait_healthy(project, seconds: float = 120) -> None:
    deadline, out = time.monotonic() + seconds, ""
    while time.monotonic() < deadline:
        code, out = dspark(project, "status", "--json")
        if code == 0 and json.loads(out)["verdict"] == "healthy":
            return
        time.sleep(2)
    raise AssertionError(f"not healthy within {seconds:.0f} s: {out[-2000:]}")


def test_repair_stands_aside_while_the_guard_holds_the_group_puts_back_drift_and_refuses_a_change_nobody_applied(
        up, project):  # fmt: skip
    """`dspark repair` as a timer runs it: the guard paused for maintenance (the test before) and a rank stopped:
    nothing touched; the guard resumed heals the rank itself and repair finds no drift; a guard stopped on a node:
    repaired, no rank restarted; a merged but unapplied config change left alone."""
    pack = ("--policy-pack", "policy")
    node_sh("spark2", "docker stop sim-rank1 >/dev/null")
    held = containers_of(STACK)
    code, out = dspark(project, "repair", "--yes", *pack)
    assert code == 0 and "the guard holds sim (paused" in out and "nothing touched" in out, out
    assert containers_of(STACK) == held and node_sh("spark2", "docker inspect -f '{{.State.Running}}' sim-rank1"
                                                   ).strip() == "false"  # fmt: skip
    assert dspark(project, "guard", "resume")[0] == 0
    wait_healthy(project)  # the guard's own heal (docker start: the same containers)
    code, out = dspark(project, "repair", "--yes", *pack)
    assert code == 0 and "no drift" in out, out
    ranks = containers_of(STACK)
    node_sh("spark3", f"docker stop {STACK}-guard >/dev/null")
    code, out = dspark(project, "repair", *pack)
    assert code == 2 and "drift found" in out and "--yes" in out, out
    t0 = time.monotonic()
    code, out = dspark(project, "repair", "--yes", *pack)
    TIMINGS["dspark repair (a guard stopped)"] = time.monotonic() - t0
    assert code == 0 and "repaired" in out, out
    assert containers_of(STACK) == ranks  # a side container put back restarts no rank
    assert node_sh("spark3", f"docker inspect -f '{{{{.State.Running}}}}' {STACK}-guard").strip() == "true"
    wait_healthy(project)
    project.set_config("cluster.serving.maxRunningRequests", "5")
    running = containers_of(STACK)
    code, out = dspark(project, "repair", "--yes", *pack)
    assert code == 4 and "never applied" in out, out
    assert containers_of(STACK) == running


def test_a_rank_that_never_starts_is_down_at_once_and_dspark_restart_brings_the_whole_group_back(up, project):
    """spark2's GPU hook refuses containers (the image wants a newer CUDA than the driver: nvidia-smi works, so
    preflight passes) as a serving change restarts the group. pulumi-docker keeps the rank it could create but not start (`Created`, init errors); a
    plain `up` sends it an empty update that starts nothing, and readiness says at once that it never started
    and how to start over; with the hook fixed, `dspark restart` replaces every rank, the head last."""
    from sim import faults as sim_faults

    before = containers_of(STACK)
    project.set_config("cluster.serving.maxRunningRequests", "6")  # a serving change: the group restarts
    sim_faults.gpu_fault(CLUSTER, "spark2", log=lambda m: None)
    try:
        run = project.up()
        assert run.code != 0 and "Unable to start container" in run.text, run.text[-3000:]
        assert "unsatisfied condition: cuda>=13.1" in run.text
        assert node_sh("spark2", "docker inspect -f '{{.State.Status}}' sim-rank1").strip() == "created"
        code, out = dspark(project, "status")
        assert code == 2 and "rank 1" in out, out
        t0 = time.monotonic()
        run = project.up()
        TIMINGS["up with a rank left Created, to its failure"] = time.monotonic() - t0
        assert run.code != 0 and at("rank 1 (sim-rank1 on root@172.30.99.12) was created but never started") in run.text
        assert f"python -m dspark restart --stack {STACK} --yes" in run.text
        assert node_sh("spark2", "docker inspect -f '{{.State.Status}}' sim-rank1").strip() == "created"
        code, out = dspark(project, "restart", "--yes")  # before the cause is fixed: it fails, and says where first
        first = out.split(f"{STACK}: restart failed:", 1)[1].strip().splitlines()[:5]
        assert code == 1 and first[0] == "sim-sglang-rank1 (docker:index/container:Container):", out[-3000:]
        assert "unsatisfied condition: cuda>=13.1" in "\n".join(first[1:]), out[-3000:]
    finally:
        sim_faults.gpu_fault(CLUSTER, "spark2", None, log=lambda m: None)
    t0 = time.time()
    code, out = dspark(project, "restart", "--yes")
    TIMINGS["dspark restart (a rank never started), to ready"] = time.time() - t0
    assert code == 0 and "restarted the serving group" in out, out
    events = container_events(t0 - 1, time.time() + 1)
    # the new ranks' starts: the head left behind restarts on its own (restart policy) until it is deleted
    starts = {n: first_event(events, "start", n, after="create").t for n in RANKS}
    assert set(starts) == set(RANKS) and max(starts, key=starts.get) == "sim-rank0", "every rank, the head last"
    assert not set(containers_of(STACK).values()) & set(before.values())
    code, out = dspark(project, "status", "--json")
    assert code == 0 and json.loads(out)["verdict"] == "healthy", out


def test_diagnose_holds_each_part_and_no_secret(up, project, tmp_path):
    t0 = time.monotonic()
    code, text = dspark(project, "diagnose", "--out", str(tmp_path / "d.tar.gz"))
    TIMINGS["dspark diagnose (3 nodes)"] = time.monotonic() - t0
    assert code == 0, text
    m = read_diagnose(tmp_path / "d.tar.gz")
    assert list(m)[:2] == ["SUMMARY.md", "diagnose.json"]
    for name in ("versions.json", "config.json", "plan.json", "outputs.json", "status.json", "doctor.json",
                 "guard/journal.json", "last-up.json", *(f"logs/rank{i}-{n}.log" for i, n in enumerate(NODES)),
                 *(f"nccl/rank{i}-{n}.log" for i, n in enumerate(NODES))):  # fmt: skip
        assert name in m, (name, list(m))
    v = json.loads(m["versions.json"])
    assert v["local"]["pulumi"]["version"].startswith("v3.")
    assert all(n["kernel"] and n["docker"] and n["container_image"].startswith("sha256:") for n in v["nodes"]), v
    assert json.loads(m["plan.json"])["group_revision"] == project.outputs()["group_revision"]
    assert json.loads(m["status.json"])["verdict"] == "healthy"
    doc = json.loads(m["doctor.json"])
    assert all(n["fabric"]["rails"] for n in doc["nodes"]) and doc["fabric_gate"]
    assert json.loads(m["guard/journal.json"])["state"] == "serving"
    assert json.loads(m["last-up.json"])["update"]["result"] == "succeeded"
    key = Path(sim_cluster.ssh_info(CLUSTER).private_key).read_text()
    blob = "\n".join(m.values())
    for secret in (project.api_key, project.webhook, *(ln for ln in key.splitlines() if len(ln) > 16 and "---" not in ln)):
        assert not any(form in blob for form in secret_forms(secret)), "a secret in the support file"
    assert "redacted" in m["SUMMARY.md"]


def test_diagnose_with_a_node_stopped_completes_and_names_it(up, project, tmp_path):
    assert dspark(project, "guard", "pause", "--reason", "diagnose with a node stopped")[0] == 0
    sim_cluster.stop_node(CLUSTER, "spark3", log=lambda m: None)
    try:
        t0 = time.monotonic()
        code, text = dspark(project, "diagnose", "--out", str(tmp_path / "d.tar.gz"), "--timeout", "30")
        TIMINGS["dspark diagnose, spark3 stopped (--timeout 30)"] = time.monotonic() - t0
    finally:
        sim_cluster.start_node(CLUSTER, "spark3", log=lambda m: None)
    assert code == 0 and "spark3" in text, text
    m = read_diagnose(tmp_path / "d.tar.gz")
    assert "spark3 did not answer" in m["SUMMARY.md"], m["SUMMARY.md"][:3000]
    assert [a["answered"] for a in json.loads(m["diagnose.json"])["nodes"]] == [True, True, False]
    assert m["logs/rank0-spark1.log"].strip()
    assert dspark(project, "guard", "resume")[0] == 0  # the guard brings the group back (spark3 rebooted)
    healing.wait_guard(at("http://172.30.99.11:9850"), lambda s: s["state"] == "serving", timeout=180, what="serve")


def test_a_fence_that_would_cut_the_operators_ssh_is_refused_and_every_node_stays_reachable(up, project):
    """firewall.operators without this machine: the `up` stops at the first node before changing its rules,
    naming the address and the fix; every node keeps the fence it had, and ssh still gets in."""
    before = {node: node_sh(node, "nft list table inet dspark_sim") for node in NODES}
    project.set_config("cluster.firewall.operators[0]", "10.250.0.0/16")
    try:
        run = project.up()
        assert run.code != 0 and "refused, nothing changed on the node" in run.text, run.text[-3000:]
        assert "add " + at("172.30.99.1") + " to cluster.firewall.operators" in run.text, run.text[-3000:]
        assert {node: node_sh(node, "nft list table inet dspark_sim") for node in NODES} == before
    finally:
        project.cli("config", "rm", "--path", "deepseek-spark:cluster.firewall.operators").check()
    project.up().check()
    code, out = dspark(project, "smoke")
    assert code == 0, out


def ask_all_along(env: dict, answers: list, stop) -> None:
    """Ask every 0.2 s until `stop` is set: True for an answer, the error's repr for a failed request."""
    while not stop.is_set():
        try:
            answers.append("42" in ask(env))
        except Exception as exc:  # noqa: BLE001  (any failure is a failed request: kept, then asserted)
            answers.append(repr(exc))
        time.sleep(0.2)


def test_taking_away_and_adding_back_the_monitoring_server_restarts_no_rank_and_every_request_answers(
        up, project, tmp_path):  # fmt: skip
    """Prometheus and Alertmanager come out of memory.sideReserveGiB, not out of the ranks' limits: the group's
    revision stays, so an `up` that removes or adds them touches no rank while clients keep asking."""
    import threading

    import yaml

    stack_file = project.work_dir / f"Pulumi.{STACK}.yaml"
    original = stack_file.read_text()
    doc = yaml.safe_load(original)
    del doc["config"]["deepseek-spark:cluster"]["monitoring"]["server"]
    env, ranks, revision = client_env(project, tmp_path), containers_of(STACK), project.outputs()["group_revision"]
    answers: list = []
    stop = threading.Event()
    asking = threading.Thread(target=ask_all_along, args=(env, answers, stop))
    asking.start()
    try:
        stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        project.up().check()
        assert project.outputs()["group_revision"] == revision and containers_of(STACK) == ranks
        assert not [n for n in monitoring_of(STACK) if "prometheus" in n]
        stack_file.write_text(original)
        project.up().check()
        assert containers_of(STACK) == ranks and [n for n in monitoring_of(STACK) if "prometheus" in n]
    finally:
        stop.set()
        asking.join()
        stack_file.write_text(original)
    assert len(answers) > 10 and [a for a in answers if a is not True] == [], answers[:20]


def _served_certificate(host: str, ca_file: str) -> tuple[str, str]:
    """(openssl s_client's summary, the served certificate's text) from this machine, verified with `ca_file`."""
    import subprocess

    conn = subprocess.run(["openssl", "s_client", "-connect", f"{host}:443", "-CAfile", ca_file, "-showcerts"],
                          input="", capture_output=True, text=True, timeout=30)  # fmt: skip
    cert = subprocess.run(["openssl", "x509", "-noout", "-subject", "-issuer", "-serial", "-ext", "subjectAltName"],
                          input=conn.stdout, capture_output=True, text=True, timeout=30)  # fmt: skip
    return conn.stdout, cert.stdout


def test_the_front_door_serves_https_and_its_routes_only_and_a_new_certificate_restarts_nothing(up, project, tmp_path):
    """frontDoor.enabled on the serving stack: one `up` puts nginx on spark1's 443 in front of the head, restarting
    no rank; the client config's https endpoint answers (plain and streamed) with the stack's CA and is refused with
    the system's; TLS 1.3 and a certificate naming the head's address, from the stack's CA; SGLang's admin routes get
    403/404 at the door; from outside, ssh and 443 answer, nothing else (8888 is an inner port now). Then a new
    certificate (certificate.validityDays changed: a new period, what a renewal is) through `up` while a client asks
    all along: every request answered, no rank and not the door's container replaced, the new certificate served."""
    import threading

    import httpx
    import openai
    import yaml

    from e2e import exposure
    from sim import outsider

    host = at("172.30.99.11")
    ranks, revision = containers_of(STACK), project.outputs()["group_revision"]
    stack_file = project.work_dir / f"Pulumi.{STACK}.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    doc["config"]["deepseek-spark:cluster"]["frontDoor"] = {"enabled": True}
    stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    preview = project.preview().check()
    assert f"front door: https://{host}/v1 on spark1 (nginx, TLS 1.2+)" in preview.text, preview.text[-3000:]
    project.timed("sim: front door on", project.up()).check()
    out = project.outputs()
    assert out["endpoint"] == f"https://{host}/v1" and out["group_revision"] == revision
    assert {k: v for k, v in containers_of(STACK).items() if k in ranks} == ranks
    door = containers_of(STACK, roles=("frontdoor",))
    assert list(door) == ["sim-frontdoor"]

    env = client_env(project, tmp_path)
    assert env["OPENAI_BASE_URL"] == out["endpoint"] and Path(env["SSL_CERT_FILE"]).read_text() == out["front_door"]["ca_pem"]
    assert "42" in ask(env)
    client, model = openai_client(env)
    chunks = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 19 + 23?"}],
                                            max_tokens=32, stream=True)  # fmt: skip
    assert "42" in "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    system_only = openai.OpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0,
                                http_client=httpx.Client(verify=True, timeout=10))  # fmt: skip
    with pytest.raises(openai.APIConnectionError):
        system_only.models.list()
    summary, cert = _served_certificate(host, env["SSL_CERT_FILE"])
    assert "New, TLSv1.3, Cipher is" in summary and "Verify return code: 0 (ok)" in summary, summary[-1500:]
    assert f"IP Address:{host}" in cert and "DNS:spark1" in cert and "deepseek-spark CA of stack sim" in cert, cert
    key = {"Authorization": f"Bearer {env['OPENAI_API_KEY']}"}
    for method, path in (("POST", "/flush_cache"), ("GET", "/server_info"), ("POST", "/update_weights_from_disk"),
                         ("GET", "/get_model_info"), ("GET", "/metrics"), ("GET", "/health_generate")):  # fmt: skip
        status = httpx.request(method, f"https://{host}{path}", headers=key, verify=env["SSL_CERT_FILE"]).status_code
        assert status in (403, 404), (path, status)
    exposure.check_closed(CLUSTER, STACK, out)
    assert outsider.http(CLUSTER, "GET", f"http://{host}:8888/health")[0] == 0  # the head's port: an inner one now

    before = cert
    answers: list = []
    stop = threading.Event()
    asking = threading.Thread(target=ask_all_along, args=(env, answers, stop))
    asking.start()
    try:
        doc["config"]["deepseek-spark:cluster"]["frontDoor"]["certificate"] = {"validityDays": 60}
        stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        project.timed("sim: front door, a new certificate", project.up()).check()
    finally:
        stop.set()
        asking.join()
    assert len(answers) > 5 and [a for a in answers if a is not True] == [], answers[:20]
    assert containers_of(STACK, roles=("frontdoor",)) == door
    assert {k: v for k, v in containers_of(STACK).items() if k in ranks} == ranks
    _, after = _served_certificate(host, env["SSL_CERT_FILE"])
    assert after != before and "deepseek-spark CA of stack sim" in after
    summary = resources_summary(project.up().check().text)  # and it stays: the next `up` changes nothing
    assert "unchanged" in summary and not any(w in summary for w in ("created", "updated", "replaced", "deleted"))


def test_what_the_front_door_adds_to_a_request(up, project, tmp_path):
    """Benchmark (numbers printed, nothing timed asserted): the same streamed chat request through the door (https,
    the stack's CA) and straight to the head's port (this machine is one of firewall.scrapers, which reach it), 16
    streams at once, 10 requests each, on kept-alive connections: p50 and p99 of the whole request and of its first
    token; then a new connection's cost (TCP, and TLS through the door) for GET /health, sequentially."""
    import ssl
    import statistics
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    env = client_env(project, tmp_path)
    door, straight = env["OPENAI_BASE_URL"], f"http://{at('172.30.99.11')}:8888/v1"
    ctx = ssl.create_default_context(cafile=env["SSL_CERT_FILE"])
    body = {"model": env["OPENAI_MODEL"], "messages": [{"role": "user", "content": "What is 19 + 23?"}],
            "max_tokens": 16, "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {env['OPENAI_API_KEY']}"}

    def stream(base: str) -> list[tuple[float, float]]:
        out = []
        with httpx.Client(verify=ctx, timeout=60) as c:
            for _ in range(10):
                t0 = time.perf_counter()
                first = None
                with c.stream("POST", base + "/chat/completions", json=body, headers=headers) as r:
                    assert r.status_code == 200
                    for line in r.iter_lines():
                        if first is None and line.startswith("data:"):
                            first = time.perf_counter() - t0
                out.append((time.perf_counter() - t0, first))
        return out

    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000

    figures = {}
    for name, base in (("door", door), ("straight", straight)):
        with ThreadPoolExecutor(16) as pool:
            runs = [t for ts in pool.map(lambda _: stream(base), range(16)) for t in ts]
        total, first = [t for t, _ in runs], [f for _, f in runs]
        figures[name] = (pct(total, 0.5), pct(total, 0.99), pct(first, 0.5), pct(first, 0.99))

    def connect_ms(url: str) -> float:
        times = []
        for _ in range(30):
            t0 = time.perf_counter()
            with httpx.Client(verify=ctx, timeout=10) as c:
                assert c.get(url).status_code == 200
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)

    new_tls, new_tcp = connect_ms(door.removesuffix("/v1") + "/health"), connect_ms(straight.removesuffix("/v1") + "/health")
    (dp50, dp99, df50, df99), (sp50, sp99, sf50, sf99) = figures["door"], figures["straight"]
    for label, value in (("request p50", dp50 - sp50), ("request p99", dp99 - sp99), ("first token p50", df50 - sf50),
                         ("first token p99", df99 - sf99), ("new connection (TLS vs TCP)", new_tls - new_tcp)):
        TIMINGS[f"sim: the front door adds to {label}, ms"] = value
    print(f"\nfront door, 16 streams x 10: request p50 {dp50:.1f} ms / p99 {dp99:.1f} ms (straight {sp50:.1f} / "
          f"{sp99:.1f}); first token p50 {df50:.1f} / p99 {df99:.1f} ms (straight {sf50:.1f} / {sf99:.1f}); "
          f"a new connection + GET /health: {new_tls:.1f} ms with TLS, {new_tcp:.1f} ms plain (medians of 30)")


def test_destroy_keeps_the_checkpoint_the_shards_and_the_compile_caches(up, project):
    shards = shard_mtimes()
    project.timed("sim: destroy", project.destroy()).check()
    assert containers_of(STACK) == {} and monitoring_of(STACK) == {}
    assert "sim-prometheus" in node_sh("spark1", "docker volume ls --format '{{.Name}}'").split()  # keepData
    node_sh("spark1", "docker volume rm sim-prometheus")  # the next scenario starts from a fresh node
    for node in NODES:
        volumes = node_sh(node, "docker volume ls --format '{{.Name}}'").split()
        assert "sim-checkpoint" not in volumes
        assert [v for v in volumes if v.startswith("sim-compile-cache-")], f"{node}: the compile cache went"
        assert node_sh(node, "ls /srv/models/DS4.1 | grep -c safetensors").strip() == "4"
    assert node_sh("spark1", "ls /var/lib/deepseek-spark-rotated/sim/ 2>/dev/null | wc -l").strip() == "0"
    assert shard_mtimes() == shards
    no_secret_in_what_the_scenario_showed(project)


def no_secret_in_what_the_scenario_showed(project) -> None:
    """Every API key the scenario used (the first and the one test_engine_sim rotated to) is absent from all
    it printed and from the engine's event logs, which hold every line the commands wrote (the command
    plugin streams them, as pulumi-command does): keys reach nodes on stdin and the probe through its
    environment only."""
    events = project.event_texts()
    streamed = [e for text in events for line in text.splitlines() if line.strip()
                for e in [json.loads(line)] if (e.get("diagnosticEvent") or {}).get("ephemeral")]  # fmt: skip
    # the logs are not empty: the memory gates' and the probes' lines are there
    assert any("MiB available, plan needs" in json.dumps(e) for e in streamed), "no command output in the event log"
    keys = [project.api_key, "sk-e2e-rotated-" + "5" * 24, *([project.webhook] if project.webhook else [])]
    for key in keys:
        for where, text in [*(("output", t) for t in project.transcript), *(("event log", t) for t in events)]:
            assert key not in text and key[7:23] not in text, f"an API key in the scenario's {where}"
