"""Prompts as the model is meant to read them.

An instruct model was tuned on chat-formatted text; prompting it with the task's raw text wastes
most of what it learned. With a chat template the prompt becomes

    apply_chat_template([{system: task.system_prompt}?, {user: problem.prompt}],
                        add_generation_prompt=True)

tokenised without adding special tokens again (the template places them). ``task.chat``:
``auto`` uses the template when the tokenizer has one (gapo's embedded character-level policies
have none, so they keep their raw prompts), ``true`` requires one, ``false`` never uses it.

The template is rendered once when the encoder is built (before a run folder is written): a
template with a Jinja syntax error, one that raises, one that renders nothing or drops the
user's (or the system's) content is one ``ValueError`` naming the tokenizer and its template
file, not a jinja2 traceback at the first step.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["PromptEncoder", "uses_chat", "template_source"]

CHAT_MODES = ("auto", True, False)


def uses_chat(tok, chat: str | bool) -> bool:
    """Whether prompts for ``tok`` go through its chat template under ``task.chat = chat``."""
    has = bool(getattr(tok, "chat_template", None))
    if chat == "auto":
        return has
    if chat is True and not has:
        raise ValueError(
            "task.chat=true but the tokenizer has no chat template; use task.chat=auto or false, "
            "or a checkpoint whose tokenizer_config.json has a chat_template"
        )
    return bool(chat)


# contents of the probe render: plain words, so no template's escaping or trimming changes them
_PROBE_USER, _PROBE_SYSTEM = "gapo probe user turn 7f3a", "gapo probe system turn 7f3a"


def template_source(tok) -> str:
    """Where ``tok``'s chat template comes from, for messages: the tokenizer folder's
    ``chat_template.jinja`` or ``tokenizer_config.json``, else the tokenizer's name."""
    name = str(getattr(tok, "name_or_path", "") or "the tokenizer")
    folder = Path(name)
    for f in ("chat_template.jinja", "chat_template.json", "tokenizer_config.json"):
        if (folder / f).is_file():
            return f"the chat template of {str(folder / f)!r}"
    return f"the chat template of tokenizer {name!r}"


class PromptEncoder:
    """``text(prompt)``: the exact prompt text the model reads; ``ids(prompt)``: its token ids
    (memoised: the training pool repeats prompts)."""

    def __init__(self, tok, *, chat: str | bool = "auto", system_prompt: str | None = None):
        self.tok, self.system_prompt = tok, system_prompt
        self.chat = uses_chat(tok, chat)
        if system_prompt is not None and not self.chat:
            raise ValueError(
                "task.system_prompt needs a chat template (task.chat=auto with a chat tokenizer, or "
                "true); without one, put the instruction in the task's prompt template"
            )
        self._ids: dict[str, list[int]] = {}
        if self.chat:
            self._probe()

    def _probe(self) -> None:
        """Render one user turn (and a system turn when ``system_prompt`` is set) and check the
        contents come out: the template's errors surface here, at validation."""
        system = self.system_prompt
        self.system_prompt = _PROBE_SYSTEM if system is not None else None
        try:
            text = self.text(_PROBE_USER)
        finally:
            self.system_prompt = system
        missing = [
            what
            for what, probe in (("user", _PROBE_USER), ("system", _PROBE_SYSTEM))
            if (what == "user" or system is not None) and probe not in text
        ]
        if missing:
            raise ValueError(
                f"{template_source(self.tok)} renders a conversation without the {' or '.join(missing)} "
                f"message's content (rendered {text[:120]!r}); fix the template, or use task.chat=false"
            )

    def text(self, prompt: str) -> str:
        if not self.chat:
            return prompt
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        messages.append({"role": "user", "content": prompt})
        try:
            out = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - jinja2's syntax and runtime errors, raise_exception(...)
            line = getattr(e, "lineno", None)
            at = f" (line {line} of the template)" if line else ""
            raise ValueError(
                f"{template_source(self.tok)} cannot render the prompt{at}: {type(e).__name__}: {e}; "
                "fix the template, or use task.chat=false"
            ) from None
        if not isinstance(out, str) or not out.strip():
            raise ValueError(
                f"{template_source(self.tok)} renders nothing (got {out!r}) for a user turn; fix the "
                "template, or use task.chat=false"
            )
        return out

    def ids(self, prompt: str) -> list[int]:
        out = self._ids.get(prompt)
        if out is None:
            if self.chat:  # the template already holds the special tokens
                out = self.tok(self.text(prompt), add_special_tokens=False).input_ids
            else:
                out = self.tok(prompt).input_ids
            if not out:  # a sampler cannot start from nothing
                raise ValueError(
                    f"prompt {prompt[:80]!r} encodes to no tokens (the tokenizer adds no BOS and the "
                    "prompt is empty); check the task's prompt field"
                )
            self._ids[prompt] = out
        return out
