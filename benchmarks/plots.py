"""The log-log figures of the sweep benchmarks (time and memory against
length, one row of two panels per run) and their `--plot` / `--replot`
flags: a run draws its own figure, and `--replot RUN.json …` draws several
runs' JSON (say, one per backend) into one figure without running anything.

matplotlib is imported only when a figure is drawn (see `benchmarks.timing`).
"""

import json


def add_plot_arguments(parser, what):
    """`--plot PATH` (a PNG of `what`) and `--replot JSON…`."""
    parser.add_argument("--plot", default=None, help=f"save a log-log plot ({what}) to this PNG")
    parser.add_argument(
        "--replot", nargs="+", default=None, metavar="JSON",
        help="only plot: draw the results of these JSON files (one row per file) to --plot",
    )


def check_plot_arguments(parser, args):
    if args.replot and not args.plot:
        parser.error("--replot needs --plot PATH")


def load_payloads(paths):
    """The JSON results of each file in `paths`."""
    payloads = []
    for path in paths:
        with open(path) as f:
            payloads.append(json.load(f))
    return payloads


def figure_rows(count):
    """`(pyplot, figure, axes)`: `count` rows of two panels (non-interactive
    backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(count, 2, figsize=(12, 4.2 * count), squeeze=False)
    return plt, figure, axes


def log_log_panels(row, ylabels, xlabel, title, legend=False):
    """Log-log axes (base 2 along x), labels, title and grid for one row's
    panels; with `legend`, a legend in each."""
    for axis, what in zip(row, ylabels):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel(xlabel)
        axis.set_ylabel(what)
        axis.set_title(title, fontsize=9)
        axis.grid(True, which="both", alpha=0.3)
        if legend:
            axis.legend(fontsize=7)


def save_figure(plt, figure, path):
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
