#!/usr/bin/env bash
# The modes of DeepSpeed's Hugging Face autotuning examples, to reproduce the throughput table
# on your hardware:
#   ./test_tune.sh tune   tune with optuna-ds, then train with the optimal config
#   ./test_tune.sh 0      Hugging Face without DeepSpeed
#   ./test_tune.sh z0     DeepSpeed, ZeRO disabled      (z1, z2, z3: ZeRO stage 1, 2, 3)
# Each run prints train_samples_per_second. MODEL_SIZE=tiny|small|medium|large|xl (default tiny),
# PER_DEVICE_TRAIN_BATCH_SIZE (default 4), NUM_GPUS (default: all), MAX_STEPS (default 40).
set -euo pipefail
cd "$(dirname "$0")"
MODE=${1:-tune}
MODEL_SIZE=${MODEL_SIZE:-tiny}
MBS=${PER_DEVICE_TRAIN_BATCH_SIZE:-4}
MAX_STEPS=${MAX_STEPS:-40}
GPUS=()
[ -n "${NUM_GPUS:-}" ] && GPUS=(--num_gpus "$NUM_GPUS")
OPTUNA_DS=${OPTUNA_DS:-optuna-ds}
DEEPSPEED=${DEEPSPEED:-deepspeed}
PYTHON=${PYTHON:-python3}
ARGS=(--model_size "$MODEL_SIZE" --output_dir "output_$MODE" --per_device_train_batch_size "$MBS"
      --gradient_accumulation_steps 1 --max_steps "$MAX_STEPS" --report_to none --save_strategy no
      --logging_steps 10 --learning_rate 2e-5)

stage_config() {  # ds_config.json at one ZeRO stage, without the autotuning section
  "$PYTHON" - "$1" <<'PY'
import json, sys
config = json.load(open("ds_config.json"))
config.pop("autotuning")
config["zero_optimization"] = {"stage": int(sys.argv[1])}
json.dump(config, open(f"ds_config_z{sys.argv[1]}.json", "w"), indent=2)
PY
}

case "$MODE" in
  tune) exec "$OPTUNA_DS" run "${GPUS[@]}" run_clm.py --deepspeed ds_config.json "${ARGS[@]}" ;;
  0) exec "$PYTHON" run_clm.py "${ARGS[@]}" ;;
  z0|z1|z2|z3)
    stage_config "${MODE#z}"
    exec "$DEEPSPEED" "${GPUS[@]}" run_clm.py --deepspeed "ds_config_${MODE}.json" "${ARGS[@]}" ;;
  *) echo "usage: $0 tune|0|z0|z1|z2|z3" >&2; exit 2 ;;
esac
