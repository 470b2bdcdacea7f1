"""The office network's view of a brought-up stack (planning/exposure.py): from a host on the cluster's management
network that belongs to no stack (sim/outsider.py), every TCP port of every node, and requests with no credential.
Each module calls `check_closed` on its stack; what it saw goes to EXPOSURE, printed at the end of the run."""

from __future__ import annotations

from e2e.timings import EXPOSURE
from sim import outsider


def endpoint_port(outputs: dict) -> tuple[str, int]:
    """(host, port) of the stack's endpoint (its base URL ends in /v1)."""
    from urllib.parse import urlsplit

    u = urlsplit(outputs["endpoint"])
    return u.hostname, u.port or (443 if u.scheme == "https" else 80)


def listener_of(outputs: dict, node: str, port: int) -> str:
    for row in outputs["exposure"][node]["listeners"]:
        first, _, last = row["port"].partition("-")
        if first.isdigit() and int(first) <= port <= int(last or first):
            return row["listener"]
    return "(not in the plan)"


def scan(cluster: str, stack: str, outputs: dict, phase: str) -> dict[str, list[int]]:
    """Every node's open ports from outside, recorded as `phase` (before / after the fence)."""
    found = outsider.scan(cluster)
    names = {v["host"]: n for n, v in outputs["exposure"].items()}
    for host, ports in found.items():
        for port in ports:
            EXPOSURE[f"{stack} {phase} {names.get(host, host)} {port}"] = listener_of(outputs, names.get(host, ""), port)
    return found


def check_closed(cluster: str, stack: str, outputs: dict) -> dict[str, list[int]]:
    """From outside: ssh on every node and the endpoint on its node, nothing else; what answers anonymously is
    /health alone."""
    found = scan(cluster, stack, outputs, "fenced")
    host, port = endpoint_port(outputs)
    expected = {h: [22] + ([port] if h == host else []) for h in found}
    assert found == expected, f"open from outside: {found}, expected {expected}"
    base = outputs["endpoint"].removesuffix("/v1")
    door = outputs.get("front_door") or {}
    ca = door.get("ca_pem") or ""  # the front door's: /health there whatever it fronts
    health = "/health/readiness" if "gateway" in outputs and not door else "/health"
    status, _ = outsider.http(cluster, "GET", base + health, ca_pem=ca)
    assert status == 200, (health, status)
    chat = '{"model": "%s", "messages": [{"role": "user", "content": "What is 19 + 23?"}]}' % outputs["model"]
    status, text = outsider.http(cluster, "POST", base + "/v1/chat/completions", chat, ca_pem=ca)
    assert status in (401, 403), (status, text[:200])
    for path in ("/v1/models", "/metrics"):  # recorded: the router answers model lists to anyone it lets in
        EXPOSURE[f"{stack} anonymous GET {path}{' (front door)' if door else ''}"] = str(
            outsider.http(cluster, "GET", base + path, ca_pem=ca)[0])
    return found
