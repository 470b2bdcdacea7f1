"""`smoke`: one chat completion and one streamed chat completion against the stack's endpoint with
the stack's key (from `client_config`, else `endpoint`/`model`/`api_key`), with the readiness
prompt; reports the answers, time to first token, tokens per second and total time. The key is
never printed.

Exit code 0 when both requests answered and both answers contain `readiness.expect`, else 1.

JSON shape (`--json`):

    {
      "stack": "tp3", "base_url": "http://10.0.0.1:8888/v1", "model": "deepseek-v4.1-flash",
      "prompt": "What is 19 + 23?", "expect": "42",
      "chat":   {"ok": true, "http_status": 200, "answer": "42", "total_s": 0.41, "completion_tokens": 1,
                 "tokens_source": "usage" | null, "tokens_per_second": 2.4, "error": null, "expected": true},
      "stream": {"ok": true, "http_status": 200, "answer": "42", "ttft_s": 0.12, "total_s": 0.30, "chunks": 1,
                 "completion_tokens": 1, "tokens_source": "usage" | "chunks", "tokens_per_second": 3.3,
                 "decode_tokens_per_second": null, "error": null, "expected": true},
      "ok": true, "exit_code": 0
    }
"""

from __future__ import annotations

from typing import TextIO

from dspark import clients

from . import api
from .nodes import redact
from .render import cell, table, to_json
from .stack import DsparkError, Stack


def run(stack: Stack, as_json: bool, out: TextIO, timeout: float = 120.0, max_tokens: int = 64) -> int:
    try:
        client = clients.operator_client(stack.outputs(), stack=stack.short)
    except clients.ClientConfigError as exc:
        raise DsparkError(str(exc)) from None
    key = client.api_key
    prompt, expect = stack.cfg.readiness.prompt, stack.cfg.readiness.expect
    plain = api.chat(client.base_url, key, client.model, prompt, timeout, max_tokens)
    streamed = api.chat_stream(client.base_url, key, client.model, prompt, timeout, max_tokens)
    for r in (plain, streamed):
        r["expected"] = bool(r["ok"] and expect in (r["answer"] or ""))
    ok = plain["expected"] and streamed["expected"]
    doc = {
        "stack": stack.short, "base_url": client.base_url, "model": client.model, "prompt": prompt, "expect": expect,
        "chat": plain, "stream": streamed, "ok": ok, "exit_code": 0 if ok else 1,
    }  # fmt: skip
    text = to_json(doc) + "\n" if as_json else render_text(doc)
    out.write(redact(text, key))
    return doc["exit_code"]


def render_text(doc: dict) -> str:
    lines = [f"smoke: {doc['base_url']} model {doc['model']}, prompt {doc['prompt']!r} (expect {doc['expect']!r})", ""]
    rows = []
    for name, r in (("chat", doc["chat"]), ("stream", doc["stream"])):
        rows.append([
            name, r["http_status"], repr(r["answer"]) if r["answer"] is not None else None,
            f"{r['ttft_s']:.3f}" if r.get("ttft_s") is not None else None,
            f"{r['total_s']:.3f}" if r["total_s"] is not None else None,
            r["completion_tokens"], r["tokens_source"], r["tokens_per_second"],
            "yes" if r["expected"] else "NO",
        ])  # fmt: skip
    lines.append(table(["REQUEST", "HTTP", "ANSWER", "TTFT s", "TOTAL s", "TOKENS", "FROM", "TOKENS/s", "EXPECTED"],
                       rows))  # fmt: skip
    for name, r in (("chat", doc["chat"]), ("stream", doc["stream"])):
        if r["error"]:
            lines.append(f"{name}: {r['error']}")
    d = doc["stream"].get("decode_tokens_per_second")
    if d is not None:
        lines.append(f"stream decode rate after the first token: {cell(d)} tokens/s")
    lines.append(f"verdict: {'OK' if doc['ok'] else 'FAILED'} (exit {doc['exit_code']})")
    return "\n".join(lines) + "\n"
