"""HTTP against the endpoint (stdlib urllib): /health, a chat completion, a streamed one (SSE).

The key goes only into the Authorization header; error texts are built from status codes and
redacted response bodies, never from urllib's exception text (it can quote headers).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Optional

from programs import tunnel

from .nodes import Nodes, redact

Clock = Callable[[], float]


def get_status(url: str, timeout: float = 5.0) -> tuple[Optional[int], Optional[str]]:
    """(HTTP status, None) or (None, why it did not answer)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except urllib.error.URLError as exc:
        return None, f"{type(exc.reason).__name__}: {exc.reason}"
    except (OSError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def inner_status(nodes: Nodes, url: str, timeout: float = 5.0) -> tuple[Optional[int], Optional[str]]:
    """GET `url`, an inner port of the group's head (planning/exposure.py: the fence lets only the stack's own parts
    reach it), through ssh to the head, as an operator does: what get_status gives."""
    head, where = nodes[0], urllib.parse.urlsplit(url)
    forward = nodes.forward or tunnel.forward
    try:
        with forward(head.target, head.port, list(nodes.ssh_opts), where.hostname, where.port or 80) as port:
            return get_status(tunnel.local_url(url, port), timeout)
    except OSError as exc:
        return None, str(exc)


def group_status(nodes: Nodes, fronted: bool) -> Callable[[str, float], tuple[Optional[int], Optional[str]]]:
    """How to GET the group's own API: straight, or, behind the stack's router or gateway, through ssh to its head."""
    return (lambda url, timeout=5.0: inner_status(nodes, url, timeout)) if fronted else get_status


def _request(base_url: str, key: str, body: dict) -> urllib.request.Request:
    return urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}",
                 "Accept": "text/event-stream" if body.get("stream") else "application/json"},
        method="POST",
    )  # fmt: skip


def _body(model: str, prompt: str, max_tokens: int, stream: bool) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"thinking": False},
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _http_error(exc: urllib.error.HTTPError, key: str) -> str:
    try:
        text = exc.read().decode("utf-8", "replace")
    except OSError:
        text = ""
    hint = " (the endpoint refused the stack's API key)" if exc.code in (401, 403) else ""
    return f"HTTP {exc.code}{hint}: {redact(text.strip(), key)[:300]}"


def _failure(exc: BaseException, key: str) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return _http_error(exc, key)
    if isinstance(exc, urllib.error.URLError):
        return redact(f"cannot reach the endpoint: {exc.reason}", key)
    if isinstance(exc, ValueError):
        return f"{type(exc).__name__} (details withheld: they may contain the key)"
    return redact(f"{type(exc).__name__}: {exc}", key)


def _rates(tokens: Optional[int], total: float, ttft: Optional[float]) -> tuple[Optional[float], Optional[float]]:
    """(tokens/s over the whole request, tokens/s after the first token)."""
    if not tokens or total <= 0:
        return None, None
    overall = tokens / total
    decode = None
    if ttft is not None and tokens > 1 and total - ttft > 0:
        decode = (tokens - 1) / (total - ttft)
    return round(overall, 2), (round(decode, 2) if decode is not None else None)


def chat(base_url: str, key: str, model: str, prompt: str, timeout: float = 120.0, max_tokens: int = 64,
         clock: Clock = time.perf_counter) -> dict:  # fmt: skip
    """One chat completion: {ok, http_status, answer, total_s, completion_tokens, tokens_source,
    tokens_per_second, error}."""
    result: dict = {"ok": False, "http_status": None, "answer": None, "total_s": None, "completion_tokens": None,
                    "tokens_source": None, "tokens_per_second": None, "error": None}  # fmt: skip
    start = clock()
    try:
        with urllib.request.urlopen(_request(base_url, key, _body(model, prompt, max_tokens, False)),
                                    timeout=timeout) as resp:  # fmt: skip
            result["http_status"] = resp.status
            data = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        result["http_status"] = exc.code
        result["error"] = _http_error(exc, key)
        result["total_s"] = round(clock() - start, 3)
        return result
    except Exception as exc:  # noqa: BLE001 - reported, never raised to the operator as a traceback
        result["error"] = _failure(exc, key)
        result["total_s"] = round(clock() - start, 3)
        return result
    total = clock() - start
    result["total_s"] = round(total, 3)
    try:
        answer = data["choices"][0]["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        result["error"] = f"unexpected response: {redact(json.dumps(data)[:300], key)}"
        return result
    result["answer"] = redact(answer, key)
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    tokens = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else None
    result["completion_tokens"] = tokens
    result["tokens_source"] = "usage" if tokens is not None else None
    result["tokens_per_second"] = _rates(tokens, total, None)[0]
    result["ok"] = True
    return result


def sse_events(lines):
    """The JSON payloads of an SSE stream's `data:` lines, until `data: [DONE]`."""
    for raw in lines:
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        line = line.strip()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        if not payload:
            continue
        try:
            yield json.loads(payload)
        except ValueError:
            continue


def chat_stream(base_url: str, key: str, model: str, prompt: str, timeout: float = 120.0, max_tokens: int = 64,
                clock: Clock = time.perf_counter) -> dict:  # fmt: skip
    """One streamed chat completion: {ok, http_status, answer, ttft_s, total_s, chunks,
    completion_tokens, tokens_source ("usage" or "chunks"), tokens_per_second,
    decode_tokens_per_second, error}. Time to first token counts from sending the request to the
    first chunk that carries text (content or reasoning_content); the role-only chunk is not one."""
    result: dict = {"ok": False, "http_status": None, "answer": None, "ttft_s": None, "total_s": None, "chunks": 0,
                    "completion_tokens": None, "tokens_source": None, "tokens_per_second": None,
                    "decode_tokens_per_second": None, "error": None}  # fmt: skip
    start = clock()
    first: Optional[float] = None
    parts: list[str] = []
    usage_tokens: Optional[int] = None
    try:
        with urllib.request.urlopen(_request(base_url, key, _body(model, prompt, max_tokens, True)),
                                    timeout=timeout) as resp:  # fmt: skip
            result["http_status"] = resp.status
            for event in sse_events(resp):
                if not isinstance(event, dict):
                    continue
                usage = event.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    usage_tokens = usage["completion_tokens"]
                for choice in event.get("choices") or []:
                    delta = (choice or {}).get("delta") or {}
                    text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                    if text:
                        if first is None:
                            first = clock()
                        result["chunks"] += 1
                        parts.append(delta.get("content") or "")
    except urllib.error.HTTPError as exc:
        result["http_status"] = exc.code
        result["error"] = _http_error(exc, key)
        result["total_s"] = round(clock() - start, 3)
        return result
    except Exception as exc:  # noqa: BLE001
        result["error"] = _failure(exc, key)
        result["total_s"] = round(clock() - start, 3)
        return result
    total = clock() - start
    ttft = (first - start) if first is not None else None
    tokens = usage_tokens if usage_tokens is not None else (result["chunks"] or None)
    result.update(
        answer=redact("".join(parts), key),
        ttft_s=round(ttft, 3) if ttft is not None else None,
        total_s=round(total, 3),
        completion_tokens=tokens,
        tokens_source="usage" if usage_tokens is not None else ("chunks" if result["chunks"] else None),
    )
    result["tokens_per_second"], result["decode_tokens_per_second"] = _rates(tokens, total, ttft)
    if first is None:
        result["error"] = "the stream carried no text"
        return result
    result["ok"] = True
    return result
