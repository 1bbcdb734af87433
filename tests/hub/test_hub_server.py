"""The local Hub stand-in works with the real `huggingface_hub` client.

Every test talks to `tests.support.hub_server.LocalHub` on 127.0.0.1 through the
unmodified client (`hf_hub_download`, `snapshot_download`, ...), online and in
offline mode from the cache.
"""

from __future__ import annotations

import io
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import constants, hf_hub_download, hf_hub_url, model_info, snapshot_download
from huggingface_hub.errors import (
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import get_hf_file_metadata, http_get

from tests.support.hub_server import LocalHub, configure_client

# Files, HTTP and error messages: the same code on every backend (scripts/test.sh runs it on torch).
pytestmark = pytest.mark.backend_independent

REPO = "zoo-org/tiny-model"
CONFIG = b'{"hidden_size": 8}'
WEIGHTS = bytes(range(256)) * 64  # 16 KiB, binary


@pytest.fixture
def repo(local_hub):
    local_hub.add_repo(
        REPO,
        {"config.json": CONFIG, "model.weights.h5": WEIGHTS, "tokenizer/vocab.txt": "a\nb\nc\n"},
    )
    return REPO


def _raw_get(url: str, headers: dict[str, str] | None = None):
    """GET with urllib, bypassing any proxy (the URL is always on 127.0.0.1)."""
    assert url.startswith("http://127.0.0.1:")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10)


def test_download_returns_the_file(local_hub, repo):
    path = hf_hub_download(repo, "config.json")

    assert Path(path).read_bytes() == CONFIG
    assert Path(path).is_relative_to(local_hub.cache_dir)
    assert local_hub.requests == [
        ("HEAD", f"/{repo}/resolve/main/config.json"),
        ("GET", f"/{repo}/resolve/main/config.json"),
    ]
    assert local_hub.downloads_of("config.json") == 1


def test_binary_file_and_metadata_headers(local_hub, repo):
    path = hf_hub_download(repo, "model.weights.h5")
    assert Path(path).read_bytes() == WEIGHTS

    meta = get_hf_file_metadata(hf_hub_url(repo, "model.weights.h5"))
    assert meta.commit_hash == local_hub.commit_hash(repo)
    assert len(meta.commit_hash) == 40 and int(meta.commit_hash, 16) >= 0
    assert meta.size == len(WEIGHTS)
    assert meta.etag is not None and len(meta.etag) == 64  # sha256, as for LFS files
    assert meta.xet_file_data is None  # the client will not try Xet storage
    # The snapshot folder is named after the commit the server reported.
    assert Path(path).parent.name == meta.commit_hash


def test_second_download_is_served_from_cache(local_hub, repo):
    first = hf_hub_download(repo, "config.json")
    second = hf_hub_download(repo, "config.json")

    assert second == first
    assert local_hub.downloads_of("config.json") == 1
    assert local_hub.requests[-1] == ("HEAD", f"/{repo}/resolve/main/config.json")  # only re-validated


def test_file_in_a_subfolder(local_hub, repo):
    by_path = hf_hub_download(repo, "tokenizer/vocab.txt")
    by_subfolder = hf_hub_download(repo, "vocab.txt", subfolder="tokenizer")

    assert by_subfolder == by_path
    assert Path(by_path).read_text() == "a\nb\nc\n"
    assert Path(by_path).parts[-2:] == ("tokenizer", "vocab.txt")
    assert local_hub.downloads_of("tokenizer/vocab.txt") == 1
    assert ("GET", f"/{repo}/resolve/main/tokenizer/vocab.txt") in local_hub.requests


@pytest.mark.parametrize("revision", ["v1.0", "refs/pr/1"])
def test_revision_other_than_main(local_hub, repo, revision):
    local_hub.add_repo(repo, {"config.json": b'{"hidden_size": 16}'}, revision=revision)

    main = hf_hub_download(repo, "config.json")
    other = hf_hub_download(repo, "config.json", revision=revision)

    assert Path(main).read_bytes() == CONFIG
    assert Path(other).read_bytes() == b'{"hidden_size": 16}'
    assert local_hub.commit_hash(repo, revision) != local_hub.commit_hash(repo)
    assert Path(other).parent.name == local_hub.commit_hash(repo, revision)
    # The revision travels url-encoded ("refs/pr/1" -> "refs%2Fpr%2F1").
    quoted = revision.replace("/", "%2F")
    assert ("GET", f"/{repo}/resolve/{quoted}/config.json") in local_hub.requests


def test_revision_given_as_commit_hash(local_hub, repo):
    commit = local_hub.commit_hash(repo)

    path = hf_hub_download(repo, "config.json", revision=commit)

    assert Path(path).read_bytes() == CONFIG
    assert Path(path).parent.name == commit
    # Once cached, a commit-hash download needs no request at all.
    seen = len(local_hub.requests)
    assert hf_hub_download(repo, "config.json", revision=commit) == path
    assert len(local_hub.requests) == seen


