"""The front door's plan (planning/frontdoor.py), its certificates (planning/tls.py), its rules and what clients get
(dspark.clients): one HTTPS port per stack, in front of the gateway, the router or the head, and nothing else open."""

from __future__ import annotations

import datetime as dt
import json
import stat

import pytest
from cryptography import x509

from declared.cluster import ConfigError
from declared.stack import parse_stack
from dspark import clients
from harness import cluster_of, with_known_hosts
from planning import exposure, frontdoor, rules, stackplan, tls

NOW = dt.datetime(2026, 12, 8, 12, tzinfo=dt.timezone.utc)
OUTSIDE = "192.0.2.77"


def door_plan(stack: str, **door):
    raw = with_known_hosts(cluster_of(stack))
    raw["frontDoor"] = {"enabled": True, **door}
    sc = parse_stack(raw)
    return sc, stackplan.build_stack(sc, stack)


# ------------------------------------------------------------------------------------------ certificates ----

def test_a_server_certificate_names_every_address_and_name_and_chains_to_the_stacks_ca():
    ca = tls.make_ca("tp4", NOW)
    s = tls.Schedule(90, 30)
    p = s.period(NOW.date())
    srv = tls.issue_server(ca, ["10.0.0.1", "spark1", "llm.example.com"], s.not_before(p), s.not_after(p))
    cert = x509.load_pem_x509_certificate(srv["cert"].encode())
    ca_cert = x509.load_pem_x509_certificate(ca["cert"].encode())
    cert.verify_directly_issued_by(ca_cert)  # raises when another key signed it
    info = tls.describe(srv["cert"])
    assert sorted(info["names"]) == ["10.0.0.1", "llm.example.com", "spark1"]
    assert cert.not_valid_before_utc <= NOW < cert.not_valid_after_utc
    assert srv["chain"].startswith(srv["cert"]) and srv["chain"].endswith(ca["cert"])
    assert "PRIVATE KEY" in srv["key"] and "PRIVATE KEY" not in srv["chain"]
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0


def test_the_schedule_renews_renew_before_days_ahead_and_is_the_same_all_period():
    s = tls.Schedule(90, 30)
    p = s.period(NOW.date())
    assert s.period(NOW.date() + dt.timedelta(days=1)) in (p, p + 1)
    renew = s.renew_on(p)
    assert s.period(renew) == p + 1 and s.period(renew - dt.timedelta(days=1)) == p
    assert (s.not_after(p).date() - renew).days == 30  # the old one still has renewBeforeDays left
    assert s.not_before(p).date() <= NOW.date() < renew


def test_renew_before_must_leave_part_of_the_validity():
    raw = cluster_of("sim")
    raw["frontDoor"] = {"enabled": True, "certificate": {"validityDays": 30, "renewBeforeDays": 30}}
    with pytest.raises(ConfigError, match="renewBeforeDays"):
        parse_stack(raw)


# ----------------------------------------------------------------------------------------------- plan ----

@pytest.mark.parametrize("stack,fronts", [("sim", ":8888"), ("sim-tp2", ":8000"), ("sim-x2", ":8889"),
                                           ("sim-team", ":4000")])  # fmt: skip
def test_the_door_fronts_the_stacks_endpoint_on_its_node_and_the_endpoint_is_https(stack, fronts):
    sc, cp = door_plan(stack)
    fp = cp.front_door
    assert cp.endpoint == fp.endpoint == f"https://{fp.node.host}/v1"
    assert fp.upstream.endswith(fronts) and fp.upstream.startswith("http://")
    conf = fp.files["nginx.conf"]
    assert f"listen {fp.node.host}:443 ssl" in conf and "0.0.0.0" not in conf
    assert f"server {fp.upstream.removeprefix('http://')};" in conf


def test_only_the_openai_routes_and_health_pass_and_streams_are_not_buffered():
    conf = frontdoor.nginx_conf("10.0.0.1", 443, "http://10.0.0.1:4000/v1", "/health/readiness", 1800)
    passed = [line.split("location ")[1].split(" {")[0] for line in conf.splitlines() if "proxy_pass" in line]
    assert passed == ["= /v1/chat/completions", "= /v1/completions", "= /v1/models", "^~ /v1/models/", "= /health"]
    assert "location / { return 404; }" in conf
    assert "proxy_buffering off;" in conf and "ssl_protocols TLSv1.2 TLSv1.3;" in conf
    assert "proxy_pass http://endpoint/health/readiness;" in conf  # LiteLLM's unauthenticated health route


def test_the_certificate_names_what_clients_are_given_first():
    _, cp = door_plan("sim", names=["llm.example.com"])
    fp = cp.front_door
    assert fp.names == ("llm.example.com", fp.node.host, fp.node.name)
    assert fp.endpoint == "https://llm.example.com/v1"
    assert "--url https://" + fp.node.host in fp.readiness  # the probe needs no DNS: the address is on it too
    assert all(f"--name {n}" in frontdoor.server_command(fp) for n in fp.names)


