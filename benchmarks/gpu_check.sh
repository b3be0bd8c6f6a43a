#!/usr/bin/env bash
# GPU check: the cost of a speculative round (tiny pair, batch 1 / 8 / 32, syncs per round), then
# the Qwen2.5-Coder 0.5B -> 1.5B pair: lossless exactness and a small speed-up measurement on CUDA
# (bf16 draft). Sized for well under 8 minutes on one H200.
#
# Needs torch with CUDA and transformers; no network, no `datasets`/`evaluate`.
#   SECURESD_MODELS_DIR  folder holding qwen-0.5b-bf16/ and qwen-1.5b-bf16/ as written by
#                        `securesd models fetch` (default ~/.cache/securesd-models); copy it to the
#                        GPU machine first, since nothing is downloaded there.
#   SECURESD_WHEELS      optional folder of wheels (e.g. the pinned transformers) installed into a
#                        private target folder before the run, for machines whose versions differ.
#   GPU_CHECK_OUT        optional folder for the figures as JSON (gpu_check.json) and the log.
#   GPU_CHECK_ARGS       extra arguments for gpu_check.py, e.g. "--pair tiny" when the models are absent.
#
#   bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${SECURESD_WHEELS:-}" ]]; then
    python -m pip install -q --no-index --no-deps --no-compile --target /tmp/securesd-site "$SECURESD_WHEELS"/*.whl
    export PYTHONPATH="/tmp/securesd-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
out="${GPU_CHECK_OUT:-/tmp/gpu_check}"
mkdir -p "$out"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

# Round cost on the tiny pair: wall time, rounds, forward time, host time and host-device
# synchronisations per round (CUDA sync debug mode) at batch 1 / 8 / 32, greedy and with sampling
# processors. Without CUDA it runs on the CPU (no sync counts) so the script can be checked anywhere.
if python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    round_cost_args=(--device cuda --count-syncs --threads 4)
else
    echo "no CUDA device: round cost on the CPU, without sync counts"
    round_cost_args=(--device cpu --repeats 1)
fi
timeout "${ROUND_COST_TIMEOUT:-200}" python benchmarks/round_cost.py "${round_cost_args[@]}" 2>&1 \
    | grep -v "^\[transformers\]" | tee "$out/round_cost.log" || echo "round cost check failed (see above)"
# Prompt lookup drafting (one-hot proposer): ours lossless against HF's own prompt lookup and plain
# greedy, outputs checked token for token (tiny pair; on CPU too, so the path is checked anywhere).
timeout "${PROMPT_LOOKUP_TIMEOUT:-150}" python benchmarks/prompt_lookup.py --repeats 1 2>&1 \
    | tee "$out/prompt_lookup.log" || echo "prompt lookup check failed (see above)"
if [[ "${round_cost_args[1]}" != cuda ]]; then
    echo "no CUDA device: the exactness and speed check of the real pair needs one; skipped"
    exit 0
fi
# shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of arguments
timeout 450 python benchmarks/gpu_check.py --device cuda --prompts 10 --max-new-tokens 64 \
    --json "$out/gpu_check.json" ${GPU_CHECK_ARGS:-} 2>&1 | tee "$out/gpu_check.log"

# vLLM plugin on CUDA (hf_securesd/vllm; runs only where vLLM 0.32 is installed, which carries its own
# CUDA build and cannot travel with this check). The plugin selects vLLM's V1 GPU model runner, the one
# it patches. Engine-free and in-engine plugin tests, then the overhead figures (tiny pair).
if python -c "import sys, vllm; sys.exit(0 if vllm.__version__.startswith('0.32') else 1)" >/dev/null 2>&1; then
    timeout 420 python -m pytest -q -p no:cacheprovider tests/vllm/test_sampler.py tests/vllm/test_engine.py \
        2>&1 | tail -15 | tee "$out/vllm_plugin_tests.log" || echo "vLLM plugin tests failed (see above)"
    timeout 300 python benchmarks/vllm_overhead.py --json "$out/vllm_overhead.json" 2>&1 | tail -24 \
        | tee "$out/vllm_overhead.log" || echo "vLLM overhead benchmark failed (see above)"
else
    echo "vLLM plugin check skipped: vLLM 0.32 is not installed on this machine"
fi
