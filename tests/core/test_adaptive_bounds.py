import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gapo.core.adaptive_bounds import (
    BOUND_SCHEDULES,
    bapo_bounds,
    bapo_path,
    bapo_shares,
    dcpo_bounds,
)
from gapo.core.method_params import BOUND_PARAMS, check_bound_params

NAN, INF = float("nan"), float("inf")

# ---------------------------------------------------------------- BAPO


def _bapo_batch():
    """Row 0: A = +1, ratios 1.0, 1.25, 1.35; row 1: A = -1, ratios 0.65, 0.75, 1.0; a padded column
    of NaN. Weights r·|A| are the ratios themselves."""
    ratio = torch.tensor([[1.0, 1.25, 1.35, NAN], [0.65, 0.75, 1.0, INF]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    return ratio, adv, mask


# path with a- = 0.6, a+ = 1.2, b- = 0.8, b+ = 1.4, δ = 0.1:
#   j   c_low c_high   S+                 S-                  ρ
#   0   0.6   1.2      1.0                0.65+0.75+1 = 2.4   1/3.4    = 0.294
#   1   0.6   1.3      2.25               2.4                 2.25/4.65 = 0.484
#   2   0.6   1.4      3.6                2.4                 3.6/6.0  = 0.6
#   3   0.7   1.4      3.6                1.75                3.6/5.35 = 0.673
#   4   0.8   1.4      3.6                1.0                 3.6/4.6  = 0.783
SMALL = {"b_minus": 0.8, "b_plus": 1.4, "delta_1": 0.1, "delta_2": 0.1}
HAND_SHARES = [1 / 3.4, 2.25 / 4.65, 0.6, 3.6 / 5.35, 3.6 / 4.6]


def test_bapo_path_hand_computed():
    c_low, c_high = bapo_path(eps_low=0.4, eps_high=0.2, **SMALL)
    assert c_low == pytest.approx([0.6, 0.6, 0.6, 0.7, 0.8])
    assert c_high == pytest.approx([1.2, 1.3, 1.4, 1.4, 1.4])
    # a last step shorter than δ lands on the range's end
    c_low, c_high = bapo_path(eps_low=0.4, eps_high=0.2, b_minus=0.65, b_plus=1.25, delta_1=0.1, delta_2=0.1)
    assert (c_low, c_high) == ([0.6, 0.6, 0.65], [1.2, 1.25, 1.25])


def test_bapo_paper_defaults_path_ends():
    c_low, c_high = bapo_path(
        eps_low=0.4, eps_high=0.2, **{k: v for k, v in BOUND_PARAMS["bapo"].items() if k != "rho_0"}
    )
    assert (c_low[0], c_high[0]) == pytest.approx((0.6, 1.2))
    assert (c_low[-1], c_high[-1]) == (0.9, 3.0)
    assert len(c_low) == 1 + 36 + 6  # (3.0 - 1.2)/0.05 upper steps, (0.9 - 0.6)/0.05 lower steps


def test_bapo_shares_hand_computed():
    ratio, adv, mask = _bapo_batch()
    c_low, c_high = bapo_path(eps_low=0.4, eps_high=0.2, **SMALL)
    assert bapo_shares(ratio, adv, mask, c_low, c_high).tolist() == pytest.approx(HAND_SHARES, rel=1e-6)


@pytest.mark.parametrize(
    ("rho_0", "expected"),
    [
        (0.25, (0.4, 0.2)),  # met at the start
        (0.5, (0.4, 0.4)),  # j = 2: c_high raised twice
        (0.65, (0.3, 0.4)),  # j = 3: c_high at its end, c_low raised once
        (0.7, (0.2, 0.4)),  # j = 4: both at their ends, met there
        (0.9, (0.2, 0.4)),  # unreachable: both at their upper ends
    ],
)
def test_bapo_bounds_stop_at_first_step_reaching_rho_0(rho_0, expected):
    ratio, adv, mask = _bapo_batch()
    got = bapo_bounds(ratio, ratio, adv, mask, eps_low=0.4, eps_high=0.2, rho_0=rho_0, **SMALL)
    assert got == pytest.approx(expected, abs=1e-12)
    assert all(isinstance(v, float) for v in got)


def test_bapo_token_advantages_and_row_advantages_agree():
    ratio, adv, mask = _bapo_batch()
    adv_bt = adv.unsqueeze(-1).expand(2, 4).clone()
    adv_bt[:, 3] = NAN  # padding
    row = bapo_bounds(ratio, ratio, adv, mask, eps_low=0.4, eps_high=0.2, rho_0=0.65, **SMALL)
    tok = bapo_bounds(ratio, ratio, adv_bt, mask, eps_low=0.4, eps_high=0.2, rho_0=0.65, **SMALL)
    assert row == tok


def test_bapo_counts_only_unclipped_tokens():
    # one positive token far above every c_high: clipped, so S+ = 0 and the loop runs to the ends
    ratio = torch.tensor([[5.0], [1.0]])
    adv = torch.tensor([1.0, -1.0])
    got = bapo_bounds(ratio, ratio, adv, torch.ones(2, 1), eps_low=0.4, eps_high=0.2, **SMALL)
    assert got == pytest.approx((0.2, 0.4))
    # a negative token below every c_low never counts: S- = 0 -> ρ = 1, met at the start
    ratio = torch.tensor([[1.0], [0.1]])
    got = bapo_bounds(ratio, ratio, adv, torch.ones(2, 1), eps_low=0.4, eps_high=0.2, **SMALL)
    assert got == pytest.approx((0.4, 0.2))


def test_bapo_no_signal_keeps_the_start():
    ratio = torch.ones(2, 3)
    got = bapo_bounds(ratio, ratio, torch.zeros(2), torch.ones(2, 3), eps_low=0.2, eps_high=0.28)
    assert got == pytest.approx((0.2, 0.28))


def _reference_bapo(ratio, adv, mask, widths, params):
    """The loop, written out token by token in plain Python (module docstring)."""
    eps_low, eps_high = widths["eps_low"], widths["eps_high"]
    rho_0, b_minus, b_plus = params["rho_0"], params["b_minus"], params["b_plus"]
    delta_1, delta_2 = params["delta_1"], params["delta_2"]
    adv = adv.unsqueeze(-1).expand_as(ratio) if adv.ndim == 1 else adv
    toks = [(r, a) for r, a, m in zip(ratio.flatten().tolist(), adv.flatten().tolist(), mask.flatten().tolist()) if m]

    def share(cl, ch):
        sp = sum(r * a for r, a in toks if a > 0 and r <= ch)
        sn = sum(-r * a for r, a in toks if a < 0 and r >= cl)
        return 1.0 if sn == 0 else sp / (sp + sn)

    cl, ch = 1 - eps_low, 1 + eps_high
    path, shares = [(cl, ch)], [share(cl, ch)]
    while shares[-1] < rho_0 and (ch < b_plus or cl < b_minus):
        if ch < b_plus:
            ch = min(ch + delta_1, b_plus)
        else:
            cl = min(cl + delta_2, b_minus)
        path.append((cl, ch))
        shares.append(share(cl, ch))
    return (1 - cl, ch - 1), path, shares


@st.composite
def _batches(draw):
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    ratio = torch.exp(0.6 * torch.randn(B, T, generator=g))
    per_token = draw(st.booleans())
    adv = torch.randn((B, T) if per_token else (B,), generator=g)
    mask = (torch.rand(B, T, generator=g) < 0.8).long()
    ratio = torch.where(mask.bool(), ratio, torch.tensor(NAN))
    params = {
        "rho_0": draw(st.floats(0.0, 1.0)),
        "b_minus": draw(st.floats(0.7, 1.0)),
        "b_plus": draw(st.floats(1.3, 3.0)),
        "delta_1": draw(st.floats(0.01, 0.5)),
        "delta_2": draw(st.floats(0.01, 0.5)),
    }
    # the ranges' starts 1 - eps_low, 1 + eps_high lie inside [., b_minus], [., b_plus]
    widths = {"eps_low": draw(st.floats(1.0 - params["b_minus"], 0.4)), "eps_high": draw(st.floats(0.0, 0.3))}
    return ratio, adv, mask, params, widths


@settings(max_examples=150, deadline=None)
@given(batch=_batches())
def test_bapo_matches_reference_loop_and_stays_in_range(batch):
    ratio, adv, mask, params, widths = batch
    eps_low, eps_high = bapo_bounds(ratio, ratio, adv, mask, **widths, **params)
    (ref_low, ref_high), ref_path, ref_shares = _reference_bapo(ratio, adv, mask, widths, params)
    assert (eps_low, eps_high) == pytest.approx((ref_low, ref_high), abs=1e-9)
    # within the ranges [a-, b-] and [a+, b+]
    assert 1 - params["b_minus"] - 1e-12 <= eps_low <= widths["eps_low"] + 1e-12
    assert widths["eps_high"] - 1e-12 <= eps_high <= params["b_plus"] - 1 + 1e-12
    # the vectorised shares are the loop's at the loop's bounds (whose repeated additions may take
    # one more, rounding-sized, step than bapo_path's multiples of δ) ...
    ref_low_path, ref_high_path = (list(c) for c in zip(*ref_path))
    got = bapo_shares(ratio, adv, mask, ref_low_path, ref_high_path).tolist()
    assert got == pytest.approx(ref_shares, rel=1e-9, abs=1e-12)
    # ... and never decrease along the whole path
    c_low, c_high = bapo_path(**widths, **{k: v for k, v in params.items() if k != "rho_0"})
    shares = bapo_shares(ratio, adv, mask, c_low, c_high).tolist()
    assert all(b >= a - 1e-12 for a, b in zip(shares, shares[1:]))


def test_bapo_input_errors():
    ratio, adv, mask = _bapo_batch()
    bad = ratio.clone()
    bad[0, 0] = INF  # a response token
    with pytest.raises(ValueError, match="finite on response tokens"):
        bapo_bounds(bad, ratio, adv, mask, eps_low=0.2, eps_high=0.2)
    with pytest.raises(ValueError, match="advantages"):
        bapo_bounds(ratio, ratio, torch.ones(3), mask, eps_low=0.2, eps_high=0.2)
    with pytest.raises(ValueError, match="shape mismatch"):
        bapo_bounds(ratio, ratio, adv, mask[:, :2], eps_low=0.2, eps_high=0.2)
    with pytest.raises(ValueError, match="b_minus"):  # a- = 0.95 above b- = 0.9
        bapo_bounds(ratio, ratio, adv, mask, eps_low=0.05, eps_high=0.2)
    with pytest.raises(ValueError, match="b_plus"):  # a+ = 3.5 above b+ = 3.0
        bapo_bounds(ratio, ratio, adv, mask, eps_low=0.2, eps_high=2.5)
    with pytest.raises(ValueError, match="eps_low must be a finite number >= 0"):
        bapo_bounds(ratio, ratio, adv, mask, eps_low=-0.1, eps_high=0.2)
    with pytest.raises(ValueError, match="delta_1=1e-06"):
        bapo_bounds(ratio, ratio, adv, mask, eps_low=0.2, eps_high=0.2, delta_1=1e-6)
    with pytest.raises(ValueError, match="rho_0 must be a finite number in \\[0, 1\\]"):
        bapo_bounds(ratio, ratio, adv, mask, eps_low=0.2, eps_high=0.2, rho_0=1.5)


# ---------------------------------------------------------------- DCPO


def _dcpo(q, *, eps_low=0.16, eps_high=0.2, **params):
    logp = torch.log(torch.tensor([q], dtype=torch.float32))
    lo, hi = dcpo_bounds(
        logp, logp, torch.zeros(1), torch.ones_like(logp), eps_low=eps_low, eps_high=eps_high, **params
    )
    return lo[0].tolist(), hi[0].tolist()


def test_dcpo_hand_computed():
    lo, hi = _dcpo([1.0, 0.8, 0.25, 0.01, 0.001])
    # q = 1: lower = (1 + sqrt(1 - 0.64))/2 = 0.8; upper = (1 + sqrt(1.8))/2
    # q = 0.8: lower = (1 + sqrt(0.2))/2, upper = (1 + sqrt(2))/2
    # q = 0.25: 4·0.16/0.25 > 1 -> lower = 0.5; upper = (1 + sqrt(4.2))/2
    # q = 0.01: upper = (1 + sqrt(81))/2 = 5; q = 0.001: (1 + sqrt(801))/2 = 14.65 -> r_max = 10
    assert lo == pytest.approx([0.2, 0.5 - 0.5 * math.sqrt(0.2), 0.5, 0.5, 0.5], abs=1e-6)
    assert hi == pytest.approx(
        [(math.sqrt(1.8) - 1) / 2, (math.sqrt(2) - 1) / 2, (math.sqrt(4.2) - 1) / 2, 4.0, 9.0], abs=1e-5
    )
    assert _dcpo([0.01], r_max=3.0)[1] == pytest.approx([2.0])


def test_dcpo_bounds_solve_the_defining_equation():
    # the bounds r solve q·r·|r - 1| = ε: lower's r(1 - r) = ε_low/q (where 4ε_low <= q), upper's r(r - 1) = ε_high/q
    q = torch.tensor([0.7, 0.9, 1.0, 0.5, 0.2], dtype=torch.float64)
    lo, hi = _dcpo(q.tolist(), eps_low=0.1, eps_high=0.3, r_max=1e6)
    lower, upper = 1 - torch.tensor(lo, dtype=torch.float64), 1 + torch.tensor(hi, dtype=torch.float64)
    assert (q * lower * (1 - lower))[:4].tolist() == pytest.approx([0.1] * 4, rel=1e-5)
    assert lower[4].item() == 0.5  # q = 0.2 < 4·ε_low: no root, the vertex 0.5
    assert (q * upper * (upper - 1)).tolist() == pytest.approx([0.3] * 5, rel=1e-5)


def test_dcpo_limits():
    # q -> 1: the q = 1 bounds, 0.5 ± 0.5·sqrt(1 ∓ 4ε): not 1 ∓ ε
    lo, hi = _dcpo([1.0 - 1e-7], eps_low=0.1, eps_high=0.1)
    assert lo[0] == pytest.approx(0.5 - 0.5 * math.sqrt(0.6), abs=1e-6)
    assert hi[0] == pytest.approx(0.5 * math.sqrt(1.4) - 0.5, abs=1e-6)
    assert lo[0] != pytest.approx(0.1, abs=1e-3)
    # q -> 0: lower -> 0.5, upper -> r_max; log-probs far below float32's range stay finite
    logp = torch.tensor([[-30.0, -200.0, -INF, -1e30]])
    lo, hi = dcpo_bounds(logp, logp, torch.zeros(1), torch.ones_like(logp), eps_low=0.16, eps_high=0.2)
    assert lo.tolist() == [[0.5] * 4] and hi.tolist() == [[9.0] * 4]
    # zero widths: the ratio is pinned at 1 for every q, q -> 0 included
    lo, hi = dcpo_bounds(logp, logp, torch.zeros(1), torch.ones_like(logp), eps_low=0.0, eps_high=0.0)
    assert lo.tolist() == [[0.0] * 4] and hi.tolist() == [[0.0] * 4]


def test_dcpo_padding_is_finite_and_irrelevant():
    logp = torch.tensor([[-0.1, NAN, INF, -INF], [-2.0, -3.0, NAN, NAN]])
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0]])
    lo, hi = dcpo_bounds(logp, logp, torch.zeros(2), mask, eps_low=0.16, eps_high=0.2)
    assert torch.isfinite(lo).all() and torch.isfinite(hi).all()
    q1_lo, q1_hi = _dcpo([1.0])
    assert lo[0, 1:].tolist() == pytest.approx(q1_lo * 3) and hi[1, 2:].tolist() == pytest.approx(q1_hi * 2)
    clean = torch.where(mask.bool(), logp, torch.tensor(-0.5))
    lo2, hi2 = dcpo_bounds(clean, clean, torch.zeros(2), mask, eps_low=0.16, eps_high=0.2)
    assert torch.equal(lo[mask.bool()], lo2[mask.bool()]) and torch.equal(hi[mask.bool()], hi2[mask.bool()])


