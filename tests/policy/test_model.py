"""The embedded policy: character tokenizer, model presets, exact save/load round trip."""

import json
import random

import pytest
import torch

from gapo.policy.model import MARKER, build_model, build_tokenizer, load_policy, n_params, save_policy

torch.set_num_threads(1)

ALPHABET = "0123456789+-*/()= ,\n:"


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(ALPHABET)


def _strings(n=50, seed=0):
    rng = random.Random(seed)
    return [
        rng.choice(["", " ", "\n"]) + "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 30))) for _ in range(n)
    ]


def test_tokenizer_is_character_level(tok):
    from transformers import PreTrainedTokenizerFast

    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(ALPHABET)
    vocab = tok.get_vocab()
    for s in _strings():
        ids = tok(s).input_ids
        assert ids == [1] + [vocab[c] for c in s]  # <bos> then one id per character
        assert tok(s, add_special_tokens=False).input_ids == ids[1:]
        assert tok.decode(ids, skip_special_tokens=True) == s
        assert tok.decode(ids[1:] + [tok.eos_token_id]) == s + "<eos>"
    assert tok("1x2", add_special_tokens=False).input_ids == [vocab["1"], 3, vocab["2"]]  # unknown -> <unk>


def test_tokenizer_rejects_bad_alphabets():
    with pytest.raises(ValueError):
        build_tokenizer("")


def test_tiny_preset_matches_design_reference(tok):
    m = build_model(22, "tiny")
    assert m.config.hidden_size == 128 and m.config.num_hidden_layers == 4
    assert abs(n_params(m) - 0.86e6) < 0.01e6
    with pytest.raises(ValueError, match="unknown model preset"):
        build_model(22, "huge")


def test_build_model_is_seeded(tok):
    a, b = build_model(len(tok), "micro", seed=3), build_model(len(tok), "micro", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def _assert_same_tokenizer(a, b):
    assert a.get_vocab() == b.get_vocab()
    assert (a.pad_token_id, a.bos_token_id, a.eos_token_id) == (b.pad_token_id, b.bos_token_id, b.eos_token_id)
    assert a.padding_side == b.padding_side == "left"
    for s in _strings(seed=1):
        assert a(s).input_ids == b(s).input_ids
        assert a.decode(a(s).input_ids) == b.decode(b(s).input_ids)
        assert b.decode(b(s).input_ids, skip_special_tokens=True) == s


def test_save_load_round_trip_is_exact(tmp_path, tok):
    m = build_model(len(tok), "micro", seed=1).eval()
    save_policy(m, tok, tmp_path / "p", extra={"note": "test"})
    m2, tok2 = load_policy(tmp_path / "p")
    _assert_same_tokenizer(tok, tok2)
    x = torch.tensor([tok(s).input_ids for s in ["12+3=45", "(7*8)-1"]])
    with torch.no_grad():
        assert torch.equal(m(x).logits, m2(x).logits)
    assert not m2.training
    assert json.loads((tmp_path / "p" / MARKER).read_text())["extra"] == {"note": "test"}


def test_round_trip_survives_a_model_type_tokenizer_class(tmp_path, tok):
    # transformers 5.x: AutoTokenizer honours a model-type tokenizer class and then drops the
    # character vocabulary's behaviour (e.g. spaces vanish). Our loader must not.
    from transformers import AutoTokenizer

    save_policy(build_model(len(tok), "micro"), tok, tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "LlamaTokenizerFast"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    auto = AutoTokenizer.from_pretrained(tmp_path)
    s = "1 + 2 = 3\n"
    broken = auto(s).input_ids != tok(s).input_ids or auto.decode(auto(s).input_ids, skip_special_tokens=True) != s
    _, tok2 = load_policy(tmp_path)
    _assert_same_tokenizer(tok, tok2)
    if not broken:  # pragma: no cover - only informative: a future transformers may fix this
        pytest.skip("AutoTokenizer no longer mangles the character tokenizer (our loader still works)")


def test_plain_hf_checkpoint_loads_through_the_same_function(tmp_path, tok):
    # A folder written by transformers alone (no gapo marker) is treated as a real checkpoint.
    m = build_model(len(tok), "micro", seed=2).eval()
    m.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    m2, tok2 = load_policy(str(tmp_path))
    assert tok2(" 1+2").input_ids == tok(" 1+2").input_ids
    x = torch.tensor([tok("9-8").input_ids])
    with torch.no_grad():
        assert torch.equal(m(x).logits, m2(x).logits)


def test_bad_paths_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_policy(tmp_path / "missing")
    with pytest.raises(ValueError, match="does not exist"):
        load_policy("./no/such/model")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        load_policy(tmp_path / "file.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        load_policy(tmp_path / "empty")
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "config.json").write_text(json.dumps({"model_type": "resnet"}))
    with pytest.raises(ValueError, match="not a causal language model"):
        load_policy(tmp_path / "vision")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 10}))
    with pytest.raises(ValueError, match="cannot load a causal LM"):
        load_policy(tmp_path / "noweights")
