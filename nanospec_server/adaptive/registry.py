"""The depth policies `--nanospec-adaptive-policy` can name, and building one by name (no
SGLang import): a new policy is one module and one line here."""

from __future__ import annotations

from collections.abc import Callable

from nanospec_server.adaptive.depth_policy import DepthPolicy
from nanospec_server.adaptive.fixed import FixedDepthPolicy
from nanospec_server.adaptive.policy import GoodputPolicy

DEFAULT_POLICY = "goodput"
POLICIES: dict[str, Callable[[list[int]], DepthPolicy]] = {
    "goodput": GoodputPolicy,
    "fixed": FixedDepthPolicy,
}


def policy_names() -> list[str]:
    return list(POLICIES)


def build_policy(name: str, candidates: list[int]) -> DepthPolicy:
    """The policy ``name`` over these candidate depths; ValueError naming the known ones."""
    if name not in POLICIES:
        raise ValueError(f"unknown depth policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name](candidates)
