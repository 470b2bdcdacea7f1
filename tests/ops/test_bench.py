"""`dspark bench`: llama-benchy, for real, against the sglang-sim test double run as a local process
on 127.0.0.1 (no docker, no simulated cluster); the reference figures; the exit codes. Traffic goes
to loopback only: the endpoint (the outputs file says 127.0.0.1) and dspark's own corpus server."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import harness
from declared.cluster import parse_cluster
from dspark import cmd_bench
from dspark.__main__ import main
from ops_fakes import KEY, ROOT, outputs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODEL = "deepseek-v4.1-flash"


def run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Double:
    """The sglang-sim TEST DOUBLE's API (sim/testdouble/server.py), one rank, on 127.0.0.1."""

    def __init__(self, log: Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Double":
        cmd = [sys.executable, "-m", "sim.testdouble.launch_server", "--model-path", "/tmp/dspark-bench-fake",
               "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(self.port), "--api-key", KEY,
               "--nnodes", "1", "--node-rank", "0", "--tp", "3"]  # fmt: skip
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise AssertionError(f"the test double did not answer /health: {self.log.read_text()}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def double(tmp_path_factory):
    with Double(tmp_path_factory.mktemp("double") / "double.log") as d:
        yield d


def benchy_cache() -> set[str]:
    d = Path(os.path.expanduser("~")) / ".cache" / "llama-benchy"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def table_rows(out: str) -> dict[str, str]:
    """The bench table's rows by their first cell (a concurrency level, or "ref")."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("CONC "))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip() or line.startswith("("):
            break
        rows[line.split()[0]] = line
    return rows


# ------------------------------------------------------------------------------------------ for real


def test_bench_runs_llama_benchy_against_the_test_double(tmp_path, double):
    outs = outputs(tmp_path / "o.json", double.base_url, None, key=KEY, model=MODEL)
    before = benchy_cache()
    out_dir = tmp_path / "bench-out"
    start = time.monotonic()
    code, out, err = run(["bench", "--stack", "sim", "--project-dir", str(ROOT), "--outputs-file", outs,
                          "--concurrency", "1,2", "--out", str(out_dir)])  # fmt: skip
    elapsed = time.monotonic() - start
    print(out)
    print(f"bench took {elapsed:.1f} s")
    assert code == 0, out + err

    # llama-benchy's raw report: one entry per concurrency level, with figures in it
    report = json.loads((out_dir / "llama-benchy.json").read_text())
    assert report["version"] == "0.4.0" and report["model"] == MODEL
    assert [b["concurrency"] for b in report["benchmarks"]] == [1, 2]
    # TTFT and prefill always; decode rates only when the double's chunks arrived in more than one read
    # (it writes its whole answer at once, so llama-benchy may see no decode time: "-" in the table)
    assert all(b["e2e_ttft"]["mean"] > 0 and b["pp_throughput"]["mean"] > 0 for b in report["benchmarks"])
    assert "Warmup" in (out_dir / "llama-benchy.log").read_text()

    png = (out_dir / "bench.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 10_000

    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["ok"] and [r["concurrency"] for r in summary["results"]] == [1, 2]

    # the table: a row per level, each marked as having no reference, then the reference row
    rows = table_rows(out)
    assert set(rows) == {"1", "2", "ref"}
    for level in ("1", "2", "ref"):
        assert rows[level].rstrip().endswith("no reference (test double)"), rows[level]
    assert "TEST DOUBLE" in out and "approximate" in out and "verdict: OK (exit 0)" in out

    # the key is nowhere: not printed, not saved, not on llama-benchy's command line
    for text in (out, err, *(p.read_text() for p in out_dir.iterdir() if p.suffix in (".json", ".log"))):
        assert KEY not in text
    assert KEY not in " ".join(summary["tool"]["command"])
    # llama-benchy's corpus cache is left as it was (dspark's corpus URL is a one-off port)
    assert benchy_cache() == before
    assert elapsed < 60


def test_bench_json_summary(tmp_path, double):
    outs = outputs(tmp_path / "o.json", double.base_url, None, key=KEY, model=MODEL)
    code, out, _ = run(["bench", "--stack", "sim", "--project-dir", str(ROOT), "--outputs-file", outs,
                        "--concurrency", "2", "--out", str(tmp_path / "b"), "--pp", "128", "--tg", "8", "--runs", "1",
                        "--json"])  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert doc["ok"] and doc["exit_code"] == 0 and doc["test_double"] is True
    assert doc["reference"] == {"key": None, "none": "no reference (test double)"}
    assert [(r["concurrency"], r["test"], r["reference"]) for r in doc["results"]] == [
        (2, "pp128 tg8", "no reference (test double)")]
    assert doc["results"][0]["ttft_ms"] > 0
    for name in ("results", "log", "plot", "summary"):
        assert Path(doc["files"][name]).is_file(), name
    assert doc["tokenizer"]["approximate"] is True
    assert "--skip-coherence" in doc["tool"]["command"] and KEY not in out


def test_bench_exit_1_when_llama_benchy_fails_shows_its_last_lines(tmp_path, double):
    wrong = "sk-wrong-key-0123456789abcdef"
    outs = outputs(tmp_path / "o.json", double.base_url, None, key=wrong, model=MODEL)
    code, out, err = run(["bench", "--stack", "sim", "--project-dir", str(ROOT), "--outputs-file", outs,
                          "--concurrency", "1", "--out", str(tmp_path / "b")])  # fmt: skip
    assert code == 1
    assert "llama-benchy failed (exit 1)" in out and "HTTP 401" in out and "verdict: FAILED (exit 1)" in out
    assert wrong not in out + err
    assert not (tmp_path / "b" / "bench.png").exists()


# ------------------------------------------------------------------------------------------ cannot run


def test_bench_exit_3_without_outputs_or_without_llama_benchy(tmp_path, monkeypatch):
    code, _, err = run(["bench", "--stack", "tp4", "--project-dir", str(ROOT),
                        "--outputs-file", str(tmp_path / "absent.json")])  # fmt: skip
    assert code == 3 and "stack outputs unavailable" in err
    monkeypatch.setattr(cmd_bench, "NEEDED_MODULES", {"llama_benchy_not_here": "llama-benchy"})
    outs = outputs(tmp_path / "o.json", "http://127.0.0.1:9/v1", None)
    code, _, err = run(["bench", "--stack", "tp4", "--project-dir", str(ROOT), "--outputs-file", outs])
    assert code == 3 and "llama-benchy not installed" in err and "pip install -r requirements-dev.txt" in err


def test_bench_exit_3_on_bad_arguments(tmp_path):
    outs = outputs(tmp_path / "o.json", "http://127.0.0.1:9/v1", None)
    base = ["bench", "--stack", "tp4", "--project-dir", str(ROOT), "--outputs-file", outs]
    assert run(base + ["--concurrency", "1,zero"])[0] == 3
    assert run(base + ["--concurrency", "0"])[0] == 3
    code, _, err = run(base + ["--tokenizer", str(tmp_path / "no-tokenizer.json")])
    assert code == 3 and "no such file" in err
    (tmp_path / "bad.json").write_text("{}")
    code, _, err = run(base + ["--tokenizer", str(tmp_path / "bad.json")])
    assert code == 3 and "not a `tokenizers` tokenizer.json" in err
    code, _, err = run(base + ["--extra-args=--api-key other"])
    assert code == 3 and "--api-key is set by dspark bench" in err


# ------------------------------------------------------------------------------------------ reference


def ref_of(stack: str) -> dict:
    return cmd_bench.reference_for(parse_cluster(harness.group_of(stack)))


def test_tp4_reference_row_shows_45_4_134_2_and_3_8k():
    ref = ref_of("tp4")
    assert ref["key"] == "sglang/tp4" and ref["source"] == "seed 000"
    rows = [{"concurrency": c, "test": "pp4096 tg256", "pp": 4096, "tg": 256, "depth": 0, "phase": "standard",
             "decode_tok_s": 40.0 * c, "decode_tok_s_per_stream": 40.0, "peak_tok_s": None, "prefill_tok_s": 3400.0,
             "ttft_ms": 250.0, "ttfr_ms": None, "reference": cmd_bench.reference_at(ref, c)}
            for c in (1, 3, 16)]  # fmt: skip
    # a rendering only: nothing is sent to the address in base_url
    doc = {"stack": "tp4", "engine": "sglang", "tp_size": 4, "test_double": False,
           "base_url": "http://10.0.0.1:8888/v1", "model": MODEL, "tool": {"name": "llama-benchy", "version": "0.4.0"},
           "settings": {"pp": 4096, "tg": 256, "runs": 3, "concurrency": [1, 3, 16], "extra_args": []},
           "tokenizer": {"note": "prompts sized with tokenizer.json"}, "results": rows, "reference": ref,
           "error": None, "files": {"dir": "/tmp/x"}, "ok": True, "exit_code": 0}  # fmt: skip
    table = table_rows(cmd_bench.render_text(doc))
    ref_row = table["ref"]
    assert "45.4" in ref_row and "134.2" in ref_row and "3.8k" in ref_row and "seed 000" in ref_row
    assert "reference" in ref_row
    assert "45.4 tok/s" in table["1"] and "TTFT 212 ms" in table["1"]
    assert "134.2 tok/s (22.0/stream), TTFT 12.45 s" in table["16"]
    assert table["3"].rstrip().endswith("-")  # no published figure at 3 streams


def test_references_by_engine_and_tp_size():
    assert ref_of("tp3")["single_stream_tok_s"] == 37.9 and ref_of("tp3")["source"] == "seed 000"
    tp2 = ref_of("tp2")
    assert tp2["key"] == "vllm/tp2" and tp2["source"] == "seed 004" and tp2["single_stream_tok_s"] == [38, 73]
    assert cmd_bench.reference_row(tp2)[3] == "38-73 @1"
    for stack in ("sim", "sim-tp2"):  # same engine and TP as tp3 / tp2, but a test double
        assert ref_of(stack) == {"key": None, "none": "no reference (test double)"}
    tp3 = harness.cluster_of("tp3")
    other = parse_cluster(dict(tp3, serving=dict(tp3["serving"], tpSize=2, epSize=2)))
    assert cmd_bench.reference_for(other)["none"] == "no reference for sglang TP2"


def test_default_tokenizer_is_deterministic_and_cached(tmp_path):
    a = cmd_bench.default_tokenizer(directory=tmp_path / "a")
    b = cmd_bench.default_tokenizer(directory=tmp_path / "b")
    assert a.name == b.name and a.read_bytes() == b.read_bytes()
    assert cmd_bench.default_tokenizer(directory=tmp_path / "a") == a  # the cached file
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(a))
    text = cmd_bench.CORPUS.read_text()[:2000]
    assert tok.decode(tok.encode(text).ids) == text  # prompts are the corpus's own text


def test_key_is_not_on_llama_benchys_command_line():
    cmd = cmd_bench.benchy_command(base_url="http://127.0.0.1:1/v1", model=MODEL, tokenizer="/t.json",
                                   book_url="http://127.0.0.1:2/corpus.txt", concurrency=[1, 2], pp=64, tg=8, runs=1,
                                   result_path="/r.json", test_double=False)  # fmt: skip
    assert KEY not in " ".join(cmd) and "--skip-coherence" not in cmd
    env = cmd_bench.benchy_env(KEY)
    assert env[cmd_bench.KEY_ENV] == KEY and env["HF_HUB_OFFLINE"] == "1" and "127.0.0.1" in env["NO_PROXY"]
    assert cmd_bench.CORPUS.stat().st_size < 300_000
