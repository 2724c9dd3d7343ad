"""What the admin layer and the scheduler agree on over SGLang's internal-state channel: the
keys of our entries, and the per-launch token that proves a settings change came through
`POST /nanospec/settings` (SGLang's `/set_internal_state` needs no key on a keyless server)."""

from __future__ import annotations

import os
import secrets
from typing import Any

from nanospec_server import env

SETTINGS_KEY = "nanospec_settings"
STATE_KEY = "nanospec"


def ensure_token() -> str:
    """Called in the launcher before SGLang spawns its schedulers, which inherit it."""
    token = env.settings_token()
    if token is None:
        token = os.environ[env.SETTINGS_TOKEN] = secrets.token_hex(16)
    return token


def settings_request(changes: dict[str, int], key_id: str) -> dict[str, Any]:
    """The `/set_internal_state` body the admin layer sends."""
    value = {"changes": changes, "key_id": key_id, "token": env.settings_token() or ""}
    return {SETTINGS_KEY: value}


def token_matches(token: Any) -> bool:
    """Whether a settings change carries this launch's token."""
    expected = env.settings_token() or ""
    return bool(expected) and isinstance(token, str) and secrets.compare_digest(token, expected)
