"""docs/configuration.md is what the schema generates (`python -m declared.reference`), and it cannot drift:
every field of every model is on it, in its section, with the engine the code enforces and the secrets'
commands that settings.load prints."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import typing
from types import SimpleNamespace

import pytest
from pydantic import BaseModel, Field

from declared import cluster, reference, settings, stack
from declared.cluster import ClusterConfig, ConfigError, ServingConfig
from declared.stack import StackConfig
from harness import ROOT, cluster_of

REGENERATE = "python -m declared.reference"


def page_sections(text: str) -> dict[str, dict[str, list[str]]]:
    """heading -> {first cell (backticks stripped) -> the row's cells}."""
    out: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = out.setdefault(line[3:].strip("`"), {})
        elif current is not None and line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            current[cells[0].strip("`")] = cells
    return out


def _models_in(tp) -> list[tuple[type, str]]:
    """The models a field's type holds, with '[]' when in a list (walked here, not with reference's helpers)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [(tp, "")]
    many = typing.get_origin(tp) in (list, tuple)
    return [(m, "[]" if many else s) for a in typing.get_args(tp) if a is not Ellipsis for m, s in _models_in(a)]


def expected_sections() -> dict[str, type]:
    out: dict[str, type] = {}

    def walk(model: type, path: str) -> None:
        out[path] = model
        for name, f in model.model_fields.items():
            for sub, suffix in _models_in(f.annotation):
                walk(sub, f"{path}.{f.alias or name}{suffix}")

    walk(ClusterConfig, "cluster")
    for key, tp in typing.get_type_hints(StackConfig).items():
        for sub, suffix in _models_in(tp):
            walk(sub, f"cluster.{_key(key)}{suffix}")
    return out


PAGE = page_sections(reference.PAGE.read_text())


# (a) the committed page is what the schema generates


def test_committed_page_is_what_the_schema_generates():
    assert reference.PAGE == ROOT / "docs" / "configuration.md"
    assert reference.PAGE.read_text() == reference.render(), (
        f"docs/configuration.md is stale: run `{REGENERATE}` from the repository root and commit the page"
    )


def test_the_command_checks_the_committed_page():
    run = subprocess.run([sys.executable, "-m", "declared.reference", "--check"], cwd=ROOT, capture_output=True,
                         text=True)  # fmt: skip
    assert run.returncode == 0, f"run `{REGENERATE}`:\n{run.stdout}{run.stderr}"


def test_page_says_it_is_generated_and_by_what():
    head = reference.PAGE.read_text().splitlines()[:3]
    assert any("Generated" in line and f"`{REGENERATE}`" in line for line in head)


# (b) every field of every model is on it, in its model's section


def test_every_model_of_the_schema_has_a_section():
    models = {m for schema in (cluster, stack) for m in vars(schema).values()
              if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == schema.__name__}  # fmt: skip
    assert models - {cluster._Strict} == set(expected_sections().values())  # none unreachable from the stack value
    assert set(expected_sections()) <= set(PAGE)


def _key(field: str) -> str:
    """A StackConfig field as the stack file spells it (front_door: frontDoor)."""
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), field)


@pytest.mark.parametrize("path", sorted(expected_sections()))
def test_every_field_is_in_its_section(path):
    model = expected_sections()[path]
    aliases = {f.alias or name for name, f in model.model_fields.items()}
    extra = {_key(f.name) for f in dataclasses.fields(StackConfig)} if path == "cluster" else set()
    assert set(PAGE[path]) == aliases | extra
    for alias in aliases:
        assert len(PAGE[path][alias]) == len(reference.HEAD[0].split("|")) - 2, alias  # every column, no stray |


@pytest.mark.parametrize("path", sorted(expected_sections()))
def test_every_model_and_field_says_what_it_is(path):
    """The page is the user's reference: every section has its paragraph, every field its description."""
    model = expected_sections()[path]
    assert reference._doc(model), f"{model.__name__} has no docstring"
    assert [f.alias or name for name, f in model.model_fields.items() if not f.description] == []


def test_groups_and_secrets_sections():
    assert set(PAGE["cluster.groups[]"]) == {"name"}
    assert stack.GROUP_NAME.pattern in PAGE["cluster.groups[]"]["name"][3]
    text = reference.PAGE.read_text()
    groups = text.split("## `cluster.groups[]`")[1].split("\n## ")[0]
    assert all(f"`{field}`" in groups for field in stack.GROUP_FIELDS)
    assert set(PAGE["Secrets"]) == {f"{cluster.PROJECT}:{k}" for k in SECRET_KEYS}


def test_every_link_has_its_heading():
    text = reference.PAGE.read_text()
    slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^## (.+)$", text, re.M)}
    assert set(re.findall(r"\]\(#([^)]+)\)", text)) <= slugs


# (c) it can fail: a new field changes the page, and --check refuses a stale one


class _Serving(ServingConfig):
    warp_factor: int = Field(default=9, ge=1, le=10, description="how fast")


class _Cluster(ClusterConfig):
    serving: _Serving
    tea_time: str | None = Field(default=None, pattern=r"^\d\d:\d\d$", description="when")


def test_a_new_field_changes_the_page():
    text = reference.render(_Cluster)
    assert text != reference.render()
    sections = page_sections(text)
    assert sections["cluster.serving"]["warpFactor"][1:] == ["`int`", "`9`", "`1 <= x <= 10`", "both", "how fast"]
    assert sections["cluster"]["teaTime"][1:] == ["`str` or `null`", "`null`", r"matches `^\d\d:\d\d$`", "both", "when"]


def test_check_refuses_the_committed_page_when_the_schema_changed(monkeypatch, capsys):
    render = reference.render
    monkeypatch.setattr(reference, "render", lambda: render(_Cluster))
    assert reference.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert "+| `warpFactor` |" in out and "+| `teaTime` |" in out
    assert f"run `{REGENERATE}`" in err


def test_check_on_a_copy(tmp_path, capsys):
    page = tmp_path / "configuration.md"
    assert reference.main(["--check", "--out", str(page)]) == 1  # missing
    assert reference.main(["--out", str(page)]) == 0
    assert page.read_text() == reference.PAGE.read_text()
    assert reference.main(["--check", "--out", str(page)]) == 0
    page.write_text(page.read_text().replace("| `gpuMemoryUtilization` |", "| `gpuMemUtil` |"))
    capsys.readouterr()
    assert reference.main(["--check", "--out", str(page)]) == 1
    out, err = capsys.readouterr()
    assert "-| `gpuMemUtil` |" in out and "+| `gpuMemoryUtilization` |" in out
    assert f"--out {page}" in err


# (d) the engine column is the code's


def test_engine_column():
    serving = PAGE["cluster.serving"]
    assert serving["memFractionStatic"][4] == "SGLang"
    assert serving["gpuMemoryUtilization"][4] == "vLLM"
    assert serving["tpSize"][4] == "both"
    assert "required on SGLang" in serving["maxRunningRequests"][2]
    assert PAGE["cluster"]["engram"][4] == "SGLang"
    assert {row[4] for row in PAGE["cluster.engram"].values()} == {"SGLang"}
    assert {row[4] for row in PAGE["cluster.fabric"].values()} == {"both"}


@pytest.mark.parametrize("name", sorted(ServingConfig.model_fields))
def test_serving_engine_is_what_rule_engine_fields_enforces(name):
    want = "SGLang" if name in cluster.SGLANG_ONLY else "vLLM" if name in cluster.VLLM_ONLY else "both"
    assert PAGE["cluster.serving"][ServingConfig.model_fields[name].alias][4] == want


def test_engine_dependent_defaults():
    for section, alias in (("cluster", "image"), ("cluster", "engineVersion"), ("cluster.serving", "port"),
                           ("cluster.model", "profile")):  # fmt: skip
        cell = PAGE[section][alias][2]
        for engine, defaults in cluster.ENGINE_DEFAULTS.items():
            value = defaults[alias] if section == "cluster" else defaults[section.split(".")[1]][alias]
            assert f"{engine}: `{value}`" in cell


# the secrets' commands are the ones settings.load prints


def _load_refuses(monkeypatch, tmp_path, values: dict[str, str], plain: tuple[str, ...] = ()) -> str:
    raw = cluster_of("tp4")
    raw["ssh"] = {**raw.get("ssh", {}), "strictHostKeyChecking": False, "knownHostsFile": str(tmp_path / "none")}
    conf = {f"{cluster.PROJECT}:{cluster.CLUSTER_KEY}": json.dumps(raw),
            **{f"{cluster.PROJECT}:{k}": v for k, v in values.items()}}  # fmt: skip
    runtime = SimpleNamespace(get_config=conf.get, is_config_secret=lambda key: key.split(":", 1)[1] not in plain)
    fake = SimpleNamespace(get_stack=lambda: "<stack>", runtime=runtime, Output=SimpleNamespace(secret=lambda v: v))
    monkeypatch.setitem(sys.modules, "pulumi", fake)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with pytest.raises(ConfigError) as err:
        settings.load()
    return str(err.value)


SECRET_KEYS = [settings.API_KEY, settings.SSH_KEY, settings.HF_TOKEN, settings.MEMBER_KEYS, settings.ALERT_WEBHOOK,
               settings.FRONTDOOR_KEY]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_commands_are_what_load_prints(key, monkeypatch, tmp_path):
    command = PAGE["Secrets"][f"{cluster.PROJECT}:{key}"][3].strip("`")
    assert command.startswith("pulumi config set --secret ")
    values = {} if key == settings.API_KEY else {settings.API_KEY: "k" * 32, key: "{}"}
    assert command in _load_refuses(monkeypatch, tmp_path, values, plain=(key,))
