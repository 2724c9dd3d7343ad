"""The draft kinds by SGLang's speculative algorithm: a new kind is one module and one
entry in ``KINDS``."""

from __future__ import annotations

from nanospec_server.sglang_plugin.spec.draft_kinds.base import DraftKind
from nanospec_server.sglang_plugin.spec.draft_kinds.eagle import EagleKind
from nanospec_server.sglang_plugin.spec.draft_kinds.eagle3 import Eagle3Kind
from nanospec_server.sglang_plugin.spec.draft_kinds.standalone import StandaloneKind

KINDS: tuple[type[DraftKind], ...] = (EagleKind, Eagle3Kind, StandaloneKind)
BY_ALGORITHM: dict[str, type[DraftKind]] = {
    algorithm: kind for kind in KINDS for algorithm in kind.algorithms
}


def draft_kind_for(algorithm) -> DraftKind:
    """A fresh instance of the kind that serves SGLang's ``SpeculativeAlgorithm``. The other
    algorithms SGLang runs through these workers (FROZEN_KV_MTP, a plugin's) draft as EAGLE
    does."""
    return BY_ALGORITHM.get(getattr(algorithm, "name", ""), EagleKind)()
