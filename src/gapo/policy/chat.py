"""Prompts as the model is meant to read them.

An instruct model was tuned on chat-formatted text; prompting it with the task's raw text wastes
most of what it learned. With a chat template the prompt becomes

    apply_chat_template([{system: task.system_prompt}?, {user: problem.prompt}],
                        add_generation_prompt=True)

tokenised without adding special tokens again (the template places them). ``task.chat``:
``auto`` uses the template when the tokenizer has one (gapo's embedded character-level policies
have none, so they keep their raw prompts), ``true`` requires one, ``false`` never uses it.
"""

from __future__ import annotations

__all__ = ["PromptEncoder", "uses_chat"]

CHAT_MODES = ("auto", True, False)


def uses_chat(tok, chat: str | bool) -> bool:
    """Whether prompts for ``tok`` go through its chat template under ``task.chat = chat``."""
    has = bool(getattr(tok, "chat_template", None))
    if chat == "auto":
        return has
    if chat is True and not has:
        raise ValueError("task.chat=true but the tokenizer has no chat template; use task.chat=auto or false, "
                         "or a checkpoint whose tokenizer_config.json has a chat_template")
    return bool(chat)


class PromptEncoder:
    """``text(prompt)``: the exact prompt text the model reads; ``ids(prompt)``: its token ids
    (memoised: the training pool repeats prompts)."""

    def __init__(self, tok, *, chat: str | bool = "auto", system_prompt: str | None = None):
        self.tok, self.system_prompt = tok, system_prompt
        self.chat = uses_chat(tok, chat)
        if system_prompt is not None and not self.chat:
            raise ValueError("task.system_prompt needs a chat template (task.chat=auto with a chat tokenizer, or "
                             "true); without one, put the instruction in the task's prompt template")
        self._ids: dict[str, list[int]] = {}

    def text(self, prompt: str) -> str:
        if not self.chat:
            return prompt
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else [])
        messages.append({"role": "user", "content": prompt})
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def ids(self, prompt: str) -> list[int]:
        out = self._ids.get(prompt)
        if out is None:
            if self.chat:  # the template already holds the special tokens
                out = self.tok(self.text(prompt), add_special_tokens=False).input_ids
            else:
                out = self.tok(prompt).input_ids
            self._ids[prompt] = out
        return out
