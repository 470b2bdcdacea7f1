"""The layers stay layered: each folder imports only what its __init__ docstring allows.

declared -> planning -> components -> __main__.py; programs: standard library only; policy: the
shapes, never the Pulumi program. Checked on the source (every import statement, at any depth), so
a forbidden import fails here even when no test executes it.
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
    "planning": ({"declared", "programs"}, {"pydantic", "yaml"}),
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
