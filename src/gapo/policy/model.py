"""The embedded base policy: a character-level tokenizer and a tiny Hugging Face causal LM.

No model hub is reachable where gapo is built and tested (docs/design.md §9), so the default policy is
made locally: a real ``transformers`` ``LlamaForCausalLM`` with a few hundred thousand to a few
million parameters, and a real ``PreTrainedTokenizerFast`` whose vocabulary is one token per
character of the task's alphabet plus ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``.

Why a loader of our own: in transformers 5.x, ``AutoTokenizer.from_pretrained`` on a folder whose
``config.json`` says ``llama``/``qwen2`` builds the model type's byte-level tokenizer class and
silently discards the character-level vocabulary. ``save_policy`` therefore writes a marker file
(``gapo_policy.json``) next to the weights, and ``load_policy`` loads ``tokenizer.json`` directly
into ``PreTrainedTokenizerFast`` when the marker is present. Any other folder (or hub id) is a
real checkpoint and goes through ``AutoTokenizer``/``AutoModelForCausalLM`` unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

try:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
except ImportError:  # pragma: no cover - layout of older transformers
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = None

MARKER = "gapo_policy.json"
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}

# name -> LlamaConfig overrides. "tiny" is the reference point of docs/design.md §9: hidden 128, 4 layers,
# ≈0.86M parameters with a ~22-character vocabulary.
PRESETS: dict[str, dict] = {
    "micro": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2),
    "tiny": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4),
    "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=8),
}


def build_tokenizer(alphabet: str):
    """A character-level ``PreTrainedTokenizerFast``: ids 0-3 are ``<pad> <bos> <eos> <unk>``,
    then one id per distinct character of ``alphabet`` in order of first appearance.

    Encoding a string yields ``<bos>`` followed by one id per character (use
    ``add_special_tokens=False`` for a completion); decoding concatenates characters.
    """
    chars = list(dict.fromkeys(alphabet))
    if not chars:
        raise ValueError("alphabet must contain at least one character")
    specials = list(SPECIAL_TOKENS.values())
    clash = [c for c in chars if c in specials]
    if clash:
        raise ValueError(f"alphabet characters clash with special tokens: {clash}")
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # One pre-token per character (newlines and spaces included), so WordLevel sees characters.
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, padding_side="left", **SPECIAL_TOKENS)
    return tok


def build_model(
    vocab_size: int,
    preset: str = "tiny",
    *,
    seed: int | None = 0,
    **overrides,  # forwarded unread to transformers' LlamaConfig
):
    """A freshly initialised ``LlamaForCausalLM`` of the named size (``PRESETS``), fp32.

    ``overrides`` go into ``LlamaConfig`` (e.g. ``max_position_embeddings``). Special-token ids
    follow ``build_tokenizer`` (pad 0, bos 1, eos 2).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; known presets: {sorted(PRESETS)}")
    kw = dict(
        vocab_size=vocab_size,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        attention_dropout=0.0,
        rms_norm_eps=1e-5,
    )
    kw.update(PRESETS[preset])
    kw.update(overrides)
    config = LlamaConfig(**kw)
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config)
    else:
        model = LlamaForCausalLM(config)
    return model.float()


