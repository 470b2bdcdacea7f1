"""Integration: a real 3-node simulated cluster (docker engine needed; see conftest)."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from sim_helpers import http, ssh, wait_for

from sim import cluster, faults, sshconfig

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sim-test-key"
DIST_PORT = 20000
HTTP_PORT = 8888


# ---------------------------------------------------------------------------------- access ----
def test_ssh_strict_host_keys_each_node(sim_cluster):
    for n in sim_cluster.nodes:
        assert ssh(sim_cluster, n, "hostname").stdout.strip() == n.name
    # the ssh_config file works on its own too (aliases spark<i>)
    r = subprocess.run(["ssh", "-F", str(sim_cluster.ssh.ssh_config), "-o", "BatchMode=yes", "spark2", "hostname"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "spark2", r.stderr


def test_strict_checking_rejects_unknown_host_key(sim_cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    n = sim_cluster.nodes[0]
    r = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(sim_cluster.ssh.private_key), "-o", "BatchMode=yes",
                        "-o", f"UserKnownHostsFile={empty}", "-o", "StrictHostKeyChecking=yes",
                        f"root@{n.ip}", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 255 and "Host key verification failed" in r.stderr


def test_password_login_refused(sim_cluster):
    n = sim_cluster.nodes[0]
    r = subprocess.run(["ssh", "-F", "/dev/null", "-o", f"UserKnownHostsFile={sim_cluster.ssh.known_hosts}",
                        "-o", "BatchMode=yes", "-o", "PubkeyAuthentication=no", f"root@{n.ip}", "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 255 and "Permission denied" in r.stderr


def test_docker_dial_stdio_with_ssh_opts(sim_cluster):
    """What pulumi-docker does for host=ssh://root@ip with ssh_opts: `ssh <opts> -- host docker system dial-stdio`."""
    for n in sim_cluster.nodes:
        r = subprocess.run(["ssh", "-F", "/dev/null", *sim_cluster.ssh.ssh_opts(), "--", f"root@{n.ip}",
                            "docker", "system", "dial-stdio"],
                           input=b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n",
                           capture_output=True, timeout=60)
        assert r.stdout.startswith(b"HTTP/1.1 200 OK"), r.stderr
        assert r.stdout.rstrip().endswith(b"OK")


def _burst(argv: list[str], n: int) -> list[subprocess.CompletedProcess]:
    """`n` copies of `argv` started at once (as the engine's parallel steps open connections to one node)."""
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    return [subprocess.CompletedProcess(argv, p.wait(timeout=120), *p.communicate()) for p in procs]


