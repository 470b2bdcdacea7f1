"""LiteLLM proxy hooks of the team gateway (mounted next to its config.yaml, imported through dspark_gateway.py).

- `user_api_key_auth` (general_settings.custom_auth): every request's key is looked up, by its sha256,
  in the gateway's PostgreSQL table `dspark_keys` (gateway_admin.py writes it), so a revoked key gets 401
  from the next request on. The master key (the admin's) passes as LiteLLM's proxy admin; a member's key
  passes as that member (LiteLLM's key alias and user), with the member's model list and rate limits
  for LiteLLM to enforce, and only on the OpenAI routes; a member past their token budget gets 429 (checked
  before each request against the usage table, so a request in flight may end past it). The metrics key
  may read /metrics only.
  No key, a wrong or a revoked key: 401. The database down: 503 (nothing is let through unchecked).
- `usage_logger` (litellm_settings.callbacks): one `dspark_usage` row per request that reached the model
  (success or failure, with its tokens), so usage survives a gateway restart.
- `dspark_gateway_*` Prometheus series on the proxy's /metrics, per member, from those rows (seeded from
  the database at the first scrape after a start, then counted as requests are logged); and per member with a
  budget, `dspark_gateway_budget_tokens` / `dspark_gateway_budget_used_tokens` {member, period}, read from the
  database at each scrape with the key check's own count (gateway_admin.BUDGETS).

LiteLLM (1.110) rules this follows: a rejection must be an HTTPException or a ProxyException (anything else
becomes a 401 "Authentication Error"; only a ProxyException keeps its headers),
and the hook is called on every request without a cache.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import threading
from datetime import datetime, timezone
from typing import Any

from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy._types import LitellmUserRoles, ProxyErrorTypes, ProxyException, UserAPIKeyAuth
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

import gateway_admin as admin

# What a member's key may call: the OpenAI-compatible routes (the admin's key may call every route).
MEMBER_ROUTES = frozenset(
    p + r for p in ("", "/v1") for r in ("/chat/completions", "/completions", "/models", "/embeddings")
)


class _Db:
    """One connection for the hook and the logger, opened on first use and again after a failure."""

    def __init__(self) -> None:
        self.conn: Any = None
        self.lock = asyncio.Lock()

    async def run(self, sql: str, params: tuple = (), fetch: bool = True):
        import psycopg

        async with self.lock:
            for attempt in (1, 2):
                try:
                    if self.conn is None or self.conn.closed:
                        self.conn = await psycopg.AsyncConnection.connect(
                            admin.db_url(admin.read_secrets()), autocommit=True
                        )
                    cur = await self.conn.execute(sql, params)
                    return await cur.fetchall() if fetch else None
                except psycopg.OperationalError:
                    self.conn = None  # reconnect once (the database restarted); then report it down
                    if attempt == 2:
                        raise


DB = _Db()


def _is(key: str, env: str) -> bool:
    """Whether `key` is the credential in `env` (the admin's or Prometheus's), in constant time."""
    want = os.environ.get(env, "")
    return bool(want) and hmac.compare_digest(key.encode(), want.encode())


async def user_api_key_auth(request: Any, api_key: str) -> UserAPIKeyAuth:
    import psycopg

    key = (api_key or "").removeprefix("Bearer ").strip()
    if not key:
        REJECTED.inc("missing")
        raise HTTPException(status_code=401, detail="missing API key: send Authorization: Bearer <your key>")
    if _is(key, "LITELLM_MASTER_KEY"):
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN, key_alias="admin", user_id="admin")
    if _is(key, "DSPARK_METRICS_KEY"):  # Prometheus: /metrics and nothing else
        if not request.url.path.startswith("/metrics"):
            REJECTED.inc("route")
            raise HTTPException(status_code=403, detail="the metrics key may read /metrics only")
        # LiteLLM lets only its proxy admin read /metrics; this key reaches no other route (above).
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN, key_alias="metrics", user_id="metrics")
    try:
        rows = await DB.run(admin.KEY_CHECK, (admin.key_hash(key),))
    except psycopg.Error:
        REJECTED.inc("database_down")
        raise HTTPException(status_code=503, detail="the gateway's key database is not reachable; retry shortly")
    if not rows:
        REJECTED.inc("invalid_or_revoked")
        raise HTTPException(status_code=401, detail="invalid or revoked API key")
    member, models, rpm, tpm, budget, period, used, resets = rows[0]
    if request.url.path not in MEMBER_ROUTES:
        REJECTED.inc("route")
        raise HTTPException(status_code=403,
                            detail=f"a member's key may call the OpenAI routes only, not {request.url.path}")
    if budget is not None and used >= budget:
        REJECTED.inc("token_budget")
        # a ProxyException keeps its headers (LiteLLM rebuilds an HTTPException without them)
        raise ProxyException(
            message=f"{member}'s token budget is used: {used} of {budget} tokens this {period}; "
                    f"it renews at {resets:%Y-%m-%d %H:%M} UTC",
            type=ProxyErrorTypes.budget_exceeded, param=None, code=429,
            headers={"Retry-After": str(max(1, int((resets - datetime.now(timezone.utc).replace(tzinfo=None)).total_seconds())))},
        )  # fmt: skip
    return UserAPIKeyAuth(
        api_key=key, key_alias=member, user_id=member, user_role=LitellmUserRoles.INTERNAL_USER,
        models=list(models or []), rpm_limit=rpm, tpm_limit=tpm,
    )


class _Rejected:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def inc(self, reason: str) -> None:
        with self.lock:
            self.counts[reason] = self.counts.get(reason, 0) + 1


REJECTED = _Rejected()


class _Usage:
    """Per-member totals: the database's at the first scrape after a start, plus the rows logged since."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seeded_to: int | None = None  # the last usage row id the seed counted
        self.totals: dict[str, list[int]] = {}  # member -> [requests, failures, prompt, completion]
        self.pending: list[tuple[int, str, bool, int, int]] = []  # rows logged before the seed

    def add(self, row_id: int, member: str, ok: bool, prompt: int, completion: int) -> None:
        with self.lock:
            if self.seeded_to is None:
                self.pending.append((row_id, member, ok, prompt, completion))
            elif row_id > self.seeded_to:
                self._count(member, ok, prompt, completion)

    def _count(self, member: str, ok: bool, prompt: int, completion: int) -> None:
        t = self.totals.setdefault(member, [0, 0, 0, 0])
        t[0] += 1
        t[1] += 0 if ok else 1
        t[2] += prompt
        t[3] += completion

    def seed(self) -> bool:
        """Read the totals from the database (sync: the exporter collects synchronously)."""
        import psycopg

        try:
            with psycopg.connect(admin.db_url(admin.read_secrets()), autocommit=True) as conn:
                rows = conn.execute(admin.USAGE_TOTALS).fetchall()
        except (psycopg.Error, OSError):
            return False
        with self.lock:
            if self.seeded_to is None:
                self.totals = {m: [r, f, p, c] for m, r, f, p, c, _ in rows}
                self.seeded_to = max((last for *_, last in rows), default=0)
                for row_id, member, ok, prompt, completion in self.pending:
                    if row_id > self.seeded_to:
                        self._count(member, ok, prompt, completion)
                self.pending = []
        return True