def test_changed_content_is_a_new_commit(local_hub, repo):
    old = hf_hub_download(repo, "config.json")
    local_hub.add_repo(repo, {"config.json": b'{"hidden_size": 32}'})

    new = hf_hub_download(repo, "config.json")

    assert new != old
    assert Path(new).read_bytes() == b'{"hidden_size": 32}'
    assert local_hub.downloads_of("config.json") == 2


def test_missing_file_raises_entry_not_found(local_hub, repo):
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download(repo, "does-not-exist.json")
    # The client cached the file's absence under the commit the server reported.
    no_exist = local_hub.cache_dir / "models--zoo-org--tiny-model" / ".no_exist" / local_hub.commit_hash(repo)
    assert (no_exist / "does-not-exist.json").is_file()
    assert local_hub.downloads_of("does-not-exist.json") == 0


def test_missing_repo_raises_repository_not_found(local_hub, repo):
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("zoo-org/no-such-model", "config.json")


def test_missing_revision_raises_revision_not_found(local_hub, repo):
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repo, "config.json", revision="no-such-branch")


def test_offline_after_download_uses_the_cache(local_hub, hub_offline, repo):
    online = hf_hub_download(repo, "config.json")
    seen = len(local_hub.requests)

    hub_offline()
    assert constants.is_offline_mode()
    offline = hf_hub_download(repo, "config.json")

    assert offline == online
    assert Path(offline).read_bytes() == CONFIG
    assert len(local_hub.requests) == seen  # not a single request went out


def test_offline_never_downloaded_raises_local_entry_not_found(local_hub, hub_offline, repo):
    hf_hub_download(repo, "config.json")
    seen = len(local_hub.requests)

    hub_offline()
    with pytest.raises(LocalEntryNotFoundError):
        hf_hub_download(repo, "model.weights.h5")

    assert len(local_hub.requests) == seen


def test_offline_can_be_switched_back(local_hub, hub_offline, repo):
    hub_offline()
    with pytest.raises(LocalEntryNotFoundError):
        hf_hub_download(repo, "config.json")
    hub_offline(False)

    assert Path(hf_hub_download(repo, "config.json")).read_bytes() == CONFIG


def test_snapshot_download_and_model_info(local_hub, repo):
    info = model_info(repo)
    assert info.sha == local_hub.commit_hash(repo)
    files = sorted(sibling.rfilename for sibling in info.siblings)
    assert files == ["config.json", "model.weights.h5", "tokenizer/vocab.txt"]

    folder = Path(snapshot_download(repo))

    assert folder.name == local_hub.commit_hash(repo)
    assert (folder / "model.weights.h5").read_bytes() == WEIGHTS
    assert (folder / "tokenizer" / "vocab.txt").read_text() == "a\nb\nc\n"
    assert all(local_hub.downloads_of(sibling.rfilename) == 1 for sibling in info.siblings)


def test_client_resume_sends_a_range_request(local_hub, repo):
    buffer = io.BytesIO(WEIGHTS[:1000])
    buffer.seek(0, os.SEEK_END)

    http_get(hf_hub_url(repo, "model.weights.h5"), buffer, resume_size=1000, expected_size=len(WEIGHTS))

    assert buffer.getvalue() == WEIGHTS


def test_range_requests(local_hub, repo):
    url = hf_hub_url(repo, "model.weights.h5")

    with _raw_get(url, {"Range": "bytes=10-19"}) as response:
        assert response.status == 206
        assert response.headers["Content-Range"] == f"bytes 10-19/{len(WEIGHTS)}"
        assert response.read() == WEIGHTS[10:20]
    with _raw_get(url, {"Range": "bytes=-5"}) as response:
        assert response.read() == WEIGHTS[-5:]
    with pytest.raises(urllib.error.HTTPError) as error:
        _raw_get(url, {"Range": f"bytes={len(WEIGHTS)}-"})
    error.value.close()
    assert error.value.code == 416


def test_server_binds_only_loopback(local_hub):
    host, port = local_hub.server_address

    assert host == "127.0.0.1"
    assert local_hub.url == f"http://127.0.0.1:{port}"
    assert constants.ENDPOINT == local_hub.url
    # Bound to 127.0.0.1 itself, not to the wildcard address: another loopback
    # address on the same port is refused (Linux routes all of 127/8 to lo).
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", port), timeout=1).close()


def test_configure_client_is_undone(tmp_path):
    before = (constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE, constants.HF_HUB_CACHE,
              constants.HF_HUB_OFFLINE, os.environ.get("HF_ENDPOINT"), os.environ.get("HF_HUB_CACHE"))
    with LocalHub(tmp_path / "hub") as hub:
        with pytest.MonkeyPatch.context() as mp:
            configure_client(mp, hub, cache_dir=tmp_path / "cache", home=tmp_path / "home")
            assert constants.ENDPOINT == hub.url
            assert constants.HF_HUB_CACHE == str(tmp_path / "cache")
        after = (constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE, constants.HF_HUB_CACHE,
                 constants.HF_HUB_OFFLINE, os.environ.get("HF_ENDPOINT"), os.environ.get("HF_HUB_CACHE"))
    assert after == before
