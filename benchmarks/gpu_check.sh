#!/usr/bin/env bash
# One prepared GPU check (docs: benchmarks/gpu_check.py). Run in the repository root on a machine
# with PyTorch, transformers and peft installed and one CUDA GPU; no network needed.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
exec python benchmarks/gpu_check.py --shape qwen2.5-0.5b --device cuda --steps 3 "$@"
