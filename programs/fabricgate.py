"""The fabric gate: RDMA bandwidth between every pair of linked nodes, over all their rails, before a
group starts. Runs where Pulumi runs and reaches the nodes over the system ssh (the docker
provider's options), like the readiness probe.

For each node: its rails (programs/rails.py, `--format json`). For each linked pair (a, b), every
rail at once: an `ib_write_bw` server on b's rail k, then the client on a's rail k towards b's
address on that rail (programs/perftest.py builds both command lines). The pair's figure is the sum
over its rails; a pair below the floor fails the gate, naming the pair, each rail's figure and the
fix. Pairs run one after another, so a node's port is measured alone.

    python3 -m programs.fabricgate --spec JSON [--ssh-opt=OPT ...]
    spec: {"floor": 175, "nodes": [{"name", "target": "user@host", "port": 22, "rails_args": [...]}],
           "links": [{"a": "spark1", "b": "spark2", "a_ip": "10.0.0.1", "b_ip": "10.0.0.2"}]}

Prints a line per pair and, last, `deepseek-spark fabric-gate: {json}` (the `fabric` stack output).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from programs import perftest

REPORT_PREFIX = "deepseek-spark fabric-gate:"
BASE_PORT = 18515  # perftest's default; rail k uses BASE_PORT + k
RAILS = Path(__file__).with_name("rails.py")
SERVER_WAIT = 20.0
CONNECT_TRIES = 5
RUN_TIMEOUT = 90.0
FIX = ("check the cables and the switch ports (200G, autonegotiation off on the switch), flow control (PFC/ECN) on "
       "the switch, that both twins of each port have an address and are up (preflight's fabric checks), and "
       "re-measure: ib_write_bw -d <rail> --report_gbits on both nodes")  # fmt: skip


def ssh_argv(node: dict, ssh_opts: list[str], remote: str) -> list[str]:
    return ["ssh", *ssh_opts, "-p", str(node.get("port", 22)), node["target"], remote]


def rails_of(node: dict, ssh_opts: list[str], run=subprocess.run) -> dict:
    """programs/rails.py --format json on the node (its program on stdin)."""
    remote = "python3 - " + " ".join(shlex.quote(a) for a in [*node["rails_args"], "--format", "json"])
    r = run(ssh_argv(node, ssh_opts, remote), input=RAILS.read_text(), capture_output=True, text=True, timeout=60)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"rails": [], "problems": [["ssh", f"rails lookup failed ({r.returncode}): {r.stderr.strip()[-300:]}"]]}


def on_link(found: dict, ip: str) -> list[dict]:
    """The node's active rails of the port that holds `ip` (both twins), in PCI order."""
    port = set(found.get("ports", {}).get(ip, []))
    return [r for r in found["rails"] if r.get("state") == "ACTIVE" and (r["hca"] in port or not port)]


