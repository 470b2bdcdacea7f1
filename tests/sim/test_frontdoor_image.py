"""The front door image ``deepseek-spark-frontdoor:nginx-1.22`` (``sim/images.py`` ``FRONTDOOR``) running the config
the program renders (planning/frontdoor.py), with a certificate of the stack's own CA (planning/tls.py).

NOT a test double: Debian's REAL nginx, registry packages only, run in a container on this machine's docker
engine (host network, bound to 127.0.0.1) in front of a small upstream in this process that streams. What it
shows: only the allowlisted routes pass; TLS 1.2 and 1.3 only, verified with the stack's CA and refused with the
system's; a streamed answer arrives as it is sent (no buffering); a new certificate taken by the reload
(`planning.frontdoor.reload`: SIGHUP) lets a stream in flight finish while new connections get the new one.
"""
from __future__ import annotations

import datetime as dt
import http.server
import re
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from declared.stack import FRONTDOOR_IMAGE
from planning import frontdoor, tls
from sim import backend, images, rootfs

ROOT = Path(__file__).resolve().parents[2]
CONTAINER = "dspark-test-frontdoor"
pytestmark = pytest.mark.integration


def test_frontdoor_rootfs_is_the_dockerfiles_packages():
    text = frontdoor.DOCKERFILE.read_text()
    m = re.search(r"apt-get install -y --no-install-recommends ([a-z0-9 .+-]+)", text)
    assert m and set(m.group(1).split()) == set(rootfs.FRONTDOOR_ROOTFS.packages) == {"nginx", "ca-certificates"}
    assert images.FRONTDOOR_IMAGE == FRONTDOOR_IMAGE
    assert not rootfs.FRONTDOOR_ROOTFS.wheels
    # the sim's image carries the label the program's build checks, so a node holding it builds nothing
    digest = frontdoor.imagebuild_digest(text)
    assert f"LABEL {frontdoor.BUILT_FROM}={digest}" in images.FRONTDOOR.overlay().changes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list = []

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        Upstream.seen.append(("GET", self.path))
        self._send(200, b'{"ok": true}')

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Upstream.seen.append(("POST", self.path))
        if self.path != "/v1/chat/completions":
            return self._send(200, b"{}")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(4):
            data = f"data: {i}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            time.sleep(0.4)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def door(docker_engine, tmp_path_factory):
    if not backend.image_id(FRONTDOOR_IMAGE):
        pytest.fail(f"{FRONTDOOR_IMAGE} missing: run `bash .ci/setup`", pytrace=False)
    d = tmp_path_factory.mktemp("door")
    (d / "etc").mkdir()
    (d / "tls").mkdir()
    up_port, port = _free_port(), _free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", up_port), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ca = tls.make_ca("test", dt.datetime.now(dt.timezone.utc))
    (d / "ca.pem").write_text(ca["cert"])
    sched = tls.Schedule(90, 30)
    period = sched.period(dt.date.today())

    def issue() -> str:
        srv = tls.issue_server(ca, ["127.0.0.1"], sched.not_before(period), sched.not_after(period))
        (d / "tls" / "tls.pem").write_text(srv["chain"] + srv["key"])
        return srv["serial"]

    first = issue()
    (d / "etc" / "nginx.conf").write_text(frontdoor.nginx_conf("127.0.0.1", port, f"http://127.0.0.1:{up_port}/v1",
                                                               "/health", 60))  # fmt: skip
    backend.docker("rm", "-f", CONTAINER, check=False)
    backend.docker("run", "-d", "--name", CONTAINER, "--network", "host",
                   "-v", f"{d / 'etc'}:{frontdoor.ETC}/etc:ro", "-v", f"{d / 'tls'}:{frontdoor.ETC}/tls:ro",
                   FRONTDOOR_IMAGE, "nginx", "-c", f"{frontdoor.ETC}/etc/nginx.conf")  # fmt: skip
    url = f"https://127.0.0.1:{port}"
    ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(url + "/health", context=ctx, timeout=2).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                logs = subprocess.run(["docker", "logs", CONTAINER], capture_output=True, text=True)
                pytest.fail(f"the door did not answer: {logs.stdout}{logs.stderr}")
            time.sleep(0.2)
    yield {"url": url, "ctx": ctx, "dir": d, "issue": issue, "first": first, "port": port}
    backend.docker("rm", "-f", CONTAINER, check=False)
    server.shutdown()


