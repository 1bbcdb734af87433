"""Warnings that point at the user's line, not at this library's.

`warnings.warn(..., stacklevel=2)` names the caller of the function that
warns, which for a warning raised deep inside `from_preset` is another file
of this library. `warn` names the first frame outside the package instead
(what Python 3.12's `skip_file_prefixes` does), so the message shows the
user's own `from_preset(...)` line.
"""

import os
import sys
import warnings

_PACKAGE_DIRECTORY = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message, category=UserWarning):
    """`warnings.warn(message, category)` attributed to the innermost frame
    that is not in this package.

    Example:

    >>> warn("The head starts from its initializer.")  # doctest: +SKIP
    """
    level, frame = 2, sys._getframe(1)  # stacklevel 2: the caller of `warn`
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIRECTORY):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)
