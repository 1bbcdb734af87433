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


def _parse_hf_handle(handle):
    repo_and_revision = handle[len(HF_PREFIX) :]
    repo_id, _, revision = repo_and_revision.partition("@")
    parts = repo_id.split("/")
    if not repo_id or len(parts) > 2 or not all(parts):
        raise UnknownPresetError(
            f"'{handle}' is not a valid hub handle; expected 'hf://org/repo' or 'hf://org/repo@revision'."
        )
    return repo_id, revision or None


class PresetSource:
    """The files of one preset, wherever they live.

    Args:
        handle: a named preset (`"bert_base"`), `"hf://org/repo"` with an
            optional `"@revision"`, a local directory, or another
            `PresetSource` (returned as is by `PresetSource.of`).
        family: the model family a named preset must belong to, if any.

    Example:

    >>> source = PresetSource("hf://google-bert/bert-base-uncased")  # doctest: +SKIP
    >>> source.file("config.json")                                  # doctest: +SKIP
    PosixPath('.../snapshots/.../config.json')
    """

    def __init__(self, handle, family=None):
        self.handle = str(handle)
        self.preset_name = None
        self.config_overrides = {}
        self.directory = None
        self.repo_id = None
        self.revision = None
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

    @staticmethod
    def _looks_like_path(handle):
        return (
            os.path.isdir(os.path.expanduser(handle))
            or handle.startswith((".", "/", "~"))
            or os.sep in handle
        )

    @classmethod
    def of(cls, handle, family=None):
        """`handle` if it is already a `PresetSource`, else a new one."""
        return handle if isinstance(handle, PresetSource) else cls(handle, family=family)

    def __repr__(self):
        return f"PresetSource({self.handle!r})"

    @property
    def description(self):
        """The handle as the user wrote it, for error messages."""
        return self.handle

    def file(self, filename):
        """Local path of `filename` in the preset, or `None` if it has none."""
        if self.directory is not None:
            path = self.directory / filename
            return path if path.is_file() else None
        return self._download(filename)

    def require(self, filename):
        """Local path of `filename`; raises `PresetFileError` if it is absent."""
        path = self.file(filename)
        if path is None:
            raise PresetFileError(f"Preset '{self.description}' has no file '{filename}'.")
        return path

    def json(self, filename, required=True):
        """The parsed JSON file, or `None` if optional and absent."""
        path = self.require(filename) if required else self.file(filename)
        if path is None:
            return None
        try:
            return json.loads(Path(path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise PresetFileError(
                f"'{filename}' of preset '{self.description}' is not valid JSON: {error}"
            ) from error

    def config(self):
        """`config.json`, read once."""
        if self._config is None:
            self._config = self.json("config.json")
        return self._config

    def _download(self, filename):
        import huggingface_hub
        from huggingface_hub import errors

        where = f"hf://{self.repo_id}" + (f"@{self.revision}" if self.revision else "")
        try:
            return Path(huggingface_hub.hf_hub_download(self.repo_id, filename, revision=self.revision))
        except errors.LocalEntryNotFoundError as error:
            cached = huggingface_hub.try_to_load_from_cache(
                self.repo_id, filename, revision=self.revision
            )
            if cached is huggingface_hub._CACHED_NO_EXIST:
                return None
            raise PresetFileError(
                f"{where}: '{filename}' is not in the local cache and the hub cannot be "
                "reached (offline mode or no network). Connect once to download it, "
                "or load from a local directory."
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
        except errors.HfHubHTTPError as error:
            raise PresetFileError(f"{where}: downloading '{filename}' failed: {error}") from error
