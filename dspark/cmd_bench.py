"""`bench`: throughput and time to first token against the stack's endpoint, measured by
llama-benchy (PyPI `llama-benchy==0.4.0`, the llama-bench style pp/tg tables DGX Spark owners
post), at each `--concurrency` level, next to the published figures for the stack's engine and
TP size (seed 000 / seed 004), which are the reference.

Offline by construction: llama-benchy's prompt corpus (normally downloaded from Project Gutenberg)
is `dspark/bench_assets/tom-sawyer-i-xvi.txt`, served to it from a one-file HTTP server on
127.0.0.1 for the length of the run; its tokenizer is `--tokenizer PATH` (the checkpoint's
`tokenizer.json`, copied from the head node: prompt sizes are then exact) or, by default, a
byte-level BPE trained on that corpus (cached under ~/.cache/deepseek-spark/bench/): prompt
token counts are then approximate. Decode token counts come from the server's `usage` either way.
The Hugging Face hub is never asked (HF_HUB_OFFLINE=1). The API key reaches llama-benchy through
an environment variable, never its command line; every line shown or saved is redacted.

Files written into `--out` (default `bench-<stack>-<UTC timestamp>/`):
    llama-benchy.json   its raw results (`--save-result ... --format json`)
    llama-benchy.log    its output (key redacted)
    bench.png           tokens/s and TTFT against concurrency, with the reference
    summary.json        what `--json` prints

Test-double stacks (model profile sim-test-double*) have no reference, and llama-benchy's
coherence check ("the capital of France?") and latency probe are skipped for them: the double
answers a fixed sentence at once, whatever max_tokens says.

Exit code 0 when the benchmark ran and the files were written; 1 when llama-benchy failed or
measured nothing (its last lines are shown); 3 when it cannot run (no outputs, llama-benchy or
matplotlib not installed: `pip install -r requirements-dev.txt`).

JSON shape (`--json`):

    {
      "stack": "tp4", "base_url": "http://10.0.0.1:8888/v1", "model": "deepseek-v4.1-flash",
      "engine": "sglang", "tp_size": 4, "test_double": false,
      "tool": {"name": "llama-benchy", "version": "0.4.0", "exit_code": 0, "timed_out": false,
               "command": ["<python>", "-c", "...", "--base-url", ...]},        # no key in it
      "settings": {"concurrency": [1, 2, 4, 8, 16], "pp": 4096, "tg": 256, "runs": 3, "extra_args": []},
      "tokenizer": {"path": "...", "approximate": true, "note": "..."},
      "corpus": {"path": ".../tom-sawyer-i-xvi.txt", "bytes": 198222, "sha256": "..."},
      "files": {"dir": "/abs/bench-tp4-...", "results": ".../llama-benchy.json", "log": ".../llama-benchy.log",
                "plot": ".../bench.png", "summary": ".../summary.json"},
      "results": [{"concurrency": 1, "test": "pp4096 tg256", "pp": 4096, "tg": 256, "depth": 0,
                   "phase": "standard", "decode_tok_s": 44.9, "decode_tok_s_per_stream": 44.9,
                   "peak_tok_s": 47.0, "prefill_tok_s": 3391.2, "ttft_ms": 1230.5, "ttfr_ms": 1229.9,
                   "reference": "45.4 tok/s, TTFT 212 ms"}],
      "reference": {"key": "sglang/tp4", "source": "seed 000", "setup": "...", "single_stream_tok_s": 45.4,
                    "aggregate_tok_s": {"1": 45.4, ..., "16": 134.2}, "per_stream_tok_s": {...},
                    "ttft_ms": {...}, "prefill_tok_s": 3800, "notes": [...]}
                   | {"key": null, "none": "no reference (test double)"},
      "error": null, "last_lines": [], "ok": true, "exit_code": 0
    }
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import threading
from collections import deque
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO

from . import clients
from .bench_reference import is_test_double, reference_at, reference_for, reference_row
from .nodes import redact
from .render import table, to_json
from .stack import DsparkError, Stack

TOOL = "llama-benchy"
TOOL_VERSION = "0.4.0"  # requirements-dev.txt pins it; its JSON report is what parse_results reads
NEEDED_MODULES = {"llama_benchy": "llama-benchy", "matplotlib": "matplotlib", "tokenizers": "tokenizers"}
INSTALL_HINT = "pip install -r requirements-dev.txt"

ASSETS = Path(__file__).resolve().parent / "bench_assets"
CORPUS = ASSETS / "tom-sawyer-i-xvi.txt"
CORPUS_NAME = "corpus.txt"
TOKENIZER_RECIPE = "bytelevel-bpe-8000-v1"  # part of the cache key: change it when the recipe changes
TOKENIZER_VOCAB = 8000
KEY_ENV = "DSPARK_BENCH_API_KEY"

RESULTS_FILE, LOG_FILE, PLOT_FILE, SUMMARY_FILE = "llama-benchy.json", "llama-benchy.log", "bench.png", "summary.json"
LAST_LINES = 20

# llama-benchy flags dspark sets itself (some have a dspark flag of their own).
MANAGED_FLAGS = {
    "--base-url": None, "--api-key": None, "--model": None, "--served-model-name": None, "--book-url": None,
    "--save-result": "--out", "--format": None, "--tokenizer": "--tokenizer", "--concurrency": "--concurrency",
    "--pp": "--pp", "--tg": "--tg", "--runs": "--runs",
}  # fmt: skip

# ------------------------------------------------------------------------------------------ inputs


def parse_concurrency(text: str) -> list[int]:
    """"1,2,4,8,16" -> [1, 2, 4, 8, 16] (argparse type; order kept, repeats dropped)."""
    import argparse

    levels: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part.isdigit() or int(part) < 1:
            raise argparse.ArgumentTypeError(f"comma-separated positive integers, e.g. 1,2,4,8,16 (got {text!r})")
        if int(part) not in levels:
            levels.append(int(part))
    return levels


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a positive integer (got {text!r})")
    return int(text)


def missing_modules() -> list[str]:
    """The PyPI names of what `bench` needs and this Python lacks."""
    return [dist for mod, dist in NEEDED_MODULES.items() if importlib.util.find_spec(mod) is None]


def tool_version() -> Optional[str]:
    try:
        return importlib.metadata.version(TOOL)
    except importlib.metadata.PackageNotFoundError:
        return None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "deepseek-spark" / "bench"


def default_tokenizer(corpus: Path = CORPUS, directory: Optional[Path] = None) -> Path:
    """A byte-level BPE trained on `corpus`, cached by the corpus's hash and the recipe: same
    inputs, same file. Prompts decode back to the corpus's own text (byte-level round trip)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import tokenizers

    data = corpus.read_bytes()
    digest = hashlib.sha256(data + f"|{TOKENIZER_RECIPE}|{tokenizers.__version__}".encode()).hexdigest()[:16]
    directory = directory or cache_dir()
    path = directory / f"tokenizer-{digest}.json"
    if path.is_file():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    tok.train_from_iterator([data.decode("utf-8")], trainer)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tok.save(str(tmp))
    os.replace(tmp, path)
    return path


