"""The hint every "unknown name" error in the library ends with."""

import difflib


def did_you_mean(name, candidates, n=3, cutoff=0.6):
    """`" Did you mean: a, b?"` with the known names closest to `name`, or
    `""` when none is close.

    >>> did_you_mean("top-p", ["greedy", "top_k", "top_p"])
    ' Did you mean: top_p, top_k?'
    """
    close = difflib.get_close_matches(str(name), list(candidates), n=n, cutoff=cutoff)
    return f" Did you mean: {', '.join(close)}?" if close else ""
