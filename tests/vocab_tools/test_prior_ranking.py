"""The hybrid vocabulary's prior: a frequency ranking of a fixed corpus, cached per tokenizer."""

from collections import Counter

from transformers import AutoTokenizer

from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.vocab_tools import prior as prior_module
from nanospec_server.vocab_tools.prior import prior_token_ids, ranked_tokens

TEXTS = ["the cat sat on the mat.", "The dog, the cat and the bird.", "a b a b a c"]


def tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny_model_path("tiny-target")))


def test_ranking_is_frequency_order_of_the_corpus(tmp_path, monkeypatch):
    monkeypatch.setattr(prior_module, "prior_corpus", lambda: iter(TEXTS))
    tok = tokenizer()
    counts = Counter(t for text in TEXTS for t in tok.encode(text, add_special_tokens=False))
    expected = sorted(counts, key=lambda t: (-counts[t], t))
    assert ranked_tokens(tok, tmp_path) == expected
    assert prior_token_ids(tok, 3, tmp_path) == expected[:3]
    assert prior_token_ids(tok, 0, tmp_path) == []
    assert prior_token_ids(tok, 10**6, tmp_path) == expected  # never more than counted


def test_ranking_is_computed_once_per_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setattr(prior_module, "prior_corpus", lambda: iter(TEXTS))
    first = ranked_tokens(tokenizer(), tmp_path)
    monkeypatch.setattr(prior_module, "prior_corpus", lambda: iter(["zzz zzz zzz"]))
    assert ranked_tokens(tokenizer(), tmp_path) == first  # read back, not recounted
    assert len(list(tmp_path.iterdir())) == 1
