"""The configuration reference, generated from the stack config's schema (`cluster`: one group's fields;
`stack`: the stack's own): every field of `deepseek-spark:cluster` (type, default, bounds, engine,
description), then the secrets (`settings.SECRETS`).

    python -m declared.reference [--out docs/configuration.md]   # write the page
    python -m declared.reference --check                         # exit 1 and a diff when the page is stale

Names, types, defaults, bounds and descriptions come from the models' fields; a serving field's engine
from cluster.SGLANG_ONLY / VLLM_ONLY (what rule engine-fields enforces), or a description that starts
"sglang only"; engine-dependent defaults from cluster.ENGINE_DEFAULTS.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .cluster import (
    CLUSTER_KEY, ENGINE_DEFAULTS, PROJECT, SGLANG_ONLY, SGLANG_REQUIRED, VLLM_ONLY, ClusterConfig, ServingConfig,
)  # fmt: skip
from .settings import SECRETS
from .stack import GROUP_FIELDS, GROUP_NAME, GroupEntry, StackConfig, _merge

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
COMMAND = "python -m declared.reference"
SCHEMA = ("declared/cluster.py", "declared/stack.py")  # where the page comes from
ENGINES = {"sglang": "SGLang", "vllm": "vLLM"}  # the schema's engine names, as the page writes them
BOTH = "both"
HEAD = ["| field | type | default | bounds | engine | description |", "|---|---|---|---|---|---|"]


@dataclasses.dataclass(frozen=True)
class Section:
    path: str  # as the validation messages name it: cluster.serving.selfHeal, cluster.nodes[]
    model: Any  # a pydantic model, or GroupEntry for cluster.groups[]
    engine: str  # BOTH, or the engine the whole section belongs to (engram)

    @property
    def link(self) -> str:  # to the heading, by GitHub's slug
        slug = re.sub(r"[^\w\- ]", "", self.path.lower())
        return f"[{self.path.rsplit('.', 1)[-1].removesuffix('[]')}](#{slug})"


def _doc(obj: Any) -> str:
    """An object's own docstring as one paragraph ('' when it has none: a model does not inherit one)."""
    doc = obj.__doc__ if isinstance(obj, type) else inspect.getdoc(obj)
    return " ".join(inspect.cleandoc(doc).split()) if doc else ""


