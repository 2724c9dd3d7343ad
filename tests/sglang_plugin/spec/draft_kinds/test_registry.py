"""Which draft kind serves which SGLang algorithm, and what each says of itself."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nanospec_server import host
from nanospec_server.config import Mode, NanoSpecConfig
from nanospec_server.models.tiny.spec import TINY_MODELS


@pytest.fixture(scope="module")
def registry():
    host.prepare_cpu_environment()  # before SGLang's platform detection
    from nanospec_server.sglang_plugin.spec.draft_kinds import registry

    return registry


def test_every_algorithm_of_ours_has_its_kind(registry) -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    for name in ("EAGLE", "EAGLE3", "STANDALONE"):
        assert registry.draft_kind_for(SpeculativeAlgorithm[name]).name == name
    # SGLang's other EAGLE-like algorithms draft as EAGLE does
    assert registry.draft_kind_for(SpeculativeAlgorithm.FROZEN_KV_MTP).name == "EAGLE"


def test_each_kind_names_a_tiny_draft_of_its_kind(registry) -> None:
    for kind in registry.KINDS:
        assert TINY_MODELS[kind.tiny_draft].kind.value == kind.name.lower()


def test_a_token_map_is_refused_by_dynamic_modes_of_every_kind_but_eagle3(registry) -> None:
    worker = SimpleNamespace(hot_token_id=object())
    dynamic, full = NanoSpecConfig(mode=Mode.NANOSPEC), NanoSpecConfig(mode=Mode.FULL)
    for kind in registry.KINDS:
        if kind.hot_tokens_are_token_map:
            assert "--speculative-token-map" in kind().refusals(worker, dynamic)[0]
            assert kind().refusals(worker, full) == []
