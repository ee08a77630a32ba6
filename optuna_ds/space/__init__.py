"""Layer 2: what to search, per ZeRO stage: knobs, micro-batch sizes, memory bounds, names."""

from optuna_ds.space._memory import MemoryEstimate
from optuna_ds.space._memory import estimate_memory
from optuna_ds.space._micro_batch import MemoryModel
from optuna_ds.space._micro_batch import MicroBatchSearch
from optuna_ds.space._micro_batch import Observation
from optuna_ds.space._micro_batch import carried_start
from optuna_ds.space._naming import experiment_name
from optuna_ds.space._offload import OFFLOAD_VARIANTS
from optuna_ds.space._offload import offload_sections
from optuna_ds.space._offload import user_offloads
from optuna_ds.space._zero import KnobSpace
from optuna_ds.space._zero import build_knob_space
from optuna_ds.space._zero import default_tuning_space
from optuna_ds.space._zero import recommended_knobs

__all__ = [
    "OFFLOAD_VARIANTS",
    "KnobSpace",
    "MemoryEstimate",
    "MemoryModel",
    "MicroBatchSearch",
    "Observation",
    "build_knob_space",
    "carried_start",
    "default_tuning_space",
    "estimate_memory",
    "experiment_name",
    "offload_sections",
    "recommended_knobs",
    "user_offloads",
]
