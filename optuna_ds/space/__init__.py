"""Layer 1: what to search, per ZeRO stage: knobs, micro-batch sizes, memory bounds."""

from optuna_ds.space._autotp import AUTOTP_STAGES
from optuna_ds.space._autotp import AutotpSpace
from optuna_ds.space._autotp import autotp_size
from optuna_ds.space._autotp import build_autotp_space
from optuna_ds.space._autotp import distinct_batch
from optuna_ds.space._autotp import samples_per_second
from optuna_ds.space._checkpointing import CheckpointingSpace
from optuna_ds.space._checkpointing import build_checkpointing_space
from optuna_ds.space._checkpointing import checkpointing_defaults
from optuna_ds.space._levers import deepspeed_default
from optuna_ds.space._levers import is_superchip
from optuna_ds.space._memory import MemoryEstimate
from optuna_ds.space._memory import estimate_memory
from optuna_ds.space._offload import OFFLOAD_KEYS
from optuna_ds.space._offload import OFFLOAD_VARIANTS
from optuna_ds.space._offload import offload_sections
from optuna_ds.space._offload import user_offloads
from optuna_ds.space._zero import STAGE3_ONLY
from optuna_ds.space._zero import KnobSpace
from optuna_ds.space._zero import build_knob_space
from optuna_ds.space._zero import default_tuning_space
from optuna_ds.space._zero import knob_defaults

__all__ = [
    "OFFLOAD_KEYS",
    "STAGE3_ONLY",
    "deepspeed_default",
    "AUTOTP_STAGES",
    "AutotpSpace",
    "CheckpointingSpace",
    "OFFLOAD_VARIANTS",
    "KnobSpace",
    "MemoryEstimate",
    "autotp_size",
    "build_autotp_space",
    "build_checkpointing_space",
    "build_knob_space",
    "checkpointing_defaults",
    "default_tuning_space",
    "distinct_batch",
    "estimate_memory",
    "is_superchip",
    "knob_defaults",
    "offload_sections",
    "samples_per_second",
    "user_offloads",
]
