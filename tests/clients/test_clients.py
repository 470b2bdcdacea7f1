"""dspark/clients.py: client configs from the stack outputs, checked with the real clients.

- the outputs are the ones the program exports (client_config, as a secret), read back the way
  `pulumi stack output --json --show-secrets` prints them;
- the env file is sourced by sh and used by the real `openai` SDK, the LiteLLM config is loaded
  and routed by LiteLLM's own Router (what its proxy builds from `model_list`), and the curl example
  runs: all three against a stand-in OpenAI endpoint on 127.0.0.1 that records every request.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from dspark import clients
from components.cluster import client_config
from harness import TEST_API_KEY, Secret, reveal, run_program

ROOT = Path(__file__).resolve().parents[2]
MODEL = "deepseek-v4.1-flash"


class StandIn:
    """A stand-in OpenAI-compatible endpoint: answers chat completions, records what it was sent."""

    def __init__(self, api_key: str):
        self.api_key = api_key
        self.requests: list[dict] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stand_in.requests.append(
                    {"path": self.path, "authorization": self.headers.get("Authorization"), "body": json.loads(body or b"{}")}
                )
                if self.headers.get("Authorization") != f"Bearer {stand_in.api_key}":
                    return self._send(401, {"error": {"message": "invalid api key", "type": "auth_error"}})
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                model = json.loads(body)["model"]
                self._send(200, {
                    "id": "chatcmpl-standin", "object": "chat.completion", "created": 1_700_000_000, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
                })  # fmt: skip

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in():
    with StandIn(TEST_API_KEY) as s:
        yield s


def saved_outputs(endpoint: str, api_key: str = TEST_API_KEY) -> dict:
    """Outputs as `pulumi stack output --json --show-secrets` prints them, with the real client_config shape."""
    return {
        "endpoint": endpoint,
        "model": MODEL,
        "api_key": api_key,
        "client_config": client_config(endpoint, MODEL, api_key),
        "group_revision": "06117d11d0cb40f7",
    }


def clean_env(**extra: str) -> dict[str, str]:
    """A child environment without any OPENAI_*/proxy settings of the machine running the tests."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("OPENAI_", "LITELLM_"))
           and "PROXY" not in k.upper()}  # fmt: skip
    env.update(NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(ROOT), **extra)
    return env


