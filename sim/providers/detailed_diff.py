"""The detailed diff a bridged provider reports, as pulumi-terraform-bridge's MakeDetailedDiffV2 builds it
(pkg/tfbridge/detailed_diff.go; on by default for SDKv2 providers such as pulumi-docker: info.go
EnableAccurateBridgePreview "enabled by default"), for the TEST DOUBLE of pulumi-docker.

Paths are property paths (`command[1]`, `labels[2].value`, `driverOpts.o`) and each carries a kind:
- a scalar: UPDATE when it differs; ADD/DELETE when one side is absent (makePlainPropDiff, makeBaseDiff);
- a list of scalars: the edit script between the two lists (makeListAttributeDiff: an element only in the
  new list is an ADD at its new index, one only in the old a DELETE at its old index, both at one index an
  UPDATE);
- a set: elements matched by identity (TF's set hash; here the element's canonical JSON); an element gone
  is reported at its old index, a new one at its index in the inputs, both at one index compared element by
  element (makeSetDiff, makeSetChangeMap, makeSetDiffElementResult);
- a map or an object: key by key (makeMapDiff);
- under a ForceNew top-level property every kind becomes its _REPLACE (promoteToReplace). The bridge asks
  the schema at each path; the double promotes by the top-level key, which is what the docker schema's
  nested fields say for the fields this program sets (their elements are ForceNew too).
"""

from __future__ import annotations

import json
from typing import Any

ADD, DELETE, UPDATE = "ADD", "DELETE", "UPDATE"


def _present(value: Any) -> bool:
    return value is not None


def _key(path: str, sub: str) -> str:
    return f"{path}.{sub}" if sub.replace("_", "").isalnum() else f'{path}["{sub}"]'


def _identity(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _edit_script(old: list, new: list) -> list[tuple[str, int]]:
    """An LCS edit script: ("insert", new index) / ("remove", old index), as difft.DiffT yields them."""
    n, m = len(old), len(new)
    lcs = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            lcs[i][j] = lcs[i + 1][j + 1] + 1 if old[i] == new[j] else max(lcs[i + 1][j], lcs[i][j + 1])
    edits, i, j = [], 0, 0
    while i < n or j < m:
        if i < n and j < m and old[i] == new[j]:
            i, j = i + 1, j + 1
        elif j < m and (i == n or lcs[i][j + 1] >= lcs[i + 1][j]):
            edits.append(("insert", j))
            j += 1
        else:
            edits.append(("remove", i))
            i += 1
    return edits


def _list_diff(path: str, old: list, new: list) -> dict[str, str]:
    out: dict[str, str] = {}
    for change, index in _edit_script(old, new):
        key = f"{path}[{index}]"
        out[key] = UPDATE if key in out else (ADD if change == "insert" else DELETE)
    return out


def _set_diff(path: str, old: list, new: list, shapes: dict) -> dict[str, str]:
    old_ids = {_identity(v): i for i, v in enumerate(old)}
    new_ids = {_identity(v): i for i, v in enumerate(new)}
    removed = sorted(i for h, i in old_ids.items() if h not in new_ids)
    added = sorted(i for h, i in new_ids.items() if h not in old_ids)
    changes: dict[int, tuple[Any, Any]] = {i: (old[i], None) for i in removed}
    for i in added:
        changes[i] = (changes[i][0] if i in changes else None, new[i])
    out: dict[str, str] = {}
    for index, (o, n) in changes.items():
        out.update(_prop_diff(f"{path}[{index}]", o, n, shapes, element=True))
    return out


def _map_diff(path: str, old: dict, new: dict, shapes: dict) -> dict[str, str]:
    out: dict[str, str] = {}
    for k in sorted(set(old) | set(new)):
        out.update(_prop_diff(_key(path, k), old.get(k), new.get(k), shapes))
    return out


def _prop_diff(path: str, old: Any, new: Any, shapes: dict, element: bool = False) -> dict[str, str]:
    if not _present(old) and not _present(new):
        return {}
    if not _present(old):
        return {path: ADD}
    if not _present(new):
        return {path: DELETE}
    shape = shapes.get(path.split("[", 1)[0].split(".", 1)[0]) if not element else None
    if isinstance(old, list) and isinstance(new, list):
        if shape == "list" and all(not isinstance(v, (dict, list)) for v in old + new):
            return _list_diff(path, old, new)
        if shape == "list":
            out: dict[str, str] = {}
            for i in range(max(len(old), len(new))):
                out.update(_prop_diff(f"{path}[{i}]", old[i] if i < len(old) else None,
                                      new[i] if i < len(new) else None, shapes, element=True))  # fmt: skip
            return out
        return _set_diff(path, old, new, shapes)  # a set, or a nested list whose shape the double does not know
    if isinstance(old, dict) and isinstance(new, dict):
        return _map_diff(path, old, new, shapes)
    return {} if old == new else {path: UPDATE}


def detailed_diff(old: dict, new: dict, shapes: dict[str, str], force_new: set[str] | frozenset) -> dict[str, str]:
    """{path: kind} between the prior (normalized) and the planned (normalized) properties; `shapes` names the
    top-level keys that are lists (`list`) or sets (`set`); kinds under a ForceNew key end in _REPLACE."""
    out: dict[str, str] = {}
    for k in sorted(set(old) | set(new)):
        for path, kind in _prop_diff(k, old.get(k), new.get(k), shapes).items():
            out[path] = f"{kind}_REPLACE" if ("*" in force_new or k in force_new) else kind
    return out
