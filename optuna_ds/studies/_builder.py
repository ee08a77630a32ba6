from __future__ import annotations

import copy
import os
from typing import Any

from optuna_ds.config import GAS_KEY
from optuna_ds.config import MBS_KEY
from optuna_ds.config import TBS_KEY
from optuna_ds.config import ZERO_KEY
from optuna_ds.config import UserConfig
from optuna_ds.config import with_integer_sizes
from optuna_ds.launcher import Experiment
from optuna_ds.launcher import ExperimentFiles
from optuna_ds.launcher import Phase
from optuna_ds.space import KnobSpace
from optuna_ds.space import experiment_name

PROFILE_NAME = "profile_model_info"


class ExperimentBuilder:
    """Turns tuned values into complete experiment configs.

    The user's config is the base, so optimizer, fp16/bf16, scheduler and offload sections
    reach every experiment; tuning lists are replaced by the tuned or fixed values, and
    ``train_batch_size`` is made consistent with micro-batch, accumulation and GPUs.
    """

    def __init__(self, *, user: UserConfig, results_dir: str, total_gpus: int) -> None:
        self._user = user
        self._results_dir = results_dir
        self._total_gpus = total_gpus

    @property
    def data_parallel_size(self) -> int:
        return max(1, self._total_gpus // self._user.autotuning.mp_size)

    def max_batch_per_gpu(self) -> int | None:
        """The bound on ``mbs * gas`` that ``max_train_batch_size`` (or the user's own
        ``train_batch_size``) puts on one data-parallel rank."""
        bound = self._user.autotuning.max_train_batch_size or self._user.train_batch_size
        if bound is None:
            return None
        return max(1, bound // self.data_parallel_size)

    def min_batch_per_gpu(self) -> int:
        """The floor on ``mbs * gas`` that ``min_train_batch_size`` puts on one data-parallel rank."""
        return -(-self._user.autotuning.min_train_batch_size // self.data_parallel_size)

    def gas_for(self, mbs: int) -> int:
        """Gradient accumulation for ``mbs``: as much as the global-batch bound allows, else the
        user's; and at least enough for ``min_train_batch_size``. Where no accumulation fits
        both bounds at this size, the floor wins: a global batch below it is one the user said
        the training cannot use, while one above the bound exceeds it by less than a micro-batch."""
        bound = self.max_batch_per_gpu()
        gas = self._user.gradient_accumulation_steps if bound is None else bound // mbs
        return max(1, gas, -(-self.min_batch_per_gpu() // mbs))

    def train_batch_size(self, mbs: int, gas: int) -> int:
        return mbs * gas * self.data_parallel_size

    def _base(self, *, stage: int, mbs: int, gas: int, zero: dict[str, Any]) -> dict[str, Any]:
        config = copy.deepcopy(self._user.raw)
        config[MBS_KEY] = mbs
        config[GAS_KEY] = gas
        if config.get(TBS_KEY) != "auto":
            config[TBS_KEY] = self.train_batch_size(mbs, gas)
        config[ZERO_KEY] = {"stage": stage, **zero}
        config.pop("autotuning", None)
        return with_integer_sizes(config)

    def result_dir(self, name: str) -> str:
        """Where the experiment ``name`` writes its files."""
        return os.path.join(self._results_dir, name)

    def build(self, *, stage: int, phase: Phase, mbs: int, gas: int, space: KnobSpace, knobs: dict[str, Any] | None = None,
              repeat: int = 0) -> Experiment:
        """The experiment of one config; ``repeat`` > 0 names a re-measurement of one that ran."""
        knobs = dict(knobs or {})
        name = experiment_name(stage=stage, mbs=mbs, gas=gas, knobs=knobs) + (f"_{space.offload}" if space.offload else "")
        name += f"_r{repeat}" if repeat else ""
        result_dir = self.result_dir(name)
        files = ExperimentFiles(result_dir)
        config = self._base(stage=stage, mbs=mbs, gas=gas, zero={**copy.deepcopy(space.fixed), **knobs})
        a = self._user.autotuning
        config["autotuning"] = {
            "enabled": True,
            "metric_path": files.metrics,
            "start_profile_step": a.start_profile_step,
            "end_profile_step": a.end_profile_step,
        }
        return Experiment(
            name=name,
            stage=stage,
            phase=phase,
            ds_config=config,
            result_dir=result_dir,
            micro_batch_size=mbs,
            gradient_accumulation_steps=gas,
            knobs=knobs,
        )

    def build_profile(self) -> Experiment:
        """The model-info profile run: DeepSpeed's minimum-memory config (stage 3, micro-batch 1)
        with the user's offload sections kept, so a model that only fits offloaded can still
        be profiled."""
        result_dir = os.path.join(self._results_dir, PROFILE_NAME)
        offload = {k: v for k, v in self._user.zero_section().items() if k in ("offload_optimizer", "offload_param")}
        config = self._base(stage=3, mbs=1, gas=1, zero=offload)
        config["memory_breakdown"] = False
        config["autotuning"] = {
            "enabled": True,
            "model_info_path": ExperimentFiles(result_dir).model_info,
            "model_info": {"profile": True},
        }
        return Experiment(
            name=PROFILE_NAME, stage=3, phase=Phase.PROFILE, ds_config=config, result_dir=result_dir,
            micro_batch_size=1, gradient_accumulation_steps=1,
        )
