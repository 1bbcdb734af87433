"""Where a preset's files come from: a named preset, `hf://org/repo[@revision]`
or a local directory.

`PresetSource` hands out local paths of a preset's files. Hub files go through
`huggingface_hub.hf_hub_download`, so they land in its cache (shared with
`transformers`), show its progress bars, honour `HF_HUB_OFFLINE=1` and
`HF_ENDPOINT`, and are not downloaded twice.
"""

import json
import os
from pathlib import Path

from attention_zoo_keras.hub.catalog import UnknownPresetError
from attention_zoo_keras.hub.catalog import get_preset

HF_PREFIX = "hf://"


class PresetFileError(OSError):
    """A preset file is missing, unreadable or corrupt."""


# Seconds the one connectivity check of a hub source may take to connect.
HUB_CONNECT_TIMEOUT = 5.0


def _parse_hf_handle(handle):
    repo_and_revision = handle[len(HF_PREFIX) :]
    repo_id, at, revision = repo_and_revision.partition("@")
    parts = repo_id.split("/")
    if not repo_id or len(parts) > 2 or not all(parts):
        raise UnknownPresetError(
            f"'{handle}' is not a valid hub handle; expected 'hf://org/repo' or 'hf://org/repo@revision'."
        )
    if at and not revision:
        raise UnknownPresetError(
            f"'{handle}' is not a valid hub handle: the revision after '@' is empty. Write "
            f"'hf://{repo_id}' for the main branch, or name a branch, tag or commit after '@'."
        )
    return repo_id, revision or None


def inside(directory, filename):
    """`directory / filename`, or `None` when `filename` leaves `directory`
    (an absolute path, a `..` part, or a symbolic link pointing out).

    The one link allowed out is the Hugging Face cache's own layout: a file
    of `<repo>/snapshots/<revision>/` that links to `<repo>/blobs/`.
    """
    relative = Path(filename)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        return None
    path = directory / relative
    target = path.resolve()
    in_cache_blobs = directory.parent.name == "snapshots" and target.parent == directory.parent.parent / "blobs"
    if not (target.is_relative_to(directory) or in_cache_blobs):
        return None
    return path


