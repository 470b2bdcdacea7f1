"""Prometheus text exposition (format 0.0.4) read back for tests: families with their type, help and samples.

    fams = parse(text)
    fams["vllm:prompt_tokens_total"].kind, fams[...].samples  # [(sample name, {label: value}, value)]
    fams[...].label_names                                     # of its samples, without a histogram's `le`
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')
SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum"), "counter": ("",),
            "gauge": ("",), "untyped": ("",)}


@dataclass
class Family:
    name: str
    kind: str = "untyped"
    help: str = ""
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    @property
    def label_names(self) -> tuple[str, ...]:
        """The label names of its samples, in their order (a histogram's `le` left out); () without samples."""
        names: tuple[str, ...] = ()
        for _, labels, _ in self.samples:
            these = tuple(k for k in labels if k != "le")
            if names and these != names:
                raise AssertionError(f"{self.name}: samples with different label names {names} and {these}")
            names = these
        return names

    def value(self, suffix: str = "", **labels: str) -> float:
        """The one sample `name + suffix` whose labels include `labels`."""
        found = [v for n, ls, v in self.samples if n == self.name + suffix and labels.items() <= ls.items()]
        if len(found) != 1:
            raise AssertionError(f"{self.name}{suffix} {labels}: {len(found)} samples match")
        return found[0]


def _unescape(v: str) -> str:
    return v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def labels_of(text: str) -> dict[str, str]:
    out, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise ValueError(f"bad labels {text!r} at {pos}")
        out[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return out


def parse(text: str) -> dict[str, Family]:
    fams: dict[str, Family] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            _, what, name, *rest = line.split(" ", 3)
            fam = fams.setdefault(name, Family(name))
            if what == "HELP":
                fam.help = rest[0] if rest else ""
            else:
                fam.kind = rest[0].strip()
            continue
        if line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"not a sample line: {line!r}")
        sample, value = m.group(1), float(m.group(3).replace("+Inf", "inf").replace("-Inf", "-inf"))
        owner = next((f for f in fams.values() for s in SUFFIXES.get(f.kind, ("",)) if f.name + s == sample), None)
        if owner is None:
            owner = fams.setdefault(sample, Family(sample))
        owner.samples.append((sample, labels_of(m.group(2) or ""), value))
    return fams
