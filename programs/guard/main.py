"""The guard's process: its arguments, the leader's loop, and the HTTP endpoints every guard serves.

    python3 guard.pyz --stack S --group G --node spark2 --rank 1 --role follower --port 9850 \
        --state-dir /state --token-file /run/secrets/dspark-guard-token --container <rank 1's ID> \
        --gates '[["rails", "rails.py", [...]], ["memory", "memgate.py", [...]]]'
    python3 guard.pyz ... --role leader --leader '{"peers": [...], "heal": {...}, "settings": {...}, ...}'

GET /metrics (Prometheus text) and GET /status (JSON) answer anyone: they hold no secret. POST /v1/act
acts only on requests signed with the group's token (wire), and only on this node's own rank.
SIGTERM (Pulumi replacing or deleting the guard, docker stopping it) ends the process at once; a heal
in progress stays in the journal, and the next guard of the same containers starts it over.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import secrets
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from programs import membership, probe

from . import decide, heal, wire
from .dockerapi import Docker, DockerError
from .journal import Journal

PROGRAMS = ("rails.py", "memgate.py")  # the gates' programs, shipped in the archive beside the guard
RAILS_TTL = 5.0  # seconds a reading of the node's rails serves scrapes (a scrape every 15 s by default)


def log(msg: str) -> None:
    print(f"[guard {time.strftime('%H:%M:%S', time.gmtime())}Z] {msg}", flush=True)


def program_text(name: str) -> str:
    if name not in PROGRAMS:
        raise ValueError(f"no gate program {name!r}")
    return importlib.resources.files("programs").joinpath(name).read_text()


def node_gates(node: str, spec: list) -> heal.NodeGates:
    return heal.NodeGates(node, tuple((gate, program_text(name), tuple(args)) for gate, name, args in spec))


class Guard:
    def __init__(self, a: argparse.Namespace, docker: Optional[Docker] = None):
        self.a = a
        self.token = open(a.token_file, "rb").read().strip()
        self.instance = secrets.token_hex(8)
        self.docker = docker or Docker()
        self.verifier = wire.Verifier(self.token, a.node, self.instance)
        self.gates = node_gates(a.node, json.loads(a.gates))
        self.stop = threading.Event()
        self.started = time.time()
        self.leader: Optional[dict] = json.loads(a.leader) if a.leader else None
        armed = [a.container] + [p["container"] for p in (self.leader or {}).get("peers", [])]
        self.journal = Journal(a.state_dir, armed)
        self.labels = {"stack": a.stack, "group": a.group, "node": a.node, "role": a.role}
        self.rail_args = next((list(args) for gate, _, args in json.loads(a.gates) if gate == "rails"), None)
        self.fabric = json.loads(a.fabric) if a.fabric else None  # the group's last bandwidth gate (the leader's)
        self.host_run = subprocess.run  # runs a program on the node itself (heal.HOST), as the gates do
        self.rails_read: tuple[float, list[dict]] = (float("-inf"), [])

    # ------------------------------------------------------------------ answering other guards
    def act(self, doc: dict[str, Any]) -> dict[str, Any]:
        if doc.get("container") != self.a.container:
            raise wire.Refused(403, "not this node's rank: a guard acts on its own node's rank container only")
        action = doc["action"]
        if action == "state":
            return {"rank": heal.state_doc(heal.observed(self.a.rank, self.a.node, self.docker, self.a.container))}
        if action == "tail":
            return {"lines": self.docker.tail(self.a.container, min(int(doc.get("lines", 20)), 200))}
        if action == "stop":
            self.docker.stop(self.a.container, int(doc.get("grace", 10)))
        elif action == "start":
            self.docker.start(self.a.container)
        elif action == "gates":
            ok, text = self.gates.run()
            return {"ok": ok, "output": text}
        log(f"{action} {self.a.container[:12]} (asked by the group's leader)")
        return {"done": action}

    # ------------------------------------------------------------------ the leader
    def ranks(self) -> dict[int, heal.Rank]:
        assert self.leader is not None
        out: dict[int, heal.Rank] = {self.a.rank: heal.LocalRank(self.a.rank, self.a.node, self.a.container,
                                                                  self.docker, self.gates)}  # fmt: skip
        for p in self.leader["peers"]:
            out[p["rank"]] = heal.RemoteRank(p["rank"], p["node"], p["container"],
                                             heal.Peer(p["url"], p["node"], self.token))  # fmt: skip
        return out

    def key(self) -> str:
        with open(self.leader["key_file"]) as f:
            return f.read().strip()

    def health(self, url: str) -> bool:
        try:
            return probe.get_health(url, timeout=5) == 200
        except OSError:
            return False

    def lead(self) -> None:
        cfg = self.leader
        settings = decide.Settings(**cfg["settings"])
        hp = heal.HealPlan(**{**cfg["heal"], "start_order": tuple(cfg["heal"]["start_order"]),
                              "stop_order": tuple(cfg["heal"]["stop_order"])})  # fmt: skip
        ranks = self.ranks()
        answered: set[str] = set()
        j = self.journal
        j.load()
        if j.healing:
            log(f"a heal was in progress when the guard stopped (attempt {j.healing.get('attempt')}, at "
                f"{j.healing.get('step')}): it starts over unless the group serves")  # fmt: skip
        while not self.stop.is_set():
            if j.retry_requested():
                log("asked to try again: the attempts count from zero")
                j.memory.exhausted, j.memory.attempts, j.memory.next_try = None, 0, 0.0
            obs_ranks = tuple(ranks[i].observe() for i in sorted(ranks))
            up = all(r.up or r.state == decide.UNREACHABLE for r in obs_ranks)  # none known down: ask the head
            obs = decide.Observation(time.time(), obs_ranks, self.health(hp.url) if up else None, j.paused(),
                                     frozenset(answered))  # fmt: skip
            answered |= {r.node for r in obs_ranks if r.state != decide.UNREACHABLE}
            d = decide.decide(obs, j.memory, settings)
            resumed = j.healing
            if resumed and d.state == "serving":
                if hp.router and hp.worker:  # it may have stopped before the group was back in rotation
                    membership.add(hp.router, hp.worker, self.key(), hp.boot_timeout)
                j.record({**resumed, "result": "served", "why": "was serving when the guard came back",
                          "ended_at": time.time()})  # fmt: skip
                j.healing = None
            elif resumed and d.state not in ("paused", "blocked", "waiting", "exhausted"):
                fault = decide.Fault(resumed.get("fault", "rank-exited"), f"{resumed.get('detail', '')} (the heal "
                                     "was started over: the guard stopped in the middle of it)",
                                     resumed.get("fault_at") or time.time())  # fmt: skip
                d = decide.Decision("healing", fault.detail, fault)
            j.state, j.reason = d.state, d.reason
            j.extra = {"ranks": [heal.state_doc(r) | {"rank": r.rank, "node": r.node} for r in obs_ranks],
                       "health": obs.health, "node": self.a.node, "group": self.a.group}  # fmt: skip
            j.save()
            if d.fault is not None:
                self.run_heal(ranks, hp, settings, d.fault, resume=resumed is not None)
            self.stop.wait(cfg.get("interval", 5))

    def run_heal(self, ranks, hp: heal.HealPlan, settings: decide.Settings, fault: decide.Fault,
                 resume: bool) -> None:  # fmt: skip
        j = self.journal
        attempt = int(j.healing.get("attempt", 1)) if resume and j.healing else decide.started(j.memory)
        j.healing = {"attempt": attempt, "fault": fault.kind, "detail": fault.detail, "fault_at": fault.at,
                     "since": time.time(), "step": "detected"}  # fmt: skip
        j.state, j.reason = "healing", f"attempt {attempt} of {settings.max_attempts}: {fault.detail}"

        def progress(step: str) -> None:
            j.healing["step"] = step
            j.save()

        log(f"fault: {fault.detail}; healing (attempt {attempt} of {settings.max_attempts})")
        try:
            rec = heal.heal(ranks, hp, self.key(), fault, attempt, progress, self.stop, log)
        except heal.Stopping as exc:
            log(f"stopping mid-heal (at {exc}): the next guard of these containers starts it over")
            j.save()
            return
        except OSError as exc:
            rec = {"attempt": attempt, "fault": fault.kind, "detail": fault.detail, "fault_at": fault.at,
                   "result": "failed", "why": f"{type(exc).__name__}: {exc}", "ended_at": time.time()}  # fmt: skip
        j.healing = None
        j.record(rec)
        kind = f"{rec['fault']}|{rec['result']}"
        j.counts[kind] = j.counts.get(kind, 0) + 1
        if rec["result"] == "served":
            decide.served(j.memory, time.time())
            j.state, j.reason = "serving", f"healed: {fault.detail}"
        else:
            decide.failed(j.memory, settings, time.time(), rec["why"])
            j.state, j.reason = ("exhausted" if j.memory.exhausted else "backoff"), rec["why"]
        j.save()

    # ------------------------------------------------------------------ what anyone may read
    def status(self) -> dict[str, Any]:
        if self.leader is None:
            return {"role": "follower", "node": self.a.node, "group": self.a.group, "instance": self.instance,
                    "since": self.started}  # fmt: skip
        return {"role": "leader", **self.journal.document()}

    def rail_states(self) -> list[dict]:
        """This node's rails as its rails gate finds them (programs/rails.py `--format links`, run on the node as the
        gates are), read at most every RAILS_TTL seconds; [] when they cannot be read."""
        at, states = self.rails_read
        if time.monotonic() - at < RAILS_TTL:
            return states
        try:
            r = self.host_run([*heal.HOST, "python3", "-", *self.rail_args, "--format", "links"],
                              input=program_text("rails.py"), capture_output=True, text=True, timeout=30)  # fmt: skip
            states = json.loads(r.stdout) if r.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired, ValueError):
            states = []
        self.rails_read = (time.monotonic(), states)
        return states

    def fabric_metrics(self) -> list[str]:
        """This node's rails as NCCL uses them (device state, negotiated speed) and, on the leader, the group's last
        bandwidth gate per node pair (what `up` measured when the group last started)."""
        group = f'stack="{self.a.stack}",group="{self.a.group}"'
        lines = []
        if self.rail_args is not None:
            states = self.rail_states()
            lines += ["# HELP dspark_node_rail_up A data-plane rail of this node is up (RoCE port ACTIVE, link detected).",
                      "# TYPE dspark_node_rail_up gauge"]  # fmt: skip
            labels = [f'{group},node="{self.a.node}",rail="{r["netdev"]}",hca="{r["hca"]}"' for r in states]
            lines += [f"dspark_node_rail_up{{{lab}}} {int(r['up'])}" for lab, r in zip(labels, states)]
            lines += ["# HELP dspark_node_rail_speed_mbps The rail's negotiated speed (ethtool), 0 when unknown.",
                      "# TYPE dspark_node_rail_speed_mbps gauge"]  # fmt: skip
            lines += [f"dspark_node_rail_speed_mbps{{{lab}}} {r['speed_mbps']}" for lab, r in zip(labels, states)]
        if self.fabric:
            lines += ["# HELP dspark_fabric_floor_gbps fabric.minBandwidthGbps: the bandwidth gate's floor per pair.",
                      "# TYPE dspark_fabric_floor_gbps gauge", f"dspark_fabric_floor_gbps{{{group}}} "
                      f"{self.fabric.get('floorGbps', 0)}",
                      "# HELP dspark_fabric_pair_gbps What a node pair carried over all its rails at the last gate.",
                      "# TYPE dspark_fabric_pair_gbps gauge"]  # fmt: skip
            lines += [f'dspark_fabric_pair_gbps{{{group},a="{p["a"]}",b="{p["b"]}"}} {p["totalGbps"]}'
                      for p in self.fabric.get("pairs", [])]  # fmt: skip
        return lines

    def metrics(self) -> str:
        base = ",".join(f'{k}="{v}"' for k, v in self.labels.items())
        lines = ["# HELP dspark_guard_up The group's guard on this node runs.", "# TYPE dspark_guard_up gauge",
                 f"dspark_guard_up{{{base}}} 1", *self.fabric_metrics()]  # fmt: skip
        if self.leader is None:
            return "\n".join(lines) + "\n"
        j = self.journal
        group = f'stack="{self.a.stack}",group="{self.a.group}"'
        lines += ["# HELP dspark_guard_group_state The group's state as its guard sees it (1: this state).",
                  "# TYPE dspark_guard_group_state gauge"]  # fmt: skip
        lines += [f'dspark_guard_group_state{{{group},state="{s}"}} {int(j.state == s)}' for s in decide.STATES]
        lines += ["# HELP dspark_guard_heals_total Heals the guard ran, by fault and result.",
                  "# TYPE dspark_guard_heals_total counter"]  # fmt: skip
        counts = j.counts
        for f in decide.FAULTS:
            for result in ("served", "failed"):
                lines.append(f'dspark_guard_heals_total{{{group},fault="{f}",result="{result}"}} '
                             f'{counts.get(f"{f}|{result}", 0)}')  # fmt: skip
        m = j.memory
        last = j.heals[-1] if j.heals else {}
        served = [h for h in j.heals if h.get("result") == "served" and h.get("seconds_to_serve") is not None]
        gauges = [
            ("attempts", "Heals started in the current fault episode.", m.attempts),
            ("exhausted", "1 when the guard gave up: the group stays down until someone acts.", int(bool(m.exhausted))),
            ("paused", "1 while the guard is paused for maintenance.", int(j.state == "paused")),
            ("last_fault_timestamp_seconds", "When the last healed or attempted fault happened.", last.get("fault_at", 0)),
            ("last_heal_seconds_to_serve", "Seconds from the last healed fault to serving again.",
             served[-1]["seconds_to_serve"] if served else 0),
        ]  # fmt: skip
        for name, help_text, value in gauges:
            lines += [f"# HELP dspark_guard_{name} {help_text}", f"# TYPE dspark_guard_{name} gauge",
                      f"dspark_guard_{name}{{{group}}} {value}"]  # fmt: skip
        lines += ["# HELP dspark_guard_rank_up A rank's container runs (as the guard last saw it).",
                  "# TYPE dspark_guard_rank_up gauge"]  # fmt: skip
        for r in j.extra.get("ranks", []):
            lines.append(f'dspark_guard_rank_up{{{group},rank="{r["rank"]}",node="{r["node"]}"}} '
                         f'{int(r["state"] == "running")}')  # fmt: skip
        return "\n".join(lines) + "\n"


def handler(g: Guard):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_):  # requests are not logged (the probes come every few seconds)
            pass

        def _send(self, code: int, body: bytes, ctype: str, sig: Optional[str] = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if sig:
                self.send_header(wire.HEADER, sig)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/metrics":
                self._send(200, g.metrics().encode(), "text/plain; version=0.0.4")
            elif self.path == "/status":
                self._send(200, heal.dumps(g.status()).encode(), "application/json")
            else:
                self._send(404, b'{"error": "not found"}', "application/json")

        def do_POST(self):
            if self.path != "/v1/act":
                return self._send(404, b'{"error": "not found"}', "application/json")
            body = self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 65536))
            try:
                doc = g.verifier.check(body, self.headers.get(wire.HEADER))
                payload = g.act(doc)
            except wire.Refused as exc:
                log(f"refused a request: {exc.reason}")
                return self._send(exc.status, json.dumps({"error": exc.reason}).encode(), "application/json")
            except (DockerError, OSError) as exc:
                payload = {"error": str(exc)}
            data, sig = wire.answer(g.token, doc["nonce"], {**payload, "instance": g.instance})
            self._send(200, data, "application/json", sig)

    return Handler


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="guard.pyz", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--role", choices=("leader", "follower"), required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bind", default="127.0.0.1", help="the address to listen on (the node's management address: "
                   "planning/exposure.py)")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--container", required=True, help="this node's rank container, by the ID Pulumi created it with")
    p.add_argument("--gates", default="[]", help="JSON: [[gate, program, [args...]], ...] run on the node")
    p.add_argument("--leader", default="", help="JSON: peers, heal plan, settings, key file, interval (leader)")
    p.add_argument("--fabric", default="", help="JSON: the group's last bandwidth gate report (leader; served as metrics)")
    a = p.parse_args(argv)
    if (a.role == "leader") != bool(a.leader):
        p.error("--leader is required with --role leader, and only then")
    return a


def main(argv: Optional[list[str]] = None) -> int:
    a = parse(argv)
    g = Guard(a)
    server = ThreadingHTTPServer((a.bind, a.port), handler(g))
    server.daemon_threads = True

    def on_term(*_):
        g.stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    log(f"{a.role} of group {a.group} on {a.node} (rank {a.rank}, container {a.container[:12]}), {a.bind}:{a.port}")
    if g.leader is not None:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        g.lead()
    else:
        server.serve_forever()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
