"""Prompts through the chat template (gapo.policy.chat): a conversational row rendered whole, as
TRL renders it, task.system_prompt beside a row's own system turn, task.chat_template_kwargs, and
the errors that stop a run before any work. On the tests' Qwen2 checkpoint (tests/checkpoints.py,
no hub) with a Qwen-style template set here: a default system turn when the conversation has
none, and Qwen3's ``enable_thinking`` switch."""

import pytest

from checkpoints import (  # tests/checkpoints.py (tests/ is on sys.path)
    CHAT_TEMPLATE,
    DEFAULT_SYSTEM,
    QWEN_TEMPLATE,
    build_instruct_checkpoint,
)
from gapo.policy.chat import PromptEncoder
from gapo.rl.config import load_config
from gapo.rl.rollout import problem_name
from gapo.tasks.base import Problem

# the row: a system turn, one worked exchange, the real question last
FEW_SHOT = [
    {"role": "system", "content": "Answer with a number only."},
    {"role": "user", "content": "1 + 1?"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "3 + 4?"},
]


def turn(role, content):
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def conversational(messages, line=7):
    """A data:PATH row's problem: the last turn as ``prompt``, the conversation in ``meta``."""
    return Problem(messages[-1]["content"], None, {"source": "d.jsonl", "line": line, "messages": tuple(messages)})


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(build_instruct_checkpoint(tmp_path_factory.mktemp("qwen2")))
    t.chat_template = QWEN_TEMPLATE
    return t


def test_a_conversation_is_rendered_whole(tok):
    enc = PromptEncoder(tok)
    p = conversational(FEW_SHOT)
    enc.check([p], problem_name)
    text = enc.text(p)
    # its own system turn (no default one), the exchange, the question, the generation prompt
    assert text == (
        turn("system", "Answer with a number only.")
        + turn("user", "1 + 1?")
        + turn("assistant", "2")
        + turn("user", "3 + 4?")
        + "<|im_start|>assistant\n"
    )
    assert enc.ids(p) == tok.apply_chat_template(FEW_SHOT, add_generation_prompt=True, tokenize=True, return_dict=False)
    # a plain prompt is one user turn, as before (the template's default system turn first)
    plain = Problem("3 + 4?", None)
    assert enc.text(plain) == turn("system", DEFAULT_SYSTEM) + turn("user", "3 + 4?") + "<|im_start|>assistant\n"
    # same last question, another history: another prompt (not a memoised neighbour's ids)
    assert enc.ids(conversational(FEW_SHOT[1:])) != enc.ids(p) and enc.key(plain) != enc.key(p)


def test_system_prompt_beside_a_conversation(tok):
    enc = PromptEncoder(tok, system_prompt="Be brief.")
    no_system = conversational(FEW_SHOT[1:])
    assert enc.text(no_system).startswith(turn("system", "Be brief.") + turn("user", "1 + 1?"))
    with pytest.raises(ValueError, match=r"^d\.jsonl:7: task\.system_prompt is set and the conversation has a system"):
        enc.check([no_system, conversational(FEW_SHOT)], problem_name)


def test_chat_template_kwargs_reach_the_template(tok):
    p = conversational(FEW_SHOT)
    off = PromptEncoder(tok, chat_template_kwargs={"enable_thinking": False})
    assert off.text(p).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert off.ids(p) == tok.apply_chat_template(
        FEW_SHOT, add_generation_prompt=True, tokenize=True, return_dict=False, enable_thinking=False
    )
    assert PromptEncoder(tok, chat_template_kwargs={"enable_thinking": True}).text(p).endswith("assistant\n")
    assert PromptEncoder(tok).text(p) == PromptEncoder(tok, chat_template_kwargs={"enable_thinking": True}).text(p)


def test_chat_template_kwargs_the_template_never_reads(tok):
    tok2 = tok.__class__.from_pretrained(tok.name_or_path)  # the checkpoint's own template: no enable_thinking
    assert tok2.chat_template == CHAT_TEMPLATE
    with pytest.raises(ValueError, match=r"chat_template\.jinja' never reads \['enable_thinking'\]: setting"):
        PromptEncoder(tok2, chat_template_kwargs={"enable_thinking": False})
    with pytest.raises(ValueError, match="chat_template_kwargs needs a chat template"):
        PromptEncoder(tok, chat=False, chat_template_kwargs={"enable_thinking": False})


@pytest.mark.parametrize(
    "value, match",
    [
        ("[1, 2]", "expected a mapping"),
        ("{enable-thinking: false}", "'enable-thinking' is not a template variable name"),
        ("{1: x}", "1 is not a template variable name"),
        ("{add_generation_prompt: false}", "'add_generation_prompt' is set by gapo"),
        ("{messages: []}", "'messages' is set by gapo"),
    ],
)
def test_chat_template_kwargs_validated(value, match):
    with pytest.raises(ValueError, match=r"task\.chat_template_kwargs.*" + match):
        load_config(None, [f"task.chat_template_kwargs={value}"]).validate()
    cfg = load_config(None, ["task.chat_template_kwargs.enable_thinking=false"]).validate()
    assert cfg.task.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ValueError, match=r"task\.chat_template_kwargs.*task\.chat=false"):
        load_config(None, ["task.chat=false", "task.chat_template_kwargs={enable_thinking: false}"]).validate()


def test_a_conversation_without_a_chat_template(tok):
    p = conversational(FEW_SHOT, line=3)
    with pytest.raises(ValueError, match=r"^d\.jsonl:3: a conversational prompt .* chat template, and task\.chat"):
        PromptEncoder(tok, chat=False).check([Problem("plain", None), p], problem_name)
    bare = tok.__class__.from_pretrained(tok.name_or_path)
    bare.chat_template = None
    with pytest.raises(ValueError, match=r"^d\.jsonl:3: .*needs a chat template, and the tokenizer has none"):
        PromptEncoder(bare).check([p], problem_name)


def test_a_template_that_drops_turns(tok):
    """A template that renders only the last message passes the one-turn probe, but would cut a
    conversation to its question: the row is named before any work."""
    last_only = tok.__class__.from_pretrained(tok.name_or_path)
    last_only.chat_template = (
        "{{ '<|im_start|>user\\n' + messages[-1]['content'] + '<|im_end|>\\n' }}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    enc = PromptEncoder(last_only)
    enc.check([Problem("plain", None), conversational(FEW_SHOT[3:])], problem_name)  # one turn: whole
    with pytest.raises(ValueError, match=r"^d\.jsonl:7: .* without its turn 1 \(system: 'Answer with a number"):
        enc.check([conversational(FEW_SHOT)], problem_name)
