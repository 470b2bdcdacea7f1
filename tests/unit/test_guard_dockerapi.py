"""The guard's docker client against a stand-in engine on a unix socket: what inspect reads, what start and
stop accept (204, and 304 for nothing to do), and the engine's own refusals passed on."""

import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from programs.guard.dockerapi import Docker, DockerError, epoch

INSPECT = {"Id": "abc123", "Name": "/sim-rank1", "Config": {"Labels": {"deepseek-spark.rank": "1"}},
           "State": {"Status": "exited", "ExitCode": 137, "OOMKilled": True, "Error": "",
                     "StartedAt": "2026-12-03T10:00:00.123456789Z", "FinishedAt": "0001-01-01T00:00:00Z"}}


class Engine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def engine(tmp_path):
    calls = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def address_string(self):
            return "unix"

        def reply(self, code, doc=None):
            body = json.dumps(doc).encode() if doc is not None else b""
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            calls.append(("GET", self.path))
            if self.path.startswith("/containers/abc123/logs?"):
                frames = b"".join(bytes([stream, 0, 0, 0]) + len(t).to_bytes(4, "big") + t
                                  for stream, t in ((1, b"Load weight begin.\n"), (2, b"RuntimeError: CUDA\n")))
                self.send_response(200)
                self.send_header("Content-Length", str(len(frames)))
                self.end_headers()
                return self.wfile.write(frames)
            self.reply(200, INSPECT) if self.path == "/containers/abc123/json" else self.reply(404, {"message": "No such container: x"})

        def do_POST(self):
            calls.append(("POST", self.path))
            if self.path.startswith("/containers/abc123/start"):
                self.reply(304)
            elif self.path.startswith("/containers/abc123/stop"):
                self.reply(204)
            else:
                self.reply(500, {"message": "cannot start: device /dev/infiniband not found"})

    path = str(tmp_path / "docker.sock")
    server = Engine(path, H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield Docker(path), calls
    server.shutdown()


def test_inspect_reads_state_exit_code_oom_and_times(engine):
    docker, _ = engine
    c = docker.inspect("abc123")
    assert (c.name, c.status, c.exit_code, c.oom_killed) == ("sim-rank1", "exited", 137, True)
    assert c.finished_at is None and abs(c.started_at - epoch("2026-12-03T10:00:00Z") - 0.123456) < 1e-6
    assert docker.inspect("gone") is None


def test_start_and_stop_accept_nothing_to_do_and_pass_the_engines_refusal_on(engine):
    docker, calls = engine
    docker.start("abc123")
    docker.stop("abc123", 7)
    assert ("POST", "/containers/abc123/stop?t=7") in calls
    with pytest.raises(DockerError) as exc:
        docker.start("other")
    assert "device /dev/infiniband not found" in str(exc.value)


def test_no_engine_is_an_error_that_says_where_it_looked(tmp_path):
    with pytest.raises(DockerError) as exc:
        Docker(str(tmp_path / "none.sock")).inspect("x")
    assert "none.sock" in str(exc.value)


def test_a_log_tail_comes_apart_from_dockers_stream_frames(engine):
    docker, calls = engine
    assert docker.tail("abc123", 5) == ["Load weight begin.", "RuntimeError: CUDA"]
    assert ("GET", "/containers/abc123/logs?stdout=1&stderr=1&tail=5") in calls
