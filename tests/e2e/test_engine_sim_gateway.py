"""Team access: the stack `sim-team` (sim-tp2's vLLM group, the vllm-sim TEST DOUBLE) behind the team
gateway, REAL LiteLLM 1.110.2 and PostgreSQL 15 in containers on the head, through the real Pulumi engine.

preview -> up -> members answer with their own keys (env files from `dspark.clients --member`), wrong,
missing and internal keys get 401 from the gateway, and a member's key gets 401 from the engine -> what the
gateway adds to a request (printed) -> a member past their token budget, another past their rate limit, get
429 -> bob is revoked by a config change whose preview replaces nothing,
and gets 401 within moments of the database's revocation while alice keeps streaming -> usage per member
on the gateway's /metrics -> the stack's Prometheus scrapes every target, carol's used budget raises the alert naming
her -> a gateway restart keeps keys and usage (and `dspark status` shows them) -> a power cut
of both nodes: everything back by itself, keys, revocation and usage intact -> no-op up -> destroy keeps the
gateway's database volume.
"""

import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from dspark import dashboard
from e2e import exposure, observing
from e2e.conftest import (
    CLUSTER, ask, at, containers_of, dspark, monitoring_of, node_sh, openai_client, read_diagnose, resources_summary, secret_forms,
)  # fmt: skip
from e2e.timings import TIMINGS

pytestmark = pytest.mark.e2e
STACK = "sim-team"
SIM_NODES = 2
NODES = ("spark1", "spark2")
GATEWAY, DB = "sim-team-gateway", "sim-team-gateway-db"
PROMPT = [{"role": "user", "content": "What is 19 + 23?"}]


def member_env(project, tmp_path, member: str) -> dict[str, str]:
    """`python -m dspark.clients --stack sim-team --member NAME --format openai-env`: that member's file."""
    out = tmp_path / f"{member}.env"
    proc = subprocess.run([sys.executable, "-m", "dspark.clients", "--stack", STACK, "--member", member, "--format",
                           "openai-env", "--out", str(out)], cwd=project.work_dir, env=project.env,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in out.read_text().splitlines() if line and not line.startswith("#"))


def answer_of(base_url: str, key: str | None, model: str = "deepseek-v4.1-flash") -> tuple[int, str, str | None]:
    """One chat completion: the HTTP status, the body and the Retry-After header."""
    body = json.dumps({"model": model, "messages": PROMPT, "max_tokens": 8}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(base_url + "/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode(), resp.headers.get("Retry-After")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers.get("Retry-After")


def status_of(base_url: str, key: str | None, model: str = "deepseek-v4.1-flash") -> int:
    return answer_of(base_url, key, model)[0]


def metrics(url: str, key: str) -> dict[tuple[str, ...], float]:
    """The gateway's dspark_gateway_* series, read with the metrics key."""
    req = urllib.request.Request(url.removesuffix("/v1") + "/metrics/", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"/metrics/ answered {exc.code}") from None
    out = {}
    for line in text.splitlines():
        if line.startswith("dspark_gateway_") and "{" in line:
            name, rest = line.split("{", 1)
            labels, value = rest.rsplit("} ", 1)
            out[(name, *sorted(labels.split(",")))] = float(value)
    return out


def requests_of(series: dict, member: str) -> float:
    return series.get(("dspark_gateway_requests_total", f'member="{member}"', 'status="success"'), 0)


def admin(cmd: str) -> str:
    return node_sh("spark1", f"docker exec {GATEWAY} python3 /etc/dspark-gateway/gateway_admin.py {cmd}")


def wait_ready(url: str, key: str, seconds: float = 120) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            if status_of(url, key) == 200:
                return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"the gateway did not answer within {seconds} s")


@pytest.fixture(scope="module")
def first(project, tmp_path_factory):
    preview = project.timed("sim-team: preview --diff (policy pack)", project.preview()).check()
    t0 = time.monotonic()
    project.up().check()
    TIMINGS["sim-team: first up (gateway ready)"] = time.monotonic() - t0
    tmp = tmp_path_factory.mktemp("members")
    outputs = project.outputs()
    envs = {m: member_env(project, tmp, m) for m in ("alice", "bob", "carol", "dave")}
    return preview, outputs, envs["alice"], envs["bob"], envs


def test_two_members_answer_through_the_gateway_with_their_own_keys(first, project):
    preview, outputs, alice, bob, _ = first
    assert "to create" in resources_summary(preview.text)
    assert outputs["endpoint"] == at("http://172.30.99.11:4000/v1") == alice["OPENAI_BASE_URL"] == bob["OPENAI_BASE_URL"]
    assert alice["OPENAI_API_KEY"] != bob["OPENAI_API_KEY"] != project.api_key
    for env in (alice, bob):
        client, model = openai_client(env)
        answer = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=32)
        assert "42" in answer.choices[0].message.content
        stream = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=32, stream=True)
        assert "42" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert json.loads(admin("keys")) == {"alice": "active", "bob": "active", "carol": "active", "dave": "active"}
    gw = outputs["gateway"]
    assert gw["node"] == "spark1" and gw["members"] == ["alice", "bob", "carol", "dave"]
    assert "client_config" not in outputs
    assert outputs["admin_config"]["api_key"] == gw["admin_key"] not in (alice["OPENAI_API_KEY"], bob["OPENAI_API_KEY"])