@settings(max_examples=200, deadline=None)
@given(
    logp=st.lists(st.floats(-120.0, 0.0), min_size=2, max_size=30),
    eps_low=st.floats(0.0, 0.5),
    eps_high=st.floats(0.0, 2.0),
    r_max=st.floats(1.0, 50.0),
)
def test_dcpo_monotone_in_q_and_in_range(logp, eps_low, eps_high, r_max):
    x = torch.tensor(sorted(logp)).unsqueeze(0)  # q increasing along the row
    lo, hi = dcpo_bounds(x, x, torch.zeros(1), torch.ones_like(x), eps_low=eps_low, eps_high=eps_high, r_max=r_max)
    lo, hi = lo[0], hi[0]
    assert torch.isfinite(lo).all() and torch.isfinite(hi).all()
    assert ((lo >= 0) & (lo <= 0.5)).all() and ((hi >= 0) & (hi <= r_max - 1 + 1e-6)).all()
    # a likelier token gets no wider bounds: both widths non-increasing in q
    assert (lo[1:] <= lo[:-1] + 1e-6).all() and (hi[1:] <= hi[:-1] + 1e-5).all()


def test_dcpo_width_and_param_errors():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="eps_high must be a finite number >= 0"):
        dcpo_bounds(x, x, torch.zeros(1), torch.ones_like(x), eps_low=0.1, eps_high=NAN)
    with pytest.raises(ValueError, match="r_max must be a finite number >= 1"):
        dcpo_bounds(x, x, torch.zeros(1), torch.ones_like(x), eps_low=0.1, eps_high=0.2, r_max=0.5)


