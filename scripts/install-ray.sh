#!/usr/bin/env bash
# Install ringlet's `ray` extra (ray[train], for ringlet.ray and Ray Train) into a virtual environment that
# already holds torch, refusing any plan that would replace torch (a multi-GB CUDA wheel) or add NVIDIA
# libraries. Usage: scripts/install-ray.sh [VENV]   (default .venv; run from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv}/bin/python"
"$PY" -c "import torch" 2>/dev/null || { echo "install-ray: $PY has no torch; install the CPU torch first (make setup)" >&2; exit 2; }
plan=$("$PY" -m pip install --dry-run -e '.[ray]' 2>/dev/null | grep '^Would install' || true)
if grep -qiE '(^| )(torch|nvidia-[a-z0-9-]+)-[0-9]' <<<"$plan"; then
    echo "install-ray: pip would install torch or CUDA libraries; refusing. The plan: $plan" >&2
    exit 3
fi
"$PY" -m pip install -q -e '.[ray]'
"$PY" -c "import ray, torch; print(f'ray {ray.__version__} beside torch {torch.__version__}')"
