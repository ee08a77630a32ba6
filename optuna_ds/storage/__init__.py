"""Layer 1: the Optuna RDB storage, and what is kept in it: the tuning plan and which studies are a tuning's."""

from optuna_ds._optuna_compat import TrialCache
from optuna_ds._redact import redact_url
from optuna_ds.storage._folders import claim_folder
from optuna_ds.storage._plan import TuningPlan
from optuna_ds.storage._plan import check_study_name
from optuna_ds.storage._plan import claim_stage_study
from optuna_ds.storage._plan import delete_tuning
from optuna_ds.storage._plan import ending
from optuna_ds.storage._plan import load_plan
from optuna_ds.storage._plan import load_stage_study
from optuna_ds.storage._plan import open_root_study
from optuna_ds.storage._plan import open_stage_study
from optuna_ds.storage._plan import set_model_curves
from optuna_ds.storage._plan import set_verdict
from optuna_ds.storage._plan import set_ending
from optuna_ds.storage._plan import stage_of
from optuna_ds.storage._plan import stage_study_name
from optuna_ds.storage._plan import model_curves_of
from optuna_ds.storage._plan import verdict
from optuna_ds.storage._plan import tuning_names
from optuna_ds.storage._plan import tuning_study_names
from optuna_ds.storage._storage import DB_FILENAME
from optuna_ds.storage._storage import GRACE_PERIOD
from optuna_ds.storage._storage import NoDatabase
from optuna_ds.storage._storage import StorageError
from optuna_ds.storage._storage import create_storage
from optuna_ds.storage._storage import database_error
from optuna_ds.storage._storage import default_storage_url
from optuna_ds.storage._storage import storage_failures

__all__ = [
    "DB_FILENAME",
    "GRACE_PERIOD",
    "NoDatabase",
    "StorageError",
    "TrialCache",
    "TuningPlan",
    "check_study_name",
    "claim_folder",
    "claim_stage_study",
    "create_storage",
    "database_error",
    "default_storage_url",
    "delete_tuning",
    "ending",
    "load_plan",
    "load_stage_study",
    "open_root_study",
    "open_stage_study",
    "set_model_curves",
    "set_verdict",
    "set_ending",
    "redact_url",
    "stage_of",
    "stage_study_name",
    "storage_failures",
    "verdict",
    "model_curves_of",
    "tuning_names",
    "tuning_study_names",
]
