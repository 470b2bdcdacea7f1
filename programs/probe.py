"""Readiness probe run by the Readiness component where Pulumi runs (stdlib only).

`up` succeeds only when rank 0's /health answers 200 *and* one authenticated chat completion
returns the expected answer: /health alone can be 200 while generation is dead. The API key is
read from an environment variable, never from the command line, and never printed.

While it waits, it also watches every rank's container on its node (`--rank`, over the system ssh
with the docker provider's options, `--ssh-opt`): a rank that exited fails `up` at once, naming the
rank, its exit code and the tail of its log (the key redacted), instead of after the timeout.

    DSPARK_API_KEY=... python3 -m programs.probe --url http://10.0.0.1:8888/v1 --model m \
        --rank 1=tp2-rank1@root@10.0.0.2:22 --ssh-opt=-oBatchMode=yes
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from programs import bootlog, tunnel


def health_url(base_url: str, path: str = "/health") -> str:
    """The unauthenticated health route beside the OpenAI base URL (LiteLLM's proxy: /health/readiness)."""
    root = base_url.rstrip("/")
    return (root[: -len("/v1")] if root.endswith("/v1") else root) + path


def get_health(base_url: str, timeout: float, path: str = "/health") -> int:
    try:
        with urllib.request.urlopen(health_url(base_url, path), timeout=timeout) as resp:
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


STATE_FORMAT = "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}"
PHASE_EVERY = 15.0  # seconds between two reads of rank 0's boot phase
LOG_LINES = 20


def parse_rank(spec: str) -> tuple[int, str, str, int]:
    """`<rank>=<container>@<user>@<host>:<port>` -> (rank, container, user@host, port)."""
    rank, rest = spec.split("=", 1)
    container, target = rest.split("@", 1)
    target, port = target.rsplit(":", 1)
    return int(rank), container, target, int(port)


SECRET = "[secret]"


def redact(text: str, key: str | None) -> str:
    """`text` with every occurrence of the API key replaced by [secret]."""
    return text.replace(key, SECRET) if key else text


def ssh_argv(target: str, port: int, ssh_opts: list[str], remote: str) -> list[str]:
    """The system ssh running `remote` (one shell string) on a node, as the docker provider reaches it."""
    return ["ssh", *ssh_opts, "-p", str(port), target, remote]


def on_node(target: str, port: int, ssh_opts: list[str], remote: str, timeout: float = 30) -> tuple[int, str]:
    """Run `remote` (one shell string) on a node through the system ssh; (exit code, output)."""
    argv = ssh_argv(target, port, ssh_opts, remote)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 255, f"ssh to {target} timed out"
    return proc.returncode, proc.stdout + proc.stderr


# Boot phases as the engines log them on rank 0, in boot order (a 12-13 minute boot is mostly the
# first two). The last one found in the log is where the boot is.
BOOT_PHASES: tuple[tuple[str, str], ...] = (
    ("joining the rank group", r"(?i)init torch distributed|group formed|Ray cluster|ray start"),
    ("loading weights", r"(?i)Load weight begin|Loading weights|Loading safetensors"),
    ("weights loaded", r"(?i)Load weight end|Loading weights took|Model loading took"),
    ("capturing CUDA graphs", r"(?i)Capture cuda graph begin|Capturing CUDA graph"),
    ("CUDA graphs captured", r"(?i)Capture cuda graph end|Graph capturing finished"),
    ("serving", r"(?i)The server is fired up and ready to roll|Application startup complete"),
)


def boot_phase(log_text: str) -> str | None:
    """Where rank 0's boot is, from its log: the last phase whose line appears, or None."""
    found, at = None, -1
    for name, pattern in BOOT_PHASES:
        for m in re.finditer(pattern, log_text):
            if m.start() >= at:
                found, at = name, m.start()
    return found


def rank0_phase(ranks: list[str], ssh_opts: list[str], run=on_node) -> str | None:
    """Rank 0's boot phase, read from the tail of its log on its node (None if it cannot be read)."""
    head = next((r for r in ranks if r.startswith("0=")), None)
    if head is None:
        return None
    _, container, target, port = parse_rank(head)
    code, out = run(target, port, ssh_opts, f"docker logs --tail 400 {shlex.quote(container)} 2>&1")
    return boot_phase(out) if code == 0 else None


def exited_rank(ranks: list[str], ssh_opts: list[str], key: str, run=on_node) -> str | None:
    """A message for the first rank whose container is no longer running, or None (all running, or
    a node that cannot be asked right now: that is for the timeout to judge)."""
    for spec in ranks:
        rank, container, target, port = parse_rank(spec)
        code, out = run(target, port, ssh_opts, f"docker inspect --format {shlex.quote(STATE_FORMAT)} {shlex.quote(container)}")
        if code != 0:
            if "No such object" in out or "No such container" in out:
                return f"rank {rank} ({container} on {target}) does not exist: it was removed or never started"
            continue
        status, exit_code, oom = (out.strip().split(" ") + ["", ""])[:3]
        if status == "created":  # Pulumi creates and starts a rank: still `created` means its start failed
            return (f"rank {rank} ({container} on {target}) was created but never started: docker could not start "
                    "it (a missing device, a GPU or driver error); `docker start` it on the node to see why")
        if status in ("exited", "dead"):
            _, logs = run(target, port, ssh_opts, f"docker logs --tail {LOG_LINES} {shlex.quote(container)} 2>&1")
            tail = redact(logs, key)
            why = (" after its container's memory limit killed it (OOMKilled): it used more than the memory plan "
                   "gives it (the limit shown in the preview); lower serving.memFractionStatic or maxTotalTokens, or "
                   "check what else the rank allocates" if oom == "true" else "")  # fmt: skip
            return (
                f"rank {rank} ({container} on {target}) exited with code {exit_code}{why}; "
                f"last {LOG_LINES} log lines:\n" + "\n".join("  | " + line for line in tail.rstrip().splitlines())
            )
    return None


def with_hint(down: str | None, hint: str) -> str | None:
    """A down rank's message, with how to start the group over once its cause is fixed. A plain `up` cannot:
    a rank left `Created` is in the state with init errors, and the docker provider's update of it starts
    nothing; the rest of a fail-stop group is no better off running."""
    if not down or not hint:
        return down
    return f"{down}\nonce the cause is fixed, start the whole group over (every rank, the head last): {hint}"


BOOT_PREFIX = "deepseek-spark boot: "  # the probe's last line once ready: what rank 0 obtained, as JSON
BOOT_GREP = r"max_total_num_tokens=|Initialized DSpark draft runner|KV cache size: |Available KV cache memory: "


def rank0_boot(ranks: list[str], ssh_opts: list[str], engine: str, run=on_node) -> dict:
    """The figures rank 0 logged at boot (bootlog.parse), None where the log has no such line."""
    head = next((r for r in ranks if r.startswith("0=")), None)
    text = ""
    if head is not None:
        _, container, target, port = parse_rank(head)
        code, out = run(target, port, ssh_opts,
                        f"docker logs {shlex.quote(container)} 2>&1 | grep -E {shlex.quote(BOOT_GREP)} | tail -n 50")
        text = out if code == 0 else ""
    return bootlog.parse(engine, text)


def check_boot(boot: dict, expected: int, min_share: float, mode: str, log=print) -> bool:
    """Print what rank 0 obtained (the last line, JSON: the `boot` stack output reads it); False when
    the pool is below the plan's share and mode is `fail`."""
    why = bootlog.verdict(boot, expected, min_share)
    log(BOOT_PREFIX + json.dumps({**boot, "expectedKvTokens": expected, "shortfall": why}, sort_keys=True))
    if why:
        log(f"readiness: {'FAILED' if mode == 'fail' else 'WARNING'}: {why}")
    return not (why and mode == "fail")


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
    ranks_down=lambda: None,
    phase=lambda: None,
    health_path: str = "/health",
) -> bool:
    """Poll until ready or timeout; returns True when ready. Logs progress and the last error.
    `ranks_down()` returns why a rank is down (then the wait stops at once) or None; `phase()` where
    rank 0's boot is (read at most every PHASE_EVERY seconds: it costs an ssh round trip)."""
    start = clock()
    last = "no attempt yet"
    stage = "health"
    boot, boot_read = None, None
    while True:
        elapsed = clock() - start
        down = ranks_down()
        if down:
            log(f"readiness: a rank is down after {elapsed:.0f}s, the group cannot come up: {down}")
            return False
        try:
            if stage == "health":
                code = get_health(base_url, timeout=min(30.0, interval * 3), path=health_path)
                if code == 200:
                    log(f"readiness: {health_url(base_url, health_path)} is 200 after {elapsed:.0f}s")
                    stage = "chat"
                    continue
                last = f"{health_path} returned {code}"
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
        if boot_read is None or elapsed - boot_read >= PHASE_EVERY:
            boot, boot_read = phase() or boot, elapsed
        where = f", rank 0 {boot}" if boot else ""
        log(f"readiness: waiting ({elapsed:.0f}s{where}): {last}")
        sleep(interval)