class _quiet_hf:
    """Silence transformers' per-call progress bars ("Loading weights", "Writing shards")."""

    def __enter__(self):
        self._was = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()

    def __exit__(self, *exc):
        if self._was:
            hf_logging.enable_progress_bar()


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def save_policy(model, tokenizer, path: str | os.PathLike, *, extra: dict | None = None) -> Path:
    """Save model and tokenizer with ``save_pretrained`` plus gapo's marker file.

    ``extra`` (JSON-serialisable) is stored in the marker, e.g. how the policy was trained.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with _quiet_hf():
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    marker = {
        "format": 1,
        # gapo's character tokenizer must be reloaded directly (see the module docstring); any
        # other tokenizer (a real checkpoint's: BPE, chat template, its own specials) through
        # AutoTokenizer, which keeps tokenizer_config.json's chat template
        "tokenizer": "char" if _is_char_tokenizer(tokenizer) else "hf",
        "special_tokens": {k: getattr(tokenizer, k) for k in SPECIAL_TOKENS},
        "padding_side": tokenizer.padding_side,
        "extra": extra or {},
    }
    (path / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
    return path


def read_marker(path: str | os.PathLike) -> dict | None:
    """The marker written by ``save_policy``, or None for a folder gapo did not write."""
    p = Path(path) / MARKER
    if not p.is_file():
        return None
    try:
        marker = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f"{str(p)!r} is corrupt ({e}); it is gapo's marker of a saved policy: restore it, or "
            "delete it if the folder holds an ordinary Hugging Face checkpoint"
        ) from None
    if not isinstance(marker, dict):
        raise ValueError(f"{str(p)!r} is corrupt (not a JSON object)")
    return marker


def _is_char_tokenizer(tok) -> bool:
    backend = getattr(tok, "backend_tokenizer", None)
    return (
        backend is not None
        and type(backend.model).__name__ == "WordLevel"
        and all(getattr(tok, k, None) == v for k, v in SPECIAL_TOKENS.items())
    )


def _load_tokenizer(path: str, marker: dict | None):
    if marker is not None and marker.get("tokenizer", "char") == "char":
        tok_file = Path(path) / "tokenizer.json"
        if not tok_file.is_file():
            raise ValueError(f"{path}: gapo policy folder has no tokenizer.json")
        # Direct load: AutoTokenizer would substitute the model type's byte-level tokenizer.
        return PreTrainedTokenizerFast(
            tokenizer_file=str(tok_file),
            padding_side=marker.get("padding_side", "left"),
            **marker.get("special_tokens", SPECIAL_TOKENS),
        )
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"  # batched generation pads prompts on the left
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def _causal_classes() -> set[str]:
    names: set[str] = set()
    for v in (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or {}).values():
        names.update([v] if isinstance(v, str) else v)
    return names


# model types that are encoders first and causal LMs only with is_decoder=true (BERT and its kin)
try:
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES as _MASKED

    _ENCODER_TYPES = frozenset(_MASKED) & frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or {})
except ImportError:  # pragma: no cover - layout of older transformers
    _ENCODER_TYPES = frozenset()


def check_causal_lm(config, name: str) -> None:
    """The checkpoint's ``config.json`` describes a causal LM, checked before any weight loads:
    its ``model_type`` has a causal-LM class in transformers, and the ``architectures`` it was
    saved with (when listed) include a causal-LM class. A BERT folder saved from ``BertModel`` or
    ``BertForMaskedLM`` has a causal class for its type (``BertLMHeadModel``) but is not one, and
    would fail only mid-run; here it is one error naming the folder and its architecture."""
    mt = getattr(config, "model_type", None)
    archs = [a for a in (getattr(config, "architectures", None) or []) if isinstance(a, str)]
    what = f"a {mt!r} model" + (f" ({', '.join(archs)})" if archs else "")
    if MODEL_FOR_CAUSAL_LM_MAPPING_NAMES is not None and mt not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"{name!r} holds {what}, which is not a causal language model")
    causal = _causal_classes()
    if archs and not any(a in causal or a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        raise ValueError(
            f"{name!r} holds {what}, which is not a causal language model (config.json's "
            "architectures list no ...ForCausalLM / ...LMHeadModel class); gapo trains causal LMs"
        )


def load_policy(path_or_id: str | os.PathLike, device: str | torch.device = "cpu", *, dtype=None):
    """Load ``(model, tokenizer)`` from a gapo policy folder, a local HF checkpoint or a hub id.

    Raises ``ValueError`` when the path does not exist (and is not a hub-id-shaped string) or
    does not hold a causal LM. The model is returned in eval mode on ``device``.
    """
    name = str(path_or_id)
    local = Path(name).expanduser()
    is_local = local.exists()
    if not is_local:
        looks_like_id = name.count("/") <= 1 and not name.startswith((".", "/", "~"))
        if not looks_like_id or not name:
            raise ValueError(f"model path {name!r} does not exist")
    else:
        if not local.is_dir():
            raise ValueError(f"model path {name!r} is not a directory")
        if not (local / "config.json").is_file():
            raise ValueError(f"model path {name!r} has no config.json; it is not a Hugging Face model folder")
        name = str(local)
    try:
        config = AutoConfig.from_pretrained(name)
    except Exception as e:  # hub unreachable, bad id, corrupt config
        raise ValueError(f"cannot load a model config from {name!r}: {e}") from e
    check_causal_lm(config, name)
    marker = read_marker(name) if is_local else None
    kw = {"dtype": dtype} if dtype is not None else {}
    try:
        with _quiet_hf():
            model = AutoModelForCausalLM.from_pretrained(name, **kw)
    except Exception as e:
        raise ValueError(f"cannot load a causal LM from {name!r}: {e}") from e
    if config.model_type in _ENCODER_TYPES and not getattr(model.config, "is_decoder", False):
        # e.g. BertLMHeadModel without is_decoder: it attends to later tokens, so it is no causal LM
        raise ValueError(
            f"{name!r} holds a {config.model_type!r} encoder ({type(model).__name__}) without "
            "is_decoder=true in its config.json: it attends to later tokens, so it is not a causal "
            "language model; gapo trains decoder-only causal LMs"
        )
    try:
        tok = _load_tokenizer(name, marker)
    except ValueError:
        raise
    except Exception as e:  # a missing or corrupt tokenizer file
        raise ValueError(f"cannot load the tokenizer of {name!r}: {type(e).__name__}: {e}") from e
    model.to(device).eval()
    return model, tok


def eos_token_ids(model, tokenizer) -> tuple[int, ...]:
    """Every id at which sampling stops: the tokenizer's EOS, then each id of the model's
    ``generation_config.eos_token_id`` (an int or a list, as ``generation_config.json`` gives it;
    without one, ``config.eos_token_id``). Qwen2.5 base and Qwen2.5-Math, for example, have the
    tokenizer EOS ``<|endoftext|>`` while a chat turn ends in ``<|im_end|>``, which only
    ``generation_config.json`` lists: stopping at the tokenizer's EOS alone runs every rollout to
    ``max_new_tokens``. Ids outside the vocabulary are ignored (they could never be sampled)."""
    gen = getattr(model, "generation_config", None)
    ids = getattr(gen, "eos_token_id", None) if gen is not None else None
    if ids is None:
        ids = getattr(getattr(model, "config", None), "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    out: list[int] = []
    for i in [tokenizer.eos_token_id, *ids]:
        if isinstance(i, int) and not isinstance(i, bool) and i >= 0 and (vocab is None or i < vocab) and i not in out:
            out.append(i)
    return tuple(out)


def context_length(model) -> int | None:
    """The model's maximum sequence length, when its config declares one."""
    mc = model.config
    return next(
        (
            getattr(mc, k)
            for k in ("max_position_embeddings", "n_positions", "max_sequence_length")
            if isinstance(getattr(mc, k, None), int)
        ),
        None,
    )


