"""A host on a simulated cluster's management network that belongs to no stack: the office network's view of
the nodes, for proving what the fence lets through (planning/exposure.py). Each call is a short-lived container at
a fixed address of the network's dynamic range: the node image for the scan (Debian's nmap), the engine TEST
DOUBLE image for requests and `ray start --address` (its Python and the real Ray).
"""
from __future__ import annotations

import ipaddress
import json
import subprocess

from . import backend, images, inventory
from .inventory import SimError

OUTSIDER_INDEX = 250  # <subnet>.250: in the network's dynamic range (.128/25), never a node's

def address(cluster: str) -> str:
    from .cluster import plan

    return str(ipaddress.ip_network(plan(cluster, 1).subnet).network_address + OUTSIDER_INDEX)


def run(cluster: str, argv: list[str], image: str = images.ENGINE_IMAGE, timeout: float = 600) -> subprocess.CompletedProcess:
    """`argv` in a container of `image` on the cluster's management network at the outsider's address."""
    from .cluster import plan

    if not inventory.nodes(cluster):
        raise SimError(f"cluster {cluster!r} does not exist")
    return backend.docker("run", "--rm", "--network", plan(cluster, 1).network, "--ip", address(cluster),
                          "--entrypoint", argv[0], image, *argv[1:], check=False, timeout=timeout)  # fmt: skip


def scan(cluster: str) -> dict[str, list[int]]:
    """Every TCP port of every node's management address that answers the outsider: nmap's SYN scan of all 65535
    (from the node image: Debian's nmap), which tells a dropped port (filtered) from an open one however loaded
    the machine is, retrying what did not answer."""
    hosts = [n.ip for n in inventory.nodes(cluster)]
    r = run(cluster, ["nmap", "-sS", "-Pn", "-n", "-p-", "-T4", "--min-rate", "3000", "--max-retries", "3", "-oG", "-",
                      *hosts], image=images.node_image_tag())  # fmt: skip
    if r.returncode != 0:
        raise SimError(f"the outsider's scan failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    found: dict[str, list[int]] = {h: [] for h in hosts}
    for line in r.stdout.splitlines():
        if line.startswith("Host:") and "Ports:" in line:
            host = line.split()[1]
            for entry in line.split("Ports:", 1)[1].split("\t", 1)[0].split(","):
                port, state = entry.strip().split("/")[:2]
                if state == "open":
                    found[host].append(int(port))
    return found


def http(cluster: str, method: str, url: str, body: str = "", headers: dict[str, str] | None = None,
         ca_pem: str = "") -> tuple[int, str]:  # fmt: skip
    """One request from the outsider: (status, body) — status 0 when nothing answered (refused, dropped);
    `ca_pem`: an https URL is verified with this CA (the front door's)."""
    code = r"""
import json, ssl, sys, urllib.request, urllib.error
method, url, body, headers, ca = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
req = urllib.request.Request(url, data=body.encode() if body else None, method=method, headers=headers)
ctx = ssl.create_default_context(cadata=ca) if ca else None
try:
    with urllib.request.urlopen(req, timeout=5, context=ctx) as r: print(json.dumps([r.status, r.read().decode(errors="replace")[:2000]]))
except urllib.error.HTTPError as e: print(json.dumps([e.code, e.read().decode(errors="replace")[:2000]]))
except Exception as e: print(json.dumps([0, f"{type(e).__name__}: {e}"]))
"""
    r = run(cluster, ["python3", "-c", code, method, url, body, json.dumps(headers or {}), ca_pem], timeout=120)
    status, text = json.loads(r.stdout.strip().splitlines()[-1])
    return status, text


def ray_join(cluster: str, head: str, timeout: int = 40) -> tuple[int, str]:
    """`ray start --address=<head>` from the outsider (with Ray's own wait bounded): (exit code, output)."""
    r = run(cluster, ["timeout", "-k", "5", str(timeout), "ray", "start", f"--address={head}", "--block"], timeout=timeout + 30)
    return r.returncode, (r.stdout + r.stderr)[-2000:]
