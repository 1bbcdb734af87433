"""Sweeps over sequence length in which every point runs in a fresh Python
process (so that a point that runs out of memory, hangs or crashes takes
only its own process down): the worker's command-line plumbing, running one
point in a subprocess, and the log-log fits that predict the next point and
give the scaling exponents.

A script that sweeps this way takes the hidden `--worker SPEC` and
`--worker-output PATH` flags (`add_worker_arguments`); `run_worker` starts
``python -m <that script's module> --worker SPEC ...`` from the repository
root, and the worker writes its result as JSON to `--worker-output`.

Only the standard library is imported (see `benchmarks.timing`).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

# The repository root: the workers run from there, so `benchmarks` and the
# library import as they do in the parent.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_worker_arguments(parser):
    """The hidden flags of a point's worker process."""
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-output", default=None, help=argparse.SUPPRESS)


def run_worker(module, spec, threads, timeout, tail_chars):
    """Runs one point in a fresh Python process, ``python -m module --worker
    SPEC --worker-output FILE --threads N`` with the JSON of `spec`, killed
    after `timeout` seconds. Returns `{"result": the JSON the worker last
    wrote (None if none), "returncode", "timed_out", "seconds", "maxrss_bytes"
    (the process's peak resident size, from `os.wait4`'s rusage: since its
    last clear_refs reset, or its start), "tail": the last `tail_chars` of
    its output (stdout and stderr)}`."""
    with tempfile.TemporaryDirectory() as directory:
        output = os.path.join(directory, "result.json")
        log_path = os.path.join(directory, "log.txt")
        command = [
            sys.executable, "-m", module, "--worker", json.dumps(spec),
            "--worker-output", output, "--threads", str(threads),
        ]
        start = time.perf_counter()
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            timed_out = threading.Event()

            def kill():
                timed_out.set()
                process.kill()

            timer = threading.Timer(timeout, kill)
            timer.start()
            try:
                _, status, usage = os.wait4(process.pid, 0)
            finally:
                timer.cancel()
            process.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        with open(log_path) as f:
            tail = f.read()[-tail_chars:]
        result = None
        if os.path.exists(output):
            with open(output) as f:
                result = json.load(f)
        return {
            "result": result,
            "returncode": process.returncode,
            "timed_out": timed_out.is_set(),
            "seconds": seconds,
            "maxrss_bytes": usage.ru_maxrss * 1024,
            "tail": tail,
        }


def fit_exponent(points):
    """Least-squares slope of log(y) against log(L) over `[(L, y), …]` with
    y > 0; None with fewer than two such points."""
    points = [(x, y) for x, y in points if y and y > 0]
    if len(points) < 2:
        return None
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread


def extrapolate(points, length):
    """Predicted y at `length` from the last two measured `(L, y)` points on
    a log-log line (slope clamped to [1, 2]); from one point, slope 2; None
    without any."""
    points = [(x, y) for x, y in sorted(points) if y and y > 0]
    if not points:
        return None
    slope = 2.0
    if len(points) >= 2:
        (x0, y0), (x1, y1) = points[-2:]
        slope = min(2.0, max(1.0, math.log(y1 / y0) / math.log(x1 / x0)))
    x, y = points[-1]
    return y * (length / x) ** slope
