"""programs/gateway/gateway_hooks imported as the gateway image imports it (its folder on sys.path), on a machine
without the image's fastapi and psycopg: both stubbed with the names the hooks use (every database connection
fails, as with the database down), and taken out of sys.modules again afterwards."""
from __future__ import annotations

import contextlib
import os
import sys
import types
from pathlib import Path

GATEWAY = str(Path(__file__).resolve().parents[1] / "programs" / "gateway")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM reads its bundled cost map: no network


def _fastapi() -> types.ModuleType:
    m = types.ModuleType("fastapi")

    class HTTPException(Exception):
        def __init__(self, status_code: int, detail: str = ""):
            super().__init__(detail)
            self.status_code, self.detail = status_code, detail

    m.HTTPException = HTTPException
    return m


def _psycopg() -> types.ModuleType:
    m = types.ModuleType("psycopg")

    class Error(Exception):
        pass

    def connect(*_a, **_k):
        raise OSError("no database here")

    m.Error, m.OperationalError, m.connect = Error, Error, connect
    return m


@contextlib.contextmanager
def hooks():
    """Yields the gateway_hooks module (needs prometheus_client and litellm, requirements-dev.txt)."""
    stubbed = {name: make() for name, make in (("fastapi", _fastapi), ("psycopg", _psycopg)) if name not in sys.modules}
    sys.modules.update(stubbed)
    sys.path.insert(0, GATEWAY)
    try:
        import gateway_admin  # noqa: F401  (the hooks import it by name, from their folder)
        import gateway_hooks

        yield gateway_hooks
    finally:
        sys.path.remove(GATEWAY)
        for name in stubbed:  # other tests see the machine's packages as they are
            sys.modules.pop(name, None)


def admin():
    """gateway_admin (standard library only at import)."""
    sys.path.insert(0, GATEWAY)
    try:
        import gateway_admin

        return gateway_admin
    finally:
        sys.path.remove(GATEWAY)
