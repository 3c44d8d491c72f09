"""Prompts as the model is meant to read them.

An instruct model was tuned on chat-formatted text; prompting it with the task's raw text wastes
most of what it learned. With a chat template a problem's prompt becomes

    apply_chat_template(messages, add_generation_prompt=True, **task.chat_template_kwargs)
    messages = problem.meta["messages"]                          (a conversational row, whole)
             | [{system: task.system_prompt}?, {user: problem.prompt}]       (any other problem)

tokenised without adding special tokens again (the template places them), as TRL renders a
prompt. ``task.system_prompt`` goes before a conversation that has no system turn of its own; a
conversation that has one and a set ``task.system_prompt`` is an error (which should win is the
user's call). ``task.chat``: ``auto`` uses the template when the tokenizer has one (gapo's
embedded character-level policies have none, so they keep their raw prompts), ``true`` requires
one, ``false`` never uses it; a conversation without a template is an error, not its last turn.

The template is rendered once when the encoder is built (before a run folder is written): a
template with a Jinja syntax error, one that raises, one that renders nothing or drops the
user's (or the system's) content is one ``ValueError`` naming the tokenizer and its template
file, not a jinja2 traceback at the first step; so is a ``task.chat_template_kwargs`` key the
template never reads (Qwen3's ``enable_thinking`` given to a template without it would change
nothing, silently). ``check(problems)`` renders each conversation before any work: a turn whose
content the template drops is an error naming the row.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PromptEncoder", "uses_chat", "template_source", "check_chat_template_kwargs"]

CHAT_MODES = ("auto", True, False)

# apply_chat_template's own parameters and the template's conversation: never template variables
_RESERVED_KWARGS = (
    "conversation",
    "messages",
    "tools",
    "documents",
    "chat_template",
    "add_generation_prompt",
    "continue_final_message",
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
)


def check_chat_template_kwargs(key: str, kwargs) -> None:
    """``kwargs`` is a dict of template variables: identifier keys (a template can read no
    other), none of them ``apply_chat_template``'s own parameters."""
    if not isinstance(kwargs, dict):
        raise ValueError(
            f"{key}: must be a mapping of template variables (e.g. {{enable_thinking: false}}), got {kwargs!r}"
        )
    for k in kwargs:
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"{key}: {k!r} is not a template variable name (a string such as enable_thinking)")
        if k in _RESERVED_KWARGS:
            raise ValueError(
                f"{key}: {k!r} is set by gapo (or is apply_chat_template's own argument), not a template variable"
            )


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


def _variables(template) -> set[str] | None:
    """The variables a Jinja template reads, or ``None`` when that cannot be told (a dict of
    named templates, a tag of transformers' own that plain Jinja does not parse)."""
    if not isinstance(template, str):
        return None
    import jinja2  # transformers' dependency; only a chat tokenizer with kwargs gets here
    from jinja2 import meta

    try:
        env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
        return meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError:
        return None


def _conversation(problem) -> list[dict] | None:
    """``problem``'s whole conversation (``meta["messages"]``, a data row's message list), or None."""
    meta = getattr(problem, "meta", None) or {}
    return meta.get("messages")


