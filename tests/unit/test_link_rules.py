"""The data-plane addresses of `nodes[].linkIps` (rule fabric-link-ips, planning/link_rules.py): each bad kind
is refused naming the address's field and the fix; the seed stacks pass."""

import pytest

from declared.cluster import parse_cluster
from harness import cluster_of, group_of
from planning import rules

RULE = dict(rules.RULES)["fabric-link-ips"]


def findings(stack: str, **links):
    """`stack`'s config with nodes[i].linkIps replaced (`links`: n0=[...], n2=[...]), run through the rule."""
    raw = cluster_of(stack)
    for key, ips in links.items():
        raw["nodes"][int(key[1:])]["linkIps"] = ips
    return RULE(parse_cluster(raw), stack)


# tp3 is a triangle: spark1 10.0.22.1 + [10.0.23.1], spark2 10.0.22.2 + [10.0.33.2], spark3 10.0.23.3 + [10.0.33.3]
@pytest.mark.parametrize("links, field, problem, fix", [
    ({"n0": ["10.0.23.1", "10.0.23.1"]}, "nodes[0].linkIps[1]", "listed twice in spark1's linkIps", "once"),
    ({"n0": ["10.0.22.1"]}, "nodes[0].linkIps[0]", "is spark1's fabricIp too", "remove it from linkIps"),
    ({"n0": ["10.0.23.3"]}, "nodes[0].linkIps[0]", "is also spark3's nodes[2].fabricIp", "its own address"),
    ({"n1": ["10.0.23.1"]}, "nodes[1].linkIps[0]", "is also spark1's nodes[0].linkIps[0]", "its own address"),
    ({"n0": ["10.0.22.9"]}, "nodes[0].linkIps[0]", "is on 10.0.22.0/24 like spark1's own fabricIp 10.0.22.1",
     "give each cable its own /24 subnet"),
    ({"n0": ["10.0.99.1"]}, "nodes[0].linkIps[0]", "no other node has an address on 10.0.99.0/24",
     "give the node it is cabled to its address on that link (10.0.99.0/24"),
    ({"n1": ["10.0.23.2"]}, "nodes[1].linkIps[0]", "10.0.23.0/24 is shared with spark1, spark3: with topology direct "
     "a cable joins exactly two nodes", "give each cable its own /24 subnet"),
])  # fmt: skip
def test_each_bad_link_address_is_refused_with_its_field_and_fix(links, field, problem, fix):
    found = [f for f in findings("tp3", **links) if f.field == field]
    assert found, [str(f) for f in findings("tp3", **links)]
    assert problem in found[0].problem and fix in found[0].fix and found[0].level == "error"
    assert str(found[0]).startswith(f"cluster.{field} = ")


def test_one_mistake_is_one_finding():
    assert [f.field for f in findings("tp3", n0=["10.0.23.1", "10.0.23.1"])] == ["nodes[0].linkIps[1]"]
    assert [f.field for f in findings("tp3", n0=["10.0.22.1"])] == ["nodes[0].linkIps[0]"]


def test_a_subnet_shared_by_several_nodes_is_fine_on_a_switch():
    """topology switch: a second port's subnet reaches every node through the switch."""
    raw = cluster_of("tp4")
    for i, node in enumerate(raw["nodes"]):
        node["linkIps"] = [f"10.0.23.{i + 1}"]
    assert RULE(parse_cluster(raw), "tp4") == []
    raw["nodes"][3]["linkIps"] = ["10.0.24.4"]  # a subnet no other node is on still reaches nobody
    assert [f.field for f in RULE(parse_cluster(raw), "tp4")] == ["nodes[3].linkIps[0]"]


@pytest.mark.parametrize("stack", ["tp2", "tp3", "tp4", "sim", "sim-tp2"])
def test_the_seed_stacks_links_pass(stack):
    assert RULE(parse_cluster(group_of(stack)), stack) == []


def test_a_bad_address_is_left_to_fabric_ip_is_ipv4():
    raw = cluster_of("tp3")
    raw["nodes"][0]["linkIps"] = ["spark1-cx7"]
    errors, _ = rules.check(parse_cluster(raw), "tp3")
    assert RULE(parse_cluster(raw), "tp3") == []
    assert "nodes[0].linkIps[0]" in {e.field for e in errors if e.rule == "fabric-ip-is-ipv4"}
