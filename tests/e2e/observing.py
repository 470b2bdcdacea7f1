"""What the monitoring scenarios share: Alertmanager's webhook received on this machine (the sim's nodes reach it at
their network's gateway), Prometheus's HTTP API (targets, queries), and the scrape cost per target (SCRAPES: printed
at the end of the session).

Alertmanager posts a JSON document per notification (its webhook_config): `status` ("firing"/"resolved") and
`alerts`, each with `status`, `labels` and `annotations`; the sink keeps each with the time it arrived.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

from e2e.timings import SCRAPES


@dataclass(frozen=True)
class Received:
    at: float  # time.time() when it arrived
    status: str  # firing | resolved (this alert's)
    labels: dict
    annotations: dict
    starts: float  # its startsAt: when Prometheus first saw its condition hold (this machine's clock too)


def timestamp(rfc3339: str) -> float:
    """Alertmanager's times (nanoseconds, `Z`) as a unix time."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", rfc3339 or "")
    if not m:
        return 0.0
    frac = (m.group(2) or ".0")[:7]
    return datetime.fromisoformat(m.group(1) + frac + m.group(3).replace("Z", "+00:00")).timestamp()


class AlertSink:
    """An HTTP server on every address of this machine: Alertmanager's webhook (`url(host)`)."""

    def __init__(self):
        self.received: list[Received] = []
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                now = time.time()
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = {}
                with sink.lock:
                    sink.received += [Received(now, a.get("status", ""), a.get("labels", {}), a.get("annotations", {}),
                                               timestamp(a.get("startsAt", ""))) for a in doc.get("alerts", [])]  # fmt: skip
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, host: str) -> str:
        return f"http://{host}:{self.server.server_address[1]}/alerts"

    def wait(self, pred: Callable[[Received], bool], since: float, timeout: float, what: str) -> Received:
        """The first alert received after `since` that `pred` accepts (whose condition began after `since`, for a
        firing one: not the update of one that began before)."""
        pred_given = pred
        pred = lambda r: pred_given(r) and (r.status != "firing" or r.starts >= since - 2)  # noqa: E731
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                hit = next((r for r in self.received if r.at >= since and pred(r)), None)
            if hit is not None:
                return hit
            time.sleep(0.5)
        with self.lock:
            seen = [(r.status, r.labels.get("alertname"), r.labels) for r in self.received if r.at >= since]
        raise AssertionError(f"no {what} reached the webhook within {timeout:.0f}s; received since: {seen}")

    def close(self) -> None:
        self.server.shutdown()


TUNNELS = contextlib.ExitStack()  # the operator's ssh tunnels of the run (closed at its end: conftest)


def prometheus(outputs: dict, cluster: str) -> str:
    """Prometheus's URL from here. It listens on its node's loopback (planning/exposure.py): an operator comes in
    through ssh, as `dspark` does; the tunnel stays open for the rest of the run."""
    from programs import tunnel
    from sim import cluster as sim_cluster

    node = outputs["monitoring"]["node"]
    host = outputs["exposure"][node]["host"]
    ssh = sim_cluster.ssh_info(cluster)
    opts = ["-i", str(ssh.private_key), "-o", f"UserKnownHostsFile={ssh.known_hosts}", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes"]  # fmt: skip
    port = urllib.parse.urlsplit(outputs["monitoring"]["prometheus"]).port
    local = TUNNELS.enter_context(tunnel.forward(f"root@{host}", 22, opts, "127.0.0.1", port))
    return f"http://127.0.0.1:{local}"


def api(prometheus: str, path: str, **params: str) -> dict:
    url = f"{prometheus}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc = json.load(resp)
    assert doc.get("status") == "success", doc
    return doc["data"]


def query(prometheus: str, expr: str) -> list[dict]:
    return api(prometheus, "query", query=expr)["result"]


def expected_targets(outputs: dict) -> set[tuple[str, str]]:
    """(job, host:port) of every target in the stack's `prometheus` output."""
    return {(job["job_name"], t) for job in outputs["prometheus"]["scrape_configs"]
            for static in job["static_configs"] for t in static["targets"]}  # fmt: skip


def wait_every_target_up(prometheus: str, outputs: dict, timeout: float = 90) -> list[dict]:
    """Until Prometheus scrapes exactly the output's targets and each is `up == 1`; the `up` series."""
    want = expected_targets(outputs)
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            up = query(prometheus, "up")
            got = {(s["metric"]["job"], s["metric"]["instance"]): s["value"][1] for s in up}
            if set(got) == want and all(v == "1" for v in got.values()):
                return up
            last = {f"{j} {i}": v for (j, i), v in sorted(got.items())}, sorted(want - set(got))
        except OSError as exc:  # Prometheus still starting
            last = exc
        time.sleep(1)
    raise AssertionError(f"not every target up within {timeout:.0f}s (got, missing): {last}")


def record_scrape_costs(prometheus: str, stack: str) -> None:
    """Per target: its last scrape's duration and samples (Prometheus's own series), into SCRAPES."""
    dur = {(s["metric"]["job"], s["metric"]["instance"]): float(s["value"][1])
           for s in query(prometheus, "scrape_duration_seconds")}  # fmt: skip
    for s in query(prometheus, "scrape_samples_scraped"):
        key = (s["metric"]["job"], s["metric"]["instance"])
        SCRAPES[f"{stack} {key[0].removeprefix(stack + '-')} {key[1]}"] = (dur.get(key, 0.0), float(s["value"][1]))


def empty_panels(prometheus: str, dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, query) of every panel query that returns no series."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            if not query(prometheus, target["expr"]):
                out.append((panel["title"], target["expr"]))
    return out


def wait_panels(prometheus: str, dashboard: dict, timeout: float = 60) -> None:
    """Until every panel's query returns data (rates need two scrapes, latencies a request in their window)."""
    deadline = time.monotonic() + timeout
    missing: Optional[list] = None
    while time.monotonic() < deadline:
        missing = empty_panels(prometheus, dashboard)
        if not missing:
            return
        time.sleep(2)
    raise AssertionError(f"panels whose query returns nothing: {missing}")
