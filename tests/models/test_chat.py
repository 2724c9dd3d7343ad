"""A chat as the target receives it: user turns and answers in its chat template."""

from __future__ import annotations

from transformers import AutoTokenizer

from nanospec_server.models.chat import encode_chat
from nanospec_server.models.tiny import tiny_model_path


def test_encode_chat_uses_the_template_with_the_models_answer() -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path("tiny-target")))
    first = encode_chat(tokenizer, ["Hello there"], [])
    second = encode_chat(tokenizer, ["Hello there", "And then?"], ["An answer"])
    expected = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "An answer"},
         {"role": "user", "content": "And then?"}],
        add_generation_prompt=True, tokenize=True, return_dict=False)  # fmt: skip
    assert second == list(expected)
    assert tokenizer.decode(second).count("An answer") == 1
    assert len(second) > len(first)
