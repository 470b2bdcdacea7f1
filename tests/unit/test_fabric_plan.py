"""The two planes in the plan: what each rank binds and where NCCL, dist-init, Ray and the checkpoint
go, for the example stacks' realistic addressing (tp3 triangle, tp4 switch, tp2 direct link)."""

from __future__ import annotations

import json
import shlex

from declared.cluster import parse_cluster
from harness import cluster_of
from planning import commands, fabric, launch, plan, rules


def cfg_of(stack, mutate=lambda raw: raw):
    return parse_cluster(mutate(cluster_of(stack)))


def _findings(cfg, rule="fabric-planes"):
    return dict(rules.RULES)[rule](cfg, "t")


def test_tp3_triangle_links_bootstrap_over_hosts_and_nfs_per_link():
    cfg = cfg_of("tp3")
    assert [(lk.a, lk.b, lk.subnet) for lk in fabric.links(cfg)] == [
        (0, 1, "10.0.22.0/24"), (0, 2, "10.0.23.0/24"), (1, 2, "10.0.33.0/24")]
    specs = plan.rank_specs(cfg, "tp3")
    args = specs[2].args
    assert args[args.index("--dist-init-addr") + 1] == "10.0.0.1:20000"  # fabric.bootstrap: management
    assert specs[2].env["SGLANG_HOST_IP"] == "10.0.0.3" and specs[2].env["DSPARK_FABRIC_IP"] == "10.0.23.3"
    assert specs[2].env["DSPARK_LINK_IPS"] == "10.0.33.3"
    # each worker mounts from the head's address on its own link, and the export lists exactly those
    assert plan.volume_options(cfg, 1)["o"].startswith("addr=10.0.22.1,")
    assert plan.volume_options(cfg, 2)["o"].startswith("addr=10.0.23.1,")
    line = commands.export_line(cfg)
    assert "10.0.22.2(ro," in line and "10.0.23.3(ro," in line and "10.0.0." not in line
    assert _findings(cfg) == []


def test_tp4_switch_ranks_bind_the_data_plane_and_nccl_rails_are_found_on_the_node():
    cfg = cfg_of("tp4")
    specs = plan.rank_specs(cfg, "tp4")
    for spec, ip in zip(specs, ["10.0.22.1", "10.0.22.2", "10.0.22.3", "10.0.22.4"]):
        assert spec.env["SGLANG_HOST_IP"] == spec.env["HOST_IP"] == spec.env["DSPARK_BOOTSTRAP_IP"] == ip
        assert spec.args[spec.args.index("--dist-init-addr") + 1] == "10.0.22.1:20000"
        # nothing pinned: both twins and the socket interface are found at every start
        assert "NCCL_IB_HCA" not in spec.env and "NCCL_SOCKET_IFNAME" not in spec.env
        assert spec.env["NCCL_IB_ROCE_VERSION_NUM"] == "2" and spec.env["NCCL_IB_ADDR_FAMILY"] == "AF_INET"
        assert "DSPARK_RAILS" in spec.entrypoint[2] and '--fabric-ip "$DSPARK_FABRIC_IP"' in spec.entrypoint[2]
    assert {lk.subnet for lk in fabric.links(cfg)} == {"10.0.22.0/24"} and len(fabric.links(cfg)) == 6
    assert [c for c in commands.export_clients(cfg)] == ["10.0.22.2", "10.0.22.3", "10.0.22.4"]


def test_pinned_rails_and_socket_interface_reach_the_env():
    def pin(raw):
        raw["fabric"].update(ibHca="rocep1s0f1,roceP2p1s0f1", socketIfname="enp1s0f1np1", gidIndex=3)
        return raw
    env = launch.rank_env(cfg_of("tp4", pin), 1)
    assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1" and env["NCCL_IB_GID_INDEX"] == "3"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "enp1s0f1np1"


def test_tp2_vllm_ray_binds_the_data_plane():
    cfg = cfg_of("tp2")
    head, worker = plan.vllm_specs(cfg, "tp2")
    assert head.env["VLLM_HOST_IP"] == "10.0.22.1" and head.env["RAY_ADDRESS"] == "10.0.22.1:6379"
    assert worker.args[worker.args.index("--node-ip-address") + 1] == "10.0.22.2"
    assert plan.rank_checks(cfg, head)[0] == ("ray", launch.ray_head_args(cfg, "6379", "10.0.22.1"))
    # Ray's own ports on both nodes pinned to serving.rayPorts (what the fence lets the peer reach), its dashboard
    # on loopback
    for args in (launch.ray_head_args(cfg, "6379", "10.0.22.1"), worker.args):
        pinned = dict(zip(args[::1], args[1::1]))
        assert pinned["--node-manager-port"] == "6380" and pinned["--max-worker-port"] == "6479"
        assert pinned["--dashboard-host"] == "127.0.0.1"