def resolve_tokenizer(given: Optional[str]) -> dict:
    """{"path", "approximate", "note"}; raises DsparkError for a path that is not a tokenizer."""
    from tokenizers import Tokenizer

    if not given:
        path = default_tokenizer()
        return {"path": str(path), "approximate": True,
                "note": "token counts are approximate: prompts are sized with a BPE trained on the shipped "
                        "corpus, not the model's tokenizer (decode counts come from the server's usage); pass "
                        "--tokenizer <checkpointDir>/tokenizer.json, copied from the head node, for exact prompt "
                        "sizes"}  # fmt: skip
    p = Path(given).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise DsparkError(f"--tokenizer {given}: no such file (give a local tokenizer.json, e.g. the checkpoint's, "
                          "copied from the head node; the Hugging Face hub is not used)")  # fmt: skip
    try:
        Tokenizer.from_file(str(p))
    except Exception as exc:  # noqa: BLE001 - any parse error: not a tokenizers file
        raise DsparkError(f"--tokenizer {p}: not a `tokenizers` tokenizer.json ({type(exc).__name__}: {exc})") from None
    return {"path": str(p.resolve()), "approximate": False, "note": f"prompts sized with {p}"}


def check_extra_args(extra: str) -> list[str]:
    try:
        argv = shlex.split(extra or "")
    except ValueError as exc:
        raise DsparkError(f"--extra-args: {exc}") from None
    for a in argv:
        flag = a.split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            ours = MANAGED_FLAGS[flag]
            raise DsparkError(f"--extra-args: {flag} is set by dspark bench" + (f"; use its {ours}" if ours else ""))
    return argv


