"""The layers stay layered: each folder imports only what its __init__ docstring allows.

declared -> planning -> components -> __main__.py; programs: standard library only; policy: the
shapes, never the Pulumi program. Checked on the source (every import statement, at any depth), so
a forbidden import fails here even when no test executes it. And every module stays small enough to
read (BOUND lines, or an exception that says why) and no module imports one that imports it back.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"declared", "planning", "components", "programs", "dspark", "policy", "sim", "tests"}
STDLIB = set(sys.stdlib_module_names)
# folder -> (project folders it may import, third-party packages it may import)
ALLOWED = {
    "declared": (set(), {"pydantic", "yaml", "pulumi"}),
    "planning": ({"declared", "programs"}, {"pydantic", "yaml", "cryptography"}),  # cryptography: planning/tls.py
    "components": ({"planning"}, {"pulumi", "pulumi_docker", "pulumi_command"}),
    "programs": (set(), set()),
    "policy": ({"declared"}, {"pulumi_policy", "pulumi", "yaml", "pydantic"}),
}
# the engines argcheck imports inside the image (never on the machine that runs Pulumi)
ENGINES = {"sglang", "vllm", "ray", "click", "sglang_router"}
# what the team gateway's hooks import inside the gateway image (programs/gateway/requirements.txt)
GATEWAY = {"litellm", "fastapi", "psycopg", "prometheus_client"}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def violations(folder: str) -> list[str]:
    ours, third = ALLOWED[folder]
    bad = []
    local = {p.stem for p in (ROOT / folder).glob("*.py")}  # the policy pack imports its siblings by name
    for path in sorted(p for p in (ROOT / folder).rglob("*.py") if ".venv" not in p.parts):  # policy/.venv: the pack's
        siblings = {p.stem for p in path.parent.glob("*.py")}
        for mod in imports(path) - STDLIB - {"__future__"} - local - siblings:
            if folder == "programs" and path.name == "argcheck.py" and mod in ENGINES:
                continue
            if folder == "programs" and path.parent.name == "gateway" and mod in GATEWAY:
                continue
            if mod in OURS and mod != folder and mod not in ours:
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
            elif mod not in OURS and mod not in third:
                bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    return bad


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_folder_imports_only_what_its_layer_allows(folder):
    assert violations(folder) == []


def test_pulumi_only_where_config_is_read():
    """In `declared`, only settings.load reads pulumi.Config; the plan never imports pulumi at all."""
    users = [p.name for p in (ROOT / "declared").rglob("*.py") if "pulumi" in imports(p)]
    assert users == ["settings.py"]


def test_every_layer_says_what_it_may_import():
    for folder in ("declared", "planning", "components", "programs"):
        doc = ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text()))
        assert doc and "May import" in doc, folder


def test_a_forbidden_import_is_caught(tmp_path, monkeypatch):
    """The check itself can fail: a plan module that imports pulumi, a program that imports the plan."""
    for folder, line in (("planning", "import pulumi\n"), ("programs", "from planning import plan\n"),
                         ("components", "from declared import settings\n")):
        fake = tmp_path / folder
        fake.mkdir()
        (fake / "bad.py").write_text(line)
        monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
        assert violations(folder) == [f"{folder}/bad.py imports {line.split()[1].split('.')[0]}"]


# ----------------------------------------------------------------- modules small enough to read, no import circle
BOUND = 600  # lines: a module longer than this is split at its seams, or listed here with the reason it is not
CODE = ("declared", "planning", "components", "programs", "dspark", "policy", "sim")  # the project's own code
# path -> why it may stay longer (none today: every module was split at its seams)
EXCEPTIONS: dict[str, str] = {}


def sources(root: Path, folders=tuple(OURS)) -> list[Path]:
    """The project's modules in `folders` (and __main__.py), never a virtualenv's (policy/.venv)."""
    found = [p for f in sorted(folders) for p in sorted((root / f).rglob("*.py")) if ".venv" not in p.parts]
    return ([root / "__main__.py"] if (root / "__main__.py").is_file() else []) + found


def long_modules(root: Path, exceptions: dict[str, str]) -> dict[str, int]:
    """Each module over BOUND lines that is not an exception, with its length."""
    lengths = {p.relative_to(root).as_posix(): len(p.read_text().splitlines()) for p in sources(root, CODE)}
    return {path: n for path, n in lengths.items() if n > BOUND and path not in exceptions}


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project's modules it imports: every import statement at any depth (TYPE_CHECKING ones and
    those inside functions too). A bare name is looked up from the root, beside the importer (the policy pack's
    siblings) and in tests/ (the tests' helpers); `from p import m` is an edge to the module p.m when there is one."""
    paths = {module_name(root, p): p for p in sources(root)}

    def find(name: str, here: str) -> str | None:
        return next((f"{base}.{name}" if base else name for base in ("", here, "tests")
                     if (f"{base}.{name}" if base else name) in paths), None)  # fmt: skip

    graph = {}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {find(a.name, package) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if package else []
                name = ".".join(base + ([node.module] if node.module else []))
                edges |= {f"{name}.{a.name}" if f"{name}.{a.name}" in paths else name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                edges |= {find(f"{node.module}.{a.name}", package) or find(node.module, package) for a in node.names}
        graph[mod] = {e for e in edges if e in paths and e != mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, as the modules along it (the first again at the end): one per strongly connected
    component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(_circle(graph, component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _circle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One circle through the component's first module (breadth first: the shortest)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return sorted(component)


def test_no_module_over_the_bound():
    """A long module is split at its seams; one that may stay long says why in EXCEPTIONS."""
    assert long_modules(ROOT, EXCEPTIONS) == {}


def test_every_exception_is_still_needed():
    """An exception whose module was split (or removed) is dropped from EXCEPTIONS."""
    for path, reason in EXCEPTIONS.items():
        assert reason.strip(), path
        assert (ROOT / path).is_file(), f"{path}: no such module; drop its exception"
        assert len((ROOT / path).read_text().splitlines()) > BOUND, f"{path} is within {BOUND} lines; drop its exception"


def test_no_import_circle():
    """No module imports one that imports it back, by any path, TYPE_CHECKING imports included: the layers
    read from the bottom up (planning: rulebook before the rules, clusterplan before what reads a plan)."""
    graph = import_graph(ROOT)
    assert "planning.stackplan" in graph and "planning.clusterplan" in graph["planning.stackplan"]
    assert [" -> ".join(c) for c in circles(graph)] == []


def test_the_bound_and_the_circle_check_can_fail(tmp_path):
    """The checks themselves can fail: a long module, an import circle (through a TYPE_CHECKING import and a
    function's own import), in a tree of their own."""
    pkg = tmp_path / "planning"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "long.py").write_text("x = 1\n" * (BOUND + 1))
    (pkg / "even.py").write_text("x = 1\n" * BOUND)
    (pkg / "kept.py").write_text("x = 1\n" * (BOUND + 50))
    assert long_modules(tmp_path, {"planning/kept.py": "a reason"}) == {"planning/long.py": BOUND + 1}
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planning.c import C\n")
    (pkg / "c.py").write_text("def f():\n    from .a import g\n")
    (pkg / "d.py").write_text("from planning import a, long\nimport planning.even\n")  # imports the circle, not in it
    graph = import_graph(tmp_path)
    assert graph["planning.d"] == {"planning.a", "planning.long", "planning.even"}
    assert circles(graph) == [["planning.a", "planning.b", "planning.c", "planning.a"]]
    (pkg / "c.py").write_text("def f():\n    pass\n")
    assert circles(import_graph(tmp_path)) == []
