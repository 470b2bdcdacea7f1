"""A group's place in the router's rotation, run by the group's RouterMember where Pulumi runs
(stdlib only, like programs/probe.py). The API key comes from an environment variable and is
never printed.

    add:    put the group's rank 0 into the router's workers (POST /workers, unless it is there) and
            wait until the router lists it healthy.
    remove: take it out (DELETE /workers/<id>) and wait until the router no longer lists it; then
            wait until the group has no request running or queued (its /metrics gauges, idle on two
            readings one interval apart), at most
            --drain-timeout seconds, so its ranks stop only after the answers they owe went out.
            Never fails: a router that is already gone has nothing to remove, and a destroy must go on.

    DSPARK_API_KEY=... python3 -m programs.membership add --router http://10.0.0.1:8889 \\
        --worker http://10.0.0.1:8888 --key-env DSPARK_API_KEY --timeout 300
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

GAUGES = {
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
}


def _request(url: str, key: str, method: str = "GET", body: Any = None, timeout: float = 10) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {key}"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        text = resp.read().decode() or "null"
    return json.loads(text)


def listed(router: str, key: str, worker: str) -> list[dict]:
    """The router's entries for `worker` (GET /workers)."""
    data = _request(router.rstrip("/") + "/workers", key)
    return [w for w in (data or {}).get("workers", []) if w.get("url", "").rstrip("/") == worker.rstrip("/")]


def in_flight(metrics_text: str, engine: str) -> int:
    """Requests running plus queued, summed over the label sets of the engine's two gauges."""
    names = GAUGES[engine]
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return int(total)


GRACE = 30.0  # seconds a drain waits when rank 0 answers but shows no gauges


def read_metrics(worker: str, key: str, timeout: float = 5) -> tuple[Optional[str], Optional[int]]:
    """(rank 0's /metrics text, None) ; (None, HTTP status) when it answers without them; (None, None)
    when it does not answer. The key goes along: some SGLang versions guard /metrics with it."""
    req = urllib.request.Request(worker.rstrip("/") + "/metrics", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read().decode(errors="replace"), None
    except urllib.error.HTTPError as exc:
        return None, exc.code
    except (urllib.error.URLError, OSError):
        return None, None


def add(router: str, worker: str, key: str, timeout: float, interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> int:  # fmt: skip
    deadline = clock() + timeout
    posted = False
    last = ""
    while True:
        try:
            entries = listed(router, key, worker)
            if any(w.get("is_healthy") for w in entries):
                print(f"router {router}: {worker} is in rotation")
                return 0
            if not entries and not posted:
                _request(router.rstrip("/") + "/workers", key, "POST", {"url": worker})
                posted = True
                print(f"router {router}: adding {worker}")
            last = "listed, not healthy yet" if entries else "not listed yet"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
            if exc.code in (401, 403):
                print(f"router {router} refused the stack's API key (HTTP {exc.code})", file=sys.stderr)
                return 1
        except (urllib.error.URLError, OSError, ValueError) as exc:
            last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        if clock() >= deadline:
            print(f"router {router}: {worker} not in rotation after {timeout:.0f}s ({last}); check the router's "
                  "log (docker logs <stack>-router on its node) and that the node reaches the group", file=sys.stderr)  # fmt: skip
            return 1
        sleep(interval)


def remove(router: str, worker: str, key: str, engine: str, drain_timeout: float, interval: float = 1.0,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> int:  # fmt: skip
    start = clock()
    try:
        for entry in listed(router, key, worker):
            _request(router.rstrip("/") + f"/workers/{entry['id']}", key, "DELETE")
        while listed(router, key, worker):
            if clock() - start > 60:
                print(f"router {router}: {worker} still listed after 60s; draining anyway", file=sys.stderr)
                break
            sleep(interval)
        print(f"router {router}: {worker} out of rotation")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"router {router} not reachable ({type(exc).__name__}); nothing to take out", file=sys.stderr)
    deadline = clock() + drain_timeout
    zeros = 0
    while True:
        text, status = read_metrics(worker, key)
        if text is None and status is None:
            print(f"{worker}: not answering; nothing to drain")
            return 0
        if text is None:
            grace = min(drain_timeout, GRACE)
            print(f"{worker}: /metrics answered HTTP {status}, so the requests it still serves cannot be counted; "
                  f"waiting {grace:.0f}s for them", file=sys.stderr)  # fmt: skip
            end = clock() + grace
            while clock() < end:
                sleep(interval)
            return 0
        n = in_flight(text, engine)
        # Idle twice, one interval apart: a request the router sent just before it let go has arrived.
        zeros = zeros + 1 if n == 0 else 0
        if zeros == 2:
            print(f"{worker}: drained in {clock() - start:.1f}s")
            return 0
        if clock() >= deadline:
            print(f"{worker}: {n} request(s) still running after {drain_timeout:.0f}s (router.drainTimeoutSeconds); "
                  "stopping the group anyway", file=sys.stderr)  # fmt: skip
            return 0
        sleep(interval)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("add", "remove"))
    p.add_argument("--router", required=True, help="the router's URL, e.g. http://10.0.0.1:8889")
    p.add_argument("--worker", required=True, help="the group's rank-0 URL, e.g. http://10.0.0.1:8888")
    p.add_argument("--key-env", default="DSPARK_API_KEY", help="environment variable holding the API key")
    p.add_argument("--timeout", type=float, default=300, help="add: how long to wait for the router")
    p.add_argument("--engine", choices=sorted(GAUGES), default="sglang", help="remove: whose gauges to read")
    p.add_argument("--drain-timeout", type=float, default=600, help="remove: longest wait for running requests")
    a = p.parse_args(argv)
    key = os.environ.get(a.key_env, "")
    if not key:
        print(f"{a.key_env} is empty: the router needs the stack's API key", file=sys.stderr)
        return 2
    if a.action == "add":
        return add(a.router, a.worker, key, a.timeout)
    return remove(a.router, a.worker, key, a.engine, a.drain_timeout)


if __name__ == "__main__":
    sys.exit(main())