# ------------------------------------------------------------------------------------------ corpus server


class CorpusServer:
    """One file over HTTP on 127.0.0.1 (a free port), for llama-benchy's --book-url."""

    def __init__(self, data: bytes, name: str = CORPUS_NAME):
        body, path = data, "/" + name

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if self.path.split("?", 1)[0] != path:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "CorpusServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def benchy_corpus_cache(url: str) -> Path:
    """Where llama-benchy 0.4.0 caches a downloaded book (corpus.py: md5 of the URL)."""
    digest = hashlib.md5(url.encode(), usedforsecurity=False).hexdigest()
    return Path(os.path.expanduser("~")) / ".cache" / "llama-benchy" / f"{digest}.txt"


# ------------------------------------------------------------------------------------------ llama-benchy

# The key comes from the environment, so it is on no command line (ps, our output, the summary).
LAUNCHER = (
    "import os, sys; sys.argv[0] = 'llama-benchy'; "
    f"sys.argv += ['--api-key', os.environ.pop({KEY_ENV!r})]; "
    "from llama_benchy.__main__ import main; main()"
)


def benchy_command(*, base_url: str, model: str, tokenizer: str, book_url: str, concurrency: Sequence[int],
                   pp: int, tg: int, runs: int, result_path: str, test_double: bool,
                   extra: Sequence[str] = (), python: str = sys.executable) -> list[str]:  # fmt: skip
    cmd = [python, "-c", LAUNCHER,
           "--base-url", base_url, "--model", model, "--served-model-name", model,
           "--tokenizer", tokenizer, "--book-url", book_url,
           "--pp", str(pp), "--tg", str(tg), "--runs", str(runs),
           "--concurrency", *[str(c) for c in concurrency],
           "--save-result", result_path, "--format", "json",
           "--exit-on-first-fail"]  # fmt: skip
    if test_double:  # a fixed sentence, answered at once: no "Paris", nothing to subtract
        cmd += ["--skip-coherence", "--latency-mode", "none"]
    return cmd + list(extra)


def benchy_env(key: str) -> dict:
    env = dict(os.environ)
    env[KEY_ENV] = key
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    for name in ("NO_PROXY", "no_proxy"):  # the corpus server is local whatever proxy is set
        env[name] = ",".join(v for v in (env.get(name), "127.0.0.1,localhost") if v)
    return env


def run_benchy(cmd: list[str], env: dict, log_path: Path, key: str, err: TextIO,
               timeout: float) -> tuple[Optional[int], list[str], bool]:  # fmt: skip
    """Run llama-benchy, its output redacted into `log_path` and, live, onto `err`.
    Returns (exit code or None, its last lines, timed out)."""
    last: deque[str] = deque(maxlen=LAST_LINES)
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, errors="replace")  # fmt: skip
    with open(log_path, "w", encoding="utf-8") as log:

        def pump():
            assert proc.stdout is not None
            for line in proc.stdout:
                line = redact(line.rstrip("\n"), key)
                last.append(line)
                log.write(line + "\n")
                log.flush()
                err.write(f"  {TOOL}: {line}\n")
                err.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            proc.wait()
            raise
        reader.join(timeout=10)
    return proc.returncode, list(last), timed_out


