"""Print what a tuning stored for each experiment, peak GPU memory (NVML) included.

    python tune_records.py autotuning_results/optuna-ds.db
"""
import sys

import optuna

from optuna_ds.domain import ExperimentRecord


def main() -> None:
    storage = optuna.storages.RDBStorage(f"sqlite:///{sys.argv[1]}")
    print(f"{'experiment':28} {'state':9} {'samples/s':>10} {'seconds':>8} {'peak GPU MiB':>12}  reason")
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        resources = study.user_attrs.get("resources")
        if isinstance(resources, dict):
            print(f"{summary.study_name}: {resources}")
        for trial in study.trials:
            record = ExperimentRecord.from_trial(trial)
            if record.exp_name is None:
                continue
            throughput = (record.metrics or {}).get("throughput")
            peak = record.peak_gpu_memory
            print(f"{record.exp_name:28} {trial.state.name:9} {f'{throughput:.1f}' if throughput is not None else '-':>10} "
                  f"{record.duration if record.duration is not None else '-':>8} {f'{peak / 2**20:.0f}' if peak else '-':>12}  "
                  f"{record.reason.value if record.reason else ''}")


if __name__ == "__main__":
    main()
