"""EAGLE(-2) heads: the defaults of ``DraftKind`` (hidden states from the target, the
whole vocabulary or FR-Spec's list)."""

from __future__ import annotations

from nanospec_server.sglang_plugin.spec.draft_kinds.base import DraftKind


class EagleKind(DraftKind):
    name = "EAGLE"
    algorithms = ("EAGLE",)
    tiny_draft = "tiny-eagle"
