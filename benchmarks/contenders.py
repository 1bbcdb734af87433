"""The in-process contest of the benchmarks that time ours against other
implementations (KerasHub, transformers) on the same inputs: choosing the
contenders, recording one that fails (the others go on), a variant of a
contender with one setting changed, timing one call, the interleaved
rounds, the summary statistics and the ratio columns.

Interleaving: after every contender is built and warmed up, the timed calls
run in rounds, one call of each contender per round, the order rotated by
one each round (who goes first changes), so that other load on the machine
weighs on every contender alike; the "paired" ratio (the median over rounds
of each round's ratio) is then the one to trust on a busy machine.

Only the standard library is imported (see `benchmarks.timing`).
"""

import statistics
import sys
import time
import traceback

from benchmarks.timing import paired_ratio

# The note under the results tables that have ratio columns (ours = the
# reference), up to the CPU time's parenthesis, which the caller closes.
RATIO_NOTE = (
    "\nratio = contender / ours of the times (> 1: ours faster): of the medians, of the minima, and"
    "\n'paired', the median over rounds of the per-round ratio (the contenders run back to back in"
    "\neach round, so this one cancels load that changes between rounds). CPU s = median process"
    "\nCPU time (all threads"
)


def select_contenders(spec, known):
    """The names in the comma-separated `spec`, in its order; exits naming
    any that are not in `known`."""
    chosen = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        raise SystemExit(f"unknown contenders: {', '.join(unknown)}")
    return chosen


def record_failure(entry, error, heading=None):
    """Records `error` (call inside its `except`) in the dict `entry`, as
    `"error"` and `"traceback"`, and prints the traceback (under
    `"<heading> FAILED:"` if `heading` is given)."""
    entry["error"] = f"{type(error).__name__}: {error}"
    entry["traceback"] = traceback.format_exc()
    print(entry["traceback"] if heading is None else f"\n{heading} FAILED:\n{entry['traceback']}")
    sys.stdout.flush()


def with_setting(function, owner, name, value):
    """`function` with `owner.name` (a module's setting or function) set to
    `value` during each call, and so in whatever the call traces or
    compiles: a contender measured against itself with one optimisation
    undone."""

    def call(*args, **kwargs):
        kept = getattr(owner, name)
        setattr(owner, name, value)
        try:
            return function(*args, **kwargs)
        finally:
            setattr(owner, name, kept)

    return call


def transformers_optimizer(parameters, learning_rate, device):
    """`(optimizer, name)` for a `transformers` contender's training step:
    on CUDA `torch.optim.AdamW(fused=True, weight_decay=0.0)`, the fused
    kernel `transformers`' `Trainer` defaults to (without weight decay its
    update is Adam's); elsewhere `torch.optim.Adam`. torch is imported here,
    by the caller's contender only."""
    import torch

    if device == "cuda":
        optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.0, fused=True)
        return optimizer, "torch.optim.AdamW(fused=True, weight_decay=0.0)"
    return torch.optim.Adam(parameters, lr=learning_rate), "torch.optim.Adam"


def round_robin(names, rounds):
    """The order of each of `rounds` rounds: `names` rotated by one more
    place every round."""
    names = list(names)
    for index in range(rounds):
        shift = index % max(len(names), 1)
        yield names[shift:] + names[:shift]


def timed_call(call, synchronize=lambda: None):
    """`(output, wall seconds, process CPU seconds)` of one `call()`, the
    device's work included: `synchronize()` (wait for the device) before the
    clocks start and after the call."""
    synchronize()
    cpu_start, start = time.process_time(), time.perf_counter()
    out = call()
    synchronize()
    return out, time.perf_counter() - start, time.process_time() - cpu_start


def time_interleaved(runners, rounds, measure, entry, fail):
    """`rounds` interleaved rounds (`round_robin`) over the names in
    `runners` as they are when called: `measure(name)` -> `(wall, cpu)`
    seconds of one call, appended to `entry(name)["times_s"]` and
    `["cpu_s"]`. A call that raises goes to `fail(name, error)` (which
    removes the name from `runners`); the others go on."""
    for order in round_robin(list(runners), rounds):
        for name in order:
            if name not in runners:
                continue
            try:
                wall, cpu = measure(name)
            except Exception as error:  # report and go on with the other contenders
                fail(name, error)
                continue
            entry(name)["times_s"].append(wall)
            entry(name)["cpu_s"].append(cpu)


def time_rounds(runners, rounds):
    """`{name: entry}`: each of `runners` (`{name: call}`, warmed up by the
    caller) timed in `rounds` interleaved rounds (`time_interleaved`) and
    summarised (`summarise`); a call that raises stops the run."""
    entries = {name: {"times_s": [], "cpu_s": []} for name in runners}

    def measure(name):
        _, wall, cpu = timed_call(runners[name])
        return wall, cpu

    def fail(name, error):
        raise error

    time_interleaved(runners, rounds, measure, entries.__getitem__, fail)
    for entry in entries.values():
        summarise(entry)
    return entries


def summarise(entry):
    """Adds `median_s`, `min_s` and `cpu_median_s` to an entry with
    `times_s` and `cpu_s`."""
    entry["median_s"] = statistics.median(entry["times_s"])
    entry["min_s"] = min(entry["times_s"])
    entry["cpu_median_s"] = statistics.median(entry["cpu_s"])


def ratio_cells(entry, reference):
    """The three ratio columns of `entry` against `reference` (ours; None
    or without `median_s` where ours has no result): of the medians, of the
    minima and paired, the last also stored as `entry["paired_ratio"]`."""
    if not reference or "median_s" not in reference:
        return ["-", "-", "-"]
    entry["paired_ratio"] = paired_ratio(entry["times_s"], reference["times_s"])
    return [
        f"{entry['median_s'] / reference['median_s']:.2f}",
        f"{entry['min_s'] / reference['min_s']:.2f}",
        f"{entry['paired_ratio']:.2f}",
    ]