def _mean(bench: dict, name: str) -> Optional[float]:
    metric = bench.get(name)
    value = metric.get("mean") if isinstance(metric, dict) else None
    return round(float(value), 2) if isinstance(value, (int, float)) else None


def parse_results(path: Path) -> list[dict]:
    """llama-benchy 0.4.0's JSON report -> one row per (concurrency, pp, tg, depth, phase)."""
    report = json.loads(path.read_text())
    if not isinstance(report, dict) or not isinstance(report.get("benchmarks"), list):
        raise ValueError(f"{path} has no `benchmarks` list")
    rows = []
    for b in report["benchmarks"]:
        phase = "context" if b.get("is_context_prefill_phase") else "standard"
        depth = int(b.get("context_size") or 0)
        test = f"pp{b.get('prompt_size')} tg{b.get('response_size')}" + (f" @ d{depth}" if depth else "")
        rows.append({
            "concurrency": int(b["concurrency"]), "test": test if phase == "standard" else f"ctx load @ d{depth}",
            "pp": b.get("prompt_size"), "tg": b.get("response_size"), "depth": depth, "phase": phase,
            "decode_tok_s": _mean(b, "tg_throughput"), "decode_tok_s_per_stream": _mean(b, "tg_req_throughput"),
            "peak_tok_s": _mean(b, "peak_throughput"), "prefill_tok_s": _mean(b, "pp_throughput"),
            "ttft_ms": _mean(b, "e2e_ttft"), "ttfr_ms": _mean(b, "ttfr"),
        })  # fmt: skip
    return rows


METRICS = ("decode_tok_s", "decode_tok_s_per_stream", "peak_tok_s", "prefill_tok_s", "ttft_ms")


# ------------------------------------------------------------------------------------------ plot


def _ref_points(values: dict) -> tuple[list[int], list[float], list[list[float]]]:
    xs, ys, errs = [], [], [[], []]
    for c in sorted(values):
        v = values[c]
        lo, hi = (v[0], v[1]) if isinstance(v, (list, tuple)) else (v, v)
        mid = (lo + hi) / 2
        xs.append(c)
        ys.append(mid)
        errs[0].append(mid - lo)
        errs[1].append(hi - mid)
    return xs, ys, errs


