"""AutoTP as a dimension of the tuning (issue 37): DeepSpeed's ``tensor_parallel.autotp_size``,
the ranks each layer's weights are split over.

What DeepSpeed 0.19.8 does with it (``deepspeed/__init__.py``, ``runtime/engine.py``,
``runtime/tensor_parallel/config.py``, ``module_inject/auto_tp.py``):

- *A config alone enables it.* ``deepspeed.initialize`` reads ``tensor_parallel`` into its
  ``TPTrainingConfig`` model (``autotp_size: int = 0``, 0 or 1 off) and, where it is above 1,
  the engine itself builds a (data-parallel x tensor-parallel) device mesh over the ranks
  (``groups._init_tp_mesh_device``: consecutive ranks form a tensor-parallel group, so a size
  that divides the GPUs of a node keeps each group in the node) and shards the model before
  ZeRO sees it (``_apply_autotp_partitioning``): by the user's ``partition_config`` or
  ``preset_model``, else by the model's Hugging Face ``tp_plan``, else by AutoTP's heuristic
  parser. ``deepspeed.tp_model_init`` only records arguments now (its docstring: "AutoTP sharding
  is applied during ``deepspeed.initialize(...)``"); the Hugging Face Trainer calls it from the
  same config key. So no script change is needed to shard.
- *What the script must do anyway*, which no config can: feed the same batch to every rank of a
  tensor-parallel group (the engine checks the first forward's inputs and raises "Data
  inconsistency within the TP group"; the Trainer's accelerate does it, a sampler that splits the
  data over every rank does not), and hold a model AutoTP can shard (the heuristic parser asserts
  "AutoTP not supported for model" for GPT-2, DeBERTa, XLNet... and "Not able to determine model
  policy automatically" for a model class it cannot name; a ``partition_config`` of the user's
  shards any ``nn.Linear``). Whether a script does is known only from a launch: so AutoTP is a
  dimension where the user lists it, the DeepSpeed way (``"tensor_parallel": {"autotp_size": [1,
  2, 4]}``), the listing being the user's word that the script takes it, as ``arg_mappings`` is
  for the checkpointing switch; it is never proposed unlisted. A run that fails for either
  reason fails with the reason ``autotp``: reported once, the setting not tried again.
- *ZeRO stages*: DeepSpeed's AutoTP training tutorial documents stages 0, 1 and 2; 0.19.8's
  code has a ZeRO-3 path too (a two-rank CPU run of a sharded MLP ran at stage 3 here), which
  DeepSpeed's own examples (July 2026) still call unsupported. The dimension acts at the
  documented stages; a stage-3 experiment runs without it.
- *The data-parallel world*: the mesh leaves ``ranks / autotp_size`` data-parallel ranks, each
  group of ``autotp_size`` ranks working on one batch: a step trains on ``mbs x gas x ranks /
  autotp_size`` distinct samples. DeepSpeed's config does not know it: ``deepspeed.initialize``
  parses the config before the mesh exists, with no ``mpu``, so its world size is every rank and
  its batch assertion wants ``train_batch_size = mbs x gas x ranks`` (two CPU ranks, AutoTP 2,
  ``train_batch_size`` 2 for 2 samples: "train_batch_size is not equal to micro_batch_per_gpu *
  gradient_acc_step * world_size 2 != 2 * 1 * 2"), and the throughput its autotuning metrics
  file holds (``train_batch_size / latency``) counts each sample once per rank of its group:
  ``autotp_size`` times too many (:func:`samples_per_second`).
- *What it logs*: its INFO lines ("AutoTP: no effective HuggingFace tp_plan was found; falling
  back to heuristic AutoTP", the groups summary ``dp_world_size=``) only where the ranks log at
  INFO; at the default WARNING, nothing. It cannot be ignored silently: a size above 1 is
  applied in ``initialize`` or raises there, so a run that measured ran sharded.
- *On DeepSpeed's CPU accelerator* it runs (two ranks, an MLP sharded column then row by a
  ``partition_config``, ZeRO 0, 2 and 3): nothing fails there for being CPU. The same MLP without
  a ``partition_config`` fails at ``initialize`` ("Not able to determine model policy
  automatically"), a reason of the script's.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from optuna_ds.domain import AUTOTP_KNOB
from optuna_ds.domain import AUTOTP_SECTION
from optuna_ds.domain import TBS_KEY
from optuna_ds.domain import Knobs

AUTOTP_KEY = "autotp_size"
# The ZeRO stages AutoTP training is documented for.
AUTOTP_STAGES = frozenset({0, 1, 2})


@dataclasses.dataclass(frozen=True)
class AutotpSpace:
    """The AutoTP sizes a tuning may try. ``sizes`` are the sizes above 1 the user listed (off,
    the size 1, is every default config); ``fixed`` is the user's ``tensor_parallel`` section
    with its list taken out (``None``: the config has none); ``fixed_size`` the size a config
    that sets none runs with (the user's scalar ``autotp_size``, else 1)."""

    sizes: tuple[int, ...] = ()
    fixed: dict[str, Any] | None = None
    fixed_size: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "fixed": self.fixed, "fixed_size": self.fixed_size}

    def settings(self) -> list[Knobs]:
        """Every setting to try, each as the knob it departs from the defaults by."""
        return [Knobs({AUTOTP_KNOB: size}) for size in self.sizes]

    def size(self, knobs: Mapping[str, Any]) -> int:
        """The AutoTP size of a config that sets ``knobs``."""
        return int(knobs[AUTOTP_KNOB]) if AUTOTP_KNOB in knobs else self.fixed_size

    def section(self, knobs: Mapping[str, Any]) -> dict[str, Any] | None:
        """The ``tensor_parallel`` section of a config that sets ``knobs``: the user's values,
        then the knob's; ``None`` where neither sets any."""
        section = copy.deepcopy(self.fixed or {})
        if AUTOTP_KNOB in knobs:
            section[AUTOTP_KEY] = int(knobs[AUTOTP_KNOB])
        return section or None