def trust(ca_pem: str) -> None:
    """Verify https URLs with this CA (PEM) alone from now on (urllib's default opener)."""
    import ssl

    if ca_pem.strip():
        ctx = ssl.create_default_context(cadata=ca_pem)
        urllib.request.install_opener(urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="OpenAI base URL ending in /v1")
    p.add_argument("--model", required=True)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--interval", type=float, default=10)
    p.add_argument("--prompt", default="What is 19 + 23?")
    p.add_argument("--expect", default="42")
    p.add_argument("--key-env", default="DSPARK_API_KEY", help="environment variable holding the API key")
    p.add_argument("--rank", action="append", default=[], help="<rank>=<container>@<user>@<host>:<port> to watch")
    p.add_argument("--ssh-opt", action="append", default=[], help="one system ssh option (as the docker provider's)")
    p.add_argument("--engine", choices=["sglang", "vllm"], help="read what rank 0 obtained from its boot log")
    p.add_argument("--expect-kv-tokens", type=int, default=0, help="the KV pool the plan expects rank 0 to obtain")
    p.add_argument("--min-kv-share", type=float, default=0.9, help="below this share of it: --kv-shortfall")
    p.add_argument("--kv-shortfall", choices=["fail", "warn"], default="fail")
    p.add_argument("--restart-hint", default="", help="how to start the group over, said when a rank is down")
    p.add_argument("--health-path", default="/health", help="the unauthenticated health route (LiteLLM: /health/readiness)")
    p.add_argument("--ca-env", metavar="NAME", help="environment variable holding the CA (PEM) an https --url is "
                   "verified with (the front door's); the system's CAs otherwise")
    p.add_argument("--tunnel", metavar="USER@HOST:PORT", help="reach --url through ssh to this node (an inner port the "
                   "fence lets only the stack's own parts reach)")
    a = p.parse_args(argv)
    key = os.environ.get(a.key_env, "")
    if not key:
        print(f"readiness: ${a.key_env} is empty; the API key must come through the environment", file=sys.stderr)
        return 2
    if a.ca_env:
        trust(os.environ.get(a.ca_env, ""))
    if not a.tunnel:
        return probe(a, key, a.url)
    target, port = a.tunnel.rsplit(":", 1)
    where = urllib.parse.urlsplit(a.url)
    try:
        with tunnel.forward(target, int(port), a.ssh_opt, where.hostname, where.port or 80) as local:
            print(f"readiness: {where.hostname}:{where.port} through ssh to {target} (127.0.0.1:{local})", flush=True)
            return probe(a, key, tunnel.local_url(a.url, local))
    except OSError as exc:
        print(f"readiness: {exc}", flush=True)
        return 1


def probe(a: argparse.Namespace, key: str, url: str) -> int:
    ok = wait_ready(
        url, key, a.model, a.prompt, a.expect, a.timeout, a.interval,
        log=lambda m: print(m, flush=True),
        ranks_down=lambda: with_hint(exited_rank(a.rank, a.ssh_opt, key), a.restart_hint),
        phase=lambda: rank0_phase(a.rank, a.ssh_opt),
        health_path=a.health_path,
    )  # fmt: skip
    if ok and a.engine and a.rank:
        ok = check_boot(rank0_boot(a.rank, a.ssh_opt, a.engine), a.expect_kv_tokens, a.min_kv_share, a.kv_shortfall,
                        log=lambda m: print(m, flush=True))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
