"""GAPO inside verl: the registered policy losses ``gapo`` (token ratio) and ``gapo_seq`` (GSPO).

Supported verl: ``>=0.9.1,<0.10`` (tested: 0.9.1). Selecting it in a verl run::

    actor_rollout_ref.actor.policy_loss.loss_mode=gapo          # or gapo_seq
    +actor_rollout_ref.actor.policy_loss.eps_high_max=0.28      # optional, see below

**Configuration.** verl builds the actor config with ``hydra.utils.instantiate``, which calls
``verl.workers.config.PolicyLossConfig(**policy_loss)``. While this module is loaded, that call
returns a :class:`GAPOPolicyLossConfig` for ``loss_mode=gapo|gapo_seq`` (:func:`install`),
so GAPO's ``+policy_loss.*`` keys need no ``_target_`` override and are checked in verl's
``validate_config`` at start-up; a GAPO key with another loss mode, or an unknown key with a GAPO
loss mode, is a ``TypeError`` naming the fix. ``policy_loss._target_=gapo.integrations.verl.
GAPOPolicyLossConfig`` still works (and imports this module where verl's plugins are disabled).

**Loading.** gapo declares the ``verl.plugins`` entry point ``gapo = gapo.integrations.verl``,
so ``import verl`` imports this module in every process (driver and Ray workers), and the import
runs :func:`install` -- the one place gapo changes verl: the two losses registered,
``PolicyLossConfig.__new__`` (the config dispatch above) and ``ActorConfig.validate`` (GAPO's
start-up checks) wrapped. It is idempotent; :func:`uninstall` restores verl's own objects and
:func:`installed` says which state holds. ``VERL_USE_EXTERNAL_MODULES=gapo.integrations.verl`` does the same
explicitly. verl swallows a plugin's import error (DEBUG log only), so when this module fails to
import it logs the cause at ERROR level and registers ``gapo``/``gapo_seq`` as stubs that raise
it, instead of leaving verl to say "Unsupported loss mode" later.

**ε.** ``ε_low`` is verl's ``clip_ratio_low`` (falling back to ``clip_ratio``). Each rollout's
upper width runs from ``ε_low`` (no headroom) to ``ε_high_max`` (the lone success of a hard
group), docs/design.md §2.5 / the paper's Eq. 11::

    w_i = clamp((R_i − mean_group R) / ((G−1)/G · (R_max − R_min)), 0, 1)
    ε_high(i) = ε_low + (ε_high_max − ε_low)·w_i          (eps_schedule "linear"; "log" also offered)

``ε_high_max`` is ``policy_loss.eps_high_max`` or, when unset, verl's ``clip_ratio_high``.
Setting both to different values with ``clip_ratio_high`` not equal to ``clip_ratio_low`` is
ambiguous and rejected.

**Group success from advantages.** verl calls a policy loss with advantages, not rewards, so
``w_i`` (and, for binary rewards, the group success count ``c``) is recovered per row from the
row's own advantage, with ``G = actor.rollout_n``, and checked on every call
(:mod:`gapo.integrations.verl_success`, whose docstring states the formulas, what they need and
what ``reward_range=group|batch`` allows). The defaults (``adv_estimator="grpo"``,
``norm_adv_by_std_in_grpo=False``, rewards in ``[0, 1]``, binary) are the paper's recipe and
apply when no GAPO key is set.

**Loss.** ``gapo.core.losses.policy_loss`` with verl's aggregation normalisers (``global_batch_info``);
``gapo`` applies verl's dual clip (``clip_ratio_c``) like ``vanilla``; ``gapo_seq`` has none,
like ``gspo``. With ``ε_high_max == ε_low`` they equal verl's ``vanilla`` and ``gspo``
(tests/integrations/test_verl.py). ``rollout_is_weights`` (verl's rollout correction) multiply the per-token
loss after clipping, as in verl's own losses. NaN or ±inf at padded positions of any input change
neither loss, gradient nor metrics, in every ``loss_agg_mode`` (verl's ``vanilla`` masks NaN
log-probs only in ``token-mean``/``token-sum``; tests/integrations/test_verl_padding.py).

**Metrics.** verl's keys ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``, plus
``actor/gapo_eps_high_mean``, ``actor/gapo_success_weight_mean``, ``actor/gapo_clipfrac_high``,
``actor/gapo_clipfrac_low`` (rates over this micro-batch's response tokens), and with binary
rewards the per-``c`` sums of :mod:`gapo.integrations.verl_metrics` (whose
``clip_stats_from_verl`` turns one logged step into gapo's ``clip/*_by_c/{c}`` rates).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any

import torch

__all__ = [
    "GAPOPolicyLossConfig",
    "SUPPORTED_VERL",
    "TESTED_VERL",
    "compute_policy_loss_gapo",
    "compute_policy_loss_gapo_seq",
    "install",
    "installed",
    "uninstall",
]

SUPPORTED_VERL = ">=0.9.1,<0.10"
TESTED_VERL = "0.9.1"
LOSS_MODES = ("gapo", "gapo_seq")

_log = logging.getLogger(__name__)


def _require_supported_verl() -> str:
    # lazy: verl is the optional [verl] extra, and this check is what reports it missing or unsupported
    from packaging.version import InvalidVersion, Version

    try:
        import verl
    except ImportError as exc:
        raise ImportError(f"gapo.integrations.verl needs verl{SUPPORTED_VERL}: pip install 'gapo[verl]'") from exc
    version = getattr(verl, "__version__", "unknown")
    try:
        ok = Version("0.9.1") <= Version(version) < Version("0.10")
    except (InvalidVersion, TypeError):  # "unknown" (no __version__), or not a string
        ok = False
    if not ok:
        raise ImportError(
            f"gapo.integrations.verl supports verl{SUPPORTED_VERL} (tested {TESTED_VERL}); "
            f"found verl {version}. Install a supported verl: pip install 'gapo[verl]'"
        )
    return version


def _announce_failure(exc: BaseException) -> None:
    """Make an import failure loud: verl's plugin loader would hide it at DEBUG level."""
    msg = f"gapo's verl plugin failed to load, so loss modes {LOSS_MODES} are unusable: {exc!r}"
    _log.error(msg)
    try:  # lazy: verl itself may be what failed to import
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
    except Exception:  # noqa: BLE001 - verl itself may be what failed, in any way
        return

    def _broken(*args, **kwargs):  # stands in for verl's function, whatever verl passes it
        raise RuntimeError(msg) from exc

    for name in LOSS_MODES:
        POLICY_LOSS_REGISTRY.setdefault(name, _broken)