class PresetSource:
    """The files of one preset, wherever they live.

    Args:
        handle: str, Path or PresetSource. A named preset (`"bert_base"`),
            `"hf://org/repo"` with an optional `"@revision"`, a local
            directory, or another `PresetSource` (returned as is by
            `PresetSource.of`).
        family: str or None. The model family a named preset must belong
            to, if any.
        force_download: bool. Download hub files again even if they are
            cached (to replace a corrupt cached file).

    Example:

    >>> source = PresetSource("hf://google-bert/bert-base-uncased")  # doctest: +SKIP
    >>> source.file("config.json")                                  # doctest: +SKIP
    PosixPath('.../snapshots/.../config.json')
    """

    def __init__(self, handle, family=None, force_download=False):
        self.handle = str(handle)
        self.preset_name = None
        self.config_overrides = {}
        self.directory = None
        self.repo_id = None
        self.revision = None
        self.force_download = bool(force_download)
        location = self.handle
        if not location.startswith(HF_PREFIX) and not self._looks_like_path(location):
            self.preset_name = location
            entry = get_preset(location, family=family)
            location = entry["source"]
            self.config_overrides = dict(entry.get("config_overrides", {}))
        if location.startswith(HF_PREFIX):
            self.repo_id, self.revision = _parse_hf_handle(location)
        else:
            directory = Path(os.path.expanduser(location))
            if not directory.is_dir():
                raise PresetFileError(f"Preset directory '{location}' does not exist.")
            self.directory = directory.resolve()
        self._config = None
        self._downloaded = {}  # filename -> local path (or None), so each file is fetched once
        self._hub_reachable = None

    @staticmethod
    def _looks_like_path(handle):
        return (
            os.path.isdir(os.path.expanduser(handle))
            or handle.startswith((".", "/", "~"))
            or os.sep in handle
        )

    @classmethod
    def of(cls, handle, family=None, force_download=False):
        """`handle` if it is already a `PresetSource`, else a new one."""
        if isinstance(handle, PresetSource):
            return handle
        return cls(handle, family=family, force_download=force_download)

    def __repr__(self):
        return f"PresetSource({self.handle!r})"

    @property
    def description(self):
        """The handle as the user wrote it, for error messages."""
        return self.handle

    @property
    def is_hub(self):
        """Whether the files come from the Hugging Face Hub (and its cache)."""
        return self.repo_id is not None

    def file(self, filename):
        """Local path of `filename` in the preset, or `None` if it has none.

        Raises:
            PresetFileError: `filename` would leave the preset directory
                (absolute, `..`, or a symbolic link pointing out).
        """
        if self.directory is not None:
            path = inside(self.directory, filename)
            if path is None:
                raise PresetFileError(
                    f"Preset '{self.description}' refers to the file '{filename}', which lies "
                    "outside the preset directory; it is not read."
                )
            return path if path.is_file() else None
        if filename not in self._downloaded:
            self._downloaded[filename] = self._download(filename)
        return self._downloaded[filename]

    def require(self, filename):
        """Local path of `filename`; raises `PresetFileError` if it is absent."""
        path = self.file(filename)
        if path is None:
            raise PresetFileError(f"Preset '{self.description}' has no file '{filename}'.")
        return path

    def unreadable(self, filename, path, problem):
        """A `PresetFileError` for a file of this preset that cannot be read
        (`problem` says why), naming the file and how to get a good copy: a
        hub file's cached path and `force_download=True`."""
        if self.is_hub:
            remedy = (
                f"It is the cached download '{path}'; pass force_download=True to "
                "from_preset to download it again."
            )
        else:
            remedy = f"It is '{path}'; re-save or re-download the preset."
        return PresetFileError(f"'{filename}' of preset '{self.description}' {problem}. {remedy}")

    def json(self, filename, required=True):
        """The parsed JSON file, or `None` if optional and absent."""
        path = self.require(filename) if required else self.file(filename)
        if path is None:
            return None
        try:
            return json.loads(Path(path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise self.unreadable(filename, path, f"is not valid JSON ({error})") from error

    def config(self):
        """`config.json`, read once."""
        if self._config is None:
            self._config = self.json("config.json")
        return self._config

    def _where(self):
        return f"hf://{self.repo_id}" + (f"@{self.revision}" if self.revision else "")

    def _offline_help(self, offline=False):
        """Where downloaded files are read from offline; with `offline`
        (HF_HUB_OFFLINE is set already), how to get the missing file."""
        from huggingface_hub import constants

        if offline:
            return (
                f"Only files downloaded before, in the cache '{constants.HF_HUB_CACHE}', can be read offline: "
                "download this preset once with the network (HF_HUB_OFFLINE unset), or load from a local "
                "directory."
            )
        return (
            f"Files downloaded before are read from the cache '{constants.HF_HUB_CACHE}'; set "
            "HF_HUB_OFFLINE=1 to use only the cache without trying the network, or load from a "
            "local directory."
        )

    def _check_hub_reachable(self):
        """Connects to the hub once per source (instead of letting each
        download retry for half a minute): `True` if it answers at all."""
        if self._hub_reachable is None:
            import huggingface_hub
            from huggingface_hub import constants

            try:
                huggingface_hub.get_session().head(constants.ENDPOINT, timeout=HUB_CONNECT_TIMEOUT)
                self._hub_reachable = True
            except Exception:  # noqa: BLE001 - any failure to get an answer means unreachable
                self._hub_reachable = False
        return self._hub_reachable

    def _download(self, filename):
        import huggingface_hub
        from huggingface_hub import constants
        from huggingface_hub import errors

        where = self._where()
        offline = constants.is_offline_mode()
        local_only = offline or not self._check_hub_reachable()
        try:
            return Path(
                huggingface_hub.hf_hub_download(
                    self.repo_id,
                    filename,
                    revision=self.revision,
                    force_download=self.force_download and not local_only,
                    local_files_only=local_only,
                )
            )
        except errors.LocalEntryNotFoundError as error:
            cached = huggingface_hub.try_to_load_from_cache(
                self.repo_id, filename, revision=self.revision
            )
            if cached is huggingface_hub._CACHED_NO_EXIST:
                return None
            reason = "offline mode is on (HF_HUB_OFFLINE=1)" if offline else f"{constants.ENDPOINT} cannot be reached"
            raise PresetFileError(
                f"{where}: '{filename}' is not in the local cache and {reason}. "
                + self._offline_help(offline)
            ) from error
        except errors.EntryNotFoundError:
            return None
        except errors.GatedRepoError as error:
            raise PresetFileError(
                f"{where}: the repository is gated; accept its terms on the hub and log in "
                "with `hf auth login`."
            ) from error
        except errors.RevisionNotFoundError as error:
            raise PresetFileError(f"{where}: revision '{self.revision}' does not exist.") from error
        except errors.RepositoryNotFoundError as error:
            raise PresetFileError(
                f"{where}: repository not found (or private: log in with `hf auth login`)."
            ) from error
        except errors.HFValidationError as error:
            raise UnknownPresetError(f"'{where}' is not a valid hub handle: {error}") from error
        except errors.HfHubHTTPError as error:
            raise PresetFileError(f"{where}: downloading '{filename}' failed: {error}") from error
        except Exception as error:  # noqa: BLE001 - the HTTP client's own errors, wrapped
            raise PresetFileError(
                f"{where}: downloading '{filename}' failed ({type(error).__name__}: {error}). "
                + self._offline_help()
            ) from error
