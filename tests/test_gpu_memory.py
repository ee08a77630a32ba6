"""Peak GPU memory per experiment: sampled through NVML where it is there, said absent elsewhere."""
from __future__ import annotations

import dataclasses
import sys
import time
import types

import optuna
import pytest

from optuna_ds.launcher import Slot
from optuna_ds.launcher import _gpu_memory


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_gpu_memory, "_nvml", None)
    monkeypatch.setattr(_gpu_memory, "_why_not", None)


def _fake_nvml(used: dict[int, list[int]]) -> types.ModuleType:
    """NVML as pynvml exposes it, over GPUs whose used memory follows ``used`` sample by sample."""
    module = types.ModuleType("pynvml")
    calls = {i: 0 for i in used}
    module.nvmlInit = lambda: None  # type: ignore[attr-defined]
    module.nvmlDeviceGetHandleByIndex = lambda i: i if i in used else (_ for _ in ()).throw(RuntimeError("no GPU"))  # type: ignore[attr-defined]

    def info(handle: int) -> types.SimpleNamespace:
        series = used[handle]
        calls[handle] += 1
        return types.SimpleNamespace(used=series[min(calls[handle], len(series)) - 1])

    module.nvmlDeviceGetMemoryInfo = info  # type: ignore[attr-defined]
    return module


def test_peak_is_the_most_any_gpu_of_the_slot_used(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml({2: [1, 5, 9, 3], 3: [2, 7, 4, 4], 0: [100, 100]}))
    assert _gpu_memory.gpu_memory_support() == "measured with NVML"
    with _gpu_memory.PeakGpuMemory(Slot({"localhost": [2, 3]}), interval=0.01) as probe:
        time.sleep(0.2)
    assert probe.peak == 9  # GPU 0 is another slot's


def test_visible_devices_map_the_slot_to_nvml_indices(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml({5: [42], 1: [7]}))
    with _gpu_memory.PeakGpuMemory(Slot({"localhost": [1]}), interval=0.01) as probe:
        time.sleep(0.05)
    assert probe.peak == 42


def test_absent_on_cpu_and_said_so(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert _gpu_memory.gpu_memory_support() == "not reported: DS_ACCELERATOR=cpu: NVML reports NVIDIA GPUs only"
    with _gpu_memory.PeakGpuMemory(Slot({"localhost": [0]})) as probe:
        pass
    assert probe.peak is None


def test_absent_without_pynvml_and_said_so(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert "pynvml is not installed" in _gpu_memory.gpu_memory_support()


def test_the_report_has_a_peak_memory_column_where_it_was_recorded() -> None:
    from optuna_ds.config import Metric
    from optuna_ds.reporting import ReportData
    from optuna_ds.reporting import render_report
    from optuna_ds.reporting._rows import ExperimentRow

    from optuna_ds.domain import Config
    from optuna_ds.domain import ExperimentRecord
    from optuna_ds.domain import Phase

    record = ExperimentRecord(phase=Phase.MICRO_BATCH, config=Config(stage=0, micro_batch=4), slot="localhost:0",
                              result_dir="/r/z0_gas1_tmbspg4", peak_gpu_memory=3 * 2**30, exp_name="z0_gas1_tmbspg4")
    row = ExperimentRow(stage=0, trial=optuna.trial.create_trial(value=1.0), record=record)

    def page(rows: list[ExperimentRow]) -> str:
        return render_report(ReportData(study_name="t", metric=Metric.named("throughput"), studies={}, rows=rows, figures={}), base_dir="/r")

    html = page([row])
    assert ">peak GPU memory<" in html and '<td class="peak num" data-sort="3221225472">3.00 GiB</td>' in html
    assert "peak GPU memory" not in page([dataclasses.replace(row, record=dataclasses.replace(record, peak_gpu_memory=None))])
