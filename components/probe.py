"""Readiness probe run by the Readiness component where Pulumi runs (stdlib only).

`up` succeeds only when rank 0's /health answers 200 *and* one authenticated chat completion
returns the expected answer: /health alone can be 200 while generation is dead. The API key is
read from an environment variable, never from the command line, and never printed.

    DSPARK_API_KEY=... python3 -m components.probe --url http://10.0.0.1:8888/v1 --model m
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request


def health_url(base_url: str) -> str:
    root = base_url.rstrip("/")
    return (root[: -len("/v1")] if root.endswith("/v1") else root) + "/health"


def get_health(base_url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(health_url(base_url), timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def chat(base_url: str, key: str, model: str, prompt: str, timeout: float) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 32,
        "temperature": 0,
        "chat_template_kwargs": {"thinking": False},
    }
    req = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"chat completion returned HTTP {exc.code}") from None
    return data["choices"][0]["message"]["content"] or ""


def wait_ready(
    base_url: str,
    key: str,
    model: str,
    prompt: str,
    expect: str,
    timeout: float,
    interval: float,
    log=print,
    clock=time.monotonic,
    sleep=time.sleep,
) -> bool:
    """Poll until ready or timeout; returns True when ready. Logs progress and the last error."""
    start = clock()
    last = "no attempt yet"
    stage = "health"
    while True:
        elapsed = clock() - start
        try:
            if stage == "health":
                code = get_health(base_url, timeout=min(30.0, interval * 3))
                if code == 200:
                    log(f"readiness: {health_url(base_url)} is 200 after {elapsed:.0f}s")
                    stage = "chat"
                    continue
                last = f"/health returned {code}"
            else:
                answer = chat(base_url, key, model, prompt, timeout=120.0)
                if expect in answer:
                    log(f"readiness: chat completion answered {answer.strip()!r} after {elapsed:.0f}s")
                    return True
                last = f"chat completion answered {answer.strip()[:80]!r}, expected {expect!r}"
        except (OSError, RuntimeError, KeyError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        except ValueError as exc:  # urllib's message can quote the Authorization header: never print it
            last = f"{type(exc).__name__} (details withheld: they may contain the key)"
        if elapsed >= timeout:
            log(f"readiness: not ready after {timeout:.0f}s; last error: {last}")
            return False
        log(f"readiness: waiting ({elapsed:.0f}s): {last}")
        sleep(interval)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="OpenAI base URL ending in /v1")
    p.add_argument("--model", required=True)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--interval", type=float, default=10)
    p.add_argument("--prompt", default="What is 19 + 23?")
    p.add_argument("--expect", default="42")
    p.add_argument("--key-env", default="DSPARK_API_KEY", help="environment variable holding the API key")
    a = p.parse_args(argv)
    key = os.environ.get(a.key_env, "")
    if not key:
        print(f"readiness: ${a.key_env} is empty; the API key must come through the environment", file=sys.stderr)
        return 2
    ok = wait_ready(a.url, key, a.model, a.prompt, a.expect, a.timeout, a.interval, log=lambda m: print(m, flush=True))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
