#!/usr/bin/env bash
# CPU install: SGLang 0.5.23 without its CUDA kernels, plus nanospec-server, into a venv.
# Usage: bash deploy/install_cpu.sh [VENV_DIR]   (default: .venv)
# About 2 minutes and 6 GB. The GPU install is `pip install -e .` (full SGLang).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$here/.venv}
python=${PYTHON:-python3}

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# --no-deps: the full dependency set is 11 GB of CUDA libraries the CPU path never loads.
"$venv/bin/python" -m pip install -q --no-deps sglang==0.5.23
"$venv/bin/python" -m pip install -q -r "$here/deploy/requirements-cpu.txt"
"$venv/bin/python" -m pip install -q --no-deps -e "$here"
echo "installed into $venv; activate with: source $venv/bin/activate"
