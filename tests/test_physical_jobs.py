"""Physical properties of the second, independent simulated-job generator (benchmarks/physical_jobs.py)."""
import math
import statistics
import time

import pytest

from physical_jobs import PHYSICAL_JOBS, by_name, physical_job
from surfaces import SPACES, Config

JOBS = [physical_job(s) for s in range(60)]
MULTI = [j for j in JOBS if j.num_gpus > 1]
SINGLE = [j for j in JOBS if j.num_gpus == 1]


def robust_sd(xs):
    med = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - med) for x in xs)


def test_determinism_and_names():
    a, b = physical_job(7), physical_job(7)
    assert a == b and a.name == "phys-7" and a != physical_job(8)
    c = Config(0 if a.device_gb > 20 * a.params_b else 3, 1)
    assert a.measure(c, 3) == b.measure(c, 3)
    assert a.step_times(c, 3) == b.step_times(c, 3)
    assert by_name("phys-7") == a
    for j in PHYSICAL_JOBS:
        assert by_name(j.name) is j and j.name.startswith("phys-") and j.description
    with pytest.raises(KeyError):
        by_name("phys-nope")


def test_memory_rises_with_mbs_and_falls_with_stage():
    for j in JOBS:
        for stage in range(4):
            for m in (1, 2, 4, 8, 16, 32):
                assert j.memory_gb(Config(stage, 2 * m)) > j.memory_gb(Config(stage, m))
    big = [j for j in JOBS if j.num_gpus >= 4 and j.params_b >= 1.0]
    assert len(big) >= 5
    for j in big:
        mem = [j.memory_gb(Config(s, 1)) for s in range(4)]
        assert mem[0] > mem[1] > mem[2] > mem[3], (j.name, mem)
        assert j.memory_gb(Config(3, 1, offload_optimizer=True, offload_param=True)) < mem[3]


def test_oom_exactly_past_the_device_and_peak_memory():
    for j in JOBS[:30]:
        for c in (Config(0, 1), Config(2, 8), Config(3, 64), Config(1, 1024)):
            out = j.evaluate(c)
            assert (out.kind == "oom") == (j.memory_gb(c) > j.device_gb)
            assert out.seconds > j.startup_s
            if out.kind == "ok":
                pk = j.peak_memory_gb(c, 1)
                assert j.memory_gb(c) <= pk <= min(j.device_gb, 1.03 * j.memory_gb(c)) + 1e-9
                assert out.seconds > j.startup_s + j.steps * j.step_time(c)
            else:
                assert out.throughput == 0.0 and j.measure(c, 1) == 0.0 and j.step_times(c, 1) == []


def test_knobs_do_not_matter_on_one_gpu():
    assert len(SINGLE) >= 10
    checked = 0
    for j in SINGLE:
        for stage in (1, 2, 3):
            thr = []
            for knobs in j._settings(stage, fast=False):
                c = Config(stage, 1, 1, knobs)
                if j.memory_gb(c) < 0.85 * j.device_gb and j.evaluate(c).kind == "ok":
                    thr.append(j.evaluate(c).throughput)
            if len(thr) > 1:
                checked += 1
                assert max(thr) / min(thr) < 1.01, (j.name, stage)
    assert checked >= 10


def test_knobs_matter_on_many_gpus():
    spread = []
    for j in MULTI:
        thr = [j.evaluate(Config(2, 1, 1, k)).throughput for k in j._settings(2, fast=False)]
        thr = [t for t in thr if t > 0]
        if thr:
            spread.append(max(thr) / min(thr))
    assert statistics.median(spread) > 1.02


