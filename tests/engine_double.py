"""One engine TEST DOUBLE process (sim/testdouble: SGLang's launch_server or `vllm serve`) on 127.0.0.1, for
tests that read what it serves (tests/sim/test_engine_metrics.py, tests/conformance/test_real_metrics.py).
No docker: the double runs with this machine's python, one rank, API key KEY."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import promtext

ROOT = Path(__file__).resolve().parents[1]
KEY = "k1"
MODEL = "deepseek-v4.1-flash"
KV_POOL = 60000  # --max-total-tokens of the SGLang double (its pool: this times DSPARK_SIM_KV_SHARE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, key: str | None = None, body: dict | None = None, timeout: float = 10) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


class Engine:
    """The double as a child process; `stop` kills it (by its own handle)."""

    def __init__(self, engine: str, tmp: Path, metrics: bool = True, env: dict[str, str] | None = None):
        from sim.testdouble import engram

        self.engine, self.port = engine, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        if engine == "sglang":
            argv = ["-m", "sim.testdouble.launch_server", "--model-path", "/m", "--served-model-name", MODEL,
                    "--host", "127.0.0.1", "--port", str(self.port), "--api-key", KEY, "--nnodes", "1",
                    "--node-rank", "0", "--tp", "1", "--max-total-tokens", str(KV_POOL), "--context-length", "65536",
                    ] + (["--enable-metrics"] if metrics else [])  # fmt: skip
        else:
            ckpt = tmp / "ckpt"
            ckpt.mkdir(exist_ok=True)
            (ckpt / "config.json").write_bytes(engram.checkpoint_files()["config.json"])
            argv = ["-m", "sim.testdouble.vllm_serve", "serve", str(ckpt), "--served-model-name", MODEL,
                    "--host", "127.0.0.1", "--port", str(self.port), "--api-key", KEY, "--max-model-len", "8192",
                    "--max-num-seqs", "4"]  # fmt: skip
        self.log = tmp / f"{engine}-{self.port}.log"
        import os

        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})  # fmt: skip
        deadline = time.monotonic() + 20
        while http(self.base + "/health")[0] != 200:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f"{engine} double did not come up: {self.log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def metrics_text(self) -> str:
        code, body = http(self.base + "/metrics")
        assert code == 200, (code, body)
        return body

    def families(self) -> dict[str, promtext.Family]:
        return promtext.parse(self.metrics_text())

    def chat(self, content: str = "What is 19 + 23?", stream: bool = False, max_tokens: int | None = None) -> str:
        """One chat completion (streamed: its whole SSE body); asserts a 200."""
        body: dict = {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": stream}
        if max_tokens:
            body.update(max_tokens=max_tokens, ignore_eos=True)
        code, text = http(self.base + "/v1/chat/completions", KEY, body, timeout=60)
        assert code == 200, (code, text)
        return text
