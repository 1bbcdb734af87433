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


class DirectoryNotReplaceableError(FileExistsError):
    """A save was asked to replace a directory that holds files it did not write."""


def _owned_by_a_save(target, owned_entries, kind):
    """The names in `target` a save may replace (`owned_entries(target)`);
    raises unless `target` is empty or claimed that way (a directory of
    another `kind`)."""
    entries = sorted(entry.name for entry in target.iterdir())
    if not entries:
        return set()
    owned = owned_entries(target) if owned_entries is not None else None
    if owned is None:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise DirectoryNotReplaceableError(
            f"Cannot save to '{target}': the directory is not empty ({shown}) and is not {kind}, so "
            f"nothing in it was changed. Save to a new or empty directory, or to {kind}."
        )
    return owned


def _carry_over(old, staging, owned):
    """Moves the entries of the preset directory `old` that are not in `owned`
    (a user's notes, a `.git` folder) into `staging`; returns their names."""
    carried = []
    for entry in sorted(old.iterdir(), key=lambda path: path.name):
        if entry.name in owned or (staging / entry.name).exists():
            continue
        os.rename(entry, staging / entry.name)
        carried.append(entry.name)
    return carried


def _move_back(names, staging, old):
    for name in names:
        if (staging / name).exists() or (staging / name).is_symlink():
            os.rename(staging / name, old / name)


@contextlib.contextmanager
def atomic_directory(target, owned_entries=None, kind="a preset saved by attention_zoo_keras"):
    """Yields an empty staging directory that replaces `target` on success.

    Files are written into a hidden sibling of `target`. Only when the `with`
    block finishes does the staging directory take `target`'s place (the old
    one is renamed aside first and deleted last). If the block raises, the
    staging directory is deleted and `target` is untouched.

    A save never deletes what it did not write: a `target` that is not empty
    is replaced only if `owned_entries(target)` returns the names in it that
    a save owns (it returns `None` for a directory that is not of its kind,
    which is then refused, before anything is written). Entries it does not
    own are carried over into the new directory. A symbolic link to a
    directory stays a link: the directory it points to is replaced.

    Args:
        target: str or Path. The directory to create or replace.
        owned_entries: callable or None. `owned_entries(directory) -> set of
            names | None`; `None`: only a missing or empty `target` may be
            written.
        kind: str. What a directory `owned_entries` accepts is, for the
            error that refuses another.

    Raises:
        DirectoryNotReplaceableError: `target` holds files that are not ours.
        NotADirectoryError: `target` or a part of its parent path is a file.

    Example:

    >>> with atomic_directory("./my_preset") as staging:   # doctest: +SKIP
    ...     (staging / "config.json").write_text("{}")
    """
    target = Path(os.path.realpath(Path(target).expanduser()))
    if target.exists() and not target.is_dir():
        raise NotADirectoryError(f"Cannot save a preset to '{target}': it is a file.")
    owned = _owned_by_a_save(target, owned_entries, kind) if target.is_dir() else set()
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
    carried = _carry_over(target, staging, owned)
    backup = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.old"
    try:
        os.rename(target, backup)
    except BaseException:
        _move_back(carried, staging, target)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        os.rename(staging, target)
    except BaseException:
        os.rename(backup, target)
        _move_back(carried, staging, target)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(backup, ignore_errors=True)
