"""The readiness probe against a local stand-in server on 127.0.0.1."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from programs import probe
from harness import ROOT

KEY = "sk-probe-test"


class _State:
    health_codes: list
    answer = "42"
    seen_auth: list


@pytest.fixture
def server():
    state = _State()
    state.health_codes = [503, 503, 200]
    state.seen_auth = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            code = state.health_codes.pop(0) if len(state.health_codes) > 1 else state.health_codes[0]
            self._send(code, {})

        def do_POST(self):
            auth = self.headers.get("Authorization")
            state.seen_auth.append(auth)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if auth != f"Bearer {KEY}":
                return self._send(401, {"error": "Unauthorized"})
            assert self.path == "/v1/chat/completions" and body["max_tokens"] == 32
            self._send(200, {"choices": [{"message": {"content": state.answer}, "finish_reason": "stop"}]})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    yield state
    srv.shutdown()


def test_health_url():
    assert probe.health_url("http://h:8888/v1") == "http://h:8888/health"
    assert probe.health_url("http://h:8888/v1/") == "http://h:8888/health"


def test_waits_for_health_then_needs_a_real_answer(server):
    logs = []
    ok = probe.wait_ready(server.url, KEY, "m", "What is 19 + 23?", "42", timeout=10, interval=0.01, log=logs.append)
    assert ok
    assert sum("/health returned 503" in line for line in logs) == 2
    assert server.seen_auth == [f"Bearer {KEY}"]
    assert "answered '42'" in logs[-1]


def test_wrong_answer_times_out_with_last_error(server):
    server.health_codes = [200]
    server.answer = "I am broken"
    logs = []
    ok = probe.wait_ready(server.url, KEY, "m", "q", "42", timeout=0.05, interval=0.01, log=logs.append)
    assert not ok
    assert "last error: chat completion answered 'I am broken', expected '42'" in logs[-1]


def test_wrong_key_is_reported_as_401(server):
    server.health_codes = [200]
    logs = []
    assert not probe.wait_ready(server.url, "wrong", "m", "q", "42", timeout=0.05, interval=0.01, log=logs.append)
    assert "HTTP 401" in logs[-1]
    assert "wrong" not in "".join(logs)


def test_unreachable_endpoint_fails_after_timeout():
    logs = []
    ok = probe.wait_ready("http://127.0.0.1:9/v1", KEY, "m", "q", "42", timeout=0.05, interval=0.01, log=logs.append)
    assert not ok and "not ready after" in logs[-1]


def test_cli_reads_key_from_env_only(server):
    server.health_codes = [200]
    args = [sys.executable, "-m", "programs.probe", "--url", server.url, "--model", "m", "--timeout", "5",
            "--interval", "0.01"]  # fmt: skip
    ok = subprocess.run(args, cwd=ROOT, env={"DSPARK_API_KEY": KEY}, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert KEY not in ok.stdout + ok.stderr
    missing = subprocess.run(args, cwd=ROOT, env={}, capture_output=True, text=True)
    assert missing.returncode == 2 and "DSPARK_API_KEY is empty" in missing.stderr


def test_an_unsendable_key_is_never_echoed(server):
    server.health_codes = [200]
    logs = []
    bad_key = "sk-secret-part\nX-Injected: 1"
    assert not probe.wait_ready(server.url, bad_key, "m", "q", "42", timeout=0.05, interval=0.01, log=logs.append)
    assert "sk-secret-part" not in "".join(logs) and "details withheld" in logs[-1]


class FakeNodes:
    """`on_node` stand-in: container states and logs per (target, container)."""

    def __init__(self, states: dict[str, tuple[int, str]], logs: str = ""):
        self.states, self.logs, self.calls = states, logs, []

    def __call__(self, target, port, ssh_opts, remote):
        self.calls.append((target, port, tuple(ssh_opts), remote))
        name = remote.rsplit(" ", 1)[-1].split(" ")[0].strip("'")
        if remote.startswith("docker logs"):
            return 0, self.logs
        return self.states[name]


RANKS = ["0=tp2-rank0@root@10.0.0.1:22", "1=tp2-rank1@zurih@10.0.0.2:2222"]


def test_running_ranks_are_not_down():
    nodes = FakeNodes({"tp2-rank0": (0, "running 0 false\n"), "tp2-rank1": (0, "running 0 false\n")})
    assert probe.exited_rank(RANKS, ["-o", "BatchMode=yes"], KEY, run=nodes) is None
    assert nodes.calls[1][:3] == ("zurih@10.0.0.2", 2222, ("-o", "BatchMode=yes"))


def test_a_rank_left_created_is_down():
    """pulumi-docker keeps a container whose start failed after `docker create` (ErrorResourceInitFailed): it
    stays `created`, which is down, not a boot still in progress."""
    nodes = FakeNodes({"tp2-rank0": (0, "running 0 false\n"), "tp2-rank1": (0, "created 0 false\n")})
    down = probe.exited_rank(RANKS, [], KEY, run=nodes)
    assert down.startswith("rank 1 (tp2-rank1 on zurih@10.0.0.2) was created but never started")
    # a plain `up` cannot start it (init errors: an empty update): the message says what can
    hint = "python -m dspark restart --stack tp2 --yes"
    assert probe.with_hint(down, hint) == (f"{down}\nonce the cause is fixed, start the whole group over (every "
                                           f"rank, the head last): {hint}")
    assert probe.with_hint(None, hint) is None and probe.with_hint(down, "") == down


def test_the_readiness_command_carries_the_groups_restart_command():
    from declared.stack import parse_stack
    from harness import cluster_of
    from planning import stackplan

    sc = parse_stack(cluster_of("tp4x2"))
    plans = stackplan.build_stack(sc, "tp4x2").groups
    assert [p.readiness.command.split("--restart-hint ")[1].split(" --ssh-opt")[0] for p in plans] == [
        "'python -m dspark restart --stack tp4x2 --group a --yes' --tunnel zurih@10.0.0.1:22",
        "'python -m dspark restart --stack tp4x2 --group b --yes' --tunnel zurih@10.0.0.5:22"]  # behind the router


def test_an_exited_rank_is_named_with_exit_code_and_log_tail_key_redacted():
    nodes = FakeNodes({"tp2-rank0": (0, "running 0\n"), "tp2-rank1": (0, "exited 2\n")},
                      logs=f"usage: launch_server\nerror: unrecognized arguments: --bogus\nkey was {KEY}\n")  # fmt: skip
    msg = probe.exited_rank(RANKS, [], KEY, run=nodes)
    assert msg.startswith("rank 1 (tp2-rank1 on zurih@10.0.0.2) exited with code 2; last 20 log lines:")
    assert "  | error: unrecognized arguments: --bogus" in msg
    assert KEY not in msg and "[secret]" in msg


def test_a_rank_its_memory_limit_killed_says_so():
    nodes = FakeNodes({"tp2-rank0": (0, "running 0 false\n"), "tp2-rank1": (0, "exited 137 true\n")}, logs="Killed\n")
    msg = probe.exited_rank(RANKS, [], KEY, run=nodes)
    assert msg.startswith("rank 1 (tp2-rank1 on zurih@10.0.0.2) exited with code 137 after its container's memory "
                          "limit killed it (OOMKilled)")
    assert "exited with code 2 after" not in probe.exited_rank(
        RANKS, [], KEY, run=FakeNodes({"tp2-rank0": (0, "exited 2 false\n"), "tp2-rank1": (0, "running 0 false\n")}))


def test_a_removed_rank_is_down_an_unreachable_node_is_not_judged():
    assert "does not exist" in probe.exited_rank(
        RANKS[:1], [], KEY, run=FakeNodes({"tp2-rank0": (1, "Error: No such object: tp2-rank0")})
    )
    assert probe.exited_rank(RANKS[:1], [], KEY, run=FakeNodes({"tp2-rank0": (255, "ssh: connect timed out")})) is None


def test_the_wait_stops_at_once_when_a_rank_is_down():
    logs = []
    t = iter(range(100))
    ok = probe.wait_ready("http://127.0.0.1:9/v1", KEY, "m", "q", "42", timeout=1800, interval=10, log=logs.append,
                          clock=lambda: next(t), sleep=lambda s: None, ranks_down=lambda: "rank 1 exited")  # fmt: skip
    assert not ok and len(logs) == 1 and "the group cannot come up: rank 1 exited" in logs[0]


def test_boot_phase_is_the_last_phase_rank0_logged():
    assert probe.boot_phase("starting\n") is None
    assert probe.boot_phase("init torch distributed\nLoad weight begin. avail mem=110 GB\n") == "loading weights"
    sglang = "Load weight begin.\nLoad weight end.\nCapture cuda graph begin.\n"
    assert probe.boot_phase(sglang) == "capturing CUDA graphs"
    assert probe.boot_phase(sglang + "The server is fired up and ready to roll!\n") == "serving"
    assert probe.boot_phase("Loading weights took 212.4 seconds\n") == "weights loaded"  # vLLM


def test_the_wait_reports_rank0s_boot_phase_without_reading_it_every_poll():
    logs, reads = [], []
    t = iter(range(0, 1000, 5))

    def phase():
        reads.append(1)
        return "loading weights"

    ok = probe.wait_ready("http://127.0.0.1:9/v1", KEY, "m", "q", "42", timeout=40, interval=5, log=logs.append,
                          clock=lambda: next(t), sleep=lambda s: None, phase=phase)  # fmt: skip
    assert not ok
    assert "rank 0 loading weights" in logs[0] and "rank 0 loading weights" in logs[-2]
    assert len(reads) < len(logs) - 1  # every PHASE_EVERY seconds, not every poll