def test_a_new_certificate_or_config_reloads_the_running_door_and_the_key_never_reaches_an_argv():
    _, cp = door_plan("sim")
    fp = cp.front_door
    for script in (fp.tls_write, fp.files_write):
        assert script.rstrip().endswith("fi") and "docker kill -s HUP sim-frontdoor" in script
    assert "umask 077" in fp.tls_write and "chmod 600" in fp.tls_write  # the key is on stdin, written 0600
    assert fp.container.command == ("nginx", "-c", "/etc/dspark-frontdoor/etc/nginx.conf")
    assert all(ro for *_, ro in fp.container.mounts)


# -------------------------------------------------------------------------------------------- exposure ----

@pytest.mark.parametrize("stack", ["sim", "sim-tp2", "sim-x2", "sim-team"])
def test_from_outside_only_ssh_and_the_door_answer_and_what_it_fronts_is_an_inner_port(stack):
    sc, cp = door_plan(stack, names=[])
    door = cp.front_door
    for ne in cp.exposure:
        seen = {lst.port for lst in ne.reachable_from(OUTSIDE)}
        want = {"22", "443"} if ne.node == door.node.name else {"22"}
        if stack == "sim-x2" and ne.node == door.node.name:
            # its router stays open to firewall.operators (anywhere by default): its /workers calls come from where
            # Pulumi runs. Only ssh and the door answer a client that is not an operator.
            want.add("8889")
            assert {lst.sources for lst in ne.listeners if lst.port == "8889"} == {("stack", "operators")}
        assert seen == want, (ne.node, seen)


def test_the_door_must_have_a_node_to_run_on():
    raw = with_known_hosts(cluster_of("sim-x2"))
    raw["router"]["node"] = "local"
    raw["frontDoor"] = {"enabled": True}
    errors, _ = rules.check_stack(parse_stack(raw), "sim-x2")
    assert [e.rule for e in errors] == ["frontdoor-node"] and "router.node" in errors[0].fix


def test_the_doors_port_must_be_free_on_its_node():
    raw = with_known_hosts(cluster_of("sim"))
    raw["frontDoor"] = {"enabled": True, "port": raw["serving"]["port"]}
    errors, _ = rules.check_stack(parse_stack(raw), "sim")
    assert [(e.rule, e.field) for e in errors] == [("frontdoor-port-free", "frontDoor.port")]
    assert "serving.port" in errors[0].problem


def _own(names, days):
    ca = tls.make_ca("company", NOW)
    srv = tls.issue_server(ca, names, NOW - dt.timedelta(days=30), NOW + dt.timedelta(days=days))
    return srv["chain"], ca["cert"]


@pytest.mark.parametrize("names,days,found", [
    (["172.30.99.11"], 365, []),
    (["other.example.com"], 365, [("error", "does not name 172.30.99.11")]),
    (["172.30.99.11"], 10, [("warning", "expires in")]),
    (["172.30.99.11"], -2, [("error", "has expired")]),
])  # fmt: skip
def test_the_owners_certificate_must_name_the_endpoint_and_the_preview_warns_before_it_expires(names, days, found):
    raw = with_known_hosts(cluster_of("sim"))
    chain, ca = _own(names, days)
    raw["frontDoor"] = {"enabled": True, "certificate": {"source": "own", "certificate": chain, "ca": ca}}
    sc = parse_stack(raw)
    errors, warnings = rules.check_stack(sc, "sim")
    got = [(f.level, f.problem) for f in errors + warnings if f.rule == "frontdoor-own-certificate"]
    assert len(got) == len(found), got
    for (level, problem), (want_level, words) in zip(got, found):
        assert level == want_level and words in problem, got


# ---------------------------------------------------------------------------------------------- clients ----

def test_each_client_format_points_at_the_ca_file_it_writes_beside_it(tmp_path, monkeypatch):
    ca = tls.make_ca("sim", NOW)["cert"]
    outputs = {"client_config": {"base_url": "https://10.0.0.1/v1", "api_key": "sk-" + "a" * 40, "model": "m",
                                 "ca_pem": ca}}  # fmt: skip
    saved = tmp_path / "outputs.json"
    saved.write_text(json.dumps(outputs))
    monkeypatch.chdir(tmp_path)
    for fmt, line in (("openai-env", "SSL_CERT_FILE="), ("curl", "--cacert "), ("litellm", "ssl_verify: ")):
        out = tmp_path / f"c.{fmt}"
        assert clients.main(["--outputs-file", str(saved), "--format", fmt, "--out", str(out)]) == 0
        ca_file = tmp_path / "c.ca.pem"
        assert ca_file.read_text() == ca and stat.S_IMODE(ca_file.stat().st_mode) == 0o600
        assert f"{line}{ca_file}" in out.read_text() or f'{line}"{ca_file}"' in out.read_text(), out.read_text()


def test_without_a_ca_nothing_points_at_one():
    c = clients.Client("http://10.0.0.1:8888/v1", "sk-x", "m")
    for fmt in ("openai-env", "curl", "litellm"):
        text = clients.render(c, fmt)
        assert "SSL_CERT_FILE" not in text and "--cacert" not in text and "ssl_verify" not in text
