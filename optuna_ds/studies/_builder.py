from __future__ import annotations

import copy
import os
from typing import Any

from optuna_ds.config import UserConfig
from optuna_ds.config import with_integer_sizes
from optuna_ds.domain import AUTOTP_SECTION
from optuna_ds.domain import CHECKPOINTING_SECTION
from optuna_ds.domain import GAS_KEY
from optuna_ds.domain import MBS_KEY
from optuna_ds.domain import TBS_KEY
from optuna_ds.domain import ZERO_KEY
from optuna_ds.domain import Config
from optuna_ds.domain import Experiment
from optuna_ds.domain import Phase
from optuna_ds.launcher import ExperimentFiles
from optuna_ds.space import AUTOTP_STAGES
from optuna_ds.space import CheckpointingSpace
from optuna_ds.space import KnobSpace
from optuna_ds.space import build_autotp_space
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

    The global batch is the samples one optimizer step trains on, ``mbs x gas x`` the
    data-parallel ranks: the GPUs less model parallelism (``mp_size``) and AutoTP, whose ranks of
    a group share one batch. ``train_batch_size`` in a config is DeepSpeed's own count, which
    with AutoTP is not that (:mod:`optuna_ds.space._autotp`): it parses the config before its
    tensor-parallel groups exist and counts every rank.
    """

    def __init__(self, *, user: UserConfig, results_dir: str, total_gpus: int) -> None:
        self._user = user
        self._results_dir = results_dir
        self._total_gpus = total_gpus
        self.checkpointing = checkpointing_space(user)
        self.autotp = build_autotp_space(user.autotp_section())

    @property
    def data_parallel_size(self) -> int:
        """The data-parallel ranks of a config with the user's own AutoTP size."""
        return self.data_parallel(self.autotp.fixed_size)

    def data_parallel(self, autotp: int) -> int:
        """The data-parallel ranks of a config whose AutoTP size is ``autotp``."""
        return max(1, self._total_gpus // (self._user.autotuning.mp_size * max(1, autotp)))

    def max_batch_per_gpu(self, autotp: int | None = None) -> int | None:
        """The bound on ``mbs * gas`` that ``max_train_batch_size`` (or the user's own
        ``train_batch_size``) puts on one data-parallel rank of a config whose AutoTP size is
        ``autotp`` (``None``: the user's own)."""
        bound = self._user.autotuning.max_train_batch_size or self._user.own_train_batch_size
        if bound is None:
            return None
        return max(1, bound // self.data_parallel(self.autotp.fixed_size if autotp is None else autotp))

    def min_batch_per_gpu(self, autotp: int | None = None) -> int:
        """The floor on ``mbs * gas`` that ``min_train_batch_size`` puts on one data-parallel rank."""
        return -(-self._user.autotuning.min_train_batch_size // self.data_parallel(self.autotp.fixed_size if autotp is None else autotp))

    def batch_bounds(self) -> tuple[tuple[int, int | None, int], ...]:
        """For each AutoTP size the tuning tries, the bounds on ``mbs * gas`` of one data-parallel
        rank: ``(size, max, min)``."""
        return tuple((size, self.max_batch_per_gpu(size), self.min_batch_per_gpu(size)) for size in self.autotp.sizes)

    def train_batch_size(self, mbs: int, gas: int) -> int:
        """DeepSpeed's ``train_batch_size`` of a config: ``mbs x gas x`` the ranks less ``mp_size``
        (with AutoTP, the ranks of a group each counted, as DeepSpeed counts them)."""
        return mbs * gas * self.data_parallel(1)

    def _base(self, *, stage: int, mbs: int, gas: int, zero: dict[str, Any], knobs: dict[str, Any] | None = None) -> dict[str, Any]:
        knobs = knobs or {}
        config = copy.deepcopy(self._user.raw)
        config[MBS_KEY] = mbs
        config[GAS_KEY] = gas
        if config.get(TBS_KEY) != "auto":
            config[TBS_KEY] = self.train_batch_size(mbs, gas)
        config[ZERO_KEY] = {"stage": stage, **zero}
        # The user's section with its lists replaced: the tuned values, else DeepSpeed's defaults.
        section = self.checkpointing.section({k: v for k, v in knobs.items() if k.startswith(CHECKPOINTING_SECTION + ".")})
        if section is None:
            config.pop(CHECKPOINTING_SECTION, None)
        else:
            config[CHECKPOINTING_SECTION] = section
        # AutoTP at the stages it is made for; the user's own section, a size fixed, everywhere.
        tp = self.autotp.section(knobs if stage in AUTOTP_STAGES else {})
        if tp:
            config[AUTOTP_SECTION] = tp
        else:
            config.pop(AUTOTP_SECTION, None)
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
                               zero=space.zero_section(config.knobs.zero.as_dict()), knobs=config.knobs.room.as_dict())
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
        be profiled; without AutoTP."""
        result_dir = os.path.join(self._results_dir, PROFILE_NAME)
        offload = {k: v for k, v in self._user.zero_section().items() if k in ("offload_optimizer", "offload_param")}
        config = self._base(stage=3, mbs=1, gas=1, zero=offload)
        # The whole model's figures: the memory estimates split them by each AutoTP size.
        config.pop(AUTOTP_SECTION, None)
        config["memory_breakdown"] = False
        config["autotuning"] = {
            "enabled": True,
            "model_info_path": ExperimentFiles(result_dir).model_info,
            "model_info": {"profile": True},
        }
        return Experiment(name=PROFILE_NAME, phase=Phase.PROFILE, config=Config(stage=3, micro_batch=1), ds_config=config,
                          result_dir=result_dir)