USAGE = _Usage()


class UsageCollector:
    """The `dspark_gateway_*` series on LiteLLM's /metrics (prometheus_client's default registry)."""

    def collect(self):
        up = USAGE.seeded_to is not None or USAGE.seed()
        yield GaugeMetricFamily("dspark_gateway_usage_db_up", "1 when the usage totals were read from the database",
                                value=1 if up else 0)  # fmt: skip
        req = CounterMetricFamily("dspark_gateway_requests", "requests that reached the model, per member and status",
                                  labels=["member", "status"])  # fmt: skip
        tok = CounterMetricFamily("dspark_gateway_tokens", "tokens per member", labels=["member", "kind"])
        with USAGE.lock:
            totals = {m: list(t) for m, t in USAGE.totals.items()}
        for member, (n, failed, prompt, completion) in sorted(totals.items()):
            req.add_metric([member, "success"], n - failed)
            req.add_metric([member, "failure"], failed)
            tok.add_metric([member, "prompt"], prompt)
            tok.add_metric([member, "completion"], completion)
        rej = CounterMetricFamily("dspark_gateway_rejected", "requests the key check refused, per reason",
                                  labels=["reason"])  # fmt: skip
        with REJECTED.lock:
            for reason, n in sorted(REJECTED.counts.items()):
                rej.add_metric([reason], n)
        yield from (req, tok, rej)
        yield from budget_families(admin.read_budgets() if up else [])


def budget_families(rows: list[tuple[str, str, int, int]]) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    """Per member with a budget: the budget and the tokens used this period, as the key check counts them (the key
    check refuses once used >= budget)."""
    budget = GaugeMetricFamily("dspark_gateway_budget_tokens", "a member's token budget per period (prompt + "
                               "completion tokens)", labels=["member", "period"])  # fmt: skip
    used = GaugeMetricFamily("dspark_gateway_budget_used_tokens", "tokens the member used in the current budget "
                             "period (UTC), as the key check counts them", labels=["member", "period"])  # fmt: skip
    for member, period, tokens, n in sorted(rows):
        budget.add_metric([member, period], tokens)
        used.add_metric([member, period], n)
    return budget, used


_COLLECTOR = UsageCollector()
REGISTRY.register(_COLLECTOR)


class UsageLogger(CustomLogger):
    """One usage row per request that reached the model (LiteLLM's standard logging payload)."""

    async def _log(self, kwargs: dict, ok: bool) -> None:
        payload = kwargs.get("standard_logging_object") or {}
        meta = payload.get("metadata") or {}
        member = meta.get("user_api_key_alias") or meta.get("user_api_key_user_id")
        if not member:  # refused before a member was known (no key, a wrong key): counted as rejected instead
            return
        prompt, completion = int(payload.get("prompt_tokens") or 0), int(payload.get("completion_tokens") or 0)
        latency = (payload.get("response_time") or 0) * 1000
        try:
            rows = await DB.run(
                "INSERT INTO dspark_usage (member, model, status, prompt_tokens, completion_tokens, latency_ms) "
                "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
                (member, payload.get("model_group") or payload.get("model"), "success" if ok else "failure",
                 prompt, completion, latency),
            )  # fmt: skip
        except Exception as exc:  # a logging failure must never fail the request
            print(f"dspark_gateway: usage row not written ({exc})", flush=True)
            return
        USAGE.add(rows[0][0], member, ok, prompt, completion)

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        await self._log(kwargs, True)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):
        await self._log(kwargs, False)


usage_logger = UsageLogger()
