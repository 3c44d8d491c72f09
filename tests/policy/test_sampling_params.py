"""``SamplingParams``, ``DecodeOptions``, ``HeadMemory``: validation that names the field, and
``sample`` / ``logprobs`` taking them as objects only (0.3 dropped the keyword form)."""

import dataclasses
import warnings

import pytest
import torch

from gapo.policy.logprobs import HeadMemory, logprobs
from gapo.policy.model import build_model, build_tokenizer
from gapo.policy.sampling import DecodeOptions, SamplingParams, sample

torch.set_num_threads(1)

EOS, PAD = 2, 0


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer("0123456789+-*/()= ,\n:")


@pytest.fixture(scope="module")
def model(tok):
    m = build_model(len(tok), "micro", seed=0).eval()
    with torch.no_grad():  # a frequent EOS: rows stop at different lengths
        m.lm_head.weight[EOS] *= 6.0
    return m


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(s).input_ids for s in ["12+3=", "4,5,6:", "7", "(1+2)*3="]]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=-3), "max_new_tokens"),
        (dict(max_new_tokens=2.5), "max_new_tokens"),
        (dict(max_new_tokens=True), "max_new_tokens"),
        (dict(max_new_tokens=4, temperature=-0.1), "temperature"),
        (dict(max_new_tokens=4, temperature=float("nan")), "temperature"),
        (dict(max_new_tokens=4, temperature=float("inf")), "temperature"),
        (dict(max_new_tokens=4, temperature="0.7"), "temperature"),
        (dict(max_new_tokens=4, top_p=0.0), "top_p"),
        (dict(max_new_tokens=4, top_p=1.5), "top_p"),
        (dict(max_new_tokens=4, top_p=float("nan")), "top_p"),
        (dict(max_new_tokens=4, eos_token_id="2"), "eos_token_id"),
        (dict(max_new_tokens=4, eos_token_id=[2, 1.5]), "eos_token_id"),
        (dict(max_new_tokens=4, eos_token_id=True), "eos_token_id"),
        (dict(max_new_tokens=4, stop=[""]), "stop"),
        (dict(max_new_tokens=4, stop=["a", 3]), "stop"),
        (dict(max_new_tokens=4, stop=5), "stop"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_sampling_params_normalise_stops():
    p = SamplingParams(8, eos_token_id=[2, 5, 2], stop="Q:")
    assert p.eos_token_id == (2, 5) and p.stop == ("Q:",)
    assert SamplingParams(8, eos_token_id=7).eos_token_id == (7,)
    assert SamplingParams(8).eos_token_id is None  # "none given" (evaluate reads it as the model's own)
    assert SamplingParams(8, eos_token_id=[]).eos_token_id == ()  # "no stop token", explicitly
    assert SamplingParams(8) == SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 0.5


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (DecodeOptions, dict(check_every=0), "check_every"),
        (DecodeOptions, dict(check_every=2.0), "check_every"),
        (HeadMemory, dict(chunk_size=0), "chunk_size"),
        (HeadMemory, dict(max_chunk_bytes=-1), "max_chunk_bytes"),
        (HeadMemory, dict(max_saved_bytes=1.5), "max_saved_bytes"),
    ],
)
def test_bad_decode_options_and_head_memory_name_the_field(cls, kwargs, field):
    with pytest.raises(ValueError, match=field):
        cls(**kwargs)


def test_the_keyword_form_is_gone(model, prompts):
    """0.1's keywords (``max_new_tokens=``, ``fast=``, ``chunk_size=``) are Python's own TypeError."""
    p = SamplingParams(4)
    for kw in (dict(max_new_tokens=4), dict(params=p, fast=False), dict(params=p, _check_every=2)):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            sample(model, prompts, **kw)
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(TypeError, match="unexpected keyword argument 'chunk_size'"):
        logprobs(model, ids, ids, 2, chunk_size=3)


def test_new_form_warns_nothing(model, prompts):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sample(model, prompts, params=SamplingParams(3, temperature=0, eos_token_id=EOS))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(), TypeError, r"needs params=SamplingParams"),
        (dict(params=dict(max_new_tokens=4)), TypeError, "got dict"),
        (dict(params=SamplingParams(4, stop=["="])), ValueError, "tokenizer"),
    ],
)
def test_a_wrong_call_of_sample_names_the_problem(model, prompts, kwargs, error, match):
    with pytest.raises(error, match=match):
        sample(model, prompts, **kwargs)


def test_chunked_logprobs_are_the_samplers(model, prompts):
    """The sampler's log-probs are the ones recomputed (module docstring), chunked or not."""
    r = sample(model, prompts, params=SamplingParams(10, eos_token_id=EOS), generator=torch.Generator().manual_seed(1))
    T = r.completion_ids.shape[1]
    with torch.no_grad():
        chunked = logprobs(model, r.input_ids, r.attention_mask, T, memory=HeadMemory(chunk_size=3, max_saved_bytes=0))
        whole = logprobs(model, r.input_ids, r.attention_mask, T)
    m = r.response_mask.bool()
    assert torch.allclose(chunked[0][m], r.logp[m], atol=1e-5)
    assert torch.allclose(chunked[0][m], whole[0][m], atol=1e-6)
    assert torch.allclose(chunked[1][m], whole[1][m], atol=1e-5)


def test_numpy_scalars_are_numbers_and_kept_as_python_ints():
    np = pytest.importorskip("numpy")
    p = SamplingParams(np.int64(8), temperature=np.float32(0.5))
    assert p.max_new_tokens == 8 and type(p.max_new_tokens) is int
    assert type(HeadMemory(chunk_size=np.int32(4)).chunk_size) is int
    assert DecodeOptions(check_every=np.int16(2)).check_every == 2


def test_a_wrong_kind_of_options_or_memory_is_named(model, prompts):
    with pytest.raises(TypeError, match="options must be a DecodeOptions, got dict"):
        sample(model, prompts, params=SamplingParams(2), options={"fast": False})
    with pytest.raises(TypeError, match="memory must be a HeadMemory, got int"):
        logprobs(model, torch.ones(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.long), 2, memory=3)
