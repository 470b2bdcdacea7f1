"""sim/grpctrace.py: a PULUMI_DEBUG_GRPC log reduced to what the providers decided, and two traces compared."""

import json

from sim import grpctrace

URN = "urn:pulumi:sim::deepseek-spark::deepseek-spark:index:Group$docker:index/container:Container::sim-rank1"
KEY = "urn:pulumi:sim::deepseek-spark::deepseek-spark:index:Group$command:remote:Command::sim-api-key"
SECRET = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "value": "sk-plain-secret"}


def log_of(tmp_path, entries):
    path = tmp_path / "grpc.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    return path


def test_reduce_keeps_each_resources_calls_in_order_decisions_only_no_values(tmp_path):
    entries = [
        {"method": "/pulumirpc.ResourceProvider/Diff", "progress": "request_started", "request": {"urn": URN}},
        {"method": "/pulumirpc.ResourceProvider/Diff", "progress": "response_completed",
         "request": {"urn": URN, "news": {"labels": [1]}},
         "response": {"changes": "DIFF_SOME", "diffs": ["labels"], "replaces": ["labels"], "deleteBeforeReplace": True,
                      "detailedDiff": {"labels": {"kind": "UPDATE_REPLACE", "inputDiff": True}}}},
        {"method": "/pulumirpc.ResourceProvider/Create", "request": {"urn": KEY, "properties": {"stdin": SECRET}},
         "response": {"id": "sim-api-key-1a2b3c4d", "properties": {"stdout": "", "stdin": SECRET}}},
        {"method": "/pulumirpc.ResourceProvider/Delete", "request": {"urn": URN, "id": "ab" * 32}, "response": {}},
        {"method": "/pulumirpc.ResourceProvider/Create", "request": {"urn": URN, "properties": {}},
         "errors": ["creating: Unable to start container " + "cd" * 32 + ": boom\nmore"]},
        {"method": "/pulumirpc.LanguageRuntime/Run", "request": {}},
        {"method": "/pulumirpc.ResourceMonitor/RegisterResource", "request": {"urn": URN}},
    ]
    trace = grpctrace.reduce(grpctrace.load(log_of(tmp_path, entries)))
    assert list(trace) == ["sim-api-key", "sim-rank1"]
    assert trace["sim-rank1"]["type"] == "docker:index/container:Container"
    assert [c["method"] for c in trace["sim-rank1"]["calls"]] == ["Diff", "Delete", "Create"]
    d = trace["sim-rank1"]["calls"][0]
    assert (d["changes"], d["replaces"], d["deleteBeforeReplace"], d["detailed"]) == (
        "DIFF_SOME", ["labels"], True, {"labels": "UPDATE_REPLACE"})
    assert trace["sim-rank1"]["calls"][2]["error"] == "creating: Unable to start container <hex>: boom"
    assert trace["sim-api-key"]["calls"] == [{"method": "Create", "preview": False, "outputs": ["stdin", "stdout"]}]
    assert "sk-plain-secret" not in json.dumps(trace)


def test_diff_names_each_resource_and_call_that_differs(tmp_path):
    golden = {"a": {"type": "t", "calls": [{"method": "Diff", "replaces": ["x"]}]},
              "b": {"type": "t", "calls": []}}
    got = {"a": {"type": "t", "calls": [{"method": "Diff", "replaces": []}]},
           "c": {"type": "t", "calls": []}}
    lines = grpctrace.diff(golden, got)
    assert lines[0].startswith("a call 1: golden") and '"replaces": ["x"]' in lines[0]
    assert lines[1:] == ["b: only in the golden trace", "c: only in the recorded run"]
    assert grpctrace.diff(golden, golden) == []
    g, r = tmp_path / "g.json", tmp_path / "r.json"
    g.write_text(json.dumps(golden))
    r.write_text(json.dumps(got))
    assert grpctrace.main(["diff", str(g), str(g)]) == 0 and grpctrace.main(["diff", str(g), str(r)]) == 1
