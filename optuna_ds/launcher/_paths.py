from __future__ import annotations

import dataclasses
import glob
import os


@dataclasses.dataclass(frozen=True)
class ExperimentFiles:
    """Where one experiment's files go, as DeepSpeed's autotuner lays them out:
    ``exps_dir/<name>.json`` and ``results_dir/<name>/``."""

    result_dir: str
    exps_dir: str = ""

    @property
    def name(self) -> str:
        return os.path.basename(self.result_dir)

    @property
    def description(self) -> str:
        return os.path.join(self.exps_dir, f"{self.name}.json")

    @property
    def cmd(self) -> str:
        return os.path.join(self.result_dir, "cmd.txt")

    @property
    def ds_config(self) -> str:
        return os.path.join(self.result_dir, "ds_config.json")

    @property
    def exp(self) -> str:
        return os.path.join(self.result_dir, "exp.json")

    @property
    def metrics(self) -> str:
        return os.path.join(self.result_dir, "metrics.json")

    @property
    def model_info(self) -> str:
        return os.path.join(self.result_dir, "model_info.json")

    @property
    def stdout(self) -> str:
        return os.path.join(self.result_dir, "stdout.log")

    @property
    def stderr(self) -> str:
        return os.path.join(self.result_dir, "stderr.log")


def rank_log_dir(user_dir: str, experiment_name: str) -> str:
    """``--enable_each_rank_log DIR`` for one experiment: its own folder under the user's, so
    experiments running at once never share a log file."""
    return os.path.join(user_dir, experiment_name)


def rank_logs(directory: str) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(directory), "*_rank*.log")))


@dataclasses.dataclass(frozen=True)
class ResultsFiles:
    """The tuning's own files in ``results_dir``."""

    results_dir: str

    @property
    def summary(self) -> str:
        """DeepSpeed's ``summary.txt``: its table alone, in its form."""
        return os.path.join(self.results_dir, "summary.txt")

    @property
    def own_summary(self) -> str:
        """Ours: the headline, the table with each config's runs, and the notes."""
        return os.path.join(self.results_dir, "optuna_ds_summary.txt")

    @property
    def optimal_config(self) -> str:
        return os.path.join(self.results_dir, "ds_config_optimal.json")

    @property
    def optimal_cmd(self) -> str:
        return os.path.join(self.results_dir, "cmd_optimal.txt")

    @property
    def report(self) -> str:
        return os.path.join(self.results_dir, "report.html")

    def outputs(self) -> tuple[str, ...]:
        """What ``--overwrite`` removes besides the experiments."""
        return (self.summary, self.own_summary, self.optimal_config, self.optimal_cmd)
