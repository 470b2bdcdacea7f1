"""programs/rails.py: the rails NCCL gets, found from a sysfs tree laid out as a DGX Spark's, and
preflight's link checks (ethtool, MTU, no-fragment pings) against stand-in tools on PATH."""

from __future__ import annotations

import os
import stat

import pytest

from fakefabric import DEVICES, IFACES, make_sysfs
from programs import rails

def found(tmp_path, fabric_ip="10.0.22.1", bootstrap=None, ifaces=IFACES, devices=DEVICES, **kw):
    root = make_sysfs(tmp_path, devices, ifaces, kw.pop("gid_at", None))
    return rails.discover(fabric_ip, bootstrap or fabric_ip, root=root, ifaces=ifaces, **kw)


def test_both_twins_of_the_cabled_port_their_gid_and_the_socket_interface(tmp_path):
    f = found(tmp_path)
    assert f["problems"] == []
    assert f["hca"] == "rocep1s0f1,roceP2p1s0f1"  # not port 0's rocep1s0f0, not one twin alone
    assert f["gid_index"] == 3 and f["socket_ifname"] == "enp1s0f1np1"
    assert [r["ip"] for r in f["rails"]] == ["10.0.22.1", "10.0.122.1"]
    assert f["ports"] == {"10.0.22.1": ["rocep1s0f1", "roceP2p1s0f1"]}


def test_a_fabric_ip_on_the_management_nic_is_refused_naming_the_interface(tmp_path):
    f = found(tmp_path, fabric_ip="10.0.0.1")
    (check, message), = f["problems"]
    assert check == "ip" and "10.0.0.1 is on enP7s7, which is not a ConnectX-7 interface" in message
    assert f["hca"] == ""


def test_a_fabric_ip_the_node_does_not_have(tmp_path):
    (check, message), = found(tmp_path, fabric_ip="10.0.22.9")["problems"]
    assert check == "ip" and "10.0.22.9 is on no interface" in message


def test_a_twin_down_fails_naming_it_and_half_the_port(tmp_path):
    devices = [d if d[0] != "roceP2p1s0f1" else (*d[:3], "DOWN") for d in DEVICES]
    f = found(tmp_path, devices=devices)
    messages = [m for c, m in f["problems"] if c == "rails"]
    assert len(messages) == 1
    assert "roceP2p1s0f1 (enP2p1s0f1np1), twin of rocep1s0f1 on the cabled port, is DOWN" in messages[0]
    assert "half the port" in messages[0]
    assert f["hca"] == "rocep1s0f1"


def test_a_rail_without_an_ipv4_roce_v2_gid_fails(tmp_path):
    ifaces = {k: v for k, v in IFACES.items() if k != "enP2p1s0f1np1"}  # the twin has no address
    f = found(tmp_path, ifaces=ifaces)
    (check, message), = f["problems"]
    assert check == "gid" and message.startswith("roceP2p1s0f1 has no RoCE v2 GID for an IPv4 address")


def test_rails_that_disagree_on_the_gid_index_leave_it_to_nccl(tmp_path):
    f = found(tmp_path, gid_at={"roceP2p1s0f1": 2})  # its IPv4 v2 GID at index 5
    assert f["problems"] == [] and f["gid_index"] is None
    assert [r["gid_index"] for r in f["rails"]] == [3, 5]


def test_a_pinned_gid_index_that_is_not_roce_v2_ipv4_fails(tmp_path):
    (check, message), *_ = found(tmp_path, gid_index=1)["problems"]
    assert check == "gid" and "fabric.gidIndex 1 is not a RoCE v2 IPv4 GID on rocep1s0f1 (that is index 3)" in message


def test_pinned_rails_are_used_as_given_and_a_down_one_is_named(tmp_path):
    f = found(tmp_path, hca="rocep1s0f0,rocep1s0f1")
    assert [r["hca"] for r in f["rails"]] == ["rocep1s0f0", "rocep1s0f1"]
    (check, message), = [p for p in f["problems"] if p[0] == "rails"]
    assert message.startswith("rocep1s0f0 (enp1s0f0np0) is DOWN") and "a pinned rail" in message
    assert found(tmp_path / "x", hca="mlx5_0")["problems"][0][1].startswith("fabric.ibHca mlx5_0 names no RoCE device")


def test_a_triangle_node_uses_the_twins_of_both_cabled_ports(tmp_path):
    ifaces = {**IFACES, "enp1s0f0np0": "10.0.23.1/24", "enP2p1s0f0np0": "10.0.123.1/24"}
    devices = [(*d[:3], "ACTIVE") for d in DEVICES]
    f = found(tmp_path, ifaces=ifaces, devices=devices, bootstrap="10.0.0.1", link_ips=("10.0.23.1",))
    assert f["problems"] == []
    assert set(f["hca"].split(",")) == {"rocep1s0f1", "roceP2p1s0f1", "rocep1s0f0", "roceP2p1s0f0"}
    assert f["ports"]["10.0.23.1"] == ["rocep1s0f0", "roceP2p1s0f0"]
    assert f["socket_ifname"] == "enP7s7"  # bootstrap over the management plane


