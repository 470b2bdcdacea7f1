"""The pull-request workflows: what they promise (tests first, one preview comment per stack, the
policy pack, `up` only behind an approval) and that the offline linter really fails a broken one."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
LINT = ROOT / ".ci" / "lint-workflows"

# Inputs of pulumi/actions v7 (action.yml, tag v7.0.0). The action ignores unknown inputs with only a
# warning, so a misspelt `comment-on-pr` would silently post nothing: keep `with:` inside this set.
PULUMI_ACTION_INPUTS = {
    "command", "stack-name", "work-dir", "cloud-url", "comment-on-pr", "comment-on-pr-number", "comment-on-summary",
    "github-token", "edit-pr-comment", "diff", "refresh", "expect-no-changes", "policyPacks", "policyPackConfigs",
    "upsert", "secrets-provider", "config-map", "plan", "suppress-outputs", "always-include-summary",
    "pulumi-version", "pulumi-version-file", "color", "parallel", "message", "replace", "target",
    "target-dependents", "exclude-protected", "remove", "suppress-progress", "continue-on-error",
}  # fmt: skip


def load(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def pulumi_steps(job: dict) -> list[dict]:
    return [s for s in job["steps"] if str(s.get("uses", "")).startswith("pulumi/actions@")]


def expressions(node) -> list[str]:
    if isinstance(node, dict):
        return [e for v in node.values() for e in expressions(v)] + [e for k in node for e in expressions(k)]
    if isinstance(node, list):
        return [e for v in node for e in expressions(v)]
    return re.findall(r"\$\{\{(.*?)\}\}", node) if isinstance(node, str) else []


def test_the_workflow_files():
    assert {"pulumi-preview.yml", "pulumi-up.yml"} <= {p.name for p in WORKFLOWS.iterdir()}


def test_previews_run_on_pull_requests_after_the_tests():
    wf = load("pulumi-preview.yml")
    assert set(wf["on"]) == {"pull_request"}
    assert wf["permissions"] == {"contents": "read", "pull-requests": "write"}
    tests, preview = wf["jobs"]["tests"], wf["jobs"]["preview"]
    assert any("pytest" in s.get("run", "") and "tests/unit" in s["run"] for s in tests["steps"])
    assert any(".ci/lint-workflows" in s.get("run", "") for s in tests["steps"])
    assert preview["needs"] == "tests"
    assert preview["if"] == "github.event.pull_request.head.repo.full_name == github.repository"
    assert preview["runs-on"] == ["self-hosted", "linux", "dgx-spark-lan"]
    assert preview["strategy"]["matrix"]["stack"] == ["tp3", "tp4", "tp2", "tp4x2"]
    assert preview["strategy"]["fail-fast"] is False
    assert preview["env"]["PULUMI_CONFIG_PASSPHRASE"] == "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"
    (step,) = pulumi_steps(preview)
    assert step["uses"] == "pulumi/actions@v7"
    w = step["with"]
    assert set(w) <= PULUMI_ACTION_INPUTS
    assert w["command"] == "preview" and w["diff"] is True and w["comment-on-pr"] is True
    assert w["edit-pr-comment"] is True and w["policyPacks"] == "policy"
    assert w["stack-name"] == "${{ matrix.stack }}" and w["cloud-url"] == "${{ secrets.PULUMI_BACKEND_URL }}"


def test_a_stack_without_a_stack_file_is_skipped_step_by_step():
    preview = load("pulumi-preview.yml")["jobs"]["preview"]
    steps = preview["steps"]
    probe = next(i for i, s in enumerate(steps) if s.get("id") == "stack")
    assert 'Pulumi.$STACK.yaml' in steps[probe]["run"] and preview["env"]["STACK"] == "${{ matrix.stack }}"
    for s in steps[probe + 1 :]:
        assert s.get("if") == "steps.stack.outputs.present == 'true'", s.get("name", s.get("uses"))
    script = steps[probe]["run"]
    for stack, present in (("tp4", "true"), ("tp2", "true"), ("tp8", "false")):
        out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                             env={"STACK": stack, "GITHUB_OUTPUT": "/dev/stdout", "PATH": "/usr/bin:/bin"})  # fmt: skip
        assert f"present={present}" in out.stdout


def test_up_runs_only_after_a_push_to_main_and_an_approval():
    wf = load("pulumi-up.yml")
    assert set(wf["on"]) == {"push"} and wf["on"]["push"]["branches"] == ["main"]
    up = wf["jobs"]["up"]
    assert up["environment"]["name"] == "cluster-${{ matrix.stack }}"
    assert up["needs"] == "tests" and up["strategy"]["max-parallel"] == 1
    assert up["concurrency"]["cancel-in-progress"] is False
    guard = up["steps"][0]
    assert "required_reviewers" in guard["run"] and "sys.exit(1)" in guard["run"]
    (step,) = pulumi_steps(up)
    assert set(step["with"]) <= PULUMI_ACTION_INPUTS
    assert step["with"]["command"] == "up" and step["with"]["policyPacks"] == "policy"
    assert up["steps"].index(step) > 0  # after the guard
    # nothing else in any workflow applies changes
    for name in ("pulumi-preview.yml", "pulumi-up.yml"):
        for job_name, job in load(name)["jobs"].items():
            for s in pulumi_steps(job):
                assert s["with"]["command"] in ("preview", "up")
                if s["with"]["command"] == "up":
                    assert (name, job_name) == ("pulumi-up.yml", "up")
            assert "pulumi up" not in " ".join(s.get("run", "") for s in job["steps"])


def test_up_stack_list_comes_from_the_stack_files():
    tests = load("pulumi-up.yml")["jobs"]["tests"]
    script = next(s for s in tests["steps"] if s.get("id") == "stacks")["run"]
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True,
                         env={"GITHUB_OUTPUT": "/dev/stdout", "PATH": "/usr/bin:/bin"})  # fmt: skip
    expected = [s for s in ("tp3", "tp4", "tp2", "tp4x2") if (ROOT / f"Pulumi.{s}.yaml").exists()]
    assert out.stdout.strip() == "stacks=[" + ",".join(f'"{s}"' for s in expected) + "]"


@pytest.mark.parametrize("name", ["pulumi-preview.yml", "pulumi-up.yml"])
def test_references_resolve(name):
    """What the schema cannot see: needs, step ids, matrix keys and contexts used in expressions."""
    wf = load(name)
    for job_name, job in wf["jobs"].items():
        needs = job.get("needs", [])
        for need in [needs] if isinstance(needs, str) else needs:
            assert need in wf["jobs"], (job_name, need)
        ids = {s["id"] for s in job["steps"] if "id" in s}
        matrix_spec = job.get("strategy", {}).get("matrix")
        matrix = set(matrix_spec) if isinstance(matrix_spec, dict) else set()
        for expr in expressions(job):
            for sid in re.findall(r"steps\.([A-Za-z0-9_-]+)\.", expr):
                assert sid in ids, (job_name, expr)
            for key in re.findall(r"matrix\.([A-Za-z0-9_-]+)", expr):
                assert key in matrix, (job_name, expr)
            for need in re.findall(r"needs\.([A-Za-z0-9_-]+)\.", expr):
                assert need in ([needs] if isinstance(needs, str) else needs), (job_name, expr)
            for ctx in re.findall(r"(?<![.\w])([a-z]+)\.", expr):
                assert ctx in {"github", "secrets", "matrix", "steps", "needs", "env", "inputs", "runner", "vars"}, expr


@pytest.mark.skipif(not (ROOT / ".venv/bin/check-jsonschema").exists() and shutil.which("check-jsonschema") is None,
                    reason="check-jsonschema is not installed")  # fmt: skip
def test_the_linter_passes_these_workflows_and_fails_a_broken_one(tmp_path):
    ok = subprocess.run(["bash", str(LINT)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "pulumi-preview.yml" in ok.stdout and "pulumi-up.yml" in ok.stdout
    text = (WORKFLOWS / "pulumi-preview.yml").read_text()
    broken = {
        "runs-on-typo": text.replace("runs-on: [self-hosted", "run-on: [self-hosted"),
        "bad-trigger": text.replace("  pull_request:\n", "  pull_requests:\n"),
        "step-without-action": text.replace("      - uses: actions/checkout@v4\n", "      - name: nothing\n", 1),
        "bad-permission": text.replace("pull-requests: write", "pull-requests: admin"),
    }
    for label, bad_text in broken.items():
        assert bad_text != text, label
        bad = tmp_path / f"{label}.yml"
        bad.write_text(bad_text)
        run = subprocess.run(["bash", str(LINT), str(bad)], capture_output=True, text=True, timeout=120)
        assert run.returncode != 0, (label, run.stdout)
        assert "Schema validation errors" in run.stdout + run.stderr, label


def test_drift_repair_runs_on_a_timer_never_beside_an_up_and_never_applies_a_pending_change():
    wf = load("pulumi-drift.yml")
    assert "schedule" in wf["on"] and wf["on"]["schedule"][0]["cron"]
    assert wf["permissions"] == {"contents": "read"}
    job = wf["jobs"]["repair"]
    up = load("pulumi-up.yml")["jobs"]["up"]
    assert job["concurrency"]["group"] == up["concurrency"]["group"]  # one lock with `pulumi up`
    assert job["strategy"]["max-parallel"] == 1 and job["runs-on"] == up["runs-on"]
    assert job["strategy"]["matrix"]["stack"] == ["tp3", "tp4", "tp2", "tp4x2"]
    run = next(s["run"] for s in job["steps"] if "dspark repair" in s.get("run", ""))
    assert '--stack "$STACK" --yes --policy-pack policy' in run
    assert '[ "$code" -eq 4 ]' in run and "exit 0" in run  # a pending change: a warning, not an up
    for step in pulumi_steps(job):
        assert set(step["with"]) <= PULUMI_ACTION_INPUTS and "command" not in step["with"]  # install only
