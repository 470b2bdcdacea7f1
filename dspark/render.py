"""Output helpers: aligned tables for humans, JSON for machines."""

from __future__ import annotations

import json
from typing import Any, Iterable, Sequence


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], indent: str = "") -> str:
    rows = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    lines = [indent + "  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    for row in rows:
        lines.append(indent + "  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip())
    return "\n".join(lines)


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False, default=str)


def short(text: str | None, width: int = 120) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text if len(text) <= width else text[: width - 3] + "..."
