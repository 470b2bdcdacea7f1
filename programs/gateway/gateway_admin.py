"""The team gateway's key and usage records (runs inside the gateway container, its python3 and psycopg).

The program registers each member's key with `add` (the key on stdin, never in argv), which prints the
key's sha256, and revokes the member's keys with `revoke --member` (the delete step: it cannot read the
add step's output, since pulumi-command hands it over as an environment variable that sshd drops). The
LiteLLM hook (dspark_gateway.py) reads the same table on every request, so a revocation holds from the
next request on, without a restart. Usage rows are never deleted: they outlive the keys.

    python3 gateway_admin.py add --member alice [--models m1,m2] [--rpm 60] [--tpm 100000] \
        [--token-budget 5000000 --budget-period month] < key
    python3 gateway_admin.py revoke --member alice    # or --hash <sha256>: one key
    python3 gateway_admin.py usage            # JSON: per member requests, failures, tokens
    python3 gateway_admin.py keys             # JSON: members and whether their key is active
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time

SECRETS = os.environ.get("DSPARK_GATEWAY_SECRETS", "/run/dspark-gateway/secrets.env")
KEY = re.compile(r"^sk-[A-Za-z0-9_-]{32,}$")  # LiteLLM hashes (for its logs) only keys starting sk-

SCHEMA = """
CREATE TABLE IF NOT EXISTS dspark_keys (
    key_hash    text PRIMARY KEY,
    member      text NOT NULL,
    models      text[] NOT NULL DEFAULT '{}',
    rpm_limit   integer,
    tpm_limit   integer,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX IF NOT EXISTS dspark_keys_member ON dspark_keys (member);
ALTER TABLE dspark_keys ADD COLUMN IF NOT EXISTS token_budget bigint;
ALTER TABLE dspark_keys ADD COLUMN IF NOT EXISTS budget_period text NOT NULL DEFAULT 'month';
CREATE TABLE IF NOT EXISTS dspark_usage (
    id                 bigserial PRIMARY KEY,
    at                 timestamptz NOT NULL DEFAULT now(),
    member             text NOT NULL,
    model              text,
    status             text NOT NULL,
    prompt_tokens      integer NOT NULL DEFAULT 0,
    completion_tokens  integer NOT NULL DEFAULT 0,
    latency_ms         double precision
);
CREATE INDEX IF NOT EXISTS dspark_usage_member ON dspark_usage (member);
CREATE INDEX IF NOT EXISTS dspark_usage_member_at ON dspark_usage (member, at);
"""

PERIODS = ("day", "week", "month")  # PostgreSQL's date_trunc fields, in the database's time zone (UTC)

# The tokens key `k`'s member used in the current budget period (UTC): what the budget is checked against.
USED_IN_PERIOD = """(
           SELECT coalesce(sum(u.prompt_tokens + u.completion_tokens), 0) FROM dspark_usage u
           WHERE u.member = k.member AND u.at >= date_trunc(k.budget_period, now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
       )"""

# The key check (one query per request): the key's member, scopes and limits, and the tokens the member
# used in the current budget period (counted only when the member has a budget).
KEY_CHECK = f"""
SELECT k.member, k.models, k.rpm_limit, k.tpm_limit, k.token_budget, k.budget_period,
       CASE WHEN k.token_budget IS NULL THEN 0 ELSE {USED_IN_PERIOD} END,
       date_trunc(k.budget_period, now() AT TIME ZONE 'UTC') + ('1 ' || k.budget_period)::interval
FROM dspark_keys k WHERE k.key_hash = %s AND k.revoked_at IS NULL
"""

# Every member with an active key and a budget: (member, period, budget, tokens used this period), counted as
# the key check counts them (the gateway's dspark_gateway_budget_* gauges; one row per member: their newest key).
BUDGETS = f"""
SELECT DISTINCT ON (k.member) k.member, k.budget_period, k.token_budget, {USED_IN_PERIOD}
FROM dspark_keys k WHERE k.revoked_at IS NULL AND k.token_budget IS NOT NULL
ORDER BY k.member, k.created_at DESC
"""

SCHEMA_LOCK = 0x64737061726B  # "dspark": the advisory lock key the schema change holds

USAGE_TOTALS = """
SELECT member, count(*), count(*) FILTER (WHERE status <> 'success'),
       coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0), coalesce(max(id), 0)
FROM dspark_usage GROUP BY member ORDER BY member
"""


def read_secrets(path: str = SECRETS) -> dict[str, str]:
    """The gateway's secrets file (KEY='value' lines, written by the program with 0600)."""
    import shlex

    out = {}
    with open(path) as f:
        for line in f:
            name, sep, value = line.strip().partition("=")
            if sep and not name.startswith("#"):
                out[name] = shlex.split(value)[0] if value else ""
    return out


def db_url(secrets: dict[str, str]) -> str:
    """The connection string (password from the secrets file; the database listens on 127.0.0.1 only)."""
    return (f"host=127.0.0.1 port={secrets['DSPARK_DB_PORT']} dbname=dspark user=dspark "
            f"password={secrets['DSPARK_DB_PASSWORD']} connect_timeout=5")


def read_budgets() -> list[tuple[str, str, int, int]]:
    """BUDGETS now (member, period, budget, used); [] when the database does not answer."""
    import psycopg

    try:
        with psycopg.connect(db_url(read_secrets()), autocommit=True) as conn:
            return [(m, p, int(b), int(u)) for m, p, b, u in conn.execute(BUDGETS).fetchall()]
    except (psycopg.Error, OSError):
        return []


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def connect(wait_seconds: float = 0):
    """A connection, waiting up to `wait_seconds` for the database to come up (it starts beside us)."""
    import psycopg

    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            conn = psycopg.connect(db_url(read_secrets()), autocommit=True)
            # One schema change at a time: concurrent CREATE TABLE IF NOT EXISTS race in PostgreSQL's catalog
            # (UniqueViolation on pg_type), and the program registers every member at once, beside the
            # gateway's own `init`. The lock ends with the transaction.
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                conn.execute(SCHEMA)
            return conn
        except psycopg.OperationalError as exc:
            if time.monotonic() >= deadline:
                raise SystemExit(f"gateway database not reachable: {str(exc).strip()}") from None
            time.sleep(1)


def add(args: argparse.Namespace) -> int:
    key = sys.stdin.read().strip()
    if not KEY.match(key):
        print("add: the key on stdin must be sk- followed by at least 32 of [A-Za-z0-9_-]", file=sys.stderr)
        return 2
    models = [m for m in (args.models or "").split(",") if m]
    h = key_hash(key)
    with connect(args.wait) as conn:
        # Upsert: the same key again (a scope change) keeps its record and becomes active again.
        conn.execute(
            "INSERT INTO dspark_keys (key_hash, member, models, rpm_limit, tpm_limit, token_budget, budget_period) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) "
            "ON CONFLICT (key_hash) DO UPDATE SET member = EXCLUDED.member, models = EXCLUDED.models, "
            "rpm_limit = EXCLUDED.rpm_limit, tpm_limit = EXCLUDED.tpm_limit, token_budget = EXCLUDED.token_budget, "
            "budget_period = EXCLUDED.budget_period, revoked_at = NULL",
            (h, args.member, models, args.rpm, args.tpm, args.token_budget, args.budget_period),
        )
    print(h)
    return 0


def revoke(args: argparse.Namespace) -> int:
    """Revoke every active key of `--member` (what the program's delete step runs), or one key by `--hash`."""
    if args.hash is not None and not re.fullmatch(r"[0-9a-f]{64}", args.hash):
        print(f"revoke: --hash must be a key's sha256 (got {args.hash!r})", file=sys.stderr)
        return 2
    column, value = ("member", args.member) if args.member else ("key_hash", args.hash)
    with connect(args.wait) as conn:
        n = conn.execute(
            f"UPDATE dspark_keys SET revoked_at = now() WHERE {column} = %s AND revoked_at IS NULL", (value,)
        ).rowcount
    print(f"revoked {n} key(s) of {args.member}" if args.member else f"revoked {n} key(s)")
    return 0


def usage(args: argparse.Namespace) -> int:
    with connect(args.wait) as conn:
        rows = conn.execute(USAGE_TOTALS).fetchall()
    print(json.dumps({m: {"requests": r, "failures": f, "prompt_tokens": p, "completion_tokens": c}
                      for m, r, f, p, c, _ in rows}, sort_keys=True))  # fmt: skip
    return 0


def keys(args: argparse.Namespace) -> int:
    with connect(args.wait) as conn:
        rows = conn.execute(
            "SELECT member, bool_or(revoked_at IS NULL) FROM dspark_keys GROUP BY member ORDER BY member"
        ).fetchall()
    print(json.dumps({m: ("active" if active else "revoked") for m, active in rows}, sort_keys=True))
    return 0


def init(args: argparse.Namespace) -> int:
    with connect(args.wait):
        pass
    print("gateway database ready")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gateway_admin.py")
    p.add_argument("--wait", type=float, default=60, help="seconds to wait for the database")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("add")
    a.add_argument("--member", required=True)
    a.add_argument("--models", default="")
    a.add_argument("--rpm", type=int)
    a.add_argument("--tpm", type=int)
    a.add_argument("--token-budget", type=int, help="prompt + completion tokens per --budget-period")
    a.add_argument("--budget-period", choices=PERIODS, default="month")
    r = sub.add_parser("revoke")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--member")
    which.add_argument("--hash")
    for name in ("usage", "keys", "init"):
        sub.add_parser(name)
    args = p.parse_args(argv)
    return {"add": add, "revoke": revoke, "usage": usage, "keys": keys, "init": init}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