def plot(rows: list[dict], ref: dict, path: Path, title: str, subtitle: str) -> None:
    """Decode tokens/s (all streams and per stream) and TTFT against concurrency, with the reference."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    fig = Figure(figsize=(11, 4.6), dpi=100, layout="constrained")
    ax_tok, ax_ttft = fig.subplots(1, 2)
    series: dict[str, list[dict]] = {}
    for r in rows:
        if r["phase"] == "standard":
            series.setdefault(r["test"], []).append(r)
    levels: set[int] = set()
    for test, rs in series.items():
        rs = sorted(rs, key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in rs]
        levels.update(xs)
        for ax, key, label, style in ((ax_tok, "decode_tok_s", "measured, all streams", "o-"),
                                      (ax_tok, "decode_tok_s_per_stream", "measured, per stream", "s--"),
                                      (ax_ttft, "ttft_ms", "measured", "o-")):  # fmt: skip
            pts = [(x, r[key]) for x, r in zip(xs, rs) if r[key] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{label} ({test})")
    if not ref.get("none"):
        for ax, values, label in ((ax_tok, ref["aggregate_tok_s"], "all streams"),
                                  (ax_tok, ref["per_stream_tok_s"], "per stream"),
                                  (ax_ttft, ref["ttft_ms"], "TTFT")):  # fmt: skip
            if values:
                xs, ys, errs = _ref_points(values)
                levels.update(xs)
                ax.errorbar(xs, ys, yerr=errs, fmt="D:", mfc="none", capsize=4,
                            label=f"reference {ref['source']}: {label}")  # fmt: skip
    else:
        ax_tok.text(0.5, 0.04, ref["none"], transform=ax_tok.transAxes, ha="center", color="grey")
    for ax, ylabel, name in ((ax_tok, "tokens/s (decode)", "Throughput"),
                             (ax_ttft, "TTFT (ms)", "Time to first token")):  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sorted(levels) or [1]))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"{title}\n{subtitle}", fontsize=10)
    fig.savefig(path, format="png")


# ------------------------------------------------------------------------------------------ command


def _out_dir(given: Optional[str], stack: str) -> Path:
    if given:
        return Path(given)
    return Path(f"bench-{stack}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}")


def run(stack: Stack, as_json: bool, out: TextIO, err: TextIO, *, concurrency: Sequence[int] = (1, 2, 4, 8, 16),
        out_dir: Optional[str] = None, tokenizer: Optional[str] = None, pp: int = 4096, tg: int = 256,
        runs: int = 3, timeout: float = 3600.0, extra_args: str = "") -> int:  # fmt: skip
    missing = missing_modules()
    if missing:
        raise DsparkError(f"{', '.join(missing)} not installed in {sys.executable}: {INSTALL_HINT}")
    try:
        client = clients.operator_client(stack.outputs(), stack=stack.short)
    except clients.ClientConfigError as exc:
        raise DsparkError(str(exc)) from None
    key = client.api_key
    extra = check_extra_args(extra_args)
    tok = resolve_tokenizer(tokenizer)
    cfg = stack.cfg
    double = is_test_double(cfg)
    ref = reference_for(cfg)
    version = tool_version()
    if version != TOOL_VERSION:
        err.write(f"dspark bench: warning: {TOOL} {version} installed, written against {TOOL_VERSION} "
                  f"(requirements-dev.txt); its report format may differ\n")  # fmt: skip
    directory = _out_dir(out_dir, stack.short)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DsparkError(f"cannot create the output folder {directory}: {exc}") from None
    directory = directory.resolve()
    files = {"dir": str(directory), "results": str(directory / RESULTS_FILE), "log": str(directory / LOG_FILE),
             "plot": str(directory / PLOT_FILE), "summary": str(directory / SUMMARY_FILE)}  # fmt: skip
    results_path = Path(files["results"])
    results_path.unlink(missing_ok=True)  # a stale report must not pass for this run's
    corpus = CORPUS.read_bytes()
    doc: dict[str, Any] = {
        "stack": stack.short, "base_url": client.base_url, "model": client.model, "engine": cfg.engine,
        "tp_size": cfg.serving.tp_size, "test_double": double,
        "tool": {"name": TOOL, "version": version, "exit_code": None, "timed_out": False, "command": None},
        "settings": {"concurrency": list(concurrency), "pp": pp, "tg": tg, "runs": runs, "extra_args": extra},
        "tokenizer": tok,
        "corpus": {"path": str(CORPUS), "bytes": len(corpus), "sha256": hashlib.sha256(corpus).hexdigest()},
        "files": files, "results": [], "reference": ref, "error": None, "last_lines": [], "ok": False, "exit_code": 1,
    }  # fmt: skip

    with CorpusServer(corpus) as server:
        cache = benchy_corpus_cache(server.url)
        cached_before = cache.exists()
        cmd = benchy_command(base_url=client.base_url, model=client.model, tokenizer=tok["path"], book_url=server.url,
                             concurrency=concurrency, pp=pp, tg=tg, runs=runs, result_path=str(results_path),
                             test_double=double, extra=extra)  # fmt: skip
        doc["tool"]["command"] = [redact(a, key) for a in cmd]
        if not as_json:
            err.write(f"dspark bench: running {TOOL} {version} against {client.base_url} "
                      f"(concurrency {','.join(map(str, concurrency))}; log: {files['log']})\n")  # fmt: skip
        try:
            code, last, timed_out = run_benchy(cmd, benchy_env(key), Path(files["log"]), key, err, timeout)
        finally:
            if not cached_before:  # llama-benchy caches the book by URL; ours is on a one-off port
                cache.unlink(missing_ok=True)
    doc["tool"].update(exit_code=code, timed_out=timed_out)
    doc["last_lines"] = last

    if timed_out:
        doc["error"] = f"{TOOL} did not finish within {timeout:g} s (killed)"
    elif code != 0:
        doc["error"] = f"{TOOL} failed (exit {code})"
    else:
        try:
            doc["results"] = parse_results(results_path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            doc["error"] = f"{TOOL} exited 0 but its report is unreadable: {type(exc).__name__}: {exc}"
        else:
            if not any(r[m] is not None for r in doc["results"] for m in METRICS):
                doc["error"] = f"{TOOL} measured nothing (every request failed?)"
    for r in doc["results"]:
        r["reference"] = reference_at(ref, r["concurrency"])
    if doc["error"] is None:
        what = f"{TOOL} {version}, pp {pp}, tg {tg}, {runs} run(s) per level" + (
            "; TEST DOUBLE: not a model's figures" if double else "")  # fmt: skip
        title = f"{stack.short}: {client.model} ({cfg.engine} TP{cfg.serving.tp_size})"
        plot(doc["results"], ref, Path(files["plot"]), title,
             what + ("; prompt tokens approximate" if tok["approximate"] else ""))
        doc["ok"], doc["exit_code"] = True, 0
    else:  # no plot; llama-benchy may still have saved partial results
        files["plot"] = None
        files["results"] = files["results"] if results_path.is_file() else None
    Path(directory / SUMMARY_FILE).write_text(redact(to_json(doc), key) + "\n")
    text = to_json(doc) + "\n" if as_json else render_text(doc)
    out.write(redact(text, key))
    return doc["exit_code"]


def render_text(doc: dict) -> str:
    s, ref = doc["settings"], doc["reference"]
    kind = f"{doc['engine']} TP{doc['tp_size']}" + (", TEST DOUBLE" if doc["test_double"] else "")
    lines = [
        f"bench: {doc['stack']} ({kind}) at {doc['base_url']}, model {doc['model']}",
        f"{doc['tool']['name']} {doc['tool']['version']}: pp {s['pp']}, tg {s['tg']}, {s['runs']} run(s) per level, "
        f"concurrency {','.join(map(str, s['concurrency']))}"
        + (f", extra {' '.join(s['extra_args'])}" if s["extra_args"] else ""),
        f"tokenizer: {doc['tokenizer']['note']}",
        "",
    ]  # fmt: skip

    def num(v: Optional[float], digits: int = 1) -> str:
        return "-" if v is None else f"{v:,.{digits}f}"

    if doc["results"]:
        rows = [[r["concurrency"], r["test"], num(r["decode_tok_s"]), num(r["decode_tok_s_per_stream"]),
                 num(r["peak_tok_s"]), num(r["prefill_tok_s"], 0), num(r["ttft_ms"]), r["reference"]]
                for r in doc["results"]]  # fmt: skip
        rows.append(reference_row(ref))
        lines.append(table(["CONC", "TEST", "DECODE tok/s", "PER STREAM tok/s", "PEAK tok/s", "PREFILL tok/s",
                            "TTFT ms", "REFERENCE"], rows))  # fmt: skip
        lines.append("(DECODE: all streams together; TTFT: request sent to first token, as the client sees it)")
    if ref.get("none"):
        lines.append(f"reference: {ref['none']}")
    else:
        lines.append(f"reference: {ref['source']} ({ref['setup']}); published figures, not measured here")
        lines.extend(f"  {n}" for n in ref.get("notes") or [])
    if doc["error"]:
        lines.append(f"error: {doc['error']}")
        if doc["last_lines"]:
            lines.append(f"{doc['tool']['name']}'s last lines:")
            lines.extend(f"  {line}" for line in doc["last_lines"])
        lines.append(f"log: {doc['files']['log']}")
    else:
        f = doc["files"]
        lines.append(f"files: {f['dir']}/ ({RESULTS_FILE}, {LOG_FILE}, {PLOT_FILE}, {SUMMARY_FILE})")
    lines.append(f"verdict: {'OK' if doc['ok'] else 'FAILED'} (exit {doc['exit_code']})")
    return "\n".join(lines) + "\n"