def test_wrong_missing_and_internal_keys_get_401_and_a_member_key_never_reaches_a_rank(first, project):
    _, outputs, alice, _, _ = first
    url = outputs["endpoint"]
    assert status_of(url, None) == 401
    assert status_of(url, "sk-wrong-" + "x" * 40) == 401
    assert status_of(url, project.api_key) == 401  # the internal key is the gateway's, not a client's
    upstream = outputs["gateway"]["upstream"]
    assert status_of(upstream, alice["OPENAI_API_KEY"]) == 401  # the engine knows only the internal key
    bad, model = openai_client(alice, key="sk-wrong-" + "x" * 40)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=model, messages=PROMPT, max_tokens=8)
    # the gateway's secrets are in a 0600 file, not in the containers' environment
    env = node_sh("spark1", f"docker inspect --format '{{{{json .Config.Env}}}}' {GATEWAY} {DB}")
    assert project.api_key not in env and alice["OPENAI_API_KEY"] not in env and outputs["gateway"]["admin_key"] not in env


def test_what_the_gateway_adds_to_a_request(first, project):
    """Benchmark (numbers printed, nothing timed asserted): the same request through the gateway with a member's
    key and straight to the engine with the internal key, sequentially."""
    _, outputs, alice, _, _ = first
    key, url, upstream = alice["OPENAI_API_KEY"], outputs["endpoint"], outputs["gateway"]["upstream"]

    def median_ms(base, k, n=30):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            assert status_of(base, k) == 200
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)

    via, direct = median_ms(url, key), median_ms(upstream, project.api_key)
    TIMINGS["sim-team: request via gateway, median ms"] = via
    TIMINGS["sim-team: request to the engine, median ms"] = direct
    TIMINGS["sim-team: gateway adds, median ms"] = via - direct
    print(f"\ngateway: {via:.1f} ms median, engine direct: {direct:.1f} ms, the gateway adds {via - direct:.1f} ms")


def test_a_member_past_their_token_budget_or_rate_limit_gets_429_and_the_others_do_not(first):
    """carol: tokenBudget 60 a day, counted by the gateway's hook from the usage table; dave: rpmLimit 2,
    enforced by LiteLLM. Each answers until the limit, then 429 with a message saying which limit."""
    _, outputs, alice, _, envs = first
    url, carol, dave = outputs["endpoint"], envs["carol"]["OPENAI_API_KEY"], envs["dave"]["OPENAI_API_KEY"]
    answers = []
    for _ in range(40):  # a day's budget of 60 tokens: a few requests of ~20 tokens each
        answers.append(answer_of(url, carol))
        if answers[-1][0] != 200:
            break
    codes = [c for c, _, _ in answers]
    assert codes[0] == 200 and codes[-1] == 429 and set(codes[:-1]) == {200}, answers
    assert "token budget is used" in answers[-1][1] and "of 60 tokens this day" in answers[-1][1], answers[-1]
    assert 0 < int(answers[-1][2]) <= 86400  # Retry-After: seconds until the day ends (UTC)
    used = json.loads(admin("usage"))["carol"]
    assert used["prompt_tokens"] + used["completion_tokens"] >= 60
    assert status_of(url, carol) == 429  # it stays refused (until the day ends)
    print(f"\ncarol: {codes.count(200)} answers, then 429 at {used['prompt_tokens'] + used['completion_tokens']} tokens")

    dave_codes = [status_of(url, dave) for _ in range(6)]  # LiteLLM's window is a minute: at most 2 per window
    assert dave_codes[:2] == [200, 200] and 429 in dave_codes and dave_codes.count(200) <= 4, dave_codes
    assert status_of(url, alice["OPENAI_API_KEY"]) == 200  # one member's limit is theirs alone


