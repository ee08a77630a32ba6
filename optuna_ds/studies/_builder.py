from __future__ import annotations

import copy
import os
from typing import Any

from optuna_ds.config import UserConfig
from optuna_ds.config import with_integer_sizes
from optuna_ds.domain import CHECKPOINTING_SECTION
from optuna_ds.domain import GAS_KEY
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import TBS_KEY
from optuna_ds.domain import ZERO_KEY
from optuna_ds.domain import Config
from optuna_ds.domain import Experiment
from optuna_ds.domain import Phase
from optuna_ds.launcher import ExperimentFiles
from optuna_ds.space import CheckpointingSpace
from optuna_ds.space import KnobSpace
from optuna_ds.space import build_checkpointing_space

PROFILE_NAME = "profile_model_info"


def checkpointing_space(user: UserConfig) -> CheckpointingSpace:
    """The checkpointing settings the user's config and arguments allow (:mod:`optuna_ds.space._checkpointing`)."""
    return build_checkpointing_space(user.checkpointing_section(), switch=user.checkpointing_switch,
                                     switch_on=user.checkpointing_on, mp_size=user.autotuning.mp_size)


def script_switches(space: CheckpointingSpace, config: Config) -> dict[str, bool]:
    """The script switches ``config`` sets, by flag: the checkpointing switch where it is tuned."""
    on = space.switch_value(config.knobs.checkpointing.as_dict())
    return {space.switch: on} if on is not None else {}


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
        self.checkpointing = checkpointing_space(user)

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

    def train_batch_size(self, mbs: int, gas: int) -> int:
        return mbs * gas * self.data_parallel_size

    def _base(self, *, stage: int, mbs: int, gas: int, zero: dict[str, Any], checkpointing: dict[str, Any] | None = None) -> dict[str, Any]:
        config = copy.deepcopy(self._user.raw)
        config[MBS_KEY] = mbs
        config[GAS_KEY] = gas
        if config.get(TBS_KEY) != "auto":
            config[TBS_KEY] = self.train_batch_size(mbs, gas)
        config[ZERO_KEY] = {"stage": stage, **zero}
        # The user's section with its lists replaced: the tuned values, else DeepSpeed's defaults.
        section = self.checkpointing.section(checkpointing or {})
        if section is None:
            config.pop(CHECKPOINTING_SECTION, None)
        else:
            config[CHECKPOINTING_SECTION] = section
        config.pop("autotuning", None)
        return with_integer_sizes(config)

    def result_dir(self, name: str) -> str:
        """Where the experiment ``name`` writes its files."""
        return os.path.join(self._results_dir, name)

    def build(self, config: Config, *, phase: Phase, space: KnobSpace, repeat: int = 0) -> Experiment:
        """The experiment of ``config`` (``space``: its stage's, with its offload); ``repeat`` > 0
        names a re-measurement of one that ran."""
        name = config.run_name(repeat)
        result_dir = self.result_dir(name)
        files = ExperimentFiles(result_dir)
        ds_config = self._base(stage=config.stage, mbs=config.micro_batch, gas=config.accumulation,
                               zero=space.zero_section(config.knobs.zero.as_dict()), checkpointing=config.knobs.checkpointing.as_dict())
        a = self._user.autotuning
        ds_config["autotuning"] = {
            "enabled": True,
            "metric_path": files.metrics,
            "start_profile_step": a.start_profile_step,
            "end_profile_step": a.end_profile_step,
        }
        return Experiment(name=name, phase=phase, config=config, ds_config=ds_config, result_dir=result_dir,
                          switches=script_switches(self.checkpointing, config))

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
        return Experiment(name=PROFILE_NAME, phase=Phase.PROFILE, config=Config(stage=3, micro_batch=1), ds_config=config,
                          result_dir=result_dir)
