"""Atomic replacement of a directory or a file, so a failed save never
loses a preset. What is written gets the permissions of a plain file or
directory under the current umask (temporary files, and safetensors' own
writer, create them private)."""

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


def _with_default_permissions(path):
    """Gives `path` (and, for a directory, everything in it) the permissions a
    plain `open()` / `mkdir()` would have."""
    umask = _current_umask()
    path = Path(path)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)
    if path.is_dir():
        for child in path.rglob("*"):
            os.chmod(child, (0o777 if child.is_dir() else 0o666) & ~umask)


def write_atomically(path, write):
    """Calls `write(temporary_path)` and moves the file written there to
    `path`, so `path` never holds half a file.

    Example:

    >>> write_atomically("./notes.txt", lambda p: open(p, "w").write("hi"))   # doctest: +SKIP
    """
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(handle)
    try:
        write(temporary)
        _with_default_permissions(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


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
    try:
        yield staging
        _with_default_permissions(staging)
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
