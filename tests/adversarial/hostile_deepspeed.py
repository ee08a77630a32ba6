#!/usr/bin/env python3
"""A misbehaving ``deepspeed`` launcher, driven by a table of behaviours per micro-batch size.

``HOSTILE_DS_TABLE`` is a JSON object: ``{"<mbs>": behaviour, "profile": behaviour,
"default": behaviour}``. Behaviours:

    ok              metrics with throughput 10 x mbs
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

Every launch is appended to ``FAKE_DS_LOG`` (JSON lines): the experiment's name (its result
folder), the behaviour, the pids started, and whether metrics were written.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fake_deepspeed import config_path  # noqa: E402
from fake_deepspeed import parse  # noqa: E402


def log(entry):
    path = os.environ.get("FAKE_DS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def launches_of(name):
    """How many times the experiment ``name`` was launched, this launch included."""
    with open(os.environ["FAKE_DS_LOG"]) as f:
        return sum(1 for line in f if line.strip() and (e := json.loads(line))["event"] == "start" and e["name"] == name
                   and not e["profile"])


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def main():
    table = json.loads(os.environ.get("HOSTILE_DS_TABLE") or "{}")
    launcher, script, args = parse(sys.argv[1:])
    cfg_path = config_path(args)
    with open(cfg_path) as f:
        config = json.load(f)
    auto = config.get("autotuning", {})
    mbs = int(config.get("train_micro_batch_size_per_gpu", 1))
    profile = bool(auto.get("model_info", {}).get("profile"))
    training = not auto
    key = "profile" if profile else ("training" if training else str(mbs))
    behaviour = table.get(key, table.get("default", "ok")) if not training else table.get("training", "ok")
    entry = {"name": os.path.basename(os.path.dirname(os.path.abspath(cfg_path))), "mbs": mbs, "behaviour": behaviour,
             "pid": os.getpid(), "children": [], "profile": profile, "training": training, "metrics": False}
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
        time.sleep(float(os.environ.get("HOSTILE_DS_SLOW", "0")))
    if behaviour == "rendezvous":
        port = int(launcher.get("--master_port", 29500))
        store = socket.socket()
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            store.bind(("", port))
            store.listen()
        except OSError:
            print("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
                  f"port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use", file=sys.stderr)
            return done(1)
        time.sleep(float(os.environ.get("HOSTILE_DS_SLOW", "2")))
    if behaviour == "failed_first":
        time.sleep(float(os.environ.get("HOSTILE_DS_SLOW", "2")))
        return done(1)
    if behaviour == "slow":
        time.sleep(float(os.environ.get("HOSTILE_DS_SLOW", "2")))
    if profile:
        info = {"num_params": 1_000_000, "trainable_num_params": 1_000_000, "activation_mem_per_gpu": 1_000_000, "rank": 0}
        write(auto["model_info_path"], json.dumps(info))
        return done(0)
    value = {"inf": "Infinity", "nan": "NaN", "negative": "-5.0", "string": '"fast"', "zero": "0", "huge": "1e300",
             "tie": "100.0", "tiny": "5e-324", "bigint": "1" + "0" * 400}.get(behaviour, str(10.0 * mbs))
    latency = value if behaviour in ("tiny", "bigint") else "1.0"
    if behaviour == "malformed":
        write(auto["metric_path"], '{"throughput": 12')
    else:
        write(auto["metric_path"], f'{{"throughput": {value}, "latency": {latency}, "FLOPS_per_gpu": 1e9, "rank": 0}}')
    entry["metrics"] = True
    if behaviour == "linger":
        log(dict(entry, event="metrics"))
        time.sleep(3600)
    return done(0)


if __name__ == "__main__":
    sys.exit(main())
