from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Mapping

# The ops DeepSpeed's CPU accelerator JIT-builds in an experiment (shared-memory collectives,
# Adam); the Makefile's `venv` builds the same ones (its CPU_OPS).
CPU_OPS = ("ShareMemCommBuilder", "FusedAdamBuilder")


def ops_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What an experiment's environment needs for DeepSpeed to load the ops built before (by
    ``make venv``, an earlier experiment) instead of building them again, minutes each.

    - ``TORCH_EXTENSIONS_DIR``: as given; else this environment's own ``torch_extensions``
      folder where there is one (``make venv`` builds the ops there), not torch's default in
      the home folder, which a shell that did not export it would build afresh.
    - ``PATH`` with this interpreter's folder first where it holds a ``ninja`` other than the
      first on ``PATH``: torch builds with the ``ninja`` it finds, and ninja 1.11 (a system's)
      and 1.13 (pip's, DeepSpeed's dependency) record their commands in the build log each
      its own way, so each takes the other's build as outdated and compiles every op again.
    """
    environ = os.environ if environ is None else environ
    env: dict[str, str] = {}
    own = os.path.join(sys.prefix, "torch_extensions")
    if not environ.get("TORCH_EXTENSIONS_DIR") and os.path.isdir(own):
        env["TORCH_EXTENSIONS_DIR"] = own
    here = os.path.dirname(sys.executable)
    ninja = os.path.join(here, "ninja")
    path = environ.get("PATH", os.defpath)
    found = shutil.which("ninja", path=path)
    if os.access(ninja, os.X_OK) and (found is None or not os.path.samefile(found, ninja)):
        env["PATH"] = os.pathsep.join([here, path])
    return env


def cpu_ops_to_build(environ: Mapping[str, str] | None = None) -> list[str]:
    """The CPU ops the first experiment will build, silent for minutes: those of DeepSpeed's CPU
    accelerator that the extension folder an experiment uses (:func:`ops_environment`, else
    torch's default, one folder per Python and device) lacks. None off CPU."""
    from deepspeed.accelerator import get_accelerator
    from torch.utils.cpp_extension import get_default_build_root

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        return []
    environ = os.environ if environ is None else environ
    root = ops_environment(environ).get("TORCH_EXTENSIONS_DIR") or environ.get("TORCH_EXTENSIONS_DIR")
    missing = []
    for builder in CPU_OPS:
        name = accelerator.create_op_builder(builder).name
        pattern = os.path.join(glob.escape(root), name, f"{name}.so") if root else \
            os.path.join(glob.escape(get_default_build_root()), "*", name, f"{name}.so")
        if not glob.glob(pattern):
            missing.append(name)
    return missing