def _models(tp: Any) -> list[tuple[type, bool]]:
    """The sections a type leads to: (model, in a list)."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _models(args[0])
    if origin in (Union, types.UnionType):
        return [m for a in args for m in _models(a)]
    if origin in (list, tuple):
        return [(m, True) for m, _ in _models(args[0])]
    is_section = isinstance(tp, type) and (issubclass(tp, BaseModel) or tp is GroupEntry)
    return [(tp, False)] if is_section else []


def _engine(model: type, name: str, field: FieldInfo, inherited: str) -> str:
    for engine, only in (("sglang", SGLANG_ONLY), ("vllm", VLLM_ONLY)):
        if issubclass(model, ServingConfig) and name in only:
            return ENGINES[engine]
    said = re.match(r"(\w+) only\b", (field.description or "").lower())
    return ENGINES.get(said.group(1), inherited) if said else inherited


def _camel(name: str) -> str:
    """A StackConfig field as its key in the stack file (front_door -> frontDoor)."""
    first, *rest = name.split("_")
    return first + "".join(w.title() for w in rest)


def sections(cluster: type = ClusterConfig) -> list[Section]:
    """The page's sections in order: the stack value, what it nests, then each stack-level key's."""
    out = [Section("cluster", cluster, BOTH)]

    def walk(model: type, path: str, engine: str) -> None:
        for name, f in model.model_fields.items():
            for sub, many in _models(f.annotation):
                sub_path = f"{path}.{f.alias or name}{'[]' if many else ''}"
                out.append(Section(sub_path, sub, _engine(model, name, f, engine)))
                walk(sub, out[-1].path, out[-1].engine)

    walk(cluster, "cluster", BOTH)
    for key, tp in typing.get_type_hints(StackConfig).items():
        for sub, many in _models(tp):
            out.append(Section(f"cluster.{_camel(key)}{'[]' if many else ''}", sub, BOTH))
            if issubclass(sub, BaseModel):
                walk(sub, out[-1].path, BOTH)
    return out


def _type(tp: Any, links: dict[type, Section]) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _type(args[0], links)
    if origin in (Union, types.UnionType):
        shown = " or ".join(_type(a, links) for a in args if a is not type(None))
        return shown + (" or `null`" if type(None) in args else "")
    if origin is Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin in (list, tuple, dict):
        return f"{origin.__name__.replace('tuple', 'list')}[{', '.join(_type(a, links) for a in args if a != ...)}]"
    return links[tp].link if tp in links else f"`{getattr(tp, '__name__', tp)}`"


def _validator(func: Any) -> str:
    what = inspect.getclosurevars(func).nonlocals.get("what")  # shapes.shape(pattern, what)
    return f"must be {what}" if what else (_doc(func).split(". ")[0].rstrip(".") or f"`{func.__name__}`")


def _bounds(metadata: list[Any]) -> list[str]:
    got: dict[str, Any] = {}
    checks = []
    for m in metadata:
        if isinstance(m, FieldInfo):
            checks += _bounds(m.metadata)
        elif callable(getattr(m, "func", None)):
            checks.append(_validator(m.func))
        got |= {a: getattr(m, a) for a in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern")
                if getattr(m, a, None) is not None}  # fmt: skip
    out = []
    for what, ge, gt, le, lt in (("x", "ge", "gt", "le", "lt"), ("len", "min_length", "", "max_length", "")):
        lo = f"{got[ge]} <= " if ge in got else f"{got[gt]} < " if gt in got else ""
        hi = f" <= {got[le]}" if le in got else f" < {got[lt]}" if lt in got else ""
        out += [f"`{lo}{what}{hi}`"] if lo or hi else []
    return out + ([f"matches `{got['pattern']}`"] if "pattern" in got else []) + checks


def _nested_bounds(tp: Any, prefix: str = "") -> list[str]:
    """Bounds inside a type: an Optional's, a list's items, a dict's keys and values."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return [prefix + b for b in _bounds(list(args[1:]))] + _nested_bounds(args[0], prefix)
    if origin in (Union, types.UnionType):
        return [b for a in args for b in _nested_bounds(a, prefix)]
    if origin is list:
        return _nested_bounds(args[0], "each item: ")
    if origin is dict:
        return _nested_bounds(args[0], "keys: ") + _nested_bounds(args[1], "values: ")
    return []


def _value(value: Any, links: dict[type, Section]) -> str:
    if isinstance(value, BaseModel) and type(value) in links:
        return f"see {links[type(value)].link}"
    return f"`{value}`" if isinstance(value, str) else f"`{json.dumps(value)}`"


def _default(sec: Section, name: str, f: FieldInfo, links: dict[type, Section]) -> str:
    per_engine = []
    for engine, value in ENGINE_DEFAULTS.items():  # what ClusterConfig._engine_defaults fills in
        for part in (*sec.path.split(".")[1:], f.alias or name):
            value = value.get(part) if isinstance(value, dict) else None
        per_engine += [f"{engine}: {_value(value, links)}"] if value is not None and not isinstance(value, dict) else []
    if per_engine or f.is_required():
        return "; ".join(per_engine) or "required"
    shown = _value(f.default_factory() if f.default_factory else f.default, links)  # type: ignore[call-arg]
    required = issubclass(sec.model, ServingConfig) and name in SGLANG_REQUIRED
    return shown + (f"; required on {ENGINES['sglang']}" if required else "")


def _md(text: str) -> str:
    """`<` outside code spans would open an HTML tag (GitHub drops `<type>`)."""
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(text.split("`")))


