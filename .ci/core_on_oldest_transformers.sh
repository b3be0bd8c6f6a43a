#!/usr/bin/env bash
# The core test suite on the oldest supported transformers (the lower end of pyproject's range).
# Builds a fresh virtual environment on top of the global site-packages (torch and the project's
# other dependencies installed there by CI), pins transformers in it, installs this checkout
# without dependencies and runs the README's test command. Prints its runtime at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1

TRANSFORMERS_OLDEST="${TRANSFORMERS_OLDEST:-5.17.0}"
VENV="${TRANSFORMERS_OLDEST_VENV:-${TMPDIR:-/tmp}/securesd-transformers-${TRANSFORMERS_OLDEST}}"
start=$(date +%s)
trap 'echo "core suite on transformers ${TRANSFORMERS_OLDEST}: $(( $(date +%s) - start )) s"' EXIT

rm -rf "$VENV"
python -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q "transformers==${TRANSFORMERS_OLDEST}"
"$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" - <<PY
import transformers, hf_securesd, pathlib
assert transformers.__version__ == "${TRANSFORMERS_OLDEST}", transformers.__version__
assert pathlib.Path(hf_securesd.__file__).resolve().is_relative_to(pathlib.Path.cwd().resolve()), hf_securesd.__file__
print(f"transformers {transformers.__version__}, hf_securesd from {hf_securesd.__file__}")
PY

# Tests of optional extras (agentdojo, vllm) skip themselves when the extra is not installed.
HF_HUB_OFFLINE=1 SECURESD_DATA_DIR=${SECURESD_DATA_DIR:-../shared/data} "$VENV/bin/python" -m pytest -q -p no:cacheprovider
