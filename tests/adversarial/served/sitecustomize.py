"""Imported at start-up by every Python whose PYTHONPATH holds this folder. With
``HOSTILE_SERVED`` set, DeepSpeed's per-node launcher ``deepspeed.launcher.launch`` is the
hostile launcher: the launch server imports and forks it, the fallback runs it with ``-m``, so
the served path meets the same behaviour table. ``HOSTILE_SERVED=light`` also stands in for
the rest of what the server imports (DeepSpeed, torch: seconds), for in-process tests whose
tuner is the test itself; otherwise the rest of DeepSpeed is real."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _Light(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if module.__name__ == "deepspeed.accelerator":
            module.get_accelerator = lambda: None


class _HostileLaunch(importlib.abc.MetaPathFinder):
    def __init__(self, light):
        self.light = light

    def find_spec(self, name, path, target=None):
        if name == "deepspeed.launcher.launch":
            return importlib.util.spec_from_file_location(name, os.path.join(_HERE, "hostile_launch.py"))
        if self.light and name in ("deepspeed", "deepspeed.launcher", "deepspeed.accelerator"):
            return importlib.machinery.ModuleSpec(name, _Light(), is_package=name != "deepspeed.accelerator")
        return None


if os.environ.get("HOSTILE_SERVED"):
    sys.meta_path.insert(0, _HostileLaunch(os.environ["HOSTILE_SERVED"] == "light"))
