#!/usr/bin/env bash
# Regenerates reference/golden/data/*.json (see README.md beside this file).
# Two virtual environments, one per library, so that transformers can never reach
# flash-linear-attention (it would dispatch to fla's kernels): VENV_DIR/hf has torch +
# transformers and no fla-core; VENV_DIR/fla has torch + fla-core and no transformers.
# Usage: reference/golden/regenerate.sh [VENV_DIR]   (default /work/venv-golden; outside the repo)
set -euo pipefail
cd "$(dirname "$0")/../.."  # repository root: the recorded command lines are relative to it
venv_dir="${1:-/work/venv-golden}"

# The versions the committed files were made with (the files record what actually ran).
TORCH=torch==2.15.0
TRANSFORMERS=transformers==5.24.0
FLA=fla-core==0.6.0
NUMPY=numpy==2.4.6

make_venv() {  # name, packages...
  local dir="$venv_dir/$1"
  shift
  if [ ! -x "$dir/bin/python" ]; then
    python3 -m venv "$dir"
    # CPU wheels when that index is reachable; plain PyPI otherwise (its wheels run on a CPU too).
    "$dir/bin/pip" install -q "$TORCH" --index-url https://download.pytorch.org/whl/cpu ||
      "$dir/bin/pip" install -q "$TORCH"
    "$dir/bin/pip" install -q "$@"
  fi
}

make_venv hf "$TRANSFORMERS" "$NUMPY" safetensors
# fla-core 0.6.0 imports `packaging` without declaring it.
make_venv fla "$FLA" "$NUMPY" einops packaging

# -I: isolated mode, so neither the current directory nor PYTHONPATH can add a stray `fla`.
"$venv_dir/hf/bin/python" -I reference/golden/gen_transformers.py --out reference/golden/data/transformers.json
"$venv_dir/fla/bin/python" -I reference/golden/gen_fla.py --out reference/golden/data/fla.json