def build_autotp_space(section: Any) -> AutotpSpace:
    """The AutoTP space of a config whose ``tensor_parallel`` section is ``section`` (checked by
    the config: a dict or ``None``; ``autotp_size`` an int or a list of positive ints). A list
    tunes its sizes above 1 against AutoTP off, which the size search runs as every default
    config does; a number is the user's setting, in every experiment."""
    if not isinstance(section, dict):
        return AutotpSpace()
    fixed = {k: copy.deepcopy(v) for k, v in section.items() if k != AUTOTP_KEY}
    value = section.get(AUTOTP_KEY)
    if isinstance(value, list):
        # AutoTP off, the size 1, is what the default configs run: the sizes above it are tried.
        return AutotpSpace(sizes=tuple(sorted({int(v) for v in value if int(v) > 1})), fixed=fixed)
    if value is not None:
        fixed[AUTOTP_KEY] = value
    return AutotpSpace(fixed=fixed, fixed_size=max(1, int(value or 0)))


def autotp_size(ds_config: Mapping[str, Any]) -> int:
    """The AutoTP size a DeepSpeed config runs with (1: off)."""
    section = ds_config.get(AUTOTP_SECTION)
    value = section.get(AUTOTP_KEY) if isinstance(section, Mapping) else None
    return value if type(value) is int and value > 1 else 1


def distinct_batch(ds_config: Mapping[str, Any]) -> int | None:
    """The samples one optimizer step of ``ds_config`` trains on: its ``train_batch_size`` (as
    DeepSpeed counts it, every rank) over its AutoTP size, whose ranks share one batch;
    ``None`` where it gives no number (``"auto"``, or none)."""
    tbs = ds_config.get(TBS_KEY)
    if type(tbs) is not int:
        return None
    return max(1, tbs // autotp_size(ds_config))


# The key the engine's own throughput figure is kept under where :func:`samples_per_second` corrects it.
ENGINE_THROUGHPUT = "throughput_deepspeed"


def samples_per_second(metrics: dict[str, Any], ds_config: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics of a run of ``ds_config`` with its throughput in samples trained per second:
    DeepSpeed's figure (``train_batch_size / latency``) over the AutoTP size, as its
    ``train_batch_size`` counts each sample once per rank of its group; the engine's own figure
    kept beside it (:data:`ENGINE_THROUGHPUT`). Latency and FLOPS per GPU are a step's and a
    GPU's, right as they are."""
    size = autotp_size(ds_config)
    throughput = metrics.get("throughput")
    if size == 1 or not isinstance(throughput, (int, float)) or isinstance(throughput, bool):
        return metrics
    return {**metrics, "throughput": throughput / size, ENGINE_THROUGHPUT: throughput}