def test_stage2_slower_than_stage1_at_the_same_mbs():
    slower = total = 0
    for j in MULTI:
        k = j._fit_len(1, False, False, (), 1024)
        if not k:
            continue
        a, b = j.evaluate(Config(1, max(1, k // 2))), j.evaluate(Config(2, max(1, k // 2)))
        if a.kind == b.kind == "ok":
            total += 1
            slower += b.throughput < a.throughput
    assert total >= 20 and slower / total > 0.8


def test_communication_share_falls_with_gas():
    n = 0
    for j in MULTI:
        for stage in (0, 1):
            c1, c4 = Config(stage, 1, 1), Config(stage, 1, 4)
            if j.evaluate(c1).kind != "ok":
                continue
            b1, b4 = j.breakdown(c1), j.breakdown(c4)
            assert b4["comm"] / b4["step"] < b1["comm"] / b1["step"]
            assert j.evaluate(c4).throughput > j.evaluate(c1).throughput
            n += 1
    assert n >= 20


@pytest.mark.parametrize("job", [by_name("phys-gpt2l-h100"), by_name("phys-7b-2x8a100"), physical_job(3),
                                 physical_job(11)], ids=lambda j: j.name)
def test_measured_noise_matches_noise(job):
    c, true = job.optimum(fast=True, offload=True)
    logs = [math.log(job.measure(c, k) / true) for k in range(600)]
    assert abs(robust_sd(logs) / job.noise - 1) < 0.2, (robust_sd(logs), job.noise)
    assert abs(statistics.median(logs)) < 0.25 * job.noise  # the true throughput is a typical run's


def test_step_times_consistent_and_per_run_factor():
    for j in JOBS[:20]:
        c, _ = j.optimum(fast=True, offload=True)
        st = j.step_times(c, 5)
        assert len(st) == j.steps
        # DeepSpeed's trim_mean(records, 0.1): round(10%) of the steps dropped at each end
        k = round(len(st) * 0.1)
        kept = sorted(st)[k:len(st) - k]
        assert j.measure(c, 5) == pytest.approx(c.mbs * c.gas * j.num_gpus * len(kept) / sum(kept), rel=1e-12)
    # a job whose per-run factor dominates: within-run spread does not explain run-to-run spread
    j = next(j for j in JOBS if j.noise_run > 2 * j.step_sd and j.noise_run > 0.01)
    c, _ = j.optimum(fast=True, offload=True)
    runs = [j.step_times(c, k) for k in range(300)]
    means = [math.log(statistics.fmean(r)) for r in runs]
    within = statistics.median(robust_sd([math.log(x) for x in r]) for r in runs)
    assert robust_sd(means) > 1.5 * within / math.sqrt(j.steps)


def test_noise_falls_with_steps():
    j = physical_job(11)
    sds = [j.__class__(**{**{f.name: getattr(j, f.name) for f in j.__dataclass_fields__.values() if f.init},
                          "steps": s, "noise_run": 0.002}).noise for s in (5, 20)]
    assert sds[1] < 0.75 * sds[0]


def test_arm_optima_is_the_brute_force_optimum_and_fast():
    for j in (by_name("phys-13b-8xa100-40"), physical_job(0), physical_job(2)):
        best = {}
        for c in j.configs(fast=False, offload=True, max_mbs=128):
            out = j.evaluate(c)
            arm = (c.stage, c.offload_optimizer, c.offload_param)
            if out.kind == "ok" and out.throughput > best.get(arm, (None, 0.0))[1]:
                best[arm] = (c, out.throughput)
        assert j.arm_optima(fast=False, offload=True, max_mbs=128) == best
    for j in [by_name("phys-bert-4xa10")] + JOBS[:10]:
        j._cache.clear()
        t = time.perf_counter()
        j.arm_optima(fast=False, offload=True)
        assert time.perf_counter() - t < 1.5
        j._cache.clear()
        t = time.perf_counter()
        j.arm_optima(fast=True, offload=True)
        assert time.perf_counter() - t < 0.1


def test_configs_shapes():
    j = by_name("phys-1p3b-8xa100")
    full = list(j.configs(fast=False, stages=(2,)))
    assert {c.knobs for c in full} <= {k for k in j._settings(2, False)}
    assert all(dict(c.knobs).keys() == SPACES[2].keys() for c in full)
    assert all(not c.offload_optimizer for c in full)
    fast = list(j.configs(fast=True, offload=True))
    assert {(c.stage, c.offload_optimizer, c.offload_param) for c in fast} <= {
        (0, False, False), (1, False, False), (1, True, False), (2, False, False), (2, True, False),
        (3, False, False), (3, True, False), (3, True, True)}
    assert all(c.knobs == () and j.memory_gb(c) <= j.device_gb for c in fast)


def test_hand_made_jobs():
    thirty = by_name("phys-30b-4xh100")
    assert all(arm[1] for arm in thirty.arm_optima(fast=True, offload=True))  # only offload runs
    thirteen = by_name("phys-13b-8xa100-40")
    assert set(thirteen.arm_optima(fast=True)) == {(3, False, False)}
    assert by_name("phys-gpt2l-h100").num_gpus == 1 and by_name("phys-7b-2x8a100").num_gpus == 16
    bert = by_name("phys-bert-4xa10")
    assert bert.optimum(fast=True)[0].mbs > 64


def test_population():
    winners, below, offload, crash = set(), 0, 0, 0
    for j in JOBS:
        c, _ = j.optimum(fast=False, offload=True)
        winners.add(c.stage)
        offload += c.offload_optimizer
        below += c.mbs < j._fit_len(c.stage, c.offload_optimizer, c.offload_param, c.knobs, 1024)
        crash += j.crash_rule != ""
    n = len(JOBS)
    assert winners == {0, 1, 2, 3}
    assert 0.02 <= offload / n <= 0.25
    assert 0.15 <= below / n <= 0.7
    assert 0.03 <= crash / n <= 0.3
    assert 0.15 <= len(SINGLE) / n <= 0.5
    assert any(j.act_gb > 1.1 * j.act_real_gb for j in JOBS) and any(j.act_gb < 0.9 * j.act_real_gb for j in JOBS)
    assert 0.003 < min(j.noise for j in JOBS) and max(j.noise for j in JOBS) < 0.08


def test_zeropp_pays_across_a_slow_interconnect_and_not_on_one_node():
    """The lever families (issue 37): qwZ/qgZ/hpZ save inter-node bytes and cost kernels; hpZ's
    secondary partition costs memory; DeepSpeed's timers add up to the step."""
    from physical_jobs import HPZ, QGZ, QWZ, lever_job

    slow = next(j for j in (lever_job("zpp-slow", i) for i in range(10)) if j.nodes > 1)
    one = next(j for j in (lever_job("zpp-fast", i) for i in range(10)) if j.nodes == 1)
    for job in (slow, one):
        plain = Config(3, 2, 1, (("overlap_comm", True),))
        assert job.evaluate(plain).kind == "ok"
        timers = job.timers_ms(plain)
        assert sum(timers[k] for k in ("fwd", "bwd", "step")) == pytest.approx(1e3 * job.step_time(plain))
    on = Config(3, 2, 1, (("overlap_comm", True), (HPZ, 8), (QGZ, True), (QWZ, True)))
    plain = Config(3, 2, 1, (("overlap_comm", True),))
    assert slow.evaluate(on).throughput > 1.1 * slow.evaluate(plain).throughput
    psi = slow.params_b * 1e9
    assert slow.memory_gb(on) - slow.memory_gb(plain) == pytest.approx(2 * psi / 8 / 1e9, rel=0.05)
    quantized = Config(3, 2, 1, (("overlap_comm", True), (QWZ, True)))
    assert one.evaluate(quantized).throughput < one.evaluate(plain).throughput  # NVLink: only the kernels' cost
    # The levers are the job's space only where optuna-ds proposes them.
    assert set(slow.spaces()[3]) >= {HPZ, QGZ, QWZ} and set(one.spaces()[3]) & {HPZ, QGZ, QWZ} == {QWZ}
    assert not set(lever_job("zpp-slow", 0, levers=False).spaces()[3]) & {HPZ, QGZ, QWZ}


def test_checkpointing_trades_a_forward_for_activations_where_the_script_takes_the_switch():
    """The checkpointing families (issue 37): the switch on runs the same job with full
    checkpointing: fewer activations a sample, a third more compute, the backward holding the
    recomputed forward in DeepSpeed's timers; off, the space without it."""
    from physical_jobs import CKPT, checkpoint_job

    job = checkpoint_job("ckpt-short", 0)
    plain, on = Config(0, 2, 1, ()), Config(0, 2, 1, ((CKPT, True),))
    assert job.memory_gb(on) < job.memory_gb(plain)
    assert job.step_time(on) > job.step_time(plain)
    t_plain, t_on = job.timers_ms(plain), job.timers_ms(on)
    # The backward holds the recomputed forward (the per-micro-batch overheads in the forward's timer are not recomputed).
    assert t_on["bwd_inner"] / t_on["fwd"] > t_plain["bwd_inner"] / t_plain["fwd"] + 0.25
    assert any(k == ((CKPT, True),) for k in job._settings(0, True))
    assert list(checkpoint_job("ckpt-short", 0, switch=False)._settings(0, True)) == [()]
    # Somewhere a sample's activations fit only with it: its optimum is the larger space's.
    long = [checkpoint_job("ckpt-long", i) for i in range(10)]
    assert any(checkpoint_job("ckpt-long", i, switch=False).optimum(fast=True, offload=True)[0] is None
               and j.optimum(fast=True, offload=True)[0] is not None for i, j in enumerate(long))


def test_autotp_splits_the_states_and_activations_for_all_reduces_where_the_script_runs_it():
    """The AutoTP families (issue 37): a rank of a group of t holds 1/t of the model states and
    of a sample's split activations, its group trains on one batch (its throughput counts the
    group's samples once), and its per-layer all-reduces run over the node's links, ten times
    as slow on PCIe; at stages 0-2 without offload, where listed."""
    from physical_jobs import AUTOTP, autotp_job

    job, pcie = autotp_job("tp-nvlink", 0), autotp_job("tp-pcie", 0)
    plain, split = Config(0, 1, 1, ()), Config(0, 1, 1, ((AUTOTP, 2),))
    psi = job.params_b * 1e9
    assert job.memory_gb(plain) - job.memory_gb(split) > 0.9 * 10 * psi / 1e9  # half of stage 0's 20 bytes a parameter
    assert job._data_ranks(split.knobs) == job.num_gpus // 2

    def exchange(j, m: int = 4) -> float:  # the all-reduces' share of a split step's micro-batch time
        c = j._key_curve(2, False, False, ((AUTOTP, 2),), 1, m)
        return float(c["comm"][m - 1] / c["step"][m - 1])

    assert pcie.intra_gbps < 30 < job.intra_gbps and exchange(pcie) > exchange(job)
    assert ((AUTOTP, 2),) in set(job._settings(1, True)) and ((AUTOTP, 2),) not in set(job._settings(1, True, offloaded=True))
    assert ((AUTOTP, 2),) not in set(job._settings(3, True))
    assert list(autotp_job("tp-nvlink", 0, listed=False)._settings(0, True)) == [()]
