"""Integration: the vllm-sim TEST DOUBLE + REAL Ray (the PyPI wheel in the image) on two simulated
Sparks, deployed as the program deploys engine ``vllm`` (head container on node 0 gated on Ray,
``ray start --block`` worker on node 1)."""
from __future__ import annotations

import json
import shlex

import pytest
from sim_helpers import (API_KEY_FILE, HEAD_WRAPPER, WORKER_WRAPPER, head_env, http, serve_args, sse, ssh,
                         wait_for, worker_args, worker_env)

from sim import images, rootfs

pytestmark = pytest.mark.integration
API_KEY = "sim-vllm-key"
RAY_PORT = 6379
HTTP_PORT = 8000
HEAD, WORKER = "simtest-vllm-head", "simtest-vllm-worker"
HOST_KEY_FILE = "/root/simtest-vllm-api-key"
Q = {"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": "What is 19 + 23?"}]}


def docker_run(name: str, env: dict, args: list[str], wrapper: str, argv0: str, mounts: list[str]) -> str:
    cmd = ["docker", "run", "-d", "--name", name, "--network", "host", "--ipc", "host", "--gpus", "all",
           "--device", "/dev/infiniband:/dev/infiniband", "--ulimit", "memlock=-1", "--shm-size", "1g",
           "--restart", "no"]
    for m in mounts:
        cmd += ["-v", m]
    for k, v in env.items():
        cmd += ["-e", f"{k}={v}"]
    cmd += [images.VLLM_IMAGE, "/bin/sh", "-c", wrapper, argv0, *args]
    return shlex.join(cmd)


def head_cmd(info, extra_env: dict | None = None) -> str:
    head_ip = info.nodes[0].ip
    return docker_run(HEAD, dict(head_env(head_ip, RAY_PORT, 2), **(extra_env or {})), serve_args(HTTP_PORT),
                      HEAD_WRAPPER, "vllm-head",
                      ["/srv/models/DS4.1:/models/checkpoint:ro", f"{HOST_KEY_FILE}:{API_KEY_FILE}:ro"])


def worker_cmd(info, extra_env: dict | None = None) -> str:
    head_ip, ip = info.nodes[0].ip, info.nodes[1].ip
    return docker_run(WORKER, dict(worker_env(ip), **(extra_env or {})), worker_args(head_ip, ip, RAY_PORT),
                      WORKER_WRAPPER, "ray-worker", [])


