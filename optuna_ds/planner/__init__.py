"""Layer 1: the planner, one pure function from everything observed to the next experiments.

It owns the whole search of a tuning: which ZeRO stages (and offload variants) to explore,
which micro-batch sizes, which configs to measure again, when to stop, and the final choice.
The studies and the launcher carry its proposals out; a resumed tuning or a worker asks it
again with what the storage holds.
"""

from optuna_ds.planner._checkpointing import ignored as checkpointing_ignored
from optuna_ds.planner._curve import ModelCurve
from optuna_ds.planner._curve import model_curves
from optuna_ds.planner._levers import communication_share
from optuna_ds.planner._levers import lever_effect
from optuna_ds.planner._memory import FeasibilityModel
from optuna_ds.planner._planner import launch_price
from optuna_ds.planner._planner import plan
from optuna_ds.planner._problem import Arm
from optuna_ds.planner._problem import Choice
from optuna_ds.planner._problem import Decision
from optuna_ds.planner._problem import KnobSetting
from optuna_ds.planner._problem import Observation
from optuna_ds.planner._problem import Problem
from optuna_ds.planner._problem import Proposal
from optuna_ds.planner._problem import Status
from optuna_ds.planner._settings import PlannerSettings
from optuna_ds.planner._settings import Priors
from optuna_ds.planner._surrogate import ThroughputModel
from optuna_ds.planner._noise import measured_noise
from optuna_ds.planner._noise import robust_level

__all__ = [
    "Arm",
    "Choice",
    "Decision",
    "FeasibilityModel",
    "KnobSetting",
    "ModelCurve",
    "Observation",
    "PlannerSettings",
    "Priors",
    "Problem",
    "Proposal",
    "Status",
    "ThroughputModel",
    "checkpointing_ignored",
    "communication_share",
    "lever_effect",
    "measured_noise",
    "model_curves",
    "robust_level",
    "launch_price",
    "plan",
]
