#!/bin/bash
# The device call (benchmarks/gpu/README.md): install the carried wheels, build DeepSpeed's CPU
# Adam and DeepCompile ops in the background, then the phases named in PHASES, in order:
#   tune    optuna-ds tune of tiny_train.py on the GPU (issue 33's CUDA path), at most TUNE_S s
#   record  the replay recording (record.py, at most RECORD_S s; RESUME=file completes an earlier one)
#   check   issue 37's gpu_check.py, at most CHECK_S s
# Run from the repository root with the staged folder G (default .gpu) and OUT set.
set -u
G=$(cd "${G:-.gpu}" && pwd)
OUT=${OUT:?OUT: where the results go}
PHASES=${PHASES:-tune record check}
TUNE_S=${TUNE_S:-130} RECORD_S=${RECORD_S:-150} CHECK_S=${CHECK_S:-100} RESUME=${RESUME:-}
T0=$(date +%s)
say() { echo "=== +$(( $(date +%s) - T0 ))s $*"; }
exec > >(tee "$OUT/log.txt") 2>&1

say install
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$G"/whl/*.whl || exit 1
export PYTHONPATH=$G:/tmp/site PATH=/tmp/site/bin:$PATH TORCH_EXTENSIONS_DIR=/tmp/ext TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, deepspeed, optuna, pynvml; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'optuna', optuna.__version__, torch.cuda.get_device_name())" || exit 1

say ops build, in the background
python3 - >/tmp/ops.log 2>&1 <<'PY' &
import time
from deepspeed.accelerator import get_accelerator
for name in ("CPUAdamBuilder", "DeepCompileBuilder"):
    t = time.time()
    try:
        get_accelerator().create_op_builder(name).load()
        print(f"{name} built in {time.time() - t:.0f}s", flush=True)
    except Exception as e:
        print(f"{name} FAILED after {time.time() - t:.0f}s: {type(e).__name__}: {e}", flush=True)
PY
OPS=$!

tune() {
    mkdir -p /tmp/tune && cp "$G"/benchmarks/gpu/{gpt.py,tiny_train.py,tiny_ds_config.json} /tmp/tune/
    (cd /tmp/tune && timeout -s INT "$TUNE_S" python3 -m optuna_ds tune --num_gpus 1 tiny_train.py --deepspeed_config tiny_ds_config.json) >"$OUT/tune_output.txt" 2>&1
    echo "tune exit $?"
    tail -n 30 "$OUT/tune_output.txt"
    cp /tmp/tune/autotuning_results/summary.txt "$OUT/tune_summary.txt"
    (cd "$G/benchmarks/gpu" && python3 tune_records.py /tmp/tune/autotuning_results/optuna-ds.db) | tee "$OUT/tune_records.txt"
}

record() {
    say waiting for CPU Adam
    while ! grep -q CPUAdamBuilder /tmp/ops.log && kill -0 $OPS 2>/dev/null; do sleep 1; done
    cat /tmp/ops.log
    local cpu_adam resume
    cpu_adam=$(grep -q "CPUAdamBuilder built" /tmp/ops.log && echo --cpu-adam)
    resume=${RESUME:+--resume $RESUME}
    local out=$OUT/gpt270m-h100.json end=$(( $(date +%s) + RECORD_S ))
    # the GPU arms in one process, then each offloaded walk in a process of its own (record.py's docstring)
    python3 "$G/benchmarks/gpu/record.py" --out "$out" --deepspeed /tmp/site/bin/deepspeed --arms 0 1 2 3 \
        --budget-s $(( RECORD_S * 3 / 4 )) $cpu_adam $resume 2>&1 | grep --line-buffered -v "time (ms)"
    for _ in 1 2 3; do
        [ "$(date +%s)" -lt "$end" ] || break
        python3 "$G/benchmarks/gpu/record.py" --out "$out" --arms 2+optimizer --walks 1 --resume "$out" \
            --budget-s $(( end - $(date +%s) )) $cpu_adam 2>&1 | grep --line-buffered -v "time (ms)"
    done
}

check() {
    say waiting for DeepCompile
    wait $OPS; cat /tmp/ops.log
    timeout -s INT "$CHECK_S" python3 "$G/benchmarks/gpu/gpu_check.py" --json "$OUT/gpu_check.json" | tee "$OUT/gpu_check.txt"
}

for phase in $PHASES; do
    say "$phase"
    $phase
done
say done
