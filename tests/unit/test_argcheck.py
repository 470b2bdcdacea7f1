"""programs/argcheck.py (the image's own parser check) and the command that runs it on a node.

The real engines' parsers are exercised by tests/conformance; here the parse entry points are the
sim's test doubles (built from the real option tables), so what is tested is argcheck's own logic:
the image checks, the messages, the exit codes, and the command line that carries the argv.
"""
from __future__ import annotations

import shlex
import sys
import types

import pytest

from declared.stack import parse_stack
from planning import commands, launch, plan
from programs import argcheck
from harness import cluster_of, with_known_hosts
from sim.testdouble import parsers


@pytest.fixture
def image(tmp_path, monkeypatch):
    """An 'image': the doubles at the engines' module paths, an adapter dir, a checkpoint with a draft."""
    for name, mod in (("sglang.srt.server_args", parsers), ("vllm.entrypoints.cli.serve", parsers),
                      ("vllm.utils.argparse_utils", parsers)):
        parts = name.split(".")
        for i in range(1, len(parts)):  # parent packages, as the image has them
            monkeypatch.setitem(sys.modules, ".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        monkeypatch.setitem(sys.modules, name, mod)
    (tmp_path / "adapter").mkdir()
    monkeypatch.setattr(argcheck, "ADAPTER_DIR", str(tmp_path / "adapter"))
    model = tmp_path / "model"
    (model / "dspark").mkdir(parents=True)
    return types.SimpleNamespace(root=tmp_path, model=model)


def _sglang_argv(model, *extra):
    cfg = parse_stack(with_known_hosts(cluster_of("tp4"))).groups[0].cfg
    [(engine, argv)] = plan.rank_checks(cfg, plan.group_specs(cfg, "tp4")[1])
    argv = [str(model) if a == launch.MODEL_MOUNT else a for a in argv]
    return engine, argv + list(extra)


def _run(capsys, *checks):
    args = ["--node", "spark2", "--rank", "1"]
    for engine, argv in checks:
        args += ["--check", engine, str(len(argv)), *argv]
    code = argcheck.main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_program_argv_passes(image, capsys):
    code, out, _ = _run(capsys, _sglang_argv(image.model))
    assert code == 0 and "node spark2 rank 1: sglang" in out and "accepts the argv" in out


def test_a_refused_flag_names_node_rank_flag_and_the_engines_message(image, capsys):
    code, out, err = _run(capsys, _sglang_argv(image.model, "--cuda-graph-max-bs", "8"))
    assert code == 3
    line = "deepseek-spark argcheck: node spark2 rank 1 (sglang): refused: --cuda-graph-max-bs: "
    assert line in out and "ambiguous option: --cuda-graph-max-bs could match" in out
    assert err.strip().splitlines()[-1].startswith(line)  # last on stderr too, where an error summary cuts
    assert len(err.splitlines()) <= 4  # the parser's last lines, not its whole usage


def test_dspark_without_draft_weights_is_refused(image, capsys):
    (image.model / "dspark").rmdir()
    code, out, _ = _run(capsys, _sglang_argv(image.model))
    assert code == 3 and "refused: --speculative-algorithm: DSPARK needs draft weights" in out
    (image.model / "config.json").write_text('{"dspark_config": {"block_size": 3}}')
    assert _run(capsys, _sglang_argv(image.model))[0] == 0  # bundled in the checkpoint's config


def test_dspark_draft_tokens_must_be_block_plus_one(image, capsys):
    code, out, _ = _run(capsys, _sglang_argv(image.model, "--speculative-num-draft-tokens", "3"))
    assert code == 3 and "block + 1 = 4" in out


def test_an_image_without_the_adapter_is_refused(image, capsys, monkeypatch):
    monkeypatch.setattr(argcheck, "ADAPTER_DIR", str(image.root / "missing"))
    code, out, _ = _run(capsys, _sglang_argv(image.model))
    assert code == 3 and "no DeepSeek-V4.1 adapter" in out


def test_the_ray_backend_needs_ray_in_the_image(image, capsys, monkeypatch):
    cfg = parse_stack(with_known_hosts(cluster_of("tp2"))).groups[0].cfg
    [_, (engine, argv)] = plan.rank_checks(cfg, plan.group_specs(cfg, "tp2")[0])
    assert engine == "vllm" and "--distributed-executor-backend" in argv
    real_find_spec = argcheck.importlib.util.find_spec
    monkeypatch.setattr(argcheck.importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real_find_spec(name, *a))
    code, out, _ = _run(capsys, (engine, argv))
    assert code == 3 and "Ray is not importable in the image" in out and "distributedExecutorBackend: mp" in out


def test_an_image_without_the_engine_says_so(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", None)  # import fails
    code, out, _ = _run(capsys, ("sglang", ["--model-path", "/m"]))
    assert code == 4 and "cannot run the sglang check" in out


def test_the_node_command_carries_the_exact_argv_and_env_quoted():
    cfg = parse_stack(with_known_hosts(cluster_of("tp2"))).groups[0].cfg
    spec = plan.group_specs(cfg, "tp2")[0]
    spec = type(spec)(**{**spec.__dict__, "env": {**spec.env, "X": "a b;$(touch /tmp/p)"}})
    checks = plan.rank_checks(cfg, spec)
    words = shlex.split(commands.argcheck(spec, checks, "tp2-checkpoint"))
    assert words[:7] == ["docker", "run", "--rm", "-i", "--network", "none", "--entrypoint"]
    assert "X=a b;$(touch /tmp/p)" in words and spec.image in words
    assert f"type=volume,source=tp2-checkpoint,target={launch.MODEL_MOUNT},readonly" in words
    tail = words[words.index("-"):]
    assert tail[:5] == ["-", "--node", spec.node, "--rank", "0"]
    i = 5
    for engine, argv in checks:  # ray's head argv, then vllm serve's, each counted
        assert tail[i:i + 3] == ["--check", engine, str(len(argv))] and tail[i + 3:i + 3 + len(argv)] == argv
        i += 3 + len(argv)
    assert i == len(tail)