class PromptEncoder:
    """``text(problem)``: the exact prompt text the model reads; ``ids(problem)``: its token
    ids (memoised: the training pool repeats prompts); ``check(problems, name)``: the problems'
    conversations can be rendered whole (before any work)."""

    def __init__(
        self,
        tok,
        *,
        chat: str | bool = "auto",
        system_prompt: str | None = None,
        chat_template_kwargs: dict | None = None,
    ):
        self.tok, self.system_prompt = tok, system_prompt
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        check_chat_template_kwargs("task.chat_template_kwargs", self.chat_template_kwargs)
        self.chat = uses_chat(tok, chat)
        for key, value in (("system_prompt", system_prompt), ("chat_template_kwargs", self.chat_template_kwargs)):
            if value and not self.chat:
                raise ValueError(
                    f"task.{key} needs a chat template (task.chat=auto with a chat tokenizer, or true); "
                    "without one, put the instruction in the task's prompt template"
                )
        self._ids: dict = {}
        if self.chat:
            self._probe()

    def _probe(self) -> None:
        """Render one user turn (and a system turn when ``system_prompt`` is set) and check the
        contents come out: the template's errors surface here, at validation. Each
        ``chat_template_kwargs`` key must be a variable the template reads."""
        system = [{"role": "system", "content": _PROBE_SYSTEM}] if self.system_prompt is not None else []
        text = self._render(system + [{"role": "user", "content": _PROBE_USER}])
        missing = [
            what
            for what, probe in (("user", _PROBE_USER), ("system", _PROBE_SYSTEM))
            if (what == "user" or system) and probe not in text
        ]
        if missing:
            raise ValueError(
                f"{template_source(self.tok)} renders a conversation without the {' or '.join(missing)} "
                f"message's content (rendered {text[:120]!r}); fix the template, or use task.chat=false"
            )
        read = _variables(self.tok.chat_template) if self.chat_template_kwargs else None
        unread = [k for k in self.chat_template_kwargs if read is not None and k not in read]
        if unread:
            raise ValueError(
                f"task.chat_template_kwargs: {template_source(self.tok)} never reads {unread}: setting them "
                "changes nothing; drop them (they belong to another model's template)"
            )

    def _render(self, messages: list[dict]) -> str:
        try:
            out = self.tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
            )
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

    def messages(self, problem) -> list[dict]:
        """The conversation the template renders for ``problem`` (module docstring)."""
        conv = _conversation(problem)
        if conv is None:
            conv = [{"role": "user", "content": problem.prompt}]
        elif self.system_prompt is not None and conv[0]["role"] == "system":
            raise ValueError(
                "task.system_prompt is set and the conversation has a system turn of its own; drop one of them"
            )
        if self.system_prompt is None or conv[0]["role"] == "system":
            return list(conv)
        return [{"role": "system", "content": self.system_prompt}, *conv]

    def text(self, problem) -> str:
        if self.chat:
            return self._render(self.messages(problem))
        if _conversation(problem) is not None:
            why = (
                "task.chat=false turns it off" if getattr(self.tok, "chat_template", None) else "the tokenizer has none"
            )
            raise ValueError(
                f"a conversational prompt (a list of {{role, content}} messages) needs a chat template, and {why}; "
                "use a chat model (task.chat=auto), or a column of plain-string prompts"
            )
        return problem.prompt

    def key(self, problem):
        """What identifies ``problem``'s prompt: its text, or its whole conversation."""
        conv = _conversation(problem)
        return problem.prompt if conv is None else ("messages", json.dumps(conv, sort_keys=True))

    def ids(self, problem) -> list[int]:
        key = self.key(problem)
        out = self._ids.get(key)
        if out is None:
            if self.chat:  # the template already holds the special tokens
                out = self.tok(self.text(problem), add_special_tokens=False).input_ids
            else:
                out = self.tok(self.text(problem)).input_ids
            if not out:  # a sampler cannot start from nothing
                raise ValueError(
                    f"prompt {problem.prompt[:80]!r} encodes to no tokens (the tokenizer adds no BOS and the "
                    "prompt is empty); check the task's prompt field"
                )
            self._ids[key] = out
        return out

    def check(self, problems: list, name) -> None:
        """Before any work: every conversation among ``problems`` renders, whole (each turn's
        content is in the text), else a ``ValueError`` naming the problem (``name(problem)``)."""
        for p in problems:
            conv = _conversation(p)
            if conv is None:
                continue
            try:
                text = self.text(p)
            except ValueError as e:
                raise ValueError(f"{name(p)}: {e}") from None
            for i, m in enumerate(self.messages(p)):
                # a reasoning template (Qwen3) keeps only what follows </think> of a past answer
                content = m["content"].rsplit("</think>", 1)[-1].strip()
                if content not in text:
                    raise ValueError(
                        f"{name(p)}: {template_source(self.tok)} renders this conversation without its "
                        f"turn {i + 1} ({m['role']}: {content[:60]!r}); fix the template, or give the "
                        "prompt as one user turn"
                    )
