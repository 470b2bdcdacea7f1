"""A node's guard answering the leader over HTTP (a stand-in docker engine behind it): signed requests act on
its own rank only; anything else is refused; a restarted guard is asked again; /metrics and /status hold no
secret."""

import json
import subprocess
import threading
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from programs.guard import heal, main, wire
from programs.guard.dockerapi import Container

TOKEN = "f" * 64


class FakeDocker:
    def __init__(self):
        self.calls = []
        self.status = {"c-rank1": "exited"}

    def inspect(self, ref):
        if ref not in self.status:
            return None
        return Container(ref, "sim-rank1", self.status[ref], 137, False, "", None, 1000.5, {})

    def stop(self, ref, grace):
        self.calls.append(("stop", ref, grace))
        self.status[ref] = "exited"

    def start(self, ref):
        self.calls.append(("start", ref))
        self.status[ref] = "running"


def serve(tmp_path, docker):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    a = main.parse(["--stack", "sim", "--group", "sim", "--node", "spark2", "--rank", "1", "--role", "follower",
                    "--port", "0", "--state-dir", str(tmp_path), "--token-file", str(token), "--container", "c-rank1"])
    g = main.Guard(a, docker=docker)
    server = ThreadingHTTPServer(("127.0.0.1", 0), main.handler(g))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return g, server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def follower(tmp_path):
    docker = FakeDocker()
    g, server, url = serve(tmp_path, docker)
    yield g, docker, url, tmp_path
    server.shutdown()


def test_the_leader_reads_stops_and_starts_the_nodes_rank(follower):
    g, docker, url, _ = follower
    rank = heal.RemoteRank(1, "spark2", "c-rank1", heal.Peer(url, "spark2", TOKEN.encode()))
    obs = rank.observe()
    assert (obs.state, obs.exit_code, obs.finished_at) == ("exited", 137, 1000.5)
    rank.start()
    assert rank.observe().up
    rank.stop(7)
    assert docker.calls == [("start", "c-rank1"), ("stop", "c-rank1", 7)]


def test_a_request_without_the_token_is_refused_and_nothing_happens(follower):
    _, docker, url, _ = follower
    rank = heal.RemoteRank(1, "spark2", "c-rank1", heal.Peer(url, "spark2", b"not-the-token"))
    assert rank.observe().state == "unreachable" and "401" in rank.observe().detail
    with pytest.raises(wire.Refused):
        rank.start()
    assert docker.calls == []


def test_the_guard_acts_on_its_own_rank_only(follower):
    _, docker, url, _ = follower
    other = heal.RemoteRank(1, "spark2", "c-someone-else", heal.Peer(url, "spark2", TOKEN.encode()))
    with pytest.raises(wire.Refused) as exc:
        other.start()
    assert exc.value.status == 403 and docker.calls == []


def test_a_recorded_request_replayed_is_refused(follower):
    _, docker, url, _ = follower
    peer = heal.Peer(url, "spark2", TOKEN.encode())
    peer.call("state", container="c-rank1")
    body, sig, _ = wire.request(TOKEN.encode(), "spark2", peer.instance, "start", container="c-rank1")
    post = lambda: urllib.request.urlopen(urllib.request.Request(  # noqa: E731
        url + "/v1/act", data=body, headers={wire.HEADER: sig}, method="POST"), timeout=5)
    post().read()
    with pytest.raises(urllib.error.HTTPError) as exc:
        post()
    assert exc.value.code == 401 and docker.calls == [("start", "c-rank1")]


def test_a_guard_that_restarted_is_asked_for_its_new_run_first(tmp_path):
    docker = FakeDocker()
    g1, s1, url = serve(tmp_path, docker)
    peer = heal.Peer(url, "spark2", TOKEN.encode())
    peer.call("state", container="c-rank1")
    first = peer.instance
    s1.shutdown()
    s1.server_close()
    g2 = main.Guard(g1.a, docker=docker)  # the same node's guard, started again
    s2 = ThreadingHTTPServer(("127.0.0.1", int(url.rsplit(":", 1)[1])), main.handler(g2))
    threading.Thread(target=s2.serve_forever, daemon=True).start()
    try:
        peer.call("start", container="c-rank1")
        assert peer.instance == g2.instance != first and docker.calls == [("start", "c-rank1")]
    finally:
        s2.shutdown()


