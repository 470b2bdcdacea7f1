"""One image per group: every node's image IDs, read now, must agree.

A tensor-parallel group whose ranks run different builds fails in ways that look like anything but
that (eugr's launcher and the reference's preflight abort when the IDs differ). Runs where Pulumi runs,
before the group generation, and reads each node over the system ssh (the docker provider's options),
like the fabric gate: a difference fails `up` while the running group is untouched, and a node fixed
since is read again at the next `up` (nothing stale is kept in the state).

    python3 -m programs.imagecheck --spec JSON [--ssh-opt=OPT ...]
    spec: {"group": "tp3", "refs": ["lmsysorg/sglang:dev-dsv41"],
           "nodes": [{"name": "spark1", "target": "user@host", "port": 22}, ...]}

Prints the agreed identity (`ref=id` per ref, sorted): the group generation's trigger, so an image
that moved on every node restarts the whole group deliberately.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor

from programs import probe


def inspect_cmd(refs: list[str]) -> str:
    """On a node: `<ref> <image ID>` per ref, `missing` when the node lacks it."""
    return (f"for ref in {' '.join(shlex.quote(r) for r in refs)}; do "
            "printf '%s %s\\n' \"$ref\" \"$(docker image inspect --format '{{.Id}}' \"$ref\" 2>/dev/null || echo missing)\"; done")  # fmt: skip


def parse(out: str) -> dict[str, str]:
    """`ref id` lines -> {ref: id}."""
    found = {}
    for line in out.splitlines():
        ref, _, image_id = line.strip().rpartition(" ")
        if ref:
            found[ref] = image_id
    return found


def problems(by_node: dict[str, dict[str, str]], refs: list[str]) -> list[str]:
    out = []
    for ref in refs:
        groups: dict[str, list[str]] = {}
        for node, ids in by_node.items():
            groups.setdefault(ids.get(ref, "missing"), []).append(node)
        missing = groups.pop("missing", [])
        if missing:
            out.append(f"{ref} is missing on {', '.join(missing)}")
        if len(groups) > 1:
            out.append(f"{ref} differs: " + "; ".join(f"{image_id} on {', '.join(nodes)}"
                                                     for image_id, nodes in sorted(groups.items())))  # fmt: skip
    return out


def read_all(spec: dict, ssh_opts: list[str], run=probe.on_node) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Every node's IDs at once; (by node, nodes that could not be read with why)."""
    cmd = inspect_cmd(spec["refs"])

    def one(node: dict) -> tuple[int, str]:
        return run(node["target"], node.get("port", 22), ssh_opts, cmd)

    with ThreadPoolExecutor(max_workers=len(spec["nodes"]) or 1) as ex:
        results = list(ex.map(one, spec["nodes"]))
    by_node, unread = {}, []
    for node, (code, out) in zip(spec["nodes"], results):
        if code != 0:
            unread.append(f"{node['name']} ({out.strip().splitlines()[-1] if out.strip() else f'exit {code}'})")
        else:
            by_node[node["name"]] = parse(out)
    return by_node, unread


def main(argv: list[str] | None = None, run=probe.on_node) -> int:
    p = argparse.ArgumentParser(prog="imagecheck")
    p.add_argument("--spec", required=True)
    p.add_argument("--ssh-opt", action="append", default=[])
    a = p.parse_args(argv)
    spec = json.loads(a.spec)
    by_node, unread = read_all(spec, a.ssh_opt, run)
    if unread:
        print(f"image {spec['group']}: FAIL cannot read the image IDs on {', '.join(unread)}; check ssh to the "
              "node and docker there (preflight's docker check)", file=sys.stderr)  # fmt: skip
        return 1
    found = problems(by_node, spec["refs"])
    if found:
        print(f"image {spec['group']}: FAIL the group's nodes do not hold the same image: {'; '.join(found)}. Fix: "
              "give every node the same image (pull the same digest everywhere: pin `image: repo@sha256:...`; or "
              "copy it: `docker save IMAGE | ssh NODE docker load`), then run up again; nothing was stopped",
              file=sys.stderr)  # fmt: skip
        return 1
    ids = by_node[spec["nodes"][0]["name"]]
    print(" ".join(f"{ref}={ids[ref]}" for ref in sorted(spec["refs"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
