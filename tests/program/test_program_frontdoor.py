"""The program with frontDoor.enabled (mocks, no node): the door's resources on the endpoint's node, its
certificate's trigger and secrecy, and what clients are handed: the https endpoint and the stack's CA."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from harness import Secret, cluster_of, labels_of, plain_strings, run_program
from planning import tls

NOW = dt.datetime(2026, 12, 8, tzinfo=dt.timezone.utc)
CA = tls.make_ca("sim", NOW)
SERVER = tls.issue_server(CA, ["172.30.99.11", "spark1"], NOW - dt.timedelta(days=1), NOW + dt.timedelta(days=60))
OUTPUT = {"sim-frontdoor-ca": json.dumps(CA), "sim-team-frontdoor-ca": json.dumps(CA),
          "sim-frontdoor-certificate": json.dumps(SERVER), "sim-team-frontdoor-certificate": json.dumps(SERVER)}


def with_door(stack: str, **door) -> dict:
    cluster = cluster_of(stack)
    cluster["frontDoor"] = {"enabled": True, **door}
    return cluster


def test_the_door_runs_on_the_head_and_clients_get_its_https_endpoint_and_the_ca():
    rec = run_program("sim", cluster=with_door("sim"), command_stdout=OUTPUT)
    door = rec.named("sim-frontdoor-container")
    assert door.inputs["name"] == "sim-frontdoor" and door.inputs["networkMode"] == "host"
    assert labels_of(door)["deepseek-spark.role"] == "frontdoor"
    cc = rec.outputs["client_config"]
    assert isinstance(cc, Secret)
    assert cc.value["base_url"] == "https://172.30.99.11/v1" and cc.value["ca_pem"] == CA["cert"]
    assert rec.outputs["endpoint"] == "https://172.30.99.11/v1"
    fd = rec.outputs["front_door"]
    assert fd["node"] == "spark1" and fd["certificate"]["source"] == "stack-ca"
    # the key never leaves a secret: not in a plain output, not in any command's plain inputs
    for text in plain_strings(rec.outputs):
        assert "PRIVATE KEY" not in text
    for r in rec.resources:
        for text in plain_strings(r.inputs):
            assert "PRIVATE KEY" not in text, r.name


def test_the_certificate_is_renewed_by_its_period_and_the_ca_is_kept():
    rec = run_program("sim", cluster=with_door("sim"), command_stdout=OUTPUT)
    cert = rec.named("sim-frontdoor-certificate")
    period = tls.Schedule(90, 30).period(dt.date.today())
    assert cert.inputs["triggers"] == [period, ["172.30.99.11", "spark1"]]
    assert isinstance(cert.inputs["stdin"], Secret)  # the CA's key goes in on stdin, a secret
    ca = rec.named("sim-frontdoor-ca")
    assert ca.inputs["update"].startswith("printf")  # KEEP: a changed command prints the CA the state holds


def test_no_rank_depends_on_the_door_and_the_door_waits_for_the_upstream():
    rec = run_program("sim", cluster=with_door("sim"), command_stdout=OUTPUT)
    assert rec.ranks() and rec.named("sim-frontdoor-container")
    for r in rec.ranks():
        assert not any("frontdoor" in d for d in r.dependencies), r.name
    probe = rec.named("sim-frontdoor-readiness-check")
    assert "--ca-env DSPARK_CA_PEM" in probe.inputs["create"] and "https://172.30.99.11/v1" in probe.inputs["create"]


def test_with_the_gateway_members_get_the_doors_endpoint_and_the_gateway_is_an_inner_port():
    rec = run_program("sim-team", cluster=with_door("sim-team"), command_stdout=OUTPUT)
    members = rec.outputs["member_configs"].value
    assert members and all(c["base_url"] == "https://172.30.99.11/v1" and c["ca_pem"] == CA["cert"]
                           for c in members.values())  # fmt: skip
    assert rec.outputs["admin_config"].value["base_url"] == "https://172.30.99.11/v1"
    gw = next(r for r in rec.outputs["exposure"]["spark1"]["listeners"] if r["listener"].startswith("team gateway"))
    assert "clients" not in gw["from"]
    assert "--tunnel" in rec.named("sim-team-gateway-readiness-check").inputs["create"]


def test_the_owners_certificate_needs_its_key_as_a_secret():
    chain = SERVER["chain"]
    cluster = with_door("sim", certificate={"source": "own", "certificate": chain, "ca": CA["cert"]})
    with pytest.raises(Exception, match="frontDoorKey"):
        run_program("sim", cluster=cluster)
    rec = run_program("sim", cluster=cluster, secrets={"frontDoorKey": SERVER["key"]})
    assert not [r for r in rec.resources if r.name.endswith("-certificate") or r.name.endswith("frontdoor-ca")]
    assert rec.outputs["client_config"].value["ca_pem"] == CA["cert"]
    assert rec.outputs["front_door"]["certificate"]["source"] == "own"
