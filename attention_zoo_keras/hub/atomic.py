"""Atomic replacement of a directory, so a failed save never loses a preset."""

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path


def _current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_directory(target):
    """Yields an empty staging directory that replaces `target` on success.

    Files are written into a hidden sibling of `target`. Only when the `with`
    block finishes does the staging directory take `target`'s place (the old
    one is renamed aside first and deleted last). If the block raises, the
    staging directory is deleted and `target` is untouched.

    Example:

    >>> with atomic_directory("./my_preset") as staging:   # doctest: +SKIP
    ...     (staging / "config.json").write_text("{}")
    """
    target = Path(target).expanduser().absolute()
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"Cannot save a preset to '{target}': it is a file.")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:
        raise NotADirectoryError(
            f"Cannot save a preset to '{target}': a part of its parent path is a file."
        ) from error
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    os.chmod(staging, 0o777 & ~_current_umask())
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not target.exists():
        os.rename(staging, target)
        return
    backup = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.old"
    os.rename(target, backup)
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(backup, target)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(backup, ignore_errors=True)