def test_metrics_and_status_answer_anyone_and_hold_no_secret(follower):
    _, _, url, _ = follower
    metrics = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    assert 'dspark_guard_up{stack="sim",group="sim",node="spark2",role="follower"} 1' in metrics
    status = urllib.request.urlopen(url + "/status", timeout=5).read().decode()
    assert '"role": "follower"' in status
    assert TOKEN not in metrics + status


def test_every_guard_serves_its_rails_and_the_leader_the_last_gates_pairs(tmp_path):
    """The fabric series the alert rules and the dashboard read: each node's rails as its rails gate finds them
    (programs/rails.py --format links, run on the node as the gates are, at most every RAILS_TTL seconds), and on
    the leader the group's last bandwidth gate (its `--fabric`)."""
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    gate = [["rails", "rails.py", ["--fabric-ip", "10.0.22.1", "--bootstrap-ip", "10.0.22.1", "--format", "check"]]]
    report = {"floorGbps": 175, "pairs": [{"a": "spark1", "b": "spark2", "totalGbps": 186.9}]}
    links = [{"hca": "rocep1s0f1", "netdev": "enp1s0f1np1", "up": True, "speed_mbps": 200000},
             {"hca": "roceP2p1s0f1", "netdev": "enP2p1s0f1np1", "up": False, "speed_mbps": 200000}]  # fmt: skip
    calls = []

    def on_node(argv, input, **kw):
        calls.append(argv)
        assert argv[: len(heal.HOST)] == list(heal.HOST) and argv[-2:] == ["--format", "links"]
        assert input == main.program_text("rails.py")
        return subprocess.CompletedProcess(argv, 0, json.dumps(links), "")

    argv = ["--stack", "sim", "--group", "sim", "--node", "spark1", "--rank", "0", "--role", "leader", "--port", "0",
            "--state-dir", str(tmp_path), "--token-file", str(token), "--container", "c0", "--gates", json.dumps(gate),
            "--leader", json.dumps({"peers": [], "heal": {}, "settings": {}}), "--fabric", json.dumps(report)]
    g = main.Guard(main.parse(argv), docker=FakeDocker())
    g.host_run = on_node
    text = g.metrics()
    lab = 'stack="sim",group="sim",node="spark1"'
    assert f'dspark_node_rail_up{{{lab},rail="enp1s0f1np1",hca="rocep1s0f1"}} 1' in text
    assert f'dspark_node_rail_up{{{lab},rail="enP2p1s0f1np1",hca="roceP2p1s0f1"}} 0' in text
    assert f'dspark_node_rail_speed_mbps{{{lab},rail="enp1s0f1np1",hca="rocep1s0f1"}} 200000' in text
    assert 'dspark_fabric_pair_gbps{stack="sim",group="sim",a="spark1",b="spark2"} 186.9' in text
    assert 'dspark_fabric_floor_gbps{stack="sim",group="sim"} 175' in text
    g.metrics()
    assert len(calls) == 1  # a scrape within RAILS_TTL reads the last reading
    g.host_run = lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "", "nsenter: permission denied")
    g.rails_read = (float("-inf"), [])
    assert "dspark_node_rail_up{" not in g.metrics()  # rails it cannot read: no series (the target stays up)
    follower = main.Guard(main.parse([*argv[: argv.index("--role")], "--role", "follower", "--port", "0", "--state-dir",
                                      str(tmp_path), "--token-file", str(token), "--container", "c1", "--gates",
                                      json.dumps(gate)]), docker=FakeDocker())  # fmt: skip
    follower.host_run = on_node
    text = follower.metrics()
    assert "dspark_node_rail_up{" in text and "dspark_fabric_pair_gbps" not in text
