"""Resuming a run with the configuration it was trained with (docs/design.md §5.2, rule 6).

The reference is the config inside the checkpoint, not ``config.yaml`` (which a user may have
edited: an edit is a change like an override). ``gapo train --resume`` and ``gapo eval RUN`` both
compare against it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from gapo.rl.config import Config, diff, from_dict, to_dict
from gapo.tasks.custom import absolute_spec

if TYPE_CHECKING:
    from gapo.rl.run_dir import RunFolder

__all__ = ["RESUME_FIXED", "resume_changes", "trained_config"]

# Keys a resumed run cannot take a new value for: they define its data, its model and its random
# streams (restored from the checkpoint), so a new value would be silently ignored.
RESUME_FIXED = ("task.", "model.path", "model.base_preset", "train.seed")


def _normalised(data: dict, where: str) -> dict:
    try:  # keys added since the run was made compare at their defaults
        cfg = from_dict(data)
        # reward specs as Config.validate records them (a run made before it did keeps my_rewards:fn)
        cfg.reward.funcs = [absolute_spec(s) for s in cfg.reward.funcs]
        return to_dict(cfg)
    except ValueError as e:
        raise ValueError(f"cannot resume: {where}: {e}") from None


def trained_config(folder: RunFolder, state: dict | None) -> tuple[dict | None, dict[str, tuple]]:
    """The config the run was trained with, the one inside its checkpoint ``state`` (normalised:
    keys added since compare at their defaults; None for a checkpoint made before checkpoints
    carried it), and the keys in which the run's ``config.yaml`` differs from it (a hand edit),
    ``key -> (checkpoint's, config.yaml's)``; none when config.yaml is missing or unreadable (the
    checkpoint's config is the reference anyway)."""
    ck = state.get("config") if isinstance(state, dict) else None
    if not isinstance(ck, dict):
        return None, {}
    saved = _normalised(ck, f"the config inside {str(folder.checkpoint)!r}")
    try:
        on_disk = _normalised(folder.saved_config(fallback=False), repr(str(folder.config)))
    except ValueError:
        return saved, {}
    return saved, diff(saved, on_disk)


def resume_changes(
    folder: RunFolder, cfg: Config, *, allow_change: bool, state: dict | None = None
) -> dict[str, tuple]:
    """The keys in which ``cfg`` differs from the config the run was trained with, ``key -> (old, new)``.

    That config is the one inside the checkpoint (``state["config"]``), so a hand-edited
    ``config.yaml`` (the base of a resumed run's config) shows up here like an override; a
    checkpoint made before checkpoints carried their config falls back to ``config.yaml``, with a
    note. A key in ``RESUME_FIXED`` is always an error; any other difference is an error unless
    ``allow_change`` (the caller then applies and logs it)."""
    saved, edits = trained_config(folder, state)
    edited = set(edits)
    if saved is None:
        if state is not None:
            print(
                f"[gapo] note: {str(folder.checkpoint)!r} does not carry its config (made by an older gapo); "
                f"comparing with {str(folder.config)!r} instead",
                file=sys.stderr,
            )
        saved, edited = _normalised(folder.saved_config(), repr(str(folder.config))), set()
    changes = diff(saved, to_dict(cfg))
    by_hand = [k for k in changes if k in edited]
    hand_note = (
        (
            f" ({', '.join(by_hand)}: {str(folder.config)!r} says so, but the checkpoint was trained with the "
            "'run' value; config.yaml was edited after the run started)"
        )
        if by_hand
        else ""
    )
    fixed = [k for k in changes if k.startswith(RESUME_FIXED)]
    if fixed:
        raise ValueError(
            f"cannot resume {str(folder.path)!r} with a different "
            + ", ".join(f"{k} (run: {changes[k][0]!r}, now: {changes[k][1]!r})" for k in fixed)
            + hand_note
            + ": these define the run's data, model and random streams. Start a new run instead"
            + (", or put the run's values back in config.yaml" if any(k in edited for k in fixed) else "")
        )
    if changes and not allow_change:
        raise ValueError(
            f"the config differs from the one the run in {str(folder.path)!r} was trained with: "
            + ", ".join(f"{k} (run: {a!r}, now: {b!r})" for k, (a, b) in changes.items())
            + hand_note
            + ". Resume without --config/overrides (and with config.yaml as the run wrote it) to continue "
            "as it was, or pass --allow-change to apply these changes (they are written to config.yaml "
            "and events.jsonl)"
        )
    return changes
