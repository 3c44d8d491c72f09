#!/usr/bin/env bash
# The prepared GPU check (docs: benchmarks/gpu_check.py, then benchmarks/gpu_vs_trl.py): gapo's
# runs at Qwen2.5-0.5B's shape, then gapo and TRL's GRPOTrainer side by side on identical work.
# Run in the repository root on a machine with PyTorch, transformers, peft, trl and datasets
# installed and one CUDA GPU; no network needed. About 8 minutes on one H200.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python benchmarks/gpu_check.py --shape qwen2.5-0.5b --device cuda --steps 3 "$@"
python benchmarks/gpu_vs_trl.py --shape qwen2.5-0.5b --device cuda --steps 3 --warmup 1
