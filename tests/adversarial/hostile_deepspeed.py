#!/usr/bin/env python3
"""A misbehaving ``deepspeed`` launcher, driven by a table of behaviours per micro-batch size.

``HOSTILE_DS_TABLE`` is a JSON object: ``{"<mbs>": behaviour, "profile": behaviour,
"default": behaviour}``. Behaviours:

    ok              throughput 10 x mbs, reported as DeepSpeed's engine does (benchmarks/fake_deepspeed.py:
                    a timer line per step, then the metrics file); the other good metrics below alike
    huge_stderr     8 MiB of stderr, then a crash
    control_bytes   terminal escapes and control bytes on stderr, then a crash
    no_metrics      exit 0 without a metrics file
    malformed       a metrics file that is not JSON
    inf, nan, negative, string    a metrics file with that throughput
    zero, huge      a metrics file with throughput 0, or 1e300
    tiny, bigint    a metrics file whose throughput and latency are 5e-324 (a rate of 1/5e-324 is
                    infinite), or an integer of 401 digits (no float)
    tie             good metrics with throughput 100, whatever the size
    ignore_sigterm  ignore SIGTERM and hang
    setsid          start a child in its own session (escaping the process group) that
                    lives an hour, then finish with good metrics (after HOSTILE_DS_SLOW seconds)
    hang            sleep an hour
    die             SIGKILL itself after a random moment of up to 0.3 s
    slow            good metrics after HOSTILE_DS_SLOW seconds (default 2)
    linger          good metrics, then an hour before it exits (a slow teardown)
    rendezvous      listen on --master_port as the rank-0 store does for HOSTILE_DS_SLOW seconds
                    (default 2), then good metrics; a port in use fails as torch does (EADDRINUSE)
    fail_first      the experiment's first launch: exit 1 without metrics after HOSTILE_DS_SLOW
                    seconds (default 2); later launches of it: good metrics
    fifo            a FIFO as the metrics file, no writer, exit 0
    dev_zero        the metrics file a link to /dev/zero, exit 0
    flood_metrics   a metrics file of 4 MiB, exit 0

With ``HOSTILE_DS_GATE`` set to a path, each wait of HOSTILE_DS_SLOW seconds above lasts
instead until that path exists: a test opens the gate once what must happen during the run
has happened, whatever the machine's load.

Every launch is appended to ``FAKE_DS_LOG`` (JSON lines): the experiment's name (its result
folder), the behaviour, the pids started, whether metrics were written, and the storage URL the
launch found in its environment (``OPTUNA_STORAGE``), if any.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))
import fake_deepspeed  # noqa: E402


def log(entry):
    fake_deepspeed.append_line(os.environ.get("FAKE_DS_LOG"), entry)


def launches_of(name):
    """How many times the experiment ``name`` was launched, this launch included."""
    with open(os.environ["FAKE_DS_LOG"]) as f:
        return sum(1 for line in f if line.strip() and (e := json.loads(line))["event"] == "start" and e["name"] == name
                   and not e["profile"])


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def pause(default):
    """Wait HOSTILE_DS_SLOW seconds (``default`` if unset), or until HOSTILE_DS_GATE exists."""
    gate = os.environ.get("HOSTILE_DS_GATE")
    if not gate:
        time.sleep(float(os.environ.get("HOSTILE_DS_SLOW", default)))
        return
    while not os.path.exists(gate):
        time.sleep(0.01)


def main(launcher="runner"):
    """``launcher``: which of DeepSpeed's launchers this one poses as (``launch``: the per-node one)."""
    table = json.loads(os.environ.get("HOSTILE_DS_TABLE") or "{}")
    launch = fake_deepspeed.parse(sys.argv[1:], launcher=launcher)
    auto, mbs, profile, training = launch.autotuning, launch.mbs, launch.profile, launch.training
    key = "profile" if profile else ("training" if training else str(mbs))
    behaviour = table.get(key, table.get("default", "ok")) if not training else table.get("training", "ok")
    entry = {"name": os.path.basename(os.path.dirname(os.path.abspath(launch.config_path or launch.metric_path))), "mbs": mbs, "behaviour": behaviour,
             "pid": os.getpid(), "children": [], "profile": profile, "training": training, "metrics": False,
             "storage_env": os.environ.get("OPTUNA_STORAGE")}
    log(dict(entry, event="start"))

    def done(code):
        log(dict(entry, event="end", code=code))
        return code

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(done(143)))
    if behaviour == "fail_first":
        behaviour = "failed_first" if launches_of(entry["name"]) == 1 else "ok"
    if training:
        print(f"training with micro-batch {mbs}", flush=True)
        if behaviour == "setsid":
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
            entry["children"].append(child.pid)
            log(dict(entry, event="child"))
        time.sleep(float(os.environ.get("HOSTILE_DS_TRAIN_SECONDS", "0")))
        return done(0)
    if behaviour == "huge_stderr":
        chunk = "x" * 1023 + "\n"
        for _ in range(8 * 1024):
            sys.stderr.write(chunk)
        sys.stderr.write("RuntimeError: the real cause at the end\n")
        return done(1)
    if behaviour == "control_bytes":
        sys.stderr.write("\x1b[2J\x1b[31mRuntimeError: red\x1b[0m\x07 and \x1b]0;title\x07 bell\r\n")
        return done(1)
    if behaviour == "no_metrics":
        return done(0)
    if behaviour in ("hang", "ignore_sigterm"):
        print("UserWarning: torch.distributed ErrorHandler is deprecated", file=sys.stderr, flush=True)
        if behaviour == "ignore_sigterm":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)
    if behaviour == "die":
        time.sleep(random.uniform(0, 0.3))
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour == "setsid":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
        entry["children"].append(child.pid)
        log(dict(entry, event="child"))
        pause("0")
    if behaviour == "rendezvous":
        port = launch.options.master_port
        store = socket.socket()
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            store.bind(("", port))
            store.listen()
        except OSError:
            print("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
                  f"port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use", file=sys.stderr)
            return done(1)
        pause("2")
    if behaviour == "failed_first":
        pause("2")
        return done(1)
    if behaviour == "slow":
        pause("2")
    if profile:
        info = {"num_params": 1_000_000, "trainable_num_params": 1_000_000, "activation_mem_per_gpu": 1_000_000, "rank": 0}
        write(auto["model_info_path"], json.dumps(info))
        return done(0)
    bad = {"inf": "Infinity", "nan": "NaN", "negative": "-5.0", "string": '"fast"', "zero": "0", "huge": "1e300",
           "tiny": "5e-324", "bigint": "1" + "0" * 400}.get(behaviour)
    if behaviour == "fifo":
        os.mkfifo(auto["metric_path"])
        return done(0)
    if behaviour == "dev_zero":
        os.symlink("/dev/zero", auto["metric_path"])
        return done(0)
    if behaviour == "flood_metrics":
        write(auto["metric_path"], '{"throughput": 10, "pad": "' + "x" * (4 << 20) + '"}')
        return done(0)
    if behaviour == "malformed":
        write(auto["metric_path"], '{"throughput": 12')
    elif bad is not None:  # a metrics file alone, no step timers
        latency = bad if behaviour in ("tiny", "bigint") else "1.0"
        write(auto["metric_path"], f'{{"throughput": {bad}, "latency": {latency}, "FLOPS_per_gpu": 1e9, "rank": 0}}')
    else:
        fake_deepspeed.report(launch, throughput=100.0 if behaviour == "tie" else 10.0 * mbs, flops_per_gpu=1e9)
    entry["metrics"] = True
    if behaviour == "linger":
        log(dict(entry, event="metrics"))
        time.sleep(3600)
    return done(0)


if __name__ == "__main__":
    sys.exit(main())
