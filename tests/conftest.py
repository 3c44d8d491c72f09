import os

import pytest
import torch

from gapo.policy.base_policy import get_base_policy
from gapo.policy.pretrain import PretrainConfig

# One thread was measured faster than two on the 2-core machines this project is built on.
torch.set_num_threads(int(os.environ.get("GAPO_TEST_THREADS", "1")))

TASK = dict(n_numbers=2, num_range=(1, 10))
# an easy supervised base: 2-number Countdown over 1-10, 150 SFT steps of a micro Llama (~5 s);
# measured base pass@1 ≈ 0.35 on held-out instances
EASY = PretrainConfig(
    name="test-easy",
    sft_mix=((TASK, 1.0),),
    rl_task=TASK,
    model_preset="micro",
    pool_size=300,
    batch_size=32,
    max_steps=150,
    time_budget_s=None,
    lr=1e-2,
    warmup_steps=10,
)


@pytest.fixture(scope="session")
def easy_policy(tmp_path_factory):
    """A small Countdown policy built once per session (in a private GAPO_CACHE)."""
    os.environ["GAPO_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    return str(get_base_policy(EASY, progress=False))
