#!/usr/bin/env python3
"""The hostile launcher posing as DeepSpeed's ``deepspeed`` runner, whose console script reads
``from deepspeed.launcher.runner import main``: the tuner then starts single-node experiments
with the per-node launcher, from its launch server (see ``sitecustomize.py`` here)."""

import os
import runpy

runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hostile_deepspeed.py"), run_name="__main__")