def test_a_triangle_without_bootstrap_management_is_refused_naming_the_fix():
    def fabric_boot(raw):
        raw["fabric"]["bootstrap"] = "fabric"
        return raw
    (f,) = _findings(cfg_of("tp3", fabric_boot))
    assert f.field == "fabric.bootstrap" and "2 /24 subnets (10.0.22.0/24, 10.0.23.0/24)" in f.problem and "bootstrap: management" in f.fix


def test_a_pair_without_a_shared_subnet_is_named():
    def apart(raw):
        raw["nodes"][3]["fabricIp"] = "10.0.99.4"
        return raw
    found = _findings(cfg_of("tp4", apart))
    pairs = [f for f in found if f.field == "nodes[3].fabricIp"]
    assert len(pairs) == 3 and "spark1 and spark4 have no data-plane addresses in one /24 subnet" in pairs[0].problem
    assert any(f.field == "fabric.bootstrap" for f in found)


def test_a_ring_needs_only_its_neighbours_linked():
    def ring(raw):
        raw["topology"] = "ring"
        raw["fabric"]["bootstrap"] = "management"
        for i, (ip, link_ip) in enumerate([("10.0.12.1", "10.0.41.1"), ("10.0.12.2", "10.0.23.2"),
                                           ("10.0.23.3", "10.0.34.3"), ("10.0.34.4", "10.0.41.4")]):  # fmt: skip
            raw["nodes"][i].update(fabricIp=ip, linkIps=[link_ip])
        return raw
    cfg = cfg_of("tp4", ring)
    assert _findings(cfg) == []
    assert [(lk.a, lk.b) for lk in fabric.links(cfg)] == [(0, 1), (0, 3), (1, 2), (2, 3)]


def test_control_and_data_plane_on_one_address_is_a_warning_and_the_read_model_shows_it():
    def same(raw):
        for n in raw["nodes"]:
            n["fabricIp"] = n["host"]
        return raw
    cfg = cfg_of("tp4", same)
    found = _findings(cfg)
    assert {f.level for f in found} == {"warning"} and len(found) == 4
    slow = fabric.boot_read_minutes(cfg, 77.0)
    fast = fabric.boot_read_minutes(cfg_of("tp4"), 77.0)
    assert slow[1]["path"] == "nfs-management" and fast[1]["path"] == "nfs-fabric"
    assert slow[1]["minutes"] > 3 * fast[1]["minutes"]  # three workers share the 10 GbE link
    assert "over management" in fabric.summary(cfg, 77.0) and "over ConnectX-7 10.0.22.0/24" in fabric.summary(cfg_of("tp4"), 77.0)


def test_an_nfs_server_ip_off_the_workers_link_is_refused():
    def wrong(raw):
        raw["nodes"][2]["nfsServerIp"] = "10.0.22.1"  # the head's address on spark2's link, not spark3's
        return raw
    (f,) = _findings(cfg_of("tp3", wrong))
    assert f.field == "nodes[2].nfsServerIp" and "default: 10.0.23.1" in f.fix


def test_the_fabric_gate_measures_every_linked_pair_and_is_off_for_one_node_or_when_disabled():
    cmd = commands.fabric_gate(cfg_of("tp3"))
    words = shlex.split(cmd)
    assert words[:3] == ["python3", "-m", "programs.fabricgate"]
    spec = json.loads(words[words.index("--spec") + 1])
    assert spec["floor"] == 175 and [(x["a"], x["b"], x["a_ip"], x["b_ip"]) for x in spec["links"]] == [
        ("spark1", "spark2", "10.0.22.1", "10.0.22.2"), ("spark1", "spark3", "10.0.23.1", "10.0.23.3"),
        ("spark2", "spark3", "10.0.33.2", "10.0.33.3")]
    assert spec["nodes"][0]["target"] == "zurih@10.0.0.1"  # reached over the control plane
    assert "--link-ip=10.0.23.1" in spec["nodes"][0]["rails_args"]

    def off(raw):
        raw["fabric"]["bandwidthGate"] = False
        return raw
    assert commands.fabric_gate(cfg_of("tp3", off)) is None


def test_preflight_runs_the_fabric_checks_with_the_nodes_peers():
    script = commands.preflight(cfg_of("tp3"), "tp3", 1)
    first = next(line for line in script.splitlines() if line.startswith("python3 - "))
    assert "--peer=spark1=10.0.22.1" in first and "--peer=spark3=10.0.33.3" in first
    assert "--mtu 9000" in first and "--speed-mbps 200000" in first and first.endswith("|| failed=1")
    assert script.count("\nDSPARK_RAILS\n") == 1 and "fabric-link" not in script.split("DSPARK_RAILS")[0]