def test_sshd_drops_a_burst_past_max_startups_and_the_programs_shared_connection_rides_it_out(sim_cluster):
    """The nodes run sshd's default MaxStartups (10:30:100): 40 connections at once, some dropped
    (`kex_exchange_identification`). The program's system-ssh options (commands.ssh_opts: ControlMaster, one
    connection per node) carry the same burst of docker calls once the master is up, sessions past MaxSessions
    (10) falling back to their own connections."""
    from declared.cluster import parse_cluster
    from harness import group_of
    from planning import commands

    import shutil
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))  # a socket path stays under 104 bytes
    n = sim_cluster.nodes[1]
    base = ["ssh", "-F", "/dev/null", *sim_cluster.ssh.ssh_opts(), "-o", "BatchMode=yes"]
    plain = _burst([*base, f"root@{n.ip}", "sleep 1; docker version --format ok"], 40)
    dropped = [r for r in plain if r.returncode != 0]
    assert dropped and all("kex_exchange_identification" in r.stderr or "Connection reset" in r.stderr
                           or "Connection closed" in r.stderr for r in dropped), [r.stderr for r in dropped][:3]
    raw = group_of("sim")
    raw["ssh"] = {**raw.get("ssh", {}), "controlPath": str(tmp_path / "cm-%C")}
    program = commands.ssh_opts(parse_cluster(raw))
    opts = [o for o in program if "Control" in o]
    assert opts == ["ControlMaster=auto", f"ControlPath={tmp_path}/cm-%C", "ControlPersist=60"]
    shared = [*base, *(x for pair in zip(program[::2], program[1::2]) if "Control" in pair[1] for x in pair)]
    assert subprocess.run([*shared, f"root@{n.ip}", "true"], timeout=60).returncode == 0  # the master
    try:
        mux = _burst([*shared, f"root@{n.ip}", "docker version --format ok"], 10)
        assert [r.returncode for r in mux] == [0] * 10, [r.stderr for r in mux if r.returncode][:3]
    finally:
        subprocess.run([*shared, "-O", "exit", f"root@{n.ip}"], capture_output=True, timeout=30)
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_docker_cli_over_ssh_with_path_wrapper(sim_cluster, tmp_path):
    """docker CLI `-H ssh://` runs plain `ssh`: an ssh wrapper first on PATH adds `-F <sim ssh_config>`."""
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.parent.mkdir()
    real_ssh = subprocess.run(["sh", "-c", "command -v ssh"], capture_output=True, text=True).stdout.strip()
    wrapper.write_text(f'#!/bin/sh\nexec {real_ssh} -F "{sim_cluster.ssh.ssh_config}" "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, PATH=f"{wrapper.parent}:{os.environ['PATH']}")
    for n in sim_cluster.nodes:
        r = subprocess.run(["docker", "-H", f"ssh://root@{n.ip}", "info", "--format", "{{.Name}}"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == n.name, r.stderr


def test_docker_cli_over_ssh_with_user_config_include(sim_cluster):
    """`python -m sim ssh-config --install` puts an Include in ~/.ssh/config; plain docker CLI then works."""
    name = sim_cluster.name
    try:
        r = subprocess.run([sys.executable, "-m", "sim", "ssh-config", "--name", name, "--install"],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        n = sim_cluster.nodes[0]
        r = subprocess.run(["docker", "-H", f"ssh://root@{n.ip}", "info", "--format", "{{.Name}}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == n.name, r.stderr
    finally:
        sshconfig.uninstall_ssh_include(name)
    assert f"dspark-sim {name}" not in (Path.home() / ".ssh" / "config").read_text()


def test_cli_ssh_config_json_and_status(sim_cluster):
    r = subprocess.run([sys.executable, "-m", "sim", "ssh-config", "--name", sim_cluster.name, "--json"],
                       cwd=ROOT, capture_output=True, text=True)
    j = json.loads(r.stdout)
    assert [(n["name"], n["host"], n["user"], n["port"]) for n in j["nodes"]] == \
        [(n.name, n.ip, "root", 22) for n in sim_cluster.nodes]
    assert all(n["host_key"].startswith("ssh-ed25519 ") for n in j["nodes"])
    assert Path(j["private_key"]).exists() and Path(j["known_hosts"]).exists() and Path(j["ssh_config"]).exists()
    st = cluster.status(sim_cluster.name)
    assert st["healthy"], st
    again = cluster.create(sim_cluster.name, 3, subnet=sim_cluster.subnet, log=lambda m: None)  # idempotent
    assert [n.ip for n in again.nodes] == [n.ip for n in sim_cluster.nodes]


def test_node_standins(sim_cluster):
    n = sim_cluster.nodes[1]
    out = ssh(sim_cluster, n, "nvidia-smi -L; nvidia-smi --query-gpu=name --format=csv,noheader; "
                              "nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader; "
                              "ethtool enp1s0f1np1; ibdev2netdev; test -c /dev/infiniband/uverbs0 && echo uverbs-ok; "
                              "ls /srv/models/DS4.1 /srv/models/DS4.1/engram; test -d /srv/engram && echo engram-dir; "
                              "test -s /etc/dspark-sim-version && echo version-ok").stdout
    assert f"GPU 0: NVIDIA GB10 (UUID: GPU-sim-{n.name})" in out
    assert "\tSpeed: 200000Mb/s" in out and "\tLink detected: yes" in out
    assert "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)" in out and "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)" in out
    assert "uverbs-ok" in out
    for f in ["config.json"] + [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)] + ["layer1.bin"]:
        assert f in out
    assert "engram-dir" in out and "version-ok" in out
    sums = {ssh(sim_cluster, m, "cd /srv/models/DS4.1 && cat config.json engram/*.bin *.safetensors | md5sum").stdout
            for m in sim_cluster.nodes}
    assert len(sums) == 1  # same checkpoint on every node


def test_pack_engram_on_node(sim_cluster):
    n = sim_cluster.nodes[2]
    run = ("docker run --rm -v /srv/models:/srv/models:ro -v /srv/engram:/srv/engram sglang-sim:test-double "
           "python3 /opt/dsv41/scripts/pack_engram.py --model /srv/models/DS4.1 --out /srv/engram "
           "--rank 2 --tp 3 --layers 1,14")
    first = ssh(sim_cluster, n, run).stdout
    assert first.count("packed") == 2
    m1 = ssh(sim_cluster, n, "stat -c '%n %s %Y' /srv/engram/engram-l*-r2of3.bin").stdout
    second = ssh(sim_cluster, n, run).stdout
    assert second.count("skip") == 2
    assert ssh(sim_cluster, n, "stat -c '%n %s %Y' /srv/engram/engram-l*-r2of3.bin").stdout == m1


def test_meminfo_moves_with_a_pack_a_copy_a_drop_and_held_memory(sim_cluster):
    """The node's /proc/meminfo (sim-meminfo): written files fill the page cache, the sysctl stand-in empties
    it, held memory is neither free nor available; the real memory gate reads the same file."""
    name, n = sim_cluster.name, sim_cluster.nodes[1]
    ssh(sim_cluster, n, "sysctl -w vm.drop_caches=3 >/dev/null")
    time.sleep(0.6)
    base = faults.meminfo(name, n.name)
    ssh(sim_cluster, n, "mkdir -p /srv/engram/t && cp -r /srv/models/DS4.1/engram /srv/engram/t/ && sync")
    time.sleep(1.2)  # the daemon renders every 0.5 s
    filled = faults.meminfo(name, n.name)
    assert filled["Cached"] > base["Cached"] + 100_000 and filled["MemFree"] < base["MemFree"] - 100_000
    assert filled["MemAvailable"] < base["MemAvailable"]  # the cache is mostly, not all, reclaimable
    assert "vm.drop_caches = 3" in ssh(sim_cluster, n, "sysctl -w vm.drop_caches=3").stdout
    time.sleep(0.6)
    assert faults.meminfo(name, n.name)["Cached"] == base["Cached"]
    pid = faults.hold_memory(name, n.name, 100 * 1024)
    try:
        held = faults.meminfo(name, n.name)
        assert base["MemAvailable"] - held["MemAvailable"] == 100 * 1024
        assert ssh(sim_cluster, n, f"cat /proc/{pid}/comm").stdout.strip() == "sim-memory-hold"
        gate = ssh(sim_cluster, n, "python3 - --node x --role worker --need-mib 30000", check=False,
                   input=(Path(__file__).parents[2] / "programs" / "memgate.py").read_text())  # fmt: skip
        assert gate.returncode == 1 and "largest processes: sim-memory-hold (pid" in gate.stderr, gate.stderr
    finally:
        faults.release_memory(name, n.name)
        ssh(sim_cluster, n, "rm -rf /srv/engram/t")
    assert faults.meminfo(name, n.name)["MemAvailable"] == base["MemAvailable"]


# ---------------------------------------------------------------------------- rank group ----
WRAPPER = 'exec python3 -m sglang.launch_server "$@"'


def rank_cmd(info, rank: int, name: str, nnodes: int = 3) -> str:
    head = info.nodes[0].ip
    launch = ["--model-path", "/srv/models/DS4.1", "--served-model-name", "deepseek-v4.1-flash",
              "--trust-remote-code", "--tp", str(nnodes), "--nnodes", str(nnodes), "--node-rank", str(rank),
              "--dist-init-addr", f"{head}:{DIST_PORT}", "--host", "0.0.0.0", "--port", str(HTTP_PORT),
              "--api-key", API_KEY, "--context-length", "262144", "--mem-fraction-static", "0.9"]
    docker = ["docker", "run", "-d", "--name", name, "--network", "host", "--ipc", "host", "--gpus", "all",
              "--device", "/dev/infiniband:/dev/infiniband", "--ulimit", "memlock=-1", "--ulimit",
              "stack=67108864", "-v", "/srv/models:/srv/models:ro", "--restart", "no",
              "sglang-sim:test-double", "/bin/sh", "-c", WRAPPER, "sh", *launch]
    return shlex.join(docker)


def container_state(info, node, name) -> str:
    r = ssh(info, node, f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {name}", check=False)
    return r.stdout.strip()


@pytest.fixture()
def rank_names(sim_cluster):
    names = [f"simtest-rank{i}" for i in range(3)]
    yield names
    for n, name in zip(sim_cluster.nodes, names):
        ssh(sim_cluster, n, f"docker rm -f {name} >/dev/null 2>&1 || true", check=False)


def test_rank_group_serves_and_breaks(sim_cluster, rank_names):
    nodes = sim_cluster.nodes
    base = f"http://{nodes[0].ip}:{HTTP_PORT}"
    ssh(sim_cluster, nodes[0], rank_cmd(sim_cluster, 0, rank_names[0]))
    assert wait_for(lambda: http(base + "/health")[0] == 503, 30), "rank 0 should answer 503 before the group forms"
    for r in (1, 2):
        ssh(sim_cluster, nodes[r], rank_cmd(sim_cluster, r, rank_names[r]))
    assert wait_for(lambda: http(base + "/health")[0] == 200, 60), \
        ssh(sim_cluster, nodes[0], f"docker logs {rank_names[0]}", check=False).stdout
    for r in (1, 2):
        assert http(f"http://{nodes[r].ip}:{HTTP_PORT}/health")[0] == 200
    logs = ssh(sim_cluster, nodes[0], f"docker logs {rank_names[0]}").stdout
    assert "joined rank 1" in logs and "joined rank 2" in logs and "group formed (3/3 ranks)" in logs

    code, body = http(base + "/v1/models", API_KEY)
    assert code == 200 and json.loads(body)["data"][0]["id"] == "deepseek-v4.1-flash"
    q = {"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": "What is 19 + 23?"}]}
    code, body = http(base + "/v1/chat/completions", API_KEY, q)
    j = json.loads(body)
    assert code == 200 and j["object"] == "chat.completion"
    assert j["choices"][0]["message"]["content"] == "42" and j["choices"][0]["finish_reason"] == "stop"
    assert j["usage"]["completion_tokens"] >= 1
    assert http(base + "/v1/chat/completions", "wrong-key", q) == (401, '{"error": "Unauthorized"}')
    assert http(base + "/v1/models")[0] == 401

    # streaming (SSE)
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(dict(q, stream=True)).encode(),
                                 headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        lines = [ln.decode().strip() for ln in resp if ln.strip()]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "42"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

    # a worker dies -> rank 0 (and the other worker) exit non-zero
    ssh(sim_cluster, nodes[2], f"docker kill {rank_names[2]}")
    st = wait_for(lambda: (s := container_state(sim_cluster, nodes[0], rank_names[0])).startswith("exited") and s,
                  30)
    assert st and st != "exited 0", st
    assert "lost rank 2" in ssh(sim_cluster, nodes[0], f"docker logs {rank_names[0]}").stdout
    st1 = wait_for(lambda: (s := container_state(sim_cluster, nodes[1], rank_names[1])).startswith("exited") and s,
                   30)
    assert st1 and st1 != "exited 0", st1


def test_unknown_flag_exits_2_on_node(sim_cluster):
    n = sim_cluster.nodes[0]
    r = ssh(sim_cluster, n, "docker run --rm sglang-sim:test-double /bin/sh -c "
                            "'exec python3 -m sglang.launch_server \"$@\"' sh --model-path /m --no-such-flag 1", check=False)
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr


# ------------------------------------------------------------------------ node faults (last) ----
def test_stop_and_start_node_keeps_state(sim_cluster):
    n = sim_cluster.nodes[1]
    ssh(sim_cluster, n, "docker volume create simtest-vol >/dev/null && "
                        "docker run --rm -v simtest-vol:/d sglang-sim:test-double sh -c 'echo kept > /d/f' && "
                        "echo marker > /root/marker")
    cluster.stop_node(sim_cluster.name, n.name, log=lambda m: None)
    assert ssh(sim_cluster, n, "true", check=False, timeout=30).returncode != 0
    st = cluster.status(sim_cluster.name)
    assert not st["healthy"] and st["nodes"][1]["state"] == "exited"
    cluster.start_node(sim_cluster.name, n.name, log=lambda m: None)
    out = ssh(sim_cluster, n, "cat /root/marker; docker run --rm -v simtest-vol:/d sglang-sim:test-double cat /d/f; "
                              "docker image inspect -f ok sglang-sim:test-double").stdout
    assert out.split() == ["marker", "kept", "ok"]
    assert cluster.status(sim_cluster.name)["healthy"]