try:
    VERL_VERSION = _require_supported_verl()
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss
    from verl.workers.config import ActorConfig, PolicyLossConfig

    from gapo.core.clipping import eps_high_from_weight
    from gapo.core.losses import policy_loss
    from gapo.core.surrogate import ClipBounds
    from gapo.integrations.verl_config import check_gapo_fields, gapo_params, verl_agg_norms
    from gapo.integrations.verl_metrics import metrics_by_c
    from gapo.integrations.verl_success import row_advantages, success_from_advantages
except BaseException as _exc:  # noqa: BLE001 - re-raised after making it visible
    _announce_failure(_exc)
    raise


# --------------------------------------------------------------------------------------------
# configuration


@dataclass
class GAPOPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus GAPO's fields (what ``PolicyLossConfig(loss_mode="gapo", ...)``
    builds while this module is loaded, or select it with ``policy_loss._target_``).

    Args:
        loss_mode: ``"gapo"`` (token ratio) or ``"gapo_seq"`` (GSPO sequence ratio).
        eps_high_max: upper width of the lone success of a hard group; ``None`` uses verl's
            ``clip_ratio_high``.
        eps_schedule: ``"linear"`` (the paper's Eq. 11) or ``"log"``.
        reward_min, reward_max: the range of the scalar (summed) reward.
        reward_range: ``None`` (use ``reward_min``/``reward_max``), ``[lo, hi]`` (the same thing
            in the core's spelling), or ``"group"`` / ``"batch"``: the core's range from each
            group's (the batch's) own rewards, which verl's loss can recover from a row's
            advantage only for std-normalised GRPO advantages of binary rewards (module
            docstring); anything else is rejected at start-up.
        adv_estimator, norm_adv_by_std_in_grpo: must equal ``algorithm.*`` of the run; they say
            how to read group success back from the advantage (module docstring).
        binary_rewards: rewards take only the values ``reward_min``/``reward_max``; enables the
            integer-count check, and is required for std-normalised GRPO advantages.
    """

    loss_mode: str = "gapo"
    eps_high_max: float | None = None
    eps_schedule: str = "linear"
    reward_min: float = 0.0
    reward_max: float = 1.0
    reward_range: Any = None
    adv_estimator: str = "grpo"
    norm_adv_by_std_in_grpo: bool = False
    binary_rewards: bool = True

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        if self.loss_mode not in LOSS_MODES:
            raise ValueError(
                f"GAPOPolicyLossConfig: loss_mode must be one of {LOSS_MODES}, got "
                f"{self.loss_mode!r} (GAPO's fields would be ignored by other losses)"
            )
        check_gapo_fields(self)


# --------------------------------------------------------------------------------------------
# ``loss_mode=gapo`` with verl's own ``_target_``: instantiate GAPOPolicyLossConfig

_VERL_FIELDS = frozenset(f.name for f in fields(PolicyLossConfig))
RENAMED = {"schedule": "eps_schedule"}  # gapo 0.3: one spelling of the ε schedule, as algo.eps_schedule
GAPO_FIELDS = tuple(f.name for f in fields(GAPOPolicyLossConfig) if f.name not in _VERL_FIELDS)


def _policy_loss_config_new(cls, *args, **kwargs):  # verl's PolicyLossConfig fields, as verl passes them
    """``PolicyLossConfig.__new__`` while this module is loaded (see :func:`_install_config_dispatch`).

    ``PolicyLossConfig(loss_mode="gapo"|"gapo_seq", ...)`` returns a :class:`GAPOPolicyLossConfig`
    (a subclass, so Python then runs *its* ``__init__`` with the same keyword arguments, GAPO's
    fields included). GAPO fields with another loss mode, and unknown keys with a GAPO loss mode,
    are a ``TypeError`` that names the fix. Everything else is left to verl.
    """
    if cls is PolicyLossConfig:
        mode = kwargs.get("loss_mode", "vanilla")
        if mode in LOSS_MODES:
            cls = GAPOPolicyLossConfig
        else:
            ours = sorted(k for k in kwargs if k in GAPO_FIELDS)
            if ours:
                raise TypeError(
                    f"actor_rollout_ref.actor.policy_loss has GAPO's field(s) {ours} but loss_mode={mode!r}; "
                    f"they apply only to loss_mode={' or '.join(LOSS_MODES)} (set "
                    "actor_rollout_ref.actor.policy_loss.loss_mode=gapo or gapo_seq, or drop the "
                    "+actor_rollout_ref.actor.policy_loss.* overrides)"
                )
    if issubclass(cls, GAPOPolicyLossConfig):
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in kwargs if k not in known)
        renamed = [f"policy_loss.{k} is now policy_loss.{RENAMED[k]}" for k in unknown if k in RENAMED]
        if renamed:
            raise TypeError(f"actor_rollout_ref.actor.{'; '.join(renamed)} (docs/scale-out.md, verl section)")
        if unknown:
            raise TypeError(
                f"actor_rollout_ref.actor.policy_loss: unknown key(s) {unknown} for loss_mode="
                f"{kwargs.get('loss_mode', 'gapo')!r}; GAPO's keys are {list(GAPO_FIELDS)} "
                "(docs/scale-out.md, verl section)"
            )
    return object.__new__(cls)


def _install_config_dispatch() -> None:
    """Make verl's own ``PolicyLossConfig`` target build GAPO's config for GAPO's loss modes.

    verl builds the actor config with ``hydra.utils.instantiate`` (``omega_conf_to_dataclass``,
    ``_convert_="partial"``), which calls ``verl.workers.config.PolicyLossConfig(**policy_loss)``:
    keys added with ``+actor_rollout_ref.actor.policy_loss.eps_high_max=...`` would be an
    "unexpected keyword argument" there. Replacing the class's ``__new__`` (it has none of its own;
    ``object.__new__`` is used otherwise) changes nothing for other loss modes, for copies and
    pickles (``__new__`` without arguments), or for an explicit ``_target_``.
    """
    current = PolicyLossConfig.__dict__.get("__new__")
    if current is not None and getattr(current, "__func__", current) is _policy_loss_config_new:
        return
    if current is not None and getattr(current, "__func__", current).__module__ != __name__:
        _log.warning("verl's PolicyLossConfig already has a __new__ (%r); gapo replaces it", current)
    PolicyLossConfig.__new__ = staticmethod(_policy_loss_config_new)


def _actor_validate(self, n_gpus: int, train_batch_size: int, model_config: dict = None):
    """``ActorConfig.validate`` while this module is loaded: verl's own checks, then, for
    ``loss_mode=gapo|gapo_seq``, GAPO's checks that need the whole actor config (``gapo_params``):
    ``eps_high_max`` >= ``clip_ratio_low``, an unambiguous ``clip_ratio_high``, ``rollout_n`` >= 2.

    verl's ``validate_config`` calls this in the driver before Ray, the rollout engine or a rollout
    start, so a bad combination stops the run in seconds instead of at the first loss call. The
    loss still checks again on every call (a config built by hand skips ``validate``).
    """
    _actor_validate.verl(self, n_gpus, train_batch_size, model_config)
    pl = self.get("policy_loss", None)
    mode = pl.get("loss_mode", None) if pl is not None else None
    if mode in LOSS_MODES:
        try:
            gapo_params(self)
        except ValueError as exc:
            raise ValueError(f"actor_rollout_ref.actor with policy_loss.loss_mode={mode}: {exc}") from None


def _install_actor_validation() -> None:
    """Wrap ``ActorConfig.validate`` with :func:`_actor_validate` (idempotent; verl's subclasses
    call ``super().validate``, so FSDP and Megatron actors get it too)."""
    current = ActorConfig.__dict__["validate"]
    if current is _actor_validate:
        return
    _actor_validate.verl = current
    ActorConfig.validate = _actor_validate


# --------------------------------------------------------------------------------------------
# the losses


def _gapo_loss(level, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights):
    p = gapo_params(config)
    a_row = row_advantages(advantages, response_mask)
    w, c = success_from_advantages(
        a_row,
        p.group_size,
        adv_estimator=p.adv_estimator,
        norm_adv_by_std_in_grpo=p.norm_by_std,
        reward_range=p.reward_range,
        binary_rewards=p.binary,
    )
    eps_high = eps_high_from_weight(w, eps_low=p.eps_low, eps_high_max=p.eps_high_max, eps_schedule=p.eps_schedule).to(
        log_prob.device
    )
    mode, norms = verl_agg_norms(loss_agg_mode, config.get("global_batch_info", None))
    bounds = ClipBounds(p.eps_low, eps_high, p.clip_ratio_c if level == "token" else None)
    loss, m = policy_loss(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        bounds,
        level=level,
        agg=mode,
        weights=rollout_is_weights,
        norms=norms,
    )
    metrics = {
        "actor/pg_clipfrac": m["loss/clipfrac"].item(),
        "actor/ppo_kl": m["loss/approx_kl"].item(),
        "actor/pg_clipfrac_lower": m["loss/clipfrac_dual"].item(),
        "actor/gapo_eps_high_mean": m["clip/eps_high_mean"].item(),
        "actor/gapo_success_weight_mean": w.mean().item() if w.numel() else 0.0,
        "actor/gapo_clipfrac_high": m["loss/clipfrac_high"].item(),
        "actor/gapo_clipfrac_low": m["loss/clipfrac_low"].item(),
    }
    if c is not None:
        metrics.update(metrics_by_c(level, old_log_prob, log_prob, a_row, response_mask, c, eps_high, p))
    return loss, metrics


def compute_policy_loss_gapo(
    old_log_prob: torch.Tensor,  # (B, T)
    log_prob: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T), constant over each response
    response_mask: torch.Tensor,  # (B, T)
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl loss mode ``gapo``: PPO token-ratio surrogate with GAPO's per-rollout ε_high and
    verl's dual clip (arXiv 2609.00444, 1707.06347, 1912.09729)."""
    return _gapo_loss(
        "token", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )


