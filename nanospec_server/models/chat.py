"""User turns as a target model receives them: wrapped in its chat template."""

from __future__ import annotations


def encode_user_turns(tokenizer, turns: list[str]) -> list[list[int]]:
    """Token ids of each ``turn`` as a one-message chat ready for the assistant's answer;
    raw text for a tokenizer without a chat template (the tiny test models)."""
    if getattr(tokenizer, "chat_template", None):
        return [
            tokenizer.apply_chat_template([{"role": "user", "content": turn}],
                                          add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
            for turn in turns
        ]  # fmt: skip
    return [tokenizer(turn, add_special_tokens=False)["input_ids"] for turn in turns]
