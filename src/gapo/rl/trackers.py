"""TensorBoard and W&B mirrors of a run's ``metrics.jsonl`` and ``samples.jsonl`` (``log.tensorboard``,
``log.wandb``; the packages are the optional ``gapo[tracking]`` extra)."""

from __future__ import annotations

from pathlib import Path

from gapo.rl.config import Config, to_dict
from gapo.rl.run_dir import atomic_write

__all__ = ["Trackers", "samples_markdown", "WANDB_ID"]

WANDB_ID = "wandb_id.txt"  # the run's W&B id, so that a resumed run continues it


class Trackers:
    """TensorBoard / W&B mirrors of ``metrics.jsonl`` (``log.tensorboard``, ``log.wandb``).

    The packages are optional (``gapo[tracking]``) and imported only when asked for. The W&B run's
    id is kept in the run folder (``WANDB_ID``) when it starts; a resumed run (``--resume``, or a
    second ``fit()``) passes it back (``id=..., resume="allow"``), so that it continues the same
    W&B run. Steps redone after the checkpoint that W&B has already seen are dropped by W&B (it
    keeps a step's first values; on CPU they are the same, resume being exact)."""

    def __init__(self, cfg: Config, run_dir: Path):
        self.cfg, self.run_dir, self._open = cfg, run_dir, None

    def check(self) -> None:
        """A missing package is an error before any work."""
        try:
            if self.cfg.log.tensorboard:
                from torch.utils.tensorboard import SummaryWriter  # noqa: F401
            if self.cfg.log.wandb:
                import wandb  # noqa: F401
        except ImportError as e:
            raise ValueError(
                f"log.tensorboard/log.wandb need their packages: pip install 'gapo[tracking]' ({e})"
            ) from e

    def log(self, record: dict) -> None:
        if self._open is None:
            self._open = self._start()
        scalars = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if "tb" in self._open:
            for k, v in scalars.items():
                self._open["tb"].add_scalar(k, v, record["step"])
        if "wandb" in self._open:
            self._open["wandb"].log(scalars, step=record["step"])

    def log_samples(self, step: int, records: list[dict]) -> None:
        """The completions of ``samples.jsonl``'s rows of this step (``log.samples`` of them) as
        TensorBoard text (tag ``samples``, markdown) and a W&B table (key ``samples``: step, group,
        reward, prompt, completion), every ``log.samples_every`` steps (TRL's ``log_completions``)."""
        every = self.cfg.log.samples_every
        if not records or not every or step % every or not (self.cfg.log.tensorboard or self.cfg.log.wandb):
            return
        if self._open is None:
            self._open = self._start()
        if "tb" in self._open:
            self._open["tb"].add_text("samples", samples_markdown(records), step)
        if "wandb" in self._open:
            wandb = self._open["wandb"]
            cols = ["step", "group", "reward", "prompt", "completion"]
            table = wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in records])
            wandb.log({"samples": table}, step=step)

    def _start(self) -> dict:
        self.check()
        out = {}
        if self.cfg.log.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            out["tb"] = SummaryWriter(str(self.run_dir / "tb"))
        if self.cfg.log.wandb:
            import wandb

            self._init_wandb(wandb)
            out["wandb"] = wandb
        return out

    def _init_wandb(self, wandb) -> None:
        id_file = self.run_dir / WANDB_ID
        saved = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else ""
        resume = {"id": saved, "resume": "allow"} if saved else {}
        run = wandb.init(project=self.cfg.log.wandb_project, dir=str(self.run_dir), config=to_dict(self.cfg), **resume)
        run_id = getattr(run, "id", None)
        if isinstance(run_id, str) and run_id and run_id != saved:
            atomic_write(id_file, lambda tmp: tmp.write_text(run_id + "\n", encoding="utf-8"))

    def close(self) -> None:
        for name, w in (self._open or {}).items():
            w.close() if name == "tb" else w.finish()
        self._open = None


def samples_markdown(records: list[dict]) -> str:
    """Rows of ``samples.jsonl`` as markdown for TensorBoard's text tab: a heading per row (group,
    reward) and the prompt and completion as indented code blocks (their text verbatim: no
    markdown inside them is rendered)."""

    def block(text: str) -> str:
        return "\n".join("    " + ln for ln in str(text).split("\n"))

    parts = [
        f"**group {r.get('group')}, reward {r.get('reward')}**\n\nprompt:\n\n{block(r.get('prompt', ''))}"
        f"\n\ncompletion:\n\n{block(r.get('completion', ''))}"
        for r in records
    ]
    return "\n\n---\n\n".join(parts)
