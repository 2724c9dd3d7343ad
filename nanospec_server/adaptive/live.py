"""Whether a live ``adaptive`` / ``adaptive_depth`` change can apply to a server.

One rule for both places that check it: the admin route answers a bad change with a 400
before it is sent, and the scheduler refuses it again when it arrives (a change can reach
the scheduler by another path, and the published state may be a step old). Both read the
adaptive state as published in ``/stats/vocab.adaptive``. No SGLang import.
"""

from __future__ import annotations

from typing import Any

from nanospec_server.adaptive.registry import policy_names

LIVE_KEYS = ("adaptive", "adaptive_depth")


def live_change_problem(changes: dict[str, Any], published: dict[str, Any] | None) -> str | None:
    """Why ``changes`` cannot apply to a server whose adaptive state is ``published``
    ("key: ...", naming the setting), or None. Our policy's states are built at start,
    only with --nanospec-adaptive, so without it neither setting can change live."""
    for key in LIVE_KEYS:
        if key in changes and (published or {}).get("policy") not in policy_names():
            return f"{key}: start the server with --nanospec-adaptive to switch it live"
    depth = changes.get("adaptive_depth", -1)
    if depth != -1 and depth not in published["candidate_depths"]:
        return f"adaptive_depth: {depth} is not a candidate depth {published['candidate_depths']}"
    return None
