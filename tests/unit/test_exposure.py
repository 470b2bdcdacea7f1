"""The exposure plan (planning/exposure.py): every listener in it is bound where the program's argv binds it, the
fence lets each through from its sources only, the rule set is valid nftables, and the docs page is generated."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess

import pytest

from declared.stack import parse_stack
from declared.stackfiles import project_stacks
from dspark import exposure_page
from harness import cluster_of, with_known_hosts
from planning import exposure, stackplan

STACKS = project_stacks()
OUTSIDE = "192.0.2.77"  # TEST-NET-1: a host of the office network that is none of the stack's


def plan_of(stack: str, **firewall):
    raw = with_known_hosts(cluster_of(stack))
    if firewall:
        raw["firewall"] = firewall
    return stackplan.build_stack(parse_stack(raw), stack)


@pytest.mark.parametrize("stack", STACKS)
def test_from_outside_a_node_lets_in_ssh_and_the_endpoint_only(stack):
    cp = plan_of(stack)
    endpoint_host = cp.endpoint.split("//", 1)[1].split(":", 1)[0]
    for ne in cp.exposure:
        seen = {(lst.what.split(":")[0], lst.port) for lst in ne.reachable_from(OUTSIDE)}
        want = {("ssh", "22")} | ({(w, p) for w, p in seen if p == cp.endpoint.rsplit(":", 1)[1].split("/")[0]}
                                  if ne.host == endpoint_host else set())  # fmt: skip
        assert seen == want and len(seen) == (2 if ne.host == endpoint_host else 1), (ne.node, seen)


@pytest.mark.parametrize("stack", STACKS)
def test_every_bind_in_the_plan_is_what_the_program_runs(stack):
    """The engines', the router's, the gateway's, the monitoring's and the guard's argv bind what the plan lists
    (no 0.0.0.0 but where the plan says the software binds every interface)."""
    cp = plan_of(stack)
    argv = []
    for g in cp.groups:
        for spec in g.group.specs:
            argv.append((spec.node, " ".join(spec.args) + " " + spec.entrypoint[2]))
        if g.guard:
            argv += [(n.node, " ".join(g.guard.base_args(n.rank))) for n in g.guard.nodes]
    if cp.router and cp.router.node:
        argv.append((cp.router.node.name, " ".join(cp.router.spec.args)))
    if cp.gateway:
        argv.append((cp.gateway.node.name, " ".join(cp.gateway.gateway.command)))
    if cp.monitoring:
        argv += [(e.node.name, " ".join(e.container.command)) for e in cp.monitoring.exporters]
        if cp.monitoring.server:
            s = cp.monitoring.server
            argv += [(s.node.name, " ".join(c.command)) for c in (s.prometheus, s.alertmanager)]
    text = "\n".join(a for _, a in argv)
    assert "0.0.0.0" not in text, [a for _, a in argv if "0.0.0.0" in a]
    by_node = {ne.node: ne for ne in cp.exposure}
    for node, line in argv:
        binds = {lst.bind for lst in by_node[node].listeners}
        for flag in ("--host ", "--prometheus-host ", "--bind ", "--web.listen-address="):
            if flag in line:
                value = line.split(flag, 1)[1].split()[0].rsplit(":", 1)[0] if "=" in flag else line.split(flag, 1)[1].split()[0]
                assert value in binds, (node, flag, value, binds)


@pytest.mark.skipif(shutil.which("nft") is None or shutil.which("unshare") is None, reason="no nft here")
@pytest.mark.parametrize("stack", STACKS)
def test_every_nodes_rule_set_is_valid_nftables(stack):
    for ne in plan_of(stack, open=[{"port": 8080, "why": 'the lab\'s "dashboard"'}]).exposure:
        proc = subprocess.run(["unshare", "-rn", "nft", "-c", "-f", "-"], input=ne.ruleset, capture_output=True,
                              text=True)  # fmt: skip
        assert proc.returncode == 0, (ne.node, proc.stderr, ne.ruleset)


def test_the_fence_drops_by_default_and_lets_each_port_in_from_its_sources_only():
    cp = plan_of("sim-team", clients=["10.20.0.0/16"], operators=["10.20.5.0/24"], scrapers=["10.20.9.7"])
    head = cp.exposure[0]
    rules = head.ruleset
    assert "policy drop;" in rules and 'iifname "lo" accept' in rules and "ct state established,related accept" in rules
    assert "set operators { type ipv4_addr; flags interval; elements = { 10.20.5.0/24 } }" in rules
    assert "tcp dport 22 ip saddr @operators accept" in rules and "meta nfproto ipv6 tcp dport 22" not in rules
    assert "tcp dport 4000 ip saddr @clients accept" in rules  # the gateway, the endpoint
    assert "set peers { type ipv4_addr; flags interval; elements = { 10.99.1.12 } }" in rules
    assert "ip saddr @peers accept" in rules  # the group's data plane: NCCL's and Ray's ports too
    assert "9090" not in rules and "9093" not in rules and "5433" not in rules  # loopback only: no rule at all
    monitoring = dict(head.sets)["monitoring"]
    assert monitoring == ("10.20.9.7/32", "172.30.99.11")
    # the worker lets in its guard and exporter from the stack and the monitoring only, no client port
    worker = cp.exposure[1].ruleset
    assert "@clients" not in worker and "tcp dport { 9100, 9850 } ip saddr @monitoring accept" in worker


def test_a_source_is_an_ipv4_address_or_network_and_the_field_is_named():
    raw = cluster_of("sim")
    raw["firewall"] = {"clients": ["::/0"]}
    with pytest.raises(Exception, match=r"cluster\.firewall\.clients\[0\].*IPv6 sources are not supported"):
        parse_stack(raw)
    raw["firewall"] = {"operators": ["office"]}
    with pytest.raises(Exception, match=r"cluster\.firewall\.operators\[0\].*not an IPv4 address or network"):
        parse_stack(raw)
    assert parse_stack({**raw, "firewall": {"operators": ["10.1.2.3"]}}).firewall.operators == ["10.1.2.3/32"]


def test_firewall_off_is_no_fence_and_the_preview_says_so():
    cp = plan_of("sim", enabled=False)
    assert all(not ne.enabled for ne in cp.exposure)
    assert "no fence" in exposure.summary(cp.exposure)
    assert [lst.what for lst in cp.exposure[0].reachable_from(OUTSIDE)][:2] == ["ssh", "engine API (sglang rank 0): the endpoint"]


def test_peers_are_the_groups_other_nodes_on_the_planes_it_uses():
    tp3 = plan_of("tp3")  # bootstrap: management (a triangle): the peers' hosts too
    peers = dict(tp3.exposure[0].sets)["peers"]
    assert {"10.0.0.2", "10.0.0.3"} <= set(peers) and "10.0.0.1" not in peers
    x2 = plan_of("tp4x2")  # two groups: a node's peers are its own group's only
    a_peers = {ipaddress.ip_address(p) for p in dict(x2.exposure[0].sets)["peers"]}
    b_nodes = {ipaddress.ip_address(n.fabric_ip) for n in x2.groups[1].nodes}
    assert a_peers and not a_peers & b_nodes


def test_the_committed_page_is_what_the_plan_generates():
    assert exposure_page.PAGE.read_text() == exposure_page.render(), (
        f"docs/exposure.md is stale: run `{exposure_page.REGENERATE}` and commit the page")


def test_the_data_plane_lets_in_the_rails_twins_whose_addresses_only_the_nodes_know():
    # A Spark's cabled port is two netdevs (enp1s0f1np1, enP2p1s0f1np1), each with its own address; the config
    # names one, the fabric gate and NCCL use both: the fence lets in what arrives on the ConnectX-7's netdevs.
    rules = plan_of("sim").exposure[1].ruleset
    assert 'iifname "enp1s0f*" accept' in rules and 'iifname "enP2p1s0f*" accept' in rules
    raw = with_known_hosts(cluster_of("tp2"))
    # a socket interface pinned to another NIC (here the management one) is not let in whole: the office LAN
    # arrives on it; the peers' own addresses (@peers) are what reaches the ranks there
    raw["fabric"] = {**raw.get("fabric", {}), "socketIfname": "enp1s0f0np0,eth9"}
    pinned = stackplan.build_stack(parse_stack(raw), "tp2").exposure[0]
    assert pinned.data_plane == ("enp1s0f*", "enP2p1s0f*")
    assert 'iifname "eth9"' not in pinned.ruleset
    assert {n["host"] for n in raw["nodes"][1:]} <= set(dict(pinned.sets)["peers"])
