"""Publishing a native preset directory to the Hugging Face Hub.

`upload_preset` sends a directory written by `save_to_preset` to a Hub repo
through `huggingface_hub` (`create_repo`, `create_branch`, `create_commit`),
so it honours `HF_ENDPOINT` and the user's login like every other Hub tool.
"""

import fnmatch
from pathlib import Path

from attention_zoo_keras.hub.model_card import for_repository
from attention_zoo_keras.hub.native_preset_loader import NativePresetLoader
from attention_zoo_keras.hub.preset_format import CONFIG_FILE
from attention_zoo_keras.hub.preset_format import MODEL_CARD_FILE
from attention_zoo_keras.hub.preset_format import PREPROCESSOR_FILE
from attention_zoo_keras.hub.preset_format import TOKENIZER_FILE
from attention_zoo_keras.hub.preset_loader import get_preset_loader
from attention_zoo_keras.hub.source import HF_PREFIX
from attention_zoo_keras.hub.source import PresetFileError
from attention_zoo_keras.hub.weights import INDEX_FILE
from attention_zoo_keras.registration import UnregisteredClassError

# Files of an earlier preset that would be read with the new one if they were
# left in the repo: weights (a sharded preset replacing a single file, or the
# other way round) and the preprocessor of a preset that has none now. They are
# deleted from the revision unless the new preset has them too.
_STALE_PATTERNS = ["*.safetensors", INDEX_FILE, PREPROCESSOR_FILE, TOKENIZER_FILE]


def _preset_files(path):
    """`{path in the repo: local file}` of a preset directory. Hidden files
    (editor backups, an interrupted save's staging folders) are never part
    of a preset."""
    files = {}
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path)
        if file.is_file() and not any(part.startswith(".") for part in relative.parts):
            files[relative.as_posix()] = file
    return files


def _commit_operations(api, repo_id, revision, path, card_handle):
    """The additions (every preset file; the model card's usage snippet
    loading from `card_handle`) and deletions (stale files, `_STALE_PATTERNS`) of
    the commit publishing `path`. Unchanged files are dropped by
    `create_commit` itself, which makes no commit if nothing is left."""
    from huggingface_hub import CommitOperationAdd
    from huggingface_hub import CommitOperationDelete

    additions = []
    for name, file in _preset_files(path).items():
        content = str(file)
        if name == MODEL_CARD_FILE:
            content = for_repository(file.read_text(encoding="utf-8"), card_handle).encode("utf-8")
        additions.append(CommitOperationAdd(path_in_repo=name, path_or_fileobj=content))
    added = {operation.path_in_repo for operation in additions}
    deletions = [
        CommitOperationDelete(path_in_repo=name)
        for name in api.list_repo_files(repo_id, revision=revision or "main")
        if name not in added and any(fnmatch.fnmatch(name, pattern) for pattern in _STALE_PATTERNS)
    ]
    return additions + deletions


class PresetUploadError(OSError):
    """Publishing a preset to the Hub failed; the local directory is untouched."""


def _parse_upload_handle(handle):
    """`(repo_id, revision or None)` of `"hf://org/name[@revision]"`."""
    expected = "expected 'hf://org/name' or 'hf://org/name@revision'"
    if not isinstance(handle, str) or not handle.startswith(HF_PREFIX):
        raise ValueError(f"Cannot upload to {handle!r}: {expected}.")
    repo_id, at, revision = handle[len(HF_PREFIX) :].partition("@")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or (at and not revision):
        raise ValueError(f"Cannot upload to {handle!r}: {expected}.")
    return repo_id, revision or None


def _check_native_preset(directory):
    """`(path of directory, its NativePresetLoader)`, once the preset loader
    has read it as a native preset (so what is published loads back)."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise ValueError(f"Cannot upload '{directory}': it is not a directory.")
    not_native = ValueError(
        f"Cannot upload '{directory}': it is not a native attention_zoo_keras preset "
        f"(no {CONFIG_FILE} written by `save_to_preset`). Save the model with "
        "`model.save_to_preset(directory)` first."
    )
    if not (path / CONFIG_FILE).is_file():
        raise not_native
    try:
        loader = get_preset_loader(str(path))
    except PresetFileError as error:
        raise ValueError(f"Cannot upload '{directory}': its {CONFIG_FILE} is unreadable ({error}).") from error
    except UnregisteredClassError:
        raise
    except ValueError as error:  # neither native nor a known transformers checkpoint
        raise not_native from error
    if not isinstance(loader, NativePresetLoader):
        raise not_native
    return path, loader


def _http_status(error):
    """The HTTP status of the first `HfHubHTTPError` in `error`'s cause chain."""
    from huggingface_hub.errors import HfHubHTTPError

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, HfHubHTTPError) and error.response is not None:
            return error.response.status_code
        error = error.__cause__ or error.__context__
    return None


