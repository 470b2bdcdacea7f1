"""The provider traffic of a Pulumi run, recorded and reduced to what a provider decides, so the TEST
DOUBLES (sim/providers) can be compared with the real plugins on a machine that has them.

Recording: the Pulumi CLI writes every gRPC call it makes to the file `PULUMI_DEBUG_GRPC` names, one
JSON object per line: `method`, `request`, `response`, `errors` (and, in newer CLIs, `progress`
"request_started"/"response_completed", `timestamp`, `duration`). The file holds secrets in plain text
(the engine sends a provider the values it must use): keep it out of commits and logs; only the
reduced trace, with every secret replaced, is kept.

Reducing (`reduce`): only ResourceProvider calls for resources (Check, Diff, Create, Update, Delete,
Read), per resource name (the last part of its URN), in the order the engine made them for that
resource: the engine runs independent resources in parallel, so only a resource's own order is stable.
Each call keeps what the provider decided: Check, the input keys it returned; Diff, the changed and
replaced keys, delete-before-replace and the detailed diff kinds; Create/Update, the output keys;
failures, the first line of the error with volatile values (IDs, hex, numbers in paths) masked.
Values themselves are left out: they are the program's, not the provider's.

    python -m sim.grpctrace reduce grpc.jsonl > trace.json       # a run's reduced trace
    python -m sim.grpctrace diff golden.json trace.json          # what differs, per resource; exit 1 if any
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

SERVICE = "/pulumirpc.ResourceProvider/"
METHODS = ("Check", "Diff", "Create", "Update", "Delete", "Read")
VOLATILE = [
    (re.compile(r"\b[0-9a-f]{12,64}\b"), "<hex>"),
    (re.compile(r"sha256:<hex>"), "<digest>"),
    (re.compile(r"\d+(\.\d+)?s\b"), "<seconds>"),
]


def load(path: Path) -> list[dict]:
    """The completed calls of a PULUMI_DEBUG_GRPC file (a call logged twice, started and completed, once)."""
    entries = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        entry = json.loads(line)
        if entry.get("progress") == "request_started":
            continue
        entries.append(entry)
    return entries


def _mask(text: str) -> str:
    for pattern, repl in VOLATILE:
        text = pattern.sub(repl, text)
    return text


def _name(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def _type(urn: str) -> str:
    return urn.split("::")[2].split("$")[-1] if urn.count("::") >= 3 else ""


def _keys(struct: dict | None) -> list[str]:
    return sorted((struct or {}).keys())


def summarize(method: str, request: dict, response: dict | None, errors: list[str] | None) -> dict:
    """What the provider decided in one call (no input values: they are the program's)."""
    response = response or {}
    out: dict = {"method": method}
    if method == "Check":
        out["inputs"] = _keys(response.get("inputs"))
        if response.get("failures"):
            out["failures"] = sorted(f.get("property", "") for f in response["failures"])
    elif method == "Diff":
        out["changes"] = response.get("changes", "DIFF_UNKNOWN")
        out["diffs"] = sorted(response.get("diffs") or [])
        out["replaces"] = sorted(response.get("replaces") or [])
        out["deleteBeforeReplace"] = bool(response.get("deleteBeforeReplace"))
        out["detailed"] = {k: v.get("kind", "ADD") for k, v in sorted((response.get("detailedDiff") or {}).items())}
    elif method in ("Create", "Update"):
        out["preview"] = bool(request.get("preview"))
        out["outputs"] = _keys(response.get("properties"))
    elif method == "Read":
        out["found"] = bool(response.get("id"))
        out["outputs"] = _keys(response.get("properties"))
    if errors:
        out["error"] = _mask(errors[0].splitlines()[0])[:300]
    return out


def reduce(entries: list[dict]) -> dict[str, dict]:
    """{resource name: {"type": ..., "calls": [summaries in order]}} of the resource calls in `entries`."""
    trace: dict[str, dict] = {}
    for entry in entries:
        method = entry.get("method", "")
        if not method.startswith(SERVICE):
            continue
        name = method[len(SERVICE):]
        if name not in METHODS:
            continue
        request = entry.get("request") or {}
        urn = request.get("urn", "")
        if not urn:
            continue
        slot = trace.setdefault(_name(urn), {"type": _type(urn), "calls": []})
        slot["calls"].append(summarize(name, request, entry.get("response"), entry.get("errors")))
    return dict(sorted(trace.items()))


def diff(golden: dict[str, dict], got: dict[str, dict]) -> list[str]:
    """Human-readable differences, one per resource (or per call), empty when the traces agree."""
    lines = []
    for name in sorted(set(golden) | set(got)):
        a, b = golden.get(name), got.get(name)
        if a is None or b is None:
            lines.append(f"{name}: only in {'the recorded run' if a is None else 'the golden trace'}")
            continue
        if a["type"] != b["type"]:
            lines.append(f"{name}: type {a['type']} != {b['type']}")
        for i in range(max(len(a["calls"]), len(b["calls"]))):
            ca = a["calls"][i] if i < len(a["calls"]) else None
            cb = b["calls"][i] if i < len(b["calls"]) else None
            if ca != cb:
                lines.append(f"{name} call {i + 1}: golden {json.dumps(ca, sort_keys=True)}\n"
                             f"{' ' * len(name)}   recorded {json.dumps(cb, sort_keys=True)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.grpctrace", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reduce", help="a PULUMI_DEBUG_GRPC file -> its reduced trace (JSON, stdout)")
    r.add_argument("log", type=Path)
    d = sub.add_parser("diff", help="two reduced traces (or PULUMI_DEBUG_GRPC files): what differs")
    d.add_argument("golden", type=Path)
    d.add_argument("recorded", type=Path)
    a = p.parse_args(argv)

    def read(path: Path) -> dict:
        text = path.read_text()
        try:
            doc = json.loads(text)
            if isinstance(doc, dict) and all(isinstance(v, dict) and "calls" in v for v in doc.values()):
                return doc
        except ValueError:
            pass
        return reduce(load(path))

    if a.cmd == "reduce":
        json.dump(reduce(load(a.log)), sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    lines = diff(read(a.golden), read(a.recorded))
    print("\n".join(lines) if lines else "the traces agree")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
