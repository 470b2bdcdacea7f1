"""Every rank's generated argv of every stack, parsed by the REAL engines' own parsers (PyPI sglang,
vllm at the tp2 image's release and the newest, ray, sglang-router), and the program's flag and env
tables checked against the real packages. Each environment runs once (one process: importing an
engine takes seconds) with every check this module asks of it; the tests read its reply."""
from __future__ import annotations

import json
import re
from functools import lru_cache

import pytest

from declared import flags
from declared.stack import parse_stack
from declared.stackfiles import project_stacks
from planning import launch, plan, stackplan
from conformance.realenv import run_env, site_packages
from harness import cluster_of, with_known_hosts

STACKS = project_stacks()
ENV_OF = {"sglang": ["sglang-0.5.23"], "vllm": ["vllm-0.31.0", "vllm-0.33.0"], "ray": ["ray-router"],
          "router": ["ray-router"]}
TABLE_ENV = {("sglang", "0.5.23"): "sglang-0.5.23", ("vllm", "0.31.0"): "vllm-0.31.0",
             ("vllm", "0.33.0"): "vllm-0.33.0"}


def stack_checks(stack: str) -> list[tuple[str, str, list[str]]]:
    """(what, program, argv) for every rank of every group, and the router."""
    sc = parse_stack(with_known_hosts(cluster_of(stack)))
    cp = stackplan.build_stack(sc, stack)
    out = []
    for entry, gp in zip(sc.groups, cp.groups):
        for spec in gp.group.specs:
            for program, argv in plan.rank_checks(entry.cfg, spec):
                if program == "sglang" and spec.rank == 0:  # what the head's wrapper appends from the key file
                    argv = [*argv, "--api-key", "conformance-placeholder"]
                out.append((f"{stack} {gp.group_name} rank {spec.rank}", program, argv))
    if cp.router is not None:
        out.append((f"{stack} router", "router", list(cp.router.spec.args)))
    return out


ALL = [c for stack in STACKS for c in stack_checks(stack)]
TP4_RANK1 = next(argv for what, p, argv in ALL if what == "tp4 tp4 rank 1")
TP2_SERVE = next(argv for _, p, argv in stack_checks("tp2") if p == "vllm")
OLD_TP4 = [a if a != "--cuda-graph-max-bs-decode" else "--cuda-graph-max-bs" for a in TP4_RANK1]
REFUSALS = [(["--no-such-flag"], "--no-such-flag"), (["--attention-backend", "no-such-backend"], "--attention-backend"),
            (["--mem-fraction-static", "lots"], "--mem-fraction-static")]


def mp_checks() -> list[tuple[str, list[str]]]:
    raw = with_known_hosts(cluster_of("tp2"))
    raw["serving"] = {**raw["serving"], "distributedExecutorBackend": "mp"}
    cfg = parse_stack(raw).groups[0].cfg
    return [c for spec in plan.group_specs(cfg, "tp2") for c in plan.rank_checks(cfg, spec)]


def wanted(env: str) -> list[tuple[str, list[str]]]:
    """Every check this module asks of `env`."""
    out = [(p, argv) for _, p, argv in ALL if env in ENV_OF[p]]
    if env == "sglang-0.5.23":
        out += [("sglang", OLD_TP4)] + [("sglang", TP4_RANK1 + bad) for bad, _ in REFUSALS]
    if env.startswith("vllm-"):
        out += [("vllm", TP2_SERVE + ["--ray-address", "auto"])] + mp_checks()
    return out


@lru_cache(maxsize=None)
def reply(env: str) -> dict:
    engine_version = next(((e, v) for (e, v), name in TABLE_ENV.items() if name == env), None)
    checks = wanted(env)
    got = run_env(env, checks, dump=engine_version[0] if engine_version else None,
                  env_names=env in ("sglang-0.5.23", "vllm-0.33.0"))
    got["by_check"] = {json.dumps(c): r for c, r in zip(checks, got["results"])}
    return got


def result(env: str, program: str, argv: list[str]) -> dict:
    return reply(env)["by_check"][json.dumps((program, argv))]


def test_every_stack_is_covered():
    assert {"tp2", "tp3", "tp4", "tp4x2", "sim", "sim-tp2", "sim-x2"} <= set(STACKS)