def _row(*cells: str) -> str:
    return "| " + " | ".join(_md(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _rows(sec: Section, links: dict[type, Section]) -> list[str]:
    rows = []
    for name, f in sec.model.model_fields.items():
        about = f.description or next((_doc(m).split(". ")[0] for m, _ in _models(f.annotation) if _doc(m)), "")
        rows.append(_row(f"`{f.alias or name}`", _type(f.annotation, links), _default(sec, name, f, links),
                         "; ".join(_bounds(f.metadata) + _nested_bounds(f.annotation)),
                         _engine(sec.model, name, f, sec.engine), about))  # fmt: skip
    if sec.path == "cluster":  # the stack-level keys (StackConfig, parse_stack)
        hints = typing.get_type_hints(StackConfig)
        for f in dataclasses.fields(StackConfig):
            default = "the value itself: one group" if f.default is dataclasses.MISSING else _value(f.default, links)
            about = next((_doc(m) for m, _ in _models(hints[f.name])), "")
            rows.append(_row(f"`{_camel(f.name)}`", _type(hints[f.name], links), default, "", BOTH, about))
    return rows


def render(cluster: type = ClusterConfig) -> str:
    """The page, from the schema (`cluster` replaces ClusterConfig, e.g. with a field more)."""
    secs = sections(cluster)
    links = {s.model: s for s in secs[1:]}
    out = [
        "# Configuration reference", "",
        f"Generated from the schema ({' and '.join(f'`{m}`' for m in SCHEMA)}) by `{COMMAND}`: do not edit it by hand; change the "
        f"schema and run the command again (`{COMMAND} --check` says whether this page is current).", "",
        f"Everything lives under `{PROJECT}:{CLUSTER_KEY}` in `Pulumi.<stack>.yaml`; unknown fields are errors, "
        "names are camelCase. The engine column says which engine reads a field: a field of the other engine is "
        "refused (rule `engine-fields`). The secrets are keys of their own ([Secrets](#secrets)).", "",
    ]  # fmt: skip
    for sec in secs:
        out += [f"## `{sec.path}`", ""]
        if sec.path == "cluster":
            shared = ", ".join(f"`{a}`" for a in (f.alias or n for n, f in cluster.model_fields.items())
                               if a not in GROUP_FIELDS)  # fmt: skip
            out += ["The stack value: one group's fields, or, with `groups`, what every group shares; `groups`, "
                    f"`router`, `gateway`, `monitoring`, `firewall` and `frontDoor` are the stack's own, and so is {shared} (not a per-group "
                    "field).", ""]  # fmt: skip
        elif _doc(sec.model):
            out += [_md(_doc(sec.model)), ""]
        if sec.model is GroupEntry:
            fields = ", ".join(f"`{a}`" for a in GROUP_FIELDS)
            out += [_md(f"Each entry is `name` and any of {fields}. {_doc(_merge)}"), "", *HEAD,
                    _row("`name`", "`str`", "required", f"matches `{GROUP_NAME.pattern}`", BOTH,
                         f"the group's name: {_doc(GroupEntry.plan_name).lower()}"), ""]  # fmt: skip
        else:
            out += [*HEAD, *_rows(sec, links), ""]
    out += ["## Secrets", "", f"Keys of their own beside `{PROJECT}:{CLUSTER_KEY}`, each stored as a Pulumi "
            "secret (a plain value is refused).", "", "| key | needed | what | command |", "|---|---|---|---|"]
    out += [_row(f"`{PROJECT}:{s.key}`", s.needed, s.about, f"`{s.command()}`") for s in SECRETS]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Write the configuration reference from the schema.")
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff when the page is not what it writes")
    parser.add_argument("--out", type=Path, default=PAGE, help="the page (default: docs/configuration.md)")
    args = parser.parse_args(argv)
    text = render()
    if not args.check:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        return 0
    old = args.out.read_text() if args.out.exists() else ""
    if old == text:
        return 0
    sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                               f"{args.out} (committed)", f"{args.out} (from the schema)"))  # fmt: skip
    again = COMMAND if args.out.resolve() == PAGE else f"{COMMAND} --out {args.out}"
    print(f"{args.out} is not what the schema generates: run `{again}` and commit it", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
