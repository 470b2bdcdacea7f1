"""programs/membership.py against a loopback stand-in of the router's worker API (GET/POST
/workers, DELETE /workers/<id>, as sglang-router 0.3.2 answers them) and of rank 0's /metrics.
The real router runs in the e2e tier (tests/e2e/test_engine_sim_groups.py)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from planning import routing
from programs import membership

KEY = "sk-test-membership-0123456789"


class Fake:
    """Router + worker on one loopback server: `workers` as the router lists them, `in_flight` as
    rank 0's gauges report them, and every request seen."""

    def __init__(self):
        self.workers: list[dict] = []
        self.in_flight = 0
        self.metrics = True
        self.seen: list[tuple[str, str, str]] = []  # method, path, authorization
        self.healthy_after_polls = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=None, text=None):
                data = text.encode() if text is not None else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _auth(self):
                fake.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self._send(401, {"error": "unauthorized"})
                    return False
                return True

            def do_GET(self):
                if self.path == "/metrics":
                    fake.seen.append(("GET", "/metrics", self.headers.get("Authorization", "")))
                    if not fake.metrics:
                        return self._send(404, {"detail": "Not Found"})
                    return self._send(200, text=(
                        "# TYPE sglang:num_running_reqs gauge\n"
                        f'sglang:num_running_reqs{{model_name="m"}} {float(fake.in_flight)}\n'
                        'sglang:num_queue_reqs{model_name="m"} 0.0\n'
                    ))  # fmt: skip
                if not self._auth():
                    return
                if fake.healthy_after_polls > 0:
                    fake.healthy_after_polls -= 1
                    workers = [dict(w, is_healthy=False) for w in fake.workers]
                else:
                    workers = fake.workers
                self._send(200, {"workers": workers, "total": len(workers)})

            def do_POST(self):
                if not self._auth():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.workers.append({"id": f"id-{len(fake.workers)}", "url": body["url"], "is_healthy": True})
                self._send(202, {"status": "accepted"})

            def do_DELETE(self):
                if not self._auth():
                    return
                wid = self.path.rsplit("/", 1)[-1]
                fake.workers = [w for w in fake.workers if w["id"] != wid]
                self._send(202, {"status": "accepted"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def fake():
    f = Fake()
    yield f
    f.server.shutdown()


def no_sleep(_):
    pass


def test_add_posts_the_worker_once_and_waits_until_healthy(fake):
    fake.healthy_after_polls = 2
    assert membership.add(fake.url, "http://10.0.0.5:8888", KEY, timeout=30, sleep=no_sleep) == 0
    assert [w["url"] for w in fake.workers] == ["http://10.0.0.5:8888"]
    assert [m for m, *_ in fake.seen].count("POST") == 1
    assert all(auth == f"Bearer {KEY}" for m, p, auth in fake.seen if p != "/metrics")


def test_add_of_a_listed_worker_posts_nothing(fake):
    fake.workers = [{"id": "w1", "url": "http://10.0.0.5:8888", "is_healthy": True}]
    assert membership.add(fake.url, "http://10.0.0.5:8888/", KEY, timeout=30, sleep=no_sleep) == 0
    assert "POST" not in [m for m, *_ in fake.seen]


def test_add_gives_up_after_the_timeout(fake, capsys):
    fake.healthy_after_polls = 10**6
    clock = iter(range(0, 10**6, 5)).__next__
    assert membership.add(fake.url, "http://10.0.0.5:8888", KEY, timeout=30, clock=clock, sleep=no_sleep) == 1
    assert "not in rotation after 30s" in capsys.readouterr().err


def test_a_wrong_key_fails_add_at_once(fake, capsys):
    assert membership.add(fake.url, "http://10.0.0.5:8888", "wrong", timeout=30, sleep=no_sleep) == 1
    assert "refused the stack's API key" in capsys.readouterr().err


def test_remove_deletes_the_worker_then_waits_for_the_drain(fake, capsys):
    fake.workers = [{"id": "w1", "url": fake.url, "is_healthy": True},
                    {"id": "w2", "url": "http://other:8888", "is_healthy": True}]  # fmt: skip
    fake.in_flight = 3
    polls = []

    def sleep(_):
        polls.append(fake.in_flight)
        fake.in_flight = max(0, fake.in_flight - 1)  # requests finish while it waits

    assert membership.remove(fake.url, fake.url, KEY, "sglang", drain_timeout=60, sleep=sleep) == 0
    assert [w["id"] for w in fake.workers] == ["w2"]
    assert polls == [3, 2, 1, 0]  # idle twice in a row before it lets the group go
    methods = [m for m, p, _ in fake.seen]
    assert methods.index("DELETE") < methods.index("GET", methods.index("DELETE")) and "drained" in capsys.readouterr().out


def test_remove_stops_waiting_at_the_drain_timeout(fake, capsys):
    fake.in_flight = 2
    clock = iter(range(0, 10**6, 10)).__next__
    assert membership.remove(fake.url, fake.url, KEY, "sglang", drain_timeout=30, clock=clock, sleep=no_sleep) == 0
    assert "2 request(s) still running after 30s" in capsys.readouterr().err


def test_the_drain_sends_the_key_to_metrics(fake):
    assert membership.remove(fake.url, fake.url, KEY, "sglang", drain_timeout=5, sleep=no_sleep) == 0
    assert ("GET", "/metrics", f"Bearer {KEY}") in fake.seen
    assert membership.read_metrics(fake.url, KEY)[0].startswith("# TYPE")


def test_a_group_without_gauges_gets_a_grace_period_not_a_cut(fake, capsys):
    fake.metrics = False
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    assert membership.remove(fake.url, fake.url, KEY, "sglang", drain_timeout=600, clock=lambda: now[0],
                             sleep=sleep) == 0  # fmt: skip
    assert 30 <= now[0] < 32
    assert "answered HTTP 404" in capsys.readouterr().err


def test_remove_never_fails_when_router_and_group_are_gone(capsys):
    assert membership.remove("http://127.0.0.1:9", "http://127.0.0.1:9", KEY, "vllm", drain_timeout=5,
                             sleep=no_sleep) == 0  # fmt: skip
    err = capsys.readouterr()
    assert "nothing to take out" in err.err and "not answering; nothing to drain" in err.out


@pytest.mark.parametrize(
    "engine, text, expected",
    [
        ("sglang", 'sglang:num_running_reqs{model_name="m"} 2.0\nsglang:num_queue_reqs{model_name="m"} 1.0\n', 3),
        ("sglang", '# HELP sglang:num_running_reqs x\nsglang:num_running_reqs{a="1"} 1\nsglang:num_running_reqs{a="2"} 1\n', 2),
        ("vllm", 'vllm:num_requests_running{model_name="m"} 4.0\nvllm:num_requests_waiting{model_name="m"} 0.0\n'
                 'vllm:num_requests_running_total 99\n', 4),
        ("vllm", "", 0),
    ],
)  # fmt: skip
def test_in_flight_reads_the_engines_gauges(engine, text, expected):
    assert membership.in_flight(text, engine) == expected


def test_the_key_comes_from_the_environment_only(monkeypatch, capsys):
    monkeypatch.delenv("DSPARK_API_KEY", raising=False)
    assert membership.main(["add", "--router", "http://127.0.0.1:9", "--worker", "http://x:1"]) == 2
    assert "DSPARK_API_KEY is empty" in capsys.readouterr().err


def test_member_commands_quote_and_carry_no_key():
    add = routing.member_add("http://h:8889", "http://w:8888", 120)
    remove = routing.member_remove("http://h:8889", "http://w:8888", "vllm", 30)
    assert add == ("python3 -m programs.membership add --router http://h:8889 --worker http://w:8888 "
                   "--key-env DSPARK_API_KEY --timeout 120")  # fmt: skip
    assert remove.endswith("--engine vllm --drain-timeout 30")
    assert "$(cat" not in add + remove and routing.member_add("http://h;x", "w", 1).count("'http://h;x'") == 1