def check_context(
    model, prompt_lengths: list[int], max_new_tokens: int, *, key: str, where: str, longest: str | None = None
) -> None:
    """``max_new_tokens`` after the longest prompt (in tokens) fits the model's context: an error
    naming ``key`` (and ``longest``, where that prompt came from) before a sampler allocates for a
    length the model cannot take. The advice is ``task.max_prompt_tokens`` (drop the long
    prompts), and a smaller ``sampling.max_new_tokens`` only where one would fit."""
    ctx = context_length(model)
    if ctx is None or not prompt_lengths:
        return
    n = max(prompt_lengths)
    if n + max_new_tokens > ctx:
        at = f" ({longest})" if longest else ""
        fix = (
            [f"set task.max_prompt_tokens={ctx - max_new_tokens} to drop longer prompts"]
            if ctx > max_new_tokens
            else []
        )
        if ctx - n >= 1:
            fix.append(f"set sampling.max_new_tokens to at most {ctx - n}")
        if not fix:
            fix = [f"lower sampling.max_new_tokens below {ctx} and set task.max_prompt_tokens"]
        raise ValueError(
            f"{key}: {max_new_tokens} new tokens after the longest prompt, {n} tokens{at}, exceed the "
            f"model's context of {ctx} tokens ({where!r}); " + ", or ".join(fix)
        )


def kv_cache_bytes(model, rows: int, length: int) -> int:
    """Bytes of the key/value cache for sampling ``rows`` sequences of ``length`` tokens (fp32)."""
    conf = model.config
    layers = getattr(conf, "num_hidden_layers", None)
    heads = getattr(conf, "num_attention_heads", None)
    if not layers or not heads:
        return 0
    kv_heads = getattr(conf, "num_key_value_heads", None) or heads
    head_dim = getattr(conf, "head_dim", None) or conf.hidden_size // heads
    return 2 * layers * kv_heads * head_dim * 4 * rows * length


def available_memory(device: torch.device) -> int | None:
    """Free memory on ``device`` in bytes (CPU: MemAvailable of /proc/meminfo), None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(model, device: torch.device, rows: int, length: int, *, where: str) -> None:
    """The sampler's KV cache for ``rows`` × ``length`` tokens fits the free memory: an error
    before the run, not an out-of-memory kill in its first step."""
    need, free = kv_cache_bytes(model, rows, length), available_memory(device)
    if free is not None and need > 0.8 * free:
        raise ValueError(
            f"sampling {rows} rollouts (train.prompts × train.group_size) of up to {length} tokens needs "
            f"~{need / 2**30:.1f} GiB of KV cache for {where!r}, more than the {free / 2**30:.1f} GiB "
            "free; lower train.prompts, train.group_size or sampling.max_new_tokens"
        )
