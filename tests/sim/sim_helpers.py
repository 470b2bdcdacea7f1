"""Helpers shared by the tests in tests/sim: ssh/http/wait and the vLLM + Ray container wrappers.

The wrappers follow the contract the Pulumi program deploys for engine ``vllm`` (seed 004):

* head (node 0): ``/bin/sh -c HEAD_WRAPPER vllm-head serve /models/checkpoint ...``: ``ray start --head``
  (real Ray; returns once the head runs), then the Ray gate (``python3 -c GATE``: wait until
  ``$DSPARK_RAY_NODES`` nodes are alive, at most ``$DSPARK_RAY_WAIT`` s, else exit 1), then the API key
  file (if present) into ``VLLM_API_KEY`` and ``exec vllm "$@"``;
* worker (node 1): ``/bin/sh -c WORKER_WRAPPER ray-worker ray start --block --address HEAD:6379 ...``.
"""
from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request

API_KEY_FILE = "/run/secrets/vllm-api-key"

GATE = """import os, sys, time, ray
ray.init(address=os.environ["RAY_ADDRESS"])
want = int(os.environ["DSPARK_RAY_NODES"])
wait = int(os.environ.get("DSPARK_RAY_WAIT", "900"))
deadline = time.monotonic() + wait
while True:
    alive = sum(1 for n in ray.nodes() if n.get("Alive"))
    if alive >= want:
        break
    if time.monotonic() > deadline:
        print(f"ray gate: only {alive}/{want} Ray nodes alive after {wait}s; giving up", file=sys.stderr, flush=True)
        sys.exit(1)
    time.sleep(1)
print(f"ray gate: {alive}/{want} Ray nodes alive", flush=True)
ray.shutdown()
"""
assert "'" not in GATE  # it is embedded in a single-quoted sh string

HEAD_WRAPPER = f"""set -e
ray start --head --port "$RAY_PORT" --node-ip-address "$VLLM_HOST_IP" --num-gpus 1 --disable-usage-stats
python3 -c '{GATE}'
if [ -f "${{DSPARK_API_KEY_FILE:-{API_KEY_FILE}}}" ]; then
  VLLM_API_KEY=$(cat "${{DSPARK_API_KEY_FILE:-{API_KEY_FILE}}}"); export VLLM_API_KEY
fi
exec vllm "$@"
"""

WORKER_WRAPPER = 'echo "ray worker on $(hostname): $*"\nexec "$@"\n'

# a rank's fabric env as on a Spark: the ConnectX-7 twin netdev for sockets, both RoCE twins for NCCL
# (the doubles run NCCL's interface/device rules on it: sim/testdouble/nccl.py)
NCCL_ENV = {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "GLOO_SOCKET_IFNAME": "enp1s0f1np1",
            "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "NCCL_DEBUG": "WARN", "RAY_memory_monitor_refresh_ms": "0"}


def head_env(head_ip: str, ray_port: int = 6379, nodes: int = 2) -> dict[str, str]:
    return dict(NCCL_ENV, RAY_ADDRESS=f"{head_ip}:{ray_port}", RAY_PORT=str(ray_port), VLLM_HOST_IP=head_ip,
                DSPARK_RAY_NODES=str(nodes))


def worker_env(ip: str) -> dict[str, str]:
    return dict(NCCL_ENV, VLLM_HOST_IP=ip)


def serve_args(port: int = 8000, tp: int = 2, extra: tuple[str, ...] = (),
               model: str = "/models/checkpoint") -> list[str]:
    return ["serve", model, "--served-model-name", "deepseek-v4.1-flash",
            "--tensor-parallel-size", str(tp), "--distributed-executor-backend", "ray",
            "--kv-cache-dtype", "fp8_ds_mla", "--max-model-len", "131072", "--host", "0.0.0.0",
            "--port", str(port), "--gpu-memory-utilization", "0.85", "--max-num-seqs", "16", *extra]


def worker_args(head_ip: str, ip: str, ray_port: int = 6379) -> list[str]:
    return ["ray", "start", "--block", "--address", f"{head_ip}:{ray_port}", "--node-ip-address", ip,
            "--num-gpus", "1", "--disable-usage-stats"]


# ------------------------------------------------------------------------------ ssh / http ----
def ssh(info, node, cmd: str, timeout: float = 120, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    """ssh as pulumi's docker provider does it: explicit key + known_hosts + strict checking."""
    opts = info.ssh.ssh_opts()
    r = subprocess.run(["ssh", "-F", "/dev/null", *opts, "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "--",
                        f"root@{node.ip}", cmd], capture_output=True, text=True, timeout=timeout, input=input)
    if check:
        assert r.returncode == 0, f"{node.name}: {cmd}\n{r.stdout}\n{r.stderr}"
    return r


def http(url, key=None, body=None, timeout=10):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def sse(url, key, body, timeout=10) -> list[dict]:
    """POST a streaming chat request; returns the chunks (asserts the SSE framing and [DONE])."""
    req = urllib.request.Request(url, data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        lines = [ln.decode().strip() for ln in resp if ln.strip()]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    return chunks


def wait_for(pred, timeout=60.0, step=0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()