def run_cli(tmp_path: Path, outputs: dict, *args: str) -> subprocess.CompletedProcess:
    saved = tmp_path / "outputs.json"
    saved.write_text(json.dumps(outputs))
    return subprocess.run(
        [sys.executable, "-m", "dspark.clients", "--outputs-file", str(saved), *args],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ----------------------------------------------------------------------------------------- outputs


def test_the_programs_outputs_make_a_client():
    rec = run_program("tp4")
    assert isinstance(rec.outputs["client_config"], Secret)  # exported as a secret
    outputs = reveal(rec.outputs)
    c = clients.client_from_outputs(outputs, "tp4")
    assert (c.base_url, c.api_key, c.model) == ("http://10.0.0.1:8888/v1", TEST_API_KEY, MODEL)
    assert c.chat_completions_url == "http://10.0.0.1:8888/v1/chat/completions"
    fallback = {k: v for k, v in outputs.items() if k != "client_config"}
    assert clients.client_from_outputs(fallback) == clients.Client("http://10.0.0.1:8888/v1", TEST_API_KEY, MODEL)


def test_a_member_gets_their_own_key_and_the_gateways_endpoint():
    keys = {f"sim-team-gateway-key-{m}": f"sk-{m}-" + m[0] * 40 for m in ("alice", "bob", "carol", "dave")}
    outputs = reveal(run_program("sim-team", command_stdout=keys).outputs)
    alice = clients.client_from_outputs(outputs, "sim-team", member="alice")
    assert (alice.base_url, alice.api_key) == ("http://172.30.99.11:4000/v1", "sk-alice-" + "a" * 40)
    assert clients.client_from_outputs(outputs, member="bob").api_key == "sk-bob-" + "b" * 40
    with pytest.raises(clients.ClientConfigError, match="no member 'erin'.*members: alice, bob, carol, dave"):
        clients.client_from_outputs(outputs, member="erin")
    with pytest.raises(clients.ClientConfigError, match="--show-secrets"):
        clients.client_from_outputs({**outputs, "member_configs": "[secret]"}, member="alice")


def test_a_gateway_stack_hands_no_one_the_admin_key_unasked(capsys, tmp_path):
    # without --member the one-line client of the README gave the gateway's master key; now it names the choice
    keys = {f"sim-team-gateway-key-{m}": f"sk-{m}-" + m[0] * 40 for m in ("alice", "bob", "carol", "dave")}
    keys["sim-team-gateway-admin-key"] = "sk-admin-" + "c" * 40
    outputs = reveal(run_program("sim-team", command_stdout=keys).outputs)
    with pytest.raises(clients.ClientConfigError, match="--member NAME.*members: alice, bob, carol, dave.*--admin"):
        clients.client_from_outputs(outputs, "sim-team")
    assert clients.client_from_outputs(outputs, admin=True).api_key == "sk-admin-" + "c" * 40
    assert clients.operator_client(outputs).api_key == "sk-admin-" + "c" * 40  # smoke and bench: the operator's
    assert outputs["api_key"] not in (clients.client_from_outputs(outputs, member="dave").api_key,)
    (tmp_path / "o.json").write_text(json.dumps(outputs))
    assert clients.main(["--outputs-file", str(tmp_path / "o.json"), "--format", "openai-env"]) == 1
    out, err = capsys.readouterr()
    assert "sk-admin-" not in out + err and "--member" in err
    single = reveal(run_program("sim").outputs)
    with pytest.raises(clients.ClientConfigError, match="no gateway"):
        clients.client_from_outputs(single, admin=True)


@pytest.mark.parametrize(
    "outputs, message",
    [
        ({"endpoint": "http://h:1/v1", "model": "m", "api_key": "[secret]"}, "--show-secrets"),
        ({"client_config": {"base_url": "http://h:1/v1", "api_key": "[secret]", "model": "m"}}, "--show-secrets"),
        ({"endpoint": "http://h:1/v1", "model": "m"}, "no api_key"),
        ({"model": "m", "api_key": "k"}, "run `pulumi up` first"),
        ({"endpoint": "h:1/v1", "model": "m", "api_key": "k"}, "not an http(s) URL"),
    ],
)
def test_unusable_outputs_are_explained(outputs, message):
    with pytest.raises(clients.ClientConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        clients.client_from_outputs(outputs)


# ------------------------------------------------------------------------------------------ render


def test_renderers_carry_endpoint_key_and_model():
    c = clients.Client("http://10.0.0.1:8888/v1", TEST_API_KEY, MODEL, "tp4")
    env = clients.render_openai_env(c)
    assert f"OPENAI_BASE_URL=http://10.0.0.1:8888/v1\nOPENAI_API_KEY={TEST_API_KEY}\nOPENAI_MODEL={MODEL}\n" in env
    lite = yaml.safe_load(clients.render_litellm(c))
    assert lite == clients.litellm_config(c) == {
        "model_list": [{"model_name": MODEL, "litellm_params": {
            "model": f"openai/{MODEL}", "api_base": "http://10.0.0.1:8888/v1", "api_key": TEST_API_KEY}}]
    }  # fmt: skip
    by_env = yaml.safe_load(clients.render_litellm(c, key_env="DSPARK_API_KEY"))
    assert by_env["model_list"][0]["litellm_params"]["api_key"] == "os.environ/DSPARK_API_KEY"
    curl = clients.render_curl(c)
    assert "http://10.0.0.1:8888/v1/chat/completions" in curl and f"key={TEST_API_KEY}" in curl
    assert "curl" in curl and TEST_API_KEY not in curl.split("curl", 1)[1]  # the key never is a curl argument
    assert TEST_API_KEY not in clients.render_curl(c, key_env="K")


def test_env_values_that_need_quoting_are_quoted_and_newlines_refused():
    c = clients.Client("http://h:1/v1", "k$y with space", MODEL)
    assert "OPENAI_API_KEY='k$y with space'\n" in clients.render_openai_env(c)
    with pytest.raises(clients.ClientConfigError):
        clients.render_openai_env(clients.Client("http://h:1/v1", "a\nb", MODEL))


# ------------------------------------------------------------------------------------------- files


def test_files_are_private_from_the_start_and_replace_what_was_there(tmp_path):
    old_umask = os.umask(0)
    try:
        existing = tmp_path / "tp4.env"
        existing.write_text("old")
        existing.chmod(0o644)
        elsewhere = tmp_path / "elsewhere.txt"
        elsewhere.write_text("untouched")
        link = tmp_path / "link.env"
        link.symlink_to(elsewhere)
        clients.write_private(existing, "KEY=1\n")
        clients.write_private(link, "KEY=2\n")
        clients.write_private(tmp_path / "new.env", "KEY=3\n")
    finally:
        os.umask(old_umask)
    assert existing.read_text() == "KEY=1\n" and mode_of(existing) == 0o600
    assert not link.is_symlink() and link.read_text() == "KEY=2\n" and mode_of(link) == 0o600
    assert elsewhere.read_text() == "untouched"
    assert mode_of(tmp_path / "new.env") == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.txt", "link.env", "new.env", "tp4.env"]


def test_the_file_is_created_0600_not_chmodded_afterwards(tmp_path, monkeypatch):
    """Every file that ever exists under the target's name or as its temp file is 0600 when created."""
    created_modes = []
    real_mkstemp = clients.tempfile.mkstemp

    def spy(*args, **kwargs):
        fd, name = real_mkstemp(*args, **kwargs)
        created_modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return fd, name

    monkeypatch.setattr(clients.tempfile, "mkstemp", spy)
    clients.write_private(tmp_path / "k.env", "OPENAI_API_KEY=x\n")
    assert created_modes == [0o600]


def test_cli_reads_the_pulumi_cli_when_there_is_no_saved_file(tmp_path):
    fake = tmp_path / "bin" / "pulumi"
    fake.parent.mkdir()
    log = tmp_path / "argv.json"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        open({str(log)!r}, "w").write(json.dumps(sys.argv[1:]))
        print({json.dumps(saved_outputs("http://10.0.0.1:8888/v1"))!r})
        """))
    fake.chmod(0o755)
    env = clean_env(PATH=f"{fake.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    out = tmp_path / "tp4.env"
    proc = subprocess.run(
        [sys.executable, "-m", "dspark.clients", "--stack", "tp4", "--format", "openai-env", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(log.read_text()) == ["stack", "output", "--json", "--show-secrets", "--stack", "tp4"]
    assert f"OPENAI_API_KEY={TEST_API_KEY}" in out.read_text() and mode_of(out) == 0o600
    assert TEST_API_KEY not in proc.stdout + proc.stderr


def test_cli_without_pulumi_or_a_saved_file_says_what_to_do(tmp_path):
    env = clean_env(PATH=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "dspark.clients", "--stack", "tp4", "--format", "curl"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "--outputs-file" in proc.stderr and "pulumi stack output --json --show-secrets --stack tp4" in proc.stderr


# -------------------------------------------------------------------------------- the real clients


def test_env_file_drives_the_real_openai_client(tmp_path, stand_in):
    env_file = tmp_path / "tp4.env"
    proc = run_cli(tmp_path, saved_outputs(stand_in.base_url), "--format", "openai-env", "--out", str(env_file))
    assert proc.returncode == 0, proc.stderr
    assert mode_of(env_file) == 0o600
    script = textwrap.dedent("""\
        import os
        from openai import OpenAI
        client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
        reply = client.chat.completions.create(
            model=os.environ["OPENAI_MODEL"], messages=[{"role": "user", "content": "What is 19 + 23?"}]
        )
        print(reply.choices[0].message.content)
        """)
    run = subprocess.run(
        ["sh", "-c", 'set -a; . "$1"; set +a; exec "$2" -c "$3"', "sh", str(env_file), sys.executable, script],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "42"
    assert len(stand_in.requests) == 1
    request = stand_in.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["authorization"] == f"Bearer {TEST_API_KEY}"
    assert request["body"]["model"] == MODEL


def test_openai_client_with_a_wrong_key_is_refused_by_the_stand_in(tmp_path, stand_in):
    """The stand-in really checks the key: the same file with another key fails."""
    env_file = tmp_path / "bad.env"
    proc = run_cli(tmp_path, saved_outputs(stand_in.base_url, api_key="sk-wrong-key-000000"), "--format",
                   "openai-env", "--out", str(env_file))  # fmt: skip
    assert proc.returncode == 0
    run = subprocess.run(
        ["sh", "-c", 'set -a; . "$1"; set +a; exec "$2" -c "$3"', "sh", str(env_file), sys.executable,
         "from openai import OpenAI; "
         "OpenAI(max_retries=0).chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'x'}])"],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode != 0 and "401" in run.stderr


LITELLM_SCRIPT = textwrap.dedent("""\
    import sys, yaml
    from litellm import Router
    config = yaml.safe_load(open(sys.argv[1]))           # what `litellm --config` reads
    router = Router(model_list=config["model_list"])     # what the proxy builds from it
    name = config["model_list"][0]["model_name"]
    reply = router.completion(model=name, messages=[{"role": "user", "content": "What is 19 + 23?"}])
    print(reply.choices[0].message.content)
    """)


@pytest.mark.parametrize("key_env", [None, "DSPARK_API_KEY"], ids=["key-in-file", "key-from-env"])
def test_litellm_config_is_loaded_and_routed_by_litellm(tmp_path, stand_in, key_env):
    pytest.importorskip("litellm")
    config = tmp_path / "litellm.yaml"
    extra = ["--key-env", key_env] if key_env else []
    proc = run_cli(tmp_path, saved_outputs(stand_in.base_url), "--format", "litellm", "--out", str(config), *extra)
    assert proc.returncode == 0, proc.stderr
    assert mode_of(config) == 0o600
    assert (TEST_API_KEY in config.read_text()) is (key_env is None)
    # LITELLM_LOCAL_MODEL_COST_MAP: use the bundled model list, fetch nothing at import
    env = clean_env(LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_TELEMETRY="False")
    if key_env:
        env[key_env] = TEST_API_KEY
    run = subprocess.run([sys.executable, "-c", LITELLM_SCRIPT, str(config)], env=env, capture_output=True, text=True,
                         timeout=240)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "42"
    assert [(r["path"], r["authorization"]) for r in stand_in.requests] == [
        ("/v1/chat/completions", f"Bearer {TEST_API_KEY}")
    ]
    assert stand_in.requests[0]["body"]["model"] == MODEL  # the `openai/` prefix is LiteLLM's, not sent


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_example_runs_and_keeps_the_key_out_of_argv(tmp_path, stand_in):
    script = tmp_path / "tp4-curl.sh"
    proc = run_cli(tmp_path, saved_outputs(stand_in.base_url), "--format", "curl", "--out", str(script))
    assert proc.returncode == 0, proc.stderr
    assert mode_of(script) == 0o600
    run = subprocess.run(["sh", str(script)], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["choices"][0]["message"]["content"] == "42"
    assert stand_in.requests[0]["authorization"] == f"Bearer {TEST_API_KEY}"
    assert stand_in.requests[0]["path"] == "/v1/chat/completions"


def test_prometheus_format_is_the_scrape_configs_block_and_needs_no_key(tmp_path):
    import yaml

    from dspark.clients import ClientConfigError, main, render_prometheus

    configs = [{"job_name": "tp4x2-router", "static_configs": [{"targets": ["10.0.0.1:29000"]}]}]
    outputs = {"prometheus": {"scrape_configs": configs}, "endpoint": "http://10.0.0.1:8889/v1"}
    text = render_prometheus(outputs, "tp4x2")
    assert text.startswith("# deepseek-spark tp4x2: Prometheus scrape configs")
    assert yaml.safe_load(text) == {"scrape_configs": configs}
    saved = tmp_path / "outputs.json"
    saved.write_text(json.dumps(outputs))  # no api_key, no client_config: not needed for this format
    out = tmp_path / "scrape.yml"
    assert main(["--outputs-file", str(saved), "--format", "prometheus", "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["scrape_configs"] == configs
    for bad, why in (({}, "no `prometheus`"), ({"prometheus": {"scrape_configs": []}}, "nothing to scrape")):
        with pytest.raises(ClientConfigError, match=why):
            render_prometheus(bad)


def test_grafana_dashboard_reads_only_the_scraped_series_of_its_stack(tmp_path):
    import served
    from dspark.clients import render_grafana
    from harness import run_program

    known = served.every(tmp_path)
    for stack in ("tp4x2", "tp2"):
        outputs = run_program(stack).outputs
        doc = json.loads(render_grafana(outputs, stack))
        exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
        assert exprs and all(f'stack="{stack}"' in e for e in exprs)
        used = {m for e in exprs for m in served.metric_names(e)}
        assert used <= known, used - known
        assert any("smg_" in e for e in exprs) == (stack == "tp4x2")  # router panels only with a router
        assert any("vllm:" in e for e in exprs) == (stack == "tp2")
        assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])