def test_prometheus_scrapes_every_target_and_a_member_past_the_budget_raises_the_alert_naming_them(
        first, project, alert_sink):  # fmt: skip
    """The stack's REAL Prometheus reads the gateway with its metrics key and sees every target up; carol's budget,
    used up above, reaches the webhook naming her; every dashboard panel reads data."""
    _, outputs, _, _, _ = first
    prom = observing.prometheus(outputs, CLUSTER)
    t0 = time.time()
    up = observing.wait_every_target_up(prom, outputs)
    assert {s["metric"]["role"] for s in up} == {"engine", "guard", "gateway", "node"}
    observing.record_scrape_costs(prom, STACK)
    hit = alert_sink.wait(lambda r: r.status == "firing" and r.labels.get("alertname") == "DsparkMemberBudgetUsed"
                          and r.labels.get("stack") == STACK, t0 - 600, 60, "member-budget alert")  # fmt: skip
    assert hit.labels["member"] == "carol" and hit.labels["period"] == "day", hit.labels
    assert "carol used their token budget for this day" in hit.annotations["summary"], hit.annotations
    TIMINGS["alert: carol's budget used, to the webhook (after Prometheus is up)"] = max(0.0, hit.at - t0)
    observing.wait_panels(prom, dashboard.dashboard(outputs["prometheus"]["scrape_configs"], STACK))


def test_revoking_bob_replaces_nothing_and_his_key_fails_at_once_while_alice_streams(first, project):
    _, outputs, alice, bob, _ = first
    url = outputs["endpoint"]
    before = containers_of(STACK, NODES)
    project.cli("config", "rm", "--path", "deepseek-spark:cluster.gateway.members[1]").check()
    preview = project.preview().check()
    summary = resources_summary(preview.text)
    assert "2 to delete" in summary and "to replace" not in summary and "to update" not in summary, summary
    assert "sim-team-gateway-member-bob" in preview.text and "sim-team-gateway-key-bob" in preview.text

    stop, alice_results, bob_401_at = threading.Event(), [], []

    def alice_streams():
        client, model = openai_client(alice)
        while not stop.is_set():
            try:
                stream = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=32, stream=True)
                alice_results.append("42" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices))
            except openai.OpenAIError as exc:
                alice_results.append(repr(exc))

    def bob_polls():
        while not stop.is_set() and not bob_401_at:
            if status_of(url, bob["OPENAI_API_KEY"]) == 401:
                bob_401_at.append(time.time())
            time.sleep(0.05)

    threads = [threading.Thread(target=alice_streams), threading.Thread(target=bob_polls)]
    for t in threads:
        t.start()
    try:
        run = project.timed("sim-team: up revoking bob", project.up()).check()
        deadline = time.monotonic() + 10
        while not bob_401_at and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert "2 deleted" in resources_summary(run.text) and "replaced" not in resources_summary(run.text)
    assert containers_of(STACK, NODES) == before  # no rank, no gateway container was replaced
    assert bob_401_at, "bob's key still answered 10 s after the up that revoked it"
    revoked_at = float(node_sh("spark1", f"docker exec {DB} runuser -u postgres -- psql -h /tmp -p 5433 -d dspark -tAc "
                                         "\"SELECT extract(epoch FROM revoked_at) FROM dspark_keys WHERE member = 'bob'\"").strip())  # fmt: skip
    TIMINGS["sim-team: revocation commit to first 401, ms"] = (bob_401_at[0] - revoked_at) * 1000
    print(f"\nrevocation: first 401 {1000 * (bob_401_at[0] - revoked_at):.0f} ms after the database's revocation")
    assert alice_results and all(r is True for r in alice_results), alice_results
    TIMINGS["sim-team: alice's streams during the revoking up"] = len(alice_results)
    assert status_of(url, bob["OPENAI_API_KEY"]) == 401 and status_of(url, alice["OPENAI_API_KEY"]) == 200
    assert json.loads(admin("keys")) == {"alice": "active", "bob": "revoked", "carol": "active", "dave": "active"}


