"""The admin key that guards NanoSpec's mutating routes: SGLang's own `--admin-api-key`.

One key covers SGLang's admin routes and ours. SGLang's middleware answers 401 for both a
missing and a wrong key; ours tells them apart (401 without a key, 403 with a wrong one).
Our routes are left at SGLang's "normal" auth level, so when `--api-key` is also set the
middleware wants that key in `Authorization` and ours travels in `X-Admin-Key`.
"""

from __future__ import annotations

import hashlib
import secrets

from fastapi import HTTPException, Request

from nanospec_server.env import ADMIN_KEY

ADMIN_KEY_HEADER = "X-Admin-Key"


def key_id(key: str) -> str:
    """What the log names instead of the key: a short hash, stable across restarts."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def presented_key(request: Request) -> str | None:
    key = request.headers.get(ADMIN_KEY_HEADER)
    if key:
        return key
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def check_admin_key(configured: str | None, presented: str | None) -> str:
    """Return the key id of an accepted key; raise 401 / 403 otherwise."""
    if not configured:
        raise HTTPException(
            403,
            "settings changes need an admin key: start the server with --admin-api-key "
            f"(or {ADMIN_KEY})",
        )
    if presented is None:
        raise HTTPException(
            401,
            f"admin key required: send 'Authorization: Bearer <key>' or '{ADMIN_KEY_HEADER}'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not secrets.compare_digest(presented.encode(), configured.encode()):
        raise HTTPException(403, "wrong admin key")
    return key_id(presented)


def require_admin(request: Request) -> str:
    """FastAPI dependency for mutating routes; returns the caller's key id."""
    # deferred: imports SGLang only when called
    from sglang.srt.runtime_context import get_serving

    return check_admin_key(get_serving().admin_api_key, presented_key(request))
