"""Layer 1: the user's DeepSpeed config, its ``autotuning`` section and the script arguments."""

from optuna_ds.config._autotuning import AutotuningConfig
from optuna_ds.config._autotuning import parse_autotuning_config
from optuna_ds.config._deepspeed_check import check_with_deepspeed
from optuna_ds.config._integers import with_integer_sizes
from optuna_ds.config._metric import Metric
from optuna_ds.config._metric import format_number
from optuna_ds.config._script_args import find_arg
from optuna_ds.config._script_args import find_config_path
from optuna_ds.config._script_args import replace_config_path
from optuna_ds.config._script_args import set_arg
from optuna_ds.config._script_args import set_switch
from optuna_ds.config._script_args import switch_state
from optuna_ds.config._user_config import UserConfig
from optuna_ds.config._user_config import check_gpus
from optuna_ds.config._json_file import load_json_file
from optuna_ds.config._user_config import load_user_config
from optuna_ds.config._user_config import parse_user_config

__all__ = [
    "AutotuningConfig",
    "Metric",
    "UserConfig",
    "check_gpus",
    "check_with_deepspeed",
    "find_arg",
    "format_number",
    "find_config_path",
    "load_json_file",
    "load_user_config",
    "parse_autotuning_config",
    "parse_user_config",
    "replace_config_path",
    "set_arg",
    "set_switch",
    "switch_state",
    "with_integer_sizes",
]