def measure(server: tuple[dict, dict], client: tuple[dict, dict], port: int, ssh_opts: list[str]) -> dict:
    """One rail: ib_write_bw server on server's node, then the client; the client's BW average."""
    (snode, srail), (cnode, crail) = server, client
    row = {"server": srail["hca"], "client": crail["hca"], "gbps": 0.0, "error": ""}
    # line-buffered: over ssh its stdout is a pipe, and perftest flushes the waiting banner only at exit
    s_argv = [*perftest.STDBUF_PREFIX, *perftest.bw_argv(srail["hca"], srail.get("gid_index"), port)]
    srv = subprocess.Popen(ssh_argv(snode, ssh_opts, shlex.join(s_argv)), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    seen: list[str] = []
    ready = threading.Event()

    def pump():
        for line in srv.stdout:
            seen.append(line)
            if perftest.SERVER_READY in line:
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        if not ready.wait(SERVER_WAIT) or srv.poll() not in (None, 0):
            row["error"] = f"the ib_write_bw server on {snode['name']} did not start: " + "".join(seen)[-400:].strip()
            return row
        c_argv = perftest.bw_argv(crail["hca"], crail.get("gid_index"), port, server=srail.get("ip") or snode["ip"])
        try:
            for attempt in range(CONNECT_TRIES):  # the banner comes just before the server binds its port
                out = subprocess.run(ssh_argv(cnode, ssh_opts, shlex.join(c_argv)), stdin=subprocess.DEVNULL,
                                     capture_output=True, text=True, timeout=RUN_TIMEOUT)  # fmt: skip
                if "Couldn't connect to" not in out.stdout + out.stderr or srv.poll() is not None:
                    break
                time.sleep(0.5)
            row["gbps"] = round(perftest.parse_bw(out.stdout + out.stderr), 2)
        except subprocess.TimeoutExpired:
            row["error"] = f"ib_write_bw on {cnode['name']} did not finish in {RUN_TIMEOUT:.0f} s"
        except ValueError as e:
            row["error"] = f"ib_write_bw on {cnode['name']}: {e}"
        return row
    finally:
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()


def gate(spec: dict, ssh_opts: list[str], out=None) -> dict:
    out = out or sys.stdout
    nodes = {n["name"]: n for n in spec["nodes"]}
    floor = float(spec["floor"])
    found = {}
    for name, node in nodes.items():
        found[name] = rails_of(node, ssh_opts)
    pairs, failures = [], []
    for lk in spec["links"]:
        a, b = nodes[lk["a"]], nodes[lk["b"]]
        a["ip"], b["ip"] = lk["a_ip"], lk["b_ip"]
        ra, rb = on_link(found[lk["a"]], lk["a_ip"]), on_link(found[lk["b"]], lk["b_ip"])
        t0 = time.monotonic()
        rows: list[dict] = [{}] * min(len(ra), len(rb))
        threads = []
        for k in range(len(rows)):
            def one(k=k):
                rows[k] = measure((b, rb[k]), (a, ra[k]), BASE_PORT + k, ssh_opts)
            threads.append(threading.Thread(target=one))
            threads[-1].start()
        for t in threads:
            t.join()
        total = round(sum(r["gbps"] for r in rows), 2)
        pair = {"a": lk["a"], "b": lk["b"], "rails": rows, "totalGbps": total, "floorGbps": floor,
                "seconds": round(time.monotonic() - t0, 1), "ok": total >= floor and bool(rows)}  # fmt: skip
        pairs.append(pair)
        figures = ", ".join(f"{r['client']}<->{r['server']} {r['gbps']:g}" + (f" ({r['error']})" if r["error"] else "")
                            for r in rows) or "no rail active on both nodes"  # fmt: skip
        print(f"fabric-gate {lk['a']}<->{lk['b']}: {total:g} Gb/s over {len(rows)} rail(s) [{figures}] "
              f"(floor {floor:g}): {'ok' if pair['ok'] else 'FAIL'}", file=out, flush=True)  # fmt: skip
        if not pair["ok"]:
            weakest = min(rows, key=lambda r: r["gbps"])["client"] if rows else "-"
            failures.append(f"{lk['a']}<->{lk['b']} carried {total:g} Gb/s over {len(rows)} rail(s) ({figures}), "
                            f"below fabric.minBandwidthGbps {floor:g} (weakest rail: {weakest}); {FIX}")
    report = {"floorGbps": floor, "pairs": pairs, "ok": not failures,
              "minGbps": min((p["totalGbps"] for p in pairs), default=None)}  # fmt: skip
    return {"report": report, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fabricgate", description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True, help="JSON: floor, nodes, links (see the module docstring)")
    p.add_argument("--ssh-opt", action="append", default=[], help="one system ssh option (as the docker provider's)")
    a = p.parse_args(argv)
    result = gate(json.loads(a.spec), a.ssh_opt)
    for message in result["failures"]:
        print(f"fabric gate: FAIL {message}", file=sys.stderr)
    print(f"{REPORT_PREFIX} {json.dumps(result['report'], sort_keys=True)}", flush=True)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