# ---------------------------------------------------------------- registry and params


def test_registry_names_defaults_and_common_signature():
    assert set(BOUND_SCHEDULES) == set(BOUND_PARAMS) == {"bapo", "dcpo"}
    ratio, adv, mask = _bapo_batch()
    logp = torch.log(torch.where(mask.bool(), torch.tensor(0.5), torch.tensor(NAN)))
    for name, fn in BOUND_SCHEDULES.items():
        assert check_bound_params(name, BOUND_PARAMS[name]) is None
        eps_low, eps_high = fn(ratio, logp, adv, mask, eps_low=0.2, eps_high=0.2, **BOUND_PARAMS[name])
        assert torch.isfinite(torch.as_tensor(eps_low)).all() and torch.isfinite(torch.as_tensor(eps_high)).all()


@pytest.mark.parametrize(
    ("name", "params", "expected"),
    [
        ("bappo", {}, "unknown bound schedule 'bappo'.*Did you mean 'bapo'"),
        ("bapo", {"rho0": 0.5}, "unknown bapo bound param 'rho0'.*'b_minus'.*Did you mean 'rho_0'"),
        ("dcpo", {"rho_0": 0.5}, "unknown dcpo bound param 'rho_0'; known: \\['r_max'\\]"),
        ("bapo", {"rho_0": 1.5}, "bapo bound param rho_0 must be a finite number in \\[0, 1\\], got 1.5"),
        ("bapo", {"b_minus": 0.0}, "b_minus must be a finite number in \\(0, 1\\]"),
        ("bapo", {"b_plus": 0.9}, "b_plus must be a finite number >= 1"),
        ("bapo", {"delta_1": 0.0}, "delta_1 must be a finite number > 0"),
        ("bapo", {"delta_2": NAN}, "delta_2 must be a finite number > 0, got nan"),
        ("bapo", {"delta_2": True}, "delta_2 must be a finite number > 0, got True"),
        ("dcpo", {"r_max": INF}, "r_max must be a finite number >= 1, got inf \\(params: \\['r_max'\\]\\)"),
        ("dcpo", {"r_max": "10"}, "r_max must be a finite number >= 1, got '10'"),
    ],
)
def test_check_bound_params_messages(name, params, expected):
    msg = check_bound_params(name, params)
    assert msg is not None
    assert re.search(expected, msg), msg


def test_check_bound_params_accepts_domain_edges():
    assert check_bound_params("bapo", {"rho_0": 0, "b_minus": 1, "b_plus": 1, "delta_1": 1e-3}) is None
    assert check_bound_params("dcpo", {"r_max": 1}) is None