@pytest.mark.parametrize("program", sorted(ENV_OF))
def test_every_rank_argv_of_every_stack_is_accepted(program):
    checks = [(what, argv) for what, p, argv in ALL if p == program]
    assert checks, program
    for env in ENV_OF[program]:
        refused = [f"{what}: {r['flag']}: {r['message']}" for what, argv in checks
                   if not (r := result(env, program, argv))["ok"]]
        assert not refused, f"{env} refuses:\\n" + "\\n".join(refused)


def test_real_sglang_refuses_what_the_old_command_line_had():
    """The fatal bug this tier exists for: 0.5.20+ finds --cuda-graph-max-bs ambiguous."""
    assert OLD_TP4 != TP4_RANK1
    r = result("sglang-0.5.23", "sglang", OLD_TP4)
    assert not r["ok"]
    assert r["flag"] == "--cuda-graph-max-bs" and "ambiguous option" in r["message"], r


@pytest.mark.parametrize("bad, flag", REFUSALS)
def test_real_sglang_refusals_name_the_flag(bad, flag):
    r = result("sglang-0.5.23", "sglang", TP4_RANK1 + bad)
    assert not r["ok"] and r["flag"] == flag, r


def test_real_vllm_refuses_the_seeds_ray_address():
    for env in ENV_OF["vllm"]:
        r = result(env, "vllm", TP2_SERVE + ["--ray-address", "auto"])
        assert not r["ok"] and r["flag"] == "--ray-address", (env, r)


def test_vllm_mp_backend_argv_is_accepted():
    checks = mp_checks()
    assert [p for p, _ in checks] == ["vllm", "vllm"] and "--headless" in checks[1][1]
    for env in ENV_OF["vllm"]:
        results = [result(env, p, argv) for p, argv in checks]
        assert all(r["ok"] for r in results), (env, results)


@pytest.mark.parametrize("engine, version", sorted(TABLE_ENV))
def test_committed_option_tables_match_the_real_parsers(engine, version):
    """declared/options (which the sim's engine double and the preview rule read) is the real parser."""
    real = reply(TABLE_ENV[engine, version])["dump"]
    committed = flags.load_options(engine, version)
    assert real["allow_abbrev"] is True
    assert real == committed, (
        f"declared/options/{engine}-{version}.json is stale: regenerate it with "
        f"programs/argcheck.py --dump-options {engine} in {TABLE_ENV[engine, version]}")


def test_program_env_names_are_the_packages_own():
    """The SGLANG_*/VLLM_* names the program sets exist in the packages' env tables; DSV41_* are read
    only by the image's DeepSeek-V4.1 adapter (listed so), NCCL_* by the NCCL library the engines ship."""
    names = {**reply("sglang-0.5.23")["env_names"], **reply("vllm-0.33.0")["env_names"]}
    set_by_program: set[str] = set()
    for stack in STACKS:
        sc = parse_stack(with_known_hosts(cluster_of(stack)))
        for entry in sc.groups:
            for spec in plan.group_specs(entry.cfg, stack):
                set_by_program |= set(spec.env)
    unknown = []
    for name in sorted(set_by_program):
        if name.startswith("SGLANG_") and name not in names["sglang"] and name not in launch.ADAPTER_ENV:
            unknown.append(name)
        if name.startswith("VLLM_") and name not in names["vllm"]:
            unknown.append(name)
    assert not unknown, f"not in the packages' env tables: {unknown}"
    nccl = _nccl_env_names()
    missing = sorted(n for n in set_by_program if n.startswith("NCCL_") and n not in nccl)
    assert not missing, f"the NCCL library the engines ship does not read: {missing}"
    assert "NCCL_SKIP_TREE_CONNECT" not in nccl  # the ring setting the program used to set
    # the compile-cache directories: read by Triton (triton/knobs.py) and torch inductor (cache_dir_utils.py)
    caches = sorted(n for n in set_by_program if n.startswith(("TRITON_", "TORCHINDUCTOR_")))
    assert caches == ["TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"]
    site = site_packages("sglang-0.5.23")
    for name, where in (("TRITON_CACHE_DIR", site / "triton"), ("TORCHINDUCTOR_CACHE_DIR", site / "torch" / "_inductor")):
        assert any(name in f.read_text(errors="replace") for f in where.rglob("*.py")), f"{where} does not read {name}"


def _nccl_env_names() -> set[str]:
    libs = list((site_packages("sglang-0.5.23") / "nvidia").glob("nccl*/lib/libnccl.so*"))
    assert libs, "no libnccl in the sglang environment"
    data = libs[0].read_bytes()
    return {m.decode() for m in re.findall(rb"NCCL_[A-Z0-9_]{2,}", data)}