def state(info, node, name) -> str:
    r = ssh(info, node, f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {name}", check=False)
    return r.stdout.strip()


def exited(info, node, name, timeout: float) -> str | None:
    return wait_for(lambda: (s := state(info, node, name)).startswith("exited") and s, timeout)


def logs(info, node, name) -> str:
    r = ssh(info, node, f"docker logs {name} 2>&1", check=False)
    return r.stdout


@pytest.fixture()
def pair(sim_cluster):
    """Clean head/worker container names on nodes 0/1 and the API key file on node 0."""
    n0, n1 = sim_cluster.nodes[0], sim_cluster.nodes[1]
    for n, name in ((n0, HEAD), (n1, WORKER)):
        ssh(sim_cluster, n, f"docker rm -f {name} >/dev/null 2>&1 || true", check=False)
    ssh(sim_cluster, n0, f"printf %s {API_KEY} > {HOST_KEY_FILE} && chmod 600 {HOST_KEY_FILE}")
    yield n0, n1
    for n, name in ((n0, HEAD), (n1, WORKER)):
        ssh(sim_cluster, n, f"docker rm -f {name} >/dev/null 2>&1 || true", check=False)


def test_vllm_image_on_every_node(sim_cluster):
    for n in sim_cluster.nodes:
        out = ssh(sim_cluster, n, "docker image inspect -f '{{.Id}}' sglang-sim:test-double vllm-sim:test-double && "
                                  "docker run --rm vllm-sim:test-double sh -c 'ray --version && vllm --version && "
                                  "python3 -c \"import ray; print(ray.__version__)\"'").stdout.split("\n")
        assert out[0] == out[1] and out[0].startswith("sha256:")  # one image, two names
        assert out[2] == f"ray, version {rootfs.RAY_VERSION}" and out[4] == rootfs.RAY_VERSION  # real Ray
        assert out[3].endswith("+test-double")


def test_unknown_flags_exit_2_on_node(sim_cluster):
    n = sim_cluster.nodes[0]
    r = ssh(sim_cluster, n, "docker run --rm vllm-sim:test-double vllm serve /models/checkpoint --no-such-flag 1",
            check=False)
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr
    r = ssh(sim_cluster, n, "docker run --rm vllm-sim:test-double ray start --head --no-such-flag", check=False)
    assert r.returncode == 2 and "No such option '--no-such-flag'" in r.stderr  # real Ray's click CLI


def test_vllm_ray_head_and_worker_serve_then_break(sim_cluster, pair):
    n0, n1 = pair
    base = f"http://{n0.ip}:{HTTP_PORT}"
    ssh(sim_cluster, n0, head_cmd(sim_cluster))
    # the Ray head is up and the gate holds vllm back until the worker joined
    assert wait_for(lambda: "1 node_" in ssh(sim_cluster, n0, f"docker exec {HEAD} ray status", check=False).stdout,
                    30), logs(sim_cluster, n0, HEAD)
    assert http(base + "/health")[0] is None and state(sim_cluster, n0, HEAD) == "running 0"

    ssh(sim_cluster, n1, worker_cmd(sim_cluster))  # started after the head, as the program does
    assert wait_for(lambda: http(base + "/health")[0] == 200, 60), \
        logs(sim_cluster, n0, HEAD) + logs(sim_cluster, n1, WORKER)
    head_log = logs(sim_cluster, n0, HEAD)
    assert "ray gate: 2/2 Ray nodes alive" in head_log
    assert "rank 0 on" in head_log and f"({n0.ip}), rank 1 on" in head_log and f"({n1.ip})" in head_log
    assert "Ray runtime started" in logs(sim_cluster, n1, WORKER)
    # `ray status` shows the autoscaler's view, which lags ray.nodes() (the gate's) by a few seconds
    assert wait_for(lambda: ssh(sim_cluster, n0, f"docker exec {HEAD} ray status", check=False)
                    .stdout.count(" node_") == 2, 30)
    ips = ssh(sim_cluster, n0, f"docker exec {HEAD} python3 -c " + shlex.quote(
        "import ray; ray.init(address='auto', logging_level='ERROR'); "
        "print(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']), ray.cluster_resources()['GPU'])"
    )).stdout.strip().splitlines()[-1]
    assert ips == f"{sorted([n0.ip, n1.ip])} 2.0"

    assert http(base + "/health") == (200, "")                     # never authenticated
    assert http(base + "/v1/models") == (401, '{"error": "Unauthorized"}')
    assert http(base + "/v1/models", "wrong-key") == (401, '{"error": "Unauthorized"}')
    assert http(base + "/v1/chat/completions", "wrong-key", Q)[0] == 401
    code, body = http(base + "/v1/models", API_KEY)
    m = json.loads(body)["data"][0]
    assert code == 200 and m["id"] == "deepseek-v4.1-flash" and m["max_model_len"] == 131072
    assert m["root"] == "/models/checkpoint"
    code, body = http(base + "/v1/chat/completions", API_KEY, Q)
    j = json.loads(body)
    assert code == 200 and j["object"] == "chat.completion" and j["model"] == "deepseek-v4.1-flash"
    assert j["choices"][0]["message"]["content"] == "42" and j["choices"][0]["finish_reason"] == "stop"
    chunks = sse(base + "/v1/chat/completions", API_KEY, Q)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "42"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

    # stopping the worker container breaks the tensor-parallel group: the head container exits non-zero
    ssh(sim_cluster, n1, f"docker stop {WORKER}")
    st = exited(sim_cluster, n0, HEAD, 60)  # Ray's GCS marks the node dead, the double notices within 2 s
    assert st and st != "exited 0", (st, logs(sim_cluster, n0, HEAD))
    assert "lost Ray node(s)" in logs(sim_cluster, n0, HEAD) and n1.ip in logs(sim_cluster, n0, HEAD)


def test_worker_exits_when_head_goes(sim_cluster, pair):
    n0, n1 = pair
    ssh(sim_cluster, n0, head_cmd(sim_cluster))
    # real Ray: the worker's raylet gives up on the GCS after gcs_rpc_server_reconnect_timeout_s (60 s by
    # default; 10 s here, through Ray's own RAY_<config> variable, to keep the test short), then
    # `ray start --block` sees a Ray process die and exits 1
    ssh(sim_cluster, n1, worker_cmd(sim_cluster, {"RAY_gcs_rpc_server_reconnect_timeout_s": "10"}))
    assert wait_for(lambda: http(f"http://{n0.ip}:{HTTP_PORT}/health")[0] == 200, 60), logs(sim_cluster, n0, HEAD)
    ssh(sim_cluster, n0, f"docker stop {HEAD}")
    st = exited(sim_cluster, n1, WORKER, 120)
    assert st and st != "exited 0", (st, logs(sim_cluster, n1, WORKER))


def test_head_gives_up_without_worker(sim_cluster, pair):
    n0, _ = pair
    ssh(sim_cluster, n0, head_cmd(sim_cluster, {"DSPARK_RAY_WAIT": "3"}))
    st = exited(sim_cluster, n0, HEAD, 40)
    assert st == "exited 1", (st, logs(sim_cluster, n0, HEAD))
    assert "ray gate: only 1/2 Ray nodes alive after 3s; giving up" in logs(sim_cluster, n0, HEAD)