def compute_policy_loss_gapo_seq(
    old_log_prob: torch.Tensor,  # (B, T)
    log_prob: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B, T)
    response_mask: torch.Tensor,  # (B, T)
    loss_agg_mode: str = "seq-mean-token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl loss mode ``gapo_seq``: GSPO sequence-ratio surrogate (GSPO-token gradient) with GAPO's
    per-rollout ε_high, no dual clip, like verl's ``gspo`` (arXiv 2609.00444, 2507.18071)."""
    return _gapo_loss(
        "sequence", old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    )


def _register() -> None:
    for name, fn in (("gapo", compute_policy_loss_gapo), ("gapo_seq", compute_policy_loss_gapo_seq)):
        prev = POLICY_LOSS_REGISTRY.get(name)
        if prev is not None and getattr(prev, "__module__", None) != __name__:
            _log.warning(
                "verl policy loss %r was registered by %s; gapo replaces it", name, getattr(prev, "__module__", prev)
            )
        register_policy_loss(name)(fn)


# --------------------------------------------------------------------------------------------
# the one place this module changes verl: install() / uninstall()

_VERL_ORIGINALS: dict = {}  # what install() replaced, restored by uninstall()
_MISSING = object()


def installed() -> bool:
    """Whether :func:`install`'s changes are in place (the losses registered as gapo's and both
    hooks set)."""
    return (
        POLICY_LOSS_REGISTRY.get("gapo") is compute_policy_loss_gapo
        and POLICY_LOSS_REGISTRY.get("gapo_seq") is compute_policy_loss_gapo_seq
        and getattr(PolicyLossConfig.__dict__.get("__new__"), "__func__", None) is _policy_loss_config_new
        and ActorConfig.__dict__.get("validate") is _actor_validate
    )