def upload_preset(
    handle,
    directory,
    revision=None,
    private=False,
    token=None,
    commit_message=None,
    create_pr=False,
):
    """Publishes a native preset directory to a Hugging Face Hub repo.

    The repo is created if it does not exist (`private` only applies then),
    and so is the branch `revision` (from the head of `main`). All the files
    of `directory` go in one commit; weights and preprocessor files of an
    earlier preset that the new one lacks (`model.safetensors` replaced by
    shards, say) are deleted in that commit, so that what loads from the repo
    is exactly this preset. Other files already in the repo are kept. Files the
    repo already has with the same content are not uploaded again, and if
    nothing changed no commit is made. The model card goes up with its usage
    snippet loading from this repo (`hf://org/name`, with `@revision` on a
    branch other than main). The local directory is only read.

    Args:
        handle: str. `"hf://org/name"`, optionally
            `"hf://org/name@revision"`.
        directory: str or Path. A directory written by `save_to_preset`.
        revision: str or None. The branch to commit to (`None`: the handle's
            revision, else `"main"`); created if it does not exist.
        private: bool. Whether a repo this call creates is private.
        token: str or None. A Hugging Face access token with write access to
            `org`; `None`: the logged-in token (`hf auth login` or
            `HF_TOKEN`).
        commit_message: str or None. The commit's summary (`None`: "Upload
            <class> preset").
        create_pr: bool. Open a pull request against `main` instead of
            committing to it (not with a `revision` other than `main`).

    Returns:
        The `huggingface_hub.CommitInfo` of the commit: `oid` is the commit
        hash, `pr_url` the pull request's address with `create_pr`. When
        nothing changed, no commit is made and `oid` is the revision's current
        head commit.

    Raises:
        ValueError: `handle` is not an `hf://org/name[@revision]` handle,
            `directory` is not a native preset, or `revision` contradicts the
            handle's.
        PresetUploadError: no token is available, the token is invalid or
            cannot write to the repo, or the upload failed. The local preset is
            unchanged in every case, and a failed upload makes no commit
            (running the call again resumes it: files the Hub already stores
            are not sent twice).

    Example:

    >>> import attention_zoo_keras as azk                                  # doctest: +SKIP
    >>> classifier.save_to_preset("./my_classifier")                       # doctest: +SKIP
    >>> info = azk.upload_preset("hf://my-org/my-classifier", "./my_classifier")  # doctest: +SKIP
    >>> azk.models.BertTextClassifier.from_preset("hf://my-org/my-classifier")    # doctest: +SKIP
    """
    repo_id, handle_revision = _parse_upload_handle(handle)
    if revision is not None and handle_revision is not None and revision != handle_revision:
        raise ValueError(
            f"revision={revision!r} contradicts the revision of {handle!r}; give only one."
        )
    revision = revision or handle_revision
    if create_pr and revision not in (None, "main"):
        raise ValueError(f"create_pr=True opens a pull request against 'main'; it cannot go to {revision!r}.")
    path, loader = _check_native_preset(directory)

    import huggingface_hub
    from huggingface_hub.errors import LocalTokenNotFoundError

    where = HF_PREFIX + repo_id + (f"@{revision}" if revision else "")
    no_token = (
        f"Cannot upload to {where}: no Hugging Face token. Log in with `hf auth login`, "
        "set the HF_TOKEN environment variable, or pass token=..."
    )
    token = token or huggingface_hub.get_token()
    if not token:
        raise PresetUploadError(no_token)
    if commit_message is None:
        class_name = loader.config.get("class_name", "model")
        commit_message = f"Upload {class_name} preset"

    api = huggingface_hub.HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision not in (None, "main"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        card_handle = HF_PREFIX + repo_id + (f"@{revision}" if revision not in (None, "main") else "")
        return api.create_commit(
            repo_id,
            _commit_operations(api, repo_id, revision, path, card_handle),
            commit_message=commit_message,
            revision=revision,
            create_pr=create_pr,
        )
    except LocalTokenNotFoundError as error:
        raise PresetUploadError(no_token) from error
    except Exception as error:  # noqa: BLE001 - every failure gets the same guarantees
        status = _http_status(error)
        if status == 401:
            message = (
                f"Cannot upload to {where}: invalid token (the Hub refused it). Check it, or log in "
                "again with `hf auth login`."
            )
        elif status == 403:
            message = (
                f"Cannot upload to {where}: this token cannot write to {repo_id}. Use a token with "
                f"write access to the '{repo_id.split('/')[0]}' namespace."
            )
        elif isinstance(error, (OSError, RuntimeError, ValueError)):
            message = (
                f"Uploading '{path}' to {where} failed: {error}. The local preset is intact; "
                "run upload_preset again to retry (files the Hub already has are not sent again)."
            )
        else:
            raise
        raise PresetUploadError(message) from error
