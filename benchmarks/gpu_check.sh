#!/usr/bin/env bash
# The prepared GPU check (docs: benchmarks/gpu_check.py, then benchmarks/gpu_vs_trl.py): gapo's
# runs at Qwen2.5-0.5B's shape, then gapo and TRL's GRPOTrainer side by side on identical work.
# Run in the repository root on a machine with PyTorch, transformers and peft installed and one
# CUDA GPU; no network needed. About 8 minutes on one H200. The side-by-side also needs trl and
# datasets: where they are missing, set WHEELS to a folder holding their wheels (made beforehand
# with `pip download --no-deps -d WHEELS trl datasets` on a machine with the registry).
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
if [ -n "${WHEELS:-}" ]; then
  python -m pip install --quiet --no-index --find-links "$WHEELS" trl datasets
fi
python benchmarks/gpu_check.py --shape qwen2.5-0.5b --device cuda --steps 3 "$@"
if ! python -c "import trl, datasets" 2>/dev/null; then
  echo "gpu_vs_trl: NOT RUN: trl and datasets are not importable (set WHEELS, see the top of this script)" >&2
  exit 3
fi
python benchmarks/gpu_vs_trl.py --shape qwen2.5-0.5b --device cuda --steps 3 --warmup 1