def install() -> None:
    """Everything gapo changes in verl, in one call (idempotent): registers the policy losses
    ``gapo``/``gapo_seq`` in ``POLICY_LOSS_REGISTRY``, sets ``PolicyLossConfig.__new__`` to the
    GAPO config dispatch (:func:`_install_config_dispatch`; it acts only on ``PolicyLossConfig``
    itself with ``loss_mode=gapo|gapo_seq``, or with GAPO's keys, and leaves every other
    construction to verl) and wraps ``ActorConfig.validate`` (:func:`_install_actor_validation`).

    Importing this module calls it: verl's ``verl.plugins`` entry point (and
    ``VERL_USE_EXTERNAL_MODULES``, and an explicit ``_target_``) loads plugins by import in every
    process, Ray workers included, so the import is the only hook verl offers. Nothing else in
    gapo touches verl. :func:`uninstall` puts verl's own objects back (tests, or a process that
    wants verl unchanged after using gapo)."""
    if installed():
        return
    if not _VERL_ORIGINALS:  # the first install of this process: remember verl's own objects
        _VERL_ORIGINALS.update(
            registry={n: POLICY_LOSS_REGISTRY.get(n, _MISSING) for n in LOSS_MODES},
            new=PolicyLossConfig.__dict__.get("__new__", _MISSING),
            validate=ActorConfig.__dict__["validate"],
        )
    _register()
    _install_config_dispatch()
    _install_actor_validation()