def test_usage_per_member_is_scraped_and_survives_a_gateway_restart(first, project):
    _, outputs, alice, bob, _ = first
    url, metrics_key = outputs["endpoint"], project.outputs()["gateway"]["metrics_key"]
    before = metrics(url, metrics_key)
    assert requests_of(before, "alice") >= 30 and requests_of(before, "bob") >= 2, before
    assert before[("dspark_gateway_tokens_total", 'kind="completion"', 'member="alice"')] > 0
    assert before.get(("dspark_gateway_rejected_total", 'reason="invalid_or_revoked"'), 0) >= 1, before
    assert before.get(("dspark_gateway_rejected_total", 'reason="token_budget"'), 0) >= 2, before
    with pytest.raises(AssertionError):
        metrics(url, alice["OPENAI_API_KEY"])  # a member's key cannot read /metrics
    usage = json.loads(admin("usage"))
    assert usage["alice"]["requests"] == requests_of(before, "alice") + usage["alice"]["failures"]

    t0 = time.monotonic()
    node_sh("spark1", f"docker restart {DB} {GATEWAY}")
    TIMINGS["sim-team: gateway restart to first answer"] = wait_ready(url, alice["OPENAI_API_KEY"]) + time.monotonic() - t0
    assert status_of(url, bob["OPENAI_API_KEY"]) == 401  # the revocation survived
    after = metrics(url, metrics_key)
    assert requests_of(after, "alice") >= requests_of(before, "alice") + 1  # counted from the database, plus one
    assert requests_of(after, "bob") == requests_of(before, "bob")

    # `dspark status`: the group healthy, the gateway running and ready, each member's key state and usage
    proc = subprocess.run([sys.executable, "-m", "dspark", "status", "--stack", STACK, "--json"], cwd=project.work_dir,
                          env=project.env, capture_output=True, text=True)  # fmt: skip
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0 and doc["verdict"] == "healthy", (doc["problems"], proc.stderr)
    gw, usage = doc["gateway"], json.loads(admin("usage"))
    assert gw["containers"] == {GATEWAY: "running", DB: "running"} and gw["readiness"]["status"] == 200
    assert {m: u["key"] for m, u in gw["members"].items()} == {"admin": "admin key", "alice": "active", "bob": "revoked",
                                                               "carol": "active", "dave": "active"}  # fmt: skip
    assert gw["members"]["admin"]["requests"] >= 1  # the readiness probe's, with the admin key
    assert gw["members"]["alice"]["requests"] == usage["alice"]["requests"]


def test_after_a_power_cut_the_gateway_and_the_group_come_back_with_keys_revocation_and_usage(first, project):
    """Both nodes lose power at once. Docker brings the gateway and its database back (restart policy), the
    guard restarts the vLLM group; nobody runs a command. Every member's key state, bob's revocation and the
    usage records are what they were: they live in the database's volume."""
    from e2e import healing
    from sim import faults

    _, outputs, alice, bob, _ = first
    url, metrics_key = outputs["endpoint"], project.outputs()["gateway"]["metrics_key"]
    keys, usage = json.loads(admin("keys")), json.loads(admin("usage"))
    before = metrics(url, metrics_key)

    def power_cut():
        faults.power_cut(CLUSTER, log=lambda m: None)
        time.sleep(2)
        faults.power_on(CLUSTER, log=lambda m: None)

    healing.timed_heal("sim-team: power cut (gateway, database, vLLM + Ray)", at("http://172.30.99.11:9850"), power_cut,
                       lambda: answer_of(url, alice["OPENAI_API_KEY"])[1], ("rank-exited", "node-lost"))  # fmt: skip
    assert json.loads(admin("keys")) == keys
    assert status_of(url, bob["OPENAI_API_KEY"]) == 401 and status_of(url, alice["OPENAI_API_KEY"]) == 200
    after_usage = json.loads(admin("usage"))
    for member, row in usage.items():
        assert after_usage[member]["requests"] >= row["requests"], (member, row, after_usage[member])
    after = metrics(url, metrics_key)
    assert requests_of(after, "alice") > requests_of(before, "alice") and requests_of(after, "bob") == requests_of(before, "bob")
    preview = project.preview(policy_pack=False).check()
    assert "unchanged" in resources_summary(preview.text) and "to replace" not in preview.text


def test_diagnose_holds_the_gateway_and_none_of_its_secrets(first, project, tmp_path):
    """Every secret of the team stack, the gateway's database password too (only the state holds it), is in no form
    in the support file."""
    code, text = dspark(project, "diagnose", "--out", str(tmp_path / "d.tar.gz"))
    assert code == 0, text
    m = read_diagnose(tmp_path / "d.tar.gz")
    assert "logs/gateway-spark1.log" in m and "logs/gateway-db-spark1.log" in m, list(m)
    outs = project.outputs()
    state = json.loads(project.cli("stack", "export", "--show-secrets").check().text)
    db = next(json.loads(r["outputs"]["stdout"]["plaintext"]).strip() if isinstance(r["outputs"]["stdout"], dict)
              else r["outputs"]["stdout"].strip() for r in state["deployment"]["resources"]
              if r["urn"].endswith("::sim-team-gateway-db-password"))  # fmt: skip
    blob = "\n".join(m.values())
    for secret in (project.api_key, project.webhook, outs["gateway"]["admin_key"], outs["gateway"]["metrics_key"], db,
                   *(c["api_key"] for c in outs["member_configs"].values())):  # fmt: skip
        assert not any(form in blob for form in secret_forms(secret)), "a secret of the team stack in the support file"
    assert json.loads(m["diagnose.json"])["redaction"]["gateway-db-password"]["values_known"] == 1


