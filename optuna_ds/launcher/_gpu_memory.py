"""Peak GPU memory of an experiment, where the accelerator reports it: NVML on NVIDIA GPUs.

DeepSpeed's metrics file has no memory figure, and the ranks are other processes, so the
device's used memory is sampled from outside while the experiment runs. A slot's GPUs are
leased to one experiment at a time, so what the device uses is the experiment's (plus the
driver's own reservation).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from optuna_ds.launcher._resources import Slot
from optuna_ds.launcher._resources import local_host_names

_INTERVAL = 0.2
_lock = threading.Lock()
_nvml: Any = None
_why_not: str | None = None


def _load() -> Any:
    """pynvml, initialised once; ``None`` (with the reason kept) where NVML is not there."""
    global _nvml, _why_not
    with _lock:
        if _nvml is not None or _why_not is not None:
            return _nvml
        if os.environ.get("DS_ACCELERATOR", "cuda") not in ("cuda", ""):
            _why_not = f"DS_ACCELERATOR={os.environ['DS_ACCELERATOR']}: NVML reports NVIDIA GPUs only"
            return None
        try:
            import pynvml
        except ImportError:
            _why_not = "pynvml is not installed (pip install nvidia-ml-py)"
            return None
        try:
            pynvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVMLError and a missing libnvidia-ml alike
            _why_not = f"NVML is not available here ({e}): no NVIDIA GPU or driver"
            return None
        _nvml = pynvml
        return _nvml


def gpu_memory_support() -> str:
    """Whether peak GPU memory is measured here, in words for the report."""
    return "measured with NVML" if _load() is not None else f"not reported: {_why_not}"


def _local_ids(slot: Slot) -> list[int]:
    """The NVML indices of the slot's GPUs on this host (others cannot be sampled from here)."""
    ids = [i for host, host_ids in slot.hosts.items() if host in local_host_names() for i in host_ids]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    order = [int(v) for v in visible.split(",") if v.strip().isdigit()] if visible else []
    return [order[i] if i < len(order) else i for i in ids]


class PeakGpuMemory:
    """Samples the used memory of a slot's local GPUs in a thread while the experiment runs;
    ``peak`` is the largest figure of any of them (bytes), ``None`` where NVML is missing."""

    def __init__(self, slot: Slot, *, interval: float = _INTERVAL) -> None:
        self._nvml = _load()
        self._interval = interval
        self._stop = threading.Event()
        self._handles: Sequence[Any] = []
        self.peak: int | None = None
        if self._nvml is not None:
            try:
                self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in _local_ids(slot)]
            except Exception:  # noqa: BLE001 - an index NVML does not know: nothing to sample
                self._handles = []
        self._thread = threading.Thread(target=self._run, name="optuna-ds-gpu-memory", daemon=True)

    def _sample(self) -> None:
        for handle in self._handles:
            try:
                used = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
            except Exception:  # noqa: BLE001 - a GPU that fell off the bus: keep what was seen
                continue
            self.peak = used if self.peak is None else max(self.peak, used)

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self._interval):
                return

    def __enter__(self) -> PeakGpuMemory:
        if self._handles:
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._handles:
            self._stop.set()
            self._thread.join()