def test_env_lines_export_only_what_is_not_pinned(tmp_path):
    f = found(tmp_path)
    lines = rails.env_lines(f, {"NCCL_IB_HCA": "rocep1s0f1"})
    assert "export NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" not in lines
    assert {"export NCCL_SOCKET_IFNAME=enp1s0f1np1", "export GLOO_SOCKET_IFNAME=enp1s0f1np1",
            "export TP_SOCKET_IFNAME=enp1s0f1np1", "export NCCL_IB_GID_INDEX=3"} <= set(lines)  # fmt: skip


def test_env_format_stops_the_rank_with_the_reason(tmp_path, monkeypatch, capsys):
    root = make_sysfs(tmp_path)
    monkeypatch.setattr(rails, "interfaces", lambda: dict(IFACES))
    monkeypatch.delenv("NCCL_IB_HCA", raising=False)
    assert rails.main(["--fabric-ip", "10.0.0.1", "--bootstrap-ip", "10.0.0.1", "--sysfs", root]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "deepseek-spark fabric: FAIL ip: fabricIp 10.0.0.1 is on enP7s7" in out.err
    assert rails.main(["--fabric-ip", "10.0.22.1", "--bootstrap-ip", "10.0.22.1", "--sysfs", root]) == 0
    assert "export NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in capsys.readouterr().out


def _tool(bin_dir, name, body):
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """ethtool and ping stand-ins on PATH, driven by files the test writes; /sys/class/net MTUs."""
    bin_dir, net = tmp_path / "bin", tmp_path / "net"
    bin_dir.mkdir()
    for netdev in ("enp1s0f1np1", "enP2p1s0f1np1"):
        (net / netdev).mkdir(parents=True)
        (net / netdev / "mtu").write_text("9000\n")
    (tmp_path / "speed").write_text("200000")
    (tmp_path / "ping-max").write_text("8972")
    _tool(bin_dir, "ethtool", f'printf "Settings for %s:\\n\\tSpeed: %sMb/s\\n\\tLink detected: yes\\n" "$1" '
                              f'"$(cat {tmp_path}/speed)"\n')  # fmt: skip
    _tool(bin_dir, "ping", f'size=0; while [ $# -gt 0 ]; do [ "$1" = -s ] && size=$2; shift; done\n'
                           f'[ "$size" -le "$(cat {tmp_path}/ping-max)" ]\n')  # fmt: skip
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path, str(net)


def test_link_checks_pass_on_a_healthy_port(tmp_path, tools):
    _, net = tools
    f = found(tmp_path / "s")
    assert rails.host_checks(f, 200000, 9000, [("spark2", "10.0.22.2")], net) == []


def test_a_port_at_100g_fails_with_the_switch_fix_not_reseat_the_cable(tmp_path, tools):
    d, net = tools
    (d / "speed").write_text("100000")
    problems = rails.host_checks(found(tmp_path / "s"), 200000, 9000, [], net)
    assert [c for c, _ in problems] == ["link-speed", "link-speed"]
    assert "enp1s0f1np1 (rocep1s0f1) negotiated 100000Mb/s, fabric.linkSpeedMbps is 200000" in problems[0][1]
    assert "autonegotiation off" in problems[0][1] and "reseat" not in problems[0][1]


def test_an_mtu_mismatch_fails_locally_and_at_the_peer_ping(tmp_path, tools):
    d, net = tools
    (tmp_path / "net" / "enP2p1s0f1np1" / "mtu").write_text("1500\n")
    (d / "ping-max").write_text("1472")  # the path passes 1500-byte frames only
    problems = dict(rails.host_checks(found(tmp_path / "s"), 200000, 9000, [("spark2", "10.0.22.2")], net))
    assert problems["mtu"].startswith("enP2p1s0f1np1 (roceP2p1s0f1) has MTU 1500, fabric.mtu is 9000")
    assert problems["peer"].startswith("spark2 10.0.22.2 does not answer a no-fragment ping of 9000 bytes (1500 bytes pass)")


def test_a_peer_that_answers_nothing_is_no_route(tmp_path, tools):
    d, net = tools
    (d / "ping-max").write_text("0")
    (check, message), = rails.host_checks(found(tmp_path / "s"), 200000, 9000, [("spark3", "10.0.22.3")], net)
    assert check == "peer" and "no route over the data plane" in message and "ip route get 10.0.22.3" in message


def test_link_states_are_each_rails_device_state_and_negotiated_speed_as_the_guard_serves_them(tmp_path, tools):
    d, _ = tools
    (d / "speed").write_text("100000")
    devices = [dev if dev[0] != "roceP2p1s0f1" else (*dev[:3], "DOWN") for dev in DEVICES]
    assert rails.link_states(found(tmp_path / "s", devices=devices)) == [
        {"hca": "rocep1s0f1", "netdev": "enp1s0f1np1", "up": True, "speed_mbps": 100000},
        {"hca": "roceP2p1s0f1", "netdev": "enP2p1s0f1np1", "up": False, "speed_mbps": 100000},
    ]