def test_from_outside_only_ssh_and_the_gateway_answer_and_no_host_joins_ray(first, project):
    """From a host on the management network that belongs to no stack: ssh on both nodes and the gateway on
    spark1, nothing else: vLLM's own port (with /invocations, which its key does not guard) and Ray's are the
    stack's own, so member keys, revocation and budgets cannot be walked around; no host joins Ray."""
    from sim import outsider

    outputs = project.outputs()
    exposure.check_closed(CLUSTER, STACK, outputs)
    chat = '{"model": "%s", "messages": [{"role": "user", "content": "What is 19 + 23?"}]}' % outputs["model"]
    assert outsider.http(CLUSTER, "POST", at("http://172.30.99.11:8000/invocations"), chat)[0] == 0
    code, text = outsider.ray_join(CLUSTER, at("172.30.99.11:6379"))
    assert "Ray runtime started" not in text, text


def test_second_up_changes_nothing(first, project):
    before = containers_of(STACK, NODES)
    run = project.timed("sim-team: no-op up", project.up()).check()
    summary = resources_summary(run.text)
    assert "unchanged" in summary and not any(w in summary for w in ("created", "updated", "replaced", "deleted"))
    assert containers_of(STACK, NODES) == before


def test_behind_the_front_door_members_reach_the_gateway_over_https_and_its_admin_api_is_closed(first, project,
                                                                                                   tmp_path):  # fmt: skip
    """frontDoor.enabled on the team stack: one `up` restarts neither rank nor the gateway; each member's config
    is the door's https endpoint with the stack's CA, and their own key answers through it (a revoked or missing
    key still gets 401 from the gateway behind); LiteLLM's admin and metrics routes get 404 at the door; from
    outside only ssh and 443 answer (port 4000 is an inner one)."""
    import httpx
    import yaml

    from sim import outsider

    before = containers_of(STACK, NODES)
    stack_file = project.work_dir / f"Pulumi.{STACK}.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    doc["config"]["deepseek-spark:cluster"]["frontDoor"] = {"enabled": True}
    stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    project.timed("sim-team: front door on", project.up()).check()
    assert {k: v for k, v in containers_of(STACK, NODES).items() if k in before} == before
    out = project.outputs()
    host = at("172.30.99.11")
    alice = member_env(project, tmp_path, "alice")
    assert alice["OPENAI_BASE_URL"] == out["endpoint"] == f"https://{host}/v1" and alice["SSL_CERT_FILE"]
    assert "42" in ask(alice)
    ca = alice["SSL_CERT_FILE"]
    chat = {"model": out["model"], "messages": PROMPT, "max_tokens": 8}
    assert httpx.post(f"https://{host}/v1/chat/completions", json=chat, verify=ca).status_code == 401
    admin = {"Authorization": f"Bearer {out['gateway']['admin_key']}"}
    for method, path in (("POST", "/key/generate"), ("GET", "/key/list"), ("GET", "/user/list"), ("GET", "/metrics"),
                         ("GET", "/health/readiness"), ("POST", "/config/update"), ("GET", "/spend/logs")):  # fmt: skip
        status = httpx.request(method, f"https://{host}{path}", headers=admin, verify=ca, timeout=10).status_code
        assert status in (403, 404), (path, status)
    exposure.check_closed(CLUSTER, STACK, out)
    assert outsider.http(CLUSTER, "GET", f"http://{host}:4000/health/readiness")[0] == 0


def test_destroy_keeps_the_gateways_database(first, project):
    project.destroy().check()
    assert containers_of(STACK, NODES) == {} and monitoring_of(STACK, NODES) == {}
    volumes = node_sh("spark1", "docker volume ls --format '{{.Name}}'").split()
    assert DB in volumes and "sim-team-prometheus" in volumes  # keepData (both)
    node_sh("spark1", f"docker volume rm {DB} sim-team-prometheus")  # the next scenario starts from a fresh node
