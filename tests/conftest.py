import os

import torch

# One thread was measured faster than two on the 2-core machines this project is built on.
torch.set_num_threads(int(os.environ.get("GAPO_TEST_THREADS", "1")))
