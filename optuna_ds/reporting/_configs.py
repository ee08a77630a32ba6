"""The optimal config as a user trains with it, and its learning rate for the batch size found."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from optuna_ds._text import one_line
from optuna_ds.config import UserConfig
from optuna_ds.config import find_arg
from optuna_ds.config import set_arg
from optuna_ds.config import with_integer_sizes
from optuna_ds.studies import TuningResult


def optimal_config(result: TuningResult) -> dict[str, Any] | None:
    best = result.best
    if best is None:
        return None
    config = json.loads(json.dumps(best.ds_config))
    config.pop("autotuning", None)
    return with_integer_sizes(config)


@dataclasses.dataclass(frozen=True)
class LearningRateAdvice:
    """DeepSpeed's advice when the best global batch size B' differs from the user's B: scale
    the learning rate by sqrt(B'/B) for Adam-type optimizers, B'/B for SGD."""

    new: int
    original: int
    factor: float
    rule: str
    kind: str
    lr: float | None  # the config's own learning rate, when it is a number

    @property
    def text(self) -> str:
        advice = (f"The best global batch size is {self.new}, the original {self.original}: scale the learning rate "
                  f"by {self.rule} = {self.factor:.4g} ({self.kind}), keeping the other hyperparameters.")
        if self.lr is not None:
            advice += f" Here: lr {self.lr:g} -> {self.lr * self.factor:.4g}."
        return advice


def _config_lr(config: dict[str, Any]) -> Any:
    optimizer = config.get("optimizer")
    params = optimizer.get("params") if isinstance(optimizer, dict) else None
    return params.get("lr") if isinstance(params, dict) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def learning_rate_advice(result: TuningResult, user: UserConfig, *,
                         data_parallel_size: int) -> LearningRateAdvice | str | None:
    """DeepSpeed's advice against the user's global batch size; where the config gives none (a
    micro-batch ``"auto"`` no script flag resolves), the rule alone, as a line: a factor from
    the smallest size tried would scale the learning rate by a batch the user never trained at."""
    best = result.best
    if best is None or best.train_batch_size is None:
        return None
    new = best.train_batch_size
    if not (user.own_train_batch_size or user.baseline_micro_batch_size or user.micro_batch_sizes):
        rule = f"sqrt({new}/B) (an Adam-type optimizer)" if user.adam_type_optimizer else f"{new}/B ({user.optimizer_type})"
        return (f"The best global batch size is {new}; your config gives no batch size to compare it with, so no learning "
                f"rate is scaled: from the global batch size B you train at, scale it by {rule}.")
    original = user.own_train_batch_size or user.min_micro_batch_size * user.gradient_accumulation_steps * data_parallel_size
    if new == original:
        return None
    ratio = new / original
    if user.adam_type_optimizer:
        factor, rule, kind = math.sqrt(ratio), f"sqrt({new}/{original})", "an Adam-type optimizer"
    else:
        # The config's text inside a sentence of the summary and the terminal: one line of it.
        factor, rule, kind = ratio, f"{new}/{original}", one_line(f"{user.optimizer_type}")
    lr = _config_lr(user.raw)
    return LearningRateAdvice(new=new, original=original, factor=factor, rule=rule, kind=kind,
                              lr=float(lr) if _is_number(lr) else None)


@dataclasses.dataclass(frozen=True)
class ScaledLearningRate:
    """``--scale-lr`` applied: the optimal config and script arguments with the scaled learning
    rate, and the line that names the rule; ``note`` alone when it could not be applied."""

    config: dict[str, Any]
    script_args: list[str]
    note: str
    applied: bool


LR_FLAG = "--learning_rate"  # where a Hugging Face Trainer resolves an "auto" learning rate from


def scale_learning_rate(advice: LearningRateAdvice, *, config: dict[str, Any], script_args: Sequence[str],
                        user: UserConfig) -> ScaledLearningRate:
    """Scale the learning rate where it lives: ``optimizer.params.lr`` when it is a number, else
    the script flag it is resolved from (``arg_mappings``' ``lr``, or the Trainer's
    ``--learning_rate``) when the arguments pass it."""
    config = json.loads(json.dumps(config))
    rule = f"scaled by {advice.rule} = {advice.factor:.4g} ({advice.kind}; batch {advice.original} -> {advice.new})"
    lr = _config_lr(config)
    if _is_number(lr):
        config["optimizer"]["params"]["lr"] = new = lr * advice.factor
        return ScaledLearningRate(config, list(script_args), f"learning rate {rule}: optimizer.params.lr {lr:g} -> {new:.6g}", True)
    flag = user.arg_mappings.get("lr", LR_FLAG)
    found = find_arg(script_args, flag)
    if found is not None:
        try:
            value = float(found[1])
        except ValueError:
            value = None
        if value is not None:
            new = value * advice.factor
            return ScaledLearningRate(config, set_arg(script_args, flag, f"{new:.6g}"),
                                      f"learning rate {rule}: {flag} {value:g} -> {new:.6g}", True)
    where = "optimizer.params.lr is \"auto\"" if lr == "auto" else "the config sets no optimizer.params.lr"
    return ScaledLearningRate(config, list(script_args),
                              f"--scale-lr: not applied, {where} and the script arguments pass no {flag}: {advice.text}", False)