def _status(door, method: str, path: str, ctx=None) -> int:
    req = urllib.request.Request(door["url"] + path, method=method, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, context=ctx or door["ctx"], timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_only_the_openai_routes_and_health_reach_what_it_fronts(door):
    Upstream.seen.clear()
    allowed = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
               ("GET", "/v1/models/deepseek-v4.1-flash"), ("GET", "/health")]  # fmt: skip
    for method, path in allowed:
        assert _status(door, method, path) == 200, path
    refused = [("POST", "/invocations"), ("POST", "/tokenize"), ("POST", "/pause"), ("POST", "/scale_elastic_ep"),
               ("POST", "/update_weights_from_disk"), ("POST", "/flush_cache"), ("GET", "/server_info"),
               ("GET", "/metrics"), ("GET", "/v1/chat/completions"), ("POST", "/v1/models"), ("GET", "/key/list"),
               ("GET", "/v1/../invocations"), ("GET", "/health/readiness")]  # fmt: skip
    for method, path in refused:
        assert _status(door, method, path) in (403, 404), path
    assert Upstream.seen == allowed  # nothing refused reached the upstream


def test_tls_12_and_13_only_verified_with_the_stacks_ca_and_refused_with_the_systems(door):
    port = door["port"]
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        ctx = ssl.create_default_context(cafile=str(door["dir"] / "ca.pem"))
        ctx.minimum_version = ctx.maximum_version = version
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                assert s.version() == version.name.replace("v1_", "v1.")
    # TLS 1.1 offered: the server answers with a protocol_version alert (what the client received, not a refusal
    # of its own)
    old = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-tls1_1"], input="",
                         capture_output=True, text=True, timeout=10)  # fmt: skip
    assert "alert protocol version" in old.stdout + old.stderr, old.stdout + old.stderr
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _status(door, "GET", "/health", ctx=ssl.create_default_context())
    # plain HTTP to the port goes nowhere
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-x\r\n\r\n")
        assert b" 400 " in s.recv(200)


def _stream(door, out: list) -> None:
    req = urllib.request.Request(door["url"] + "/v1/chat/completions", data=b"{}", method="POST")
    with urllib.request.urlopen(req, context=door["ctx"], timeout=30) as resp:
        for line in resp:
            if line.startswith(b"data:"):
                out.append((time.monotonic(), line.strip().decode()))


def test_a_stream_arrives_as_it_is_sent(door):
    got: list = []
    _stream(door, got)
    assert [d for _, d in got] == ["data: 0", "data: 1", "data: 2", "data: 3"]
    gaps = [b[0] - a[0] for a, b in zip(got, got[1:])]
    assert min(gaps) > 0.25, gaps  # each event when the upstream sent it (0.4 s apart), not all at the end


def test_a_new_certificate_is_served_after_the_reload_and_the_stream_in_flight_finishes(door):
    got: list = []
    t = threading.Thread(target=_stream, args=(door, got))
    t.start()
    time.sleep(0.5)
    serial = door["issue"]()
    subprocess.run(["sh", "-c", frontdoor.reload(CONTAINER)], check=True)
    t.join(30)
    assert [d for _, d in got] == ["data: 0", "data: 1", "data: 2", "data: 3"]
    with socket.create_connection(("127.0.0.1", door["port"]), timeout=5) as raw:
        with door["ctx"].wrap_socket(raw, server_hostname="127.0.0.1") as s:
            from cryptography import x509

            served = x509.load_der_x509_certificate(s.getpeercert(binary_form=True))
    assert format(served.serial_number, "x") == serial != door["first"]
