"""Chats as a target model receives them: user turns (and answers) wrapped in its chat template."""

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


def encode_chat(tokenizer, turns: list[str], answers: list[str]) -> list[int]:
    """Token ids of a chat whose user ``turns`` alternate with the model's ``answers``
    (one fewer), ready for the next answer; plain concatenation without a chat template."""
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    if getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    text = "\n".join(m["content"] for m in messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