def _plain_new(cls, *args, **kwargs):  # verl's dataclass fields, left to its __init__
    """``object.__new__`` without the arguments: ``__init__`` (verl's dataclass) gets them."""
    return object.__new__(cls)


def uninstall() -> None:
    """Undo :func:`install` (idempotent): verl's registry entries for ``gapo``/``gapo_seq`` (absent
    unless something else had registered them), ``PolicyLossConfig.__new__`` and
    ``ActorConfig.validate`` are verl's again. ``PolicyLossConfig(loss_mode="gapo", eps_high_max=…)``
    is then verl's "unexpected keyword argument" again; :func:`install` re-applies."""
    if not _VERL_ORIGINALS:
        return
    for name, fn in _VERL_ORIGINALS["registry"].items():
        if fn is _MISSING:
            POLICY_LOSS_REGISTRY.pop(name, None)
        else:
            POLICY_LOSS_REGISTRY[name] = fn
    if _VERL_ORIGINALS["new"] is _MISSING:
        # not ``del``: CPython then keeps a __new__ slot that rejects arguments (object.__new__
        # "takes exactly one argument"); a pass-through gives verl's own behaviour and errors
        PolicyLossConfig.__new__ = staticmethod(_plain_new)
    else:
        PolicyLossConfig.__new__ = _VERL_ORIGINALS["new"]
    ActorConfig.validate = _VERL_ORIGINALS["validate"]


install()
