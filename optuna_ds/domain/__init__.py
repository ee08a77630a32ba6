"""Layer 0: the vocabulary every layer shares, and nothing else of optuna-ds: a config and its
name, one experiment, the record its trial stores and the predicates that read it, and the
record of a tuning's root study.

One experiment, from end to end: the planner proposes a :class:`Config`; the builder makes it
an :class:`Experiment` (a complete ``ds_config``, named :meth:`Config.run_name`); the launcher
runs it and returns an :class:`ExperimentResult`; its trial stores an :class:`ExperimentRecord`
(the claim, then the outcome); the planner, the summary and the report read the record back.
"""

from optuna_ds.domain._config import AUTOTP_KNOB
from optuna_ds.domain._config import AUTOTP_SECTION
from optuna_ds.domain._config import CHECKPOINTING_SECTION
from optuna_ds.domain._config import CHECKPOINTING_SWITCH
from optuna_ds.domain._config import GAS_KEY
from optuna_ds.domain._config import MBS_KEY
from optuna_ds.domain._config import TBS_KEY
from optuna_ds.domain._config import ZERO_KEY
from optuna_ds.domain._config import Config
from optuna_ds.domain._config import Knobs
from optuna_ds.domain._config import KnobsLike
from optuna_ds.domain._config import Offload
from optuna_ds.domain._config import accumulation_for
from optuna_ds.domain._config import is_checkpointing
from optuna_ds.domain._config import knob_value
from optuna_ds.domain._experiment import Experiment
from optuna_ds.domain._experiment import ExperimentResult
from optuna_ds.domain._experiment import FailureReason
from optuna_ds.domain._experiment import Phase
from optuna_ds.domain._record import DEFINITIVE_FAILURES
from optuna_ds.domain._record import ExperimentRecord
from optuna_ds.domain._record import given_up
from optuna_ds.domain._record import is_finished_experiment
from optuna_ds.domain._record import Run
from optuna_ds.domain._record import launched
from optuna_ds.domain._record import was_pruned
from optuna_ds.domain._record import read_runs
from optuna_ds.domain._record import superseded
from optuna_ds.domain._record import timed_out_sooner
from optuna_ds.domain._root import ChoiceRecord
from optuna_ds.domain._root import RecordedResources
from optuna_ds.domain._root import RootRecord
from optuna_ds.domain._root import restart_unmeasured
from optuna_ds.domain._root import StageRecord

__all__ = [
    "AUTOTP_KNOB",
    "AUTOTP_SECTION",
    "CHECKPOINTING_SECTION",
    "CHECKPOINTING_SWITCH",
    "ChoiceRecord",
    "Config",
    "DEFINITIVE_FAILURES",
    "Experiment",
    "ExperimentRecord",
    "ExperimentResult",
    "FailureReason",
    "GAS_KEY",
    "Knobs",
    "KnobsLike",
    "MBS_KEY",
    "Offload",
    "Phase",
    "RecordedResources",
    "RootRecord",
    "Run",
    "restart_unmeasured",
    "StageRecord",
    "TBS_KEY",
    "ZERO_KEY",
    "accumulation_for",
    "given_up",
    "is_checkpointing",
    "is_finished_experiment",
    "knob_value",
    "launched",
    "was_pruned",
    "read_runs",
    "superseded",
    "timed_out_sooner",
]
