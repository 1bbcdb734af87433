"""`upload_preset` publishes native presets through the real `huggingface_hub`
client to `tests.support.hub_server.LocalHub`, and what it publishes loads back.

Also tests of the LocalHub upload endpoints that the client-level tests do not
reach (malformed or hostile requests).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
import types
import urllib.error
import urllib.request

import keras
import numpy as np
import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

import attention_zoo_keras as azk
from attention_zoo_keras.hub.model_card import REPOSITORY_PLACEHOLDER
from attention_zoo_keras.hub.upload import PresetUploadError
from tests.support.tiny_checkpoints import TINY_VOCABULARY
from tests.support.hub_server import serving

# Files, HTTP and error messages: the same code on every backend (scripts/test.sh runs it on torch).
pytestmark = pytest.mark.backend_independent

TEXTS = ["the film was good", "a cat sat on the mat and the dog sat too"]
WRITER = "hf_writer"  # may write to "me" and "my-org"
OUTSIDER = "hf_outsider"  # may write to "someone-else" only
REPO = "me/tiny"


CHUNK = 8192  # multipart_hub's part size: the tiny classifier's ~31 KB weights take 4 parts


def _serve(tmp_path, monkeypatch, **kwargs):
    tokens = {WRITER: {"me", "my-org"}, OUTSIDER: {"someone-else"}}
    with serving(tmp_path, monkeypatch, tokens=tokens, **kwargs) as server:
        yield server


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running LocalHub with two valid tokens, the client pointed at it."""
    yield from _serve(tmp_path, monkeypatch)


@pytest.fixture
def multipart_hub(tmp_path, monkeypatch):
    """`hub`, but LFS objects over `CHUNK` bytes are uploaded in parts, as large files are on the Hub."""
    yield from _serve(tmp_path, monkeypatch, multipart_chunk_size=CHUNK)


def tiny_classifier(seed=1):
    keras.utils.set_random_seed(seed)
    tokenizer = azk.models.BertTokenizer.from_vocabulary(TINY_VOCABULARY)
    backbone = azk.models.BertBackbone(
        vocabulary_size=tokenizer.vocabulary_size, num_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=16,
    )
    preprocessor = azk.models.BertPreprocessor(tokenizer, sequence_length=16)
    return azk.models.BertTextClassifier(backbone=backbone, num_classes=3, preprocessor=preprocessor)


def saved_preset(path, seed=1, **kwargs):
    classifier = tiny_classifier(seed)
    classifier.save_to_preset(path, **kwargs)
    return classifier, path


def file_hashes(directory):
    """{relative path: sha256} of every file under `directory`, hidden ones included."""
    return {
        p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def published_hashes(directory, handle=f"hf://{REPO}"):
    """`file_hashes(directory)` as published to `handle`: the model card's
    usage snippet loads from `handle` instead of the placeholder."""
    hashes = file_hashes(directory)
    card = (directory / "README.md").read_text(encoding="utf-8")
    assert REPOSITORY_PLACEHOLDER in card
    hashes["README.md"] = hashlib.sha256(card.replace(REPOSITORY_PLACEHOLDER, handle).encode()).hexdigest()
    return hashes


def remote_files(hub, repo_id=REPO, revision="main"):
    return file_hashes(hub._revision_dir(repo_id, revision))


def puts(hub):
    return [path for method, path in hub.requests if method == "PUT"]


def part_puts(hub):
    return [path for path in puts(hub) if path.startswith("/lfs-multipart/") and "/part/" in path]


def completions(hub):
    return [path for method, path in hub.requests if method == "POST" and path.startswith("/lfs-multipart/")]


def sha256_of(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- publishing and loading back --------------------------------------------


def test_uploaded_preset_loads_from_a_clean_cache_with_identical_outputs(hub, tmp_path):
    classifier, preset = saved_preset(tmp_path / "preset")
    before = file_hashes(preset)

    info = azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)

    assert info.oid == hub.commit_hash(REPO)
    assert [c["oid"] for c in hub.commits] == [info.oid]
    assert hub.commits[0]["summary"] == "Upload BertTextClassifier preset"
    assert remote_files(hub) == published_hashes(preset)  # every file, byte for byte; the card loads from the repo
    card = (hub._revision_dir(REPO, "main") / "README.md").read_text()
    assert f'BertTextClassifier.from_preset("hf://{REPO}")' in card and "<this repo>" not in card
    assert file_hashes(preset) == before  # the local preset is only read
    assert any(p.startswith("/lfs-upload/") for p in puts(hub))  # the weights went through LFS
    assert not hub.is_private(REPO)
    assert not hub.cache_dir.exists() or not any(hub.cache_dir.iterdir())  # nothing cached by the upload

    loaded = azk.models.BertTextClassifier.from_preset(f"hf://{REPO}")

    np.testing.assert_array_equal(loaded.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0))
    assert ("GET", f"/{REPO}/resolve/main/model.safetensors") in hub.requests


def test_sharded_preset_round_trips(hub, tmp_path):
    classifier, preset = saved_preset(tmp_path / "preset", max_shard_size="20KB")
    shards = sorted(p.name for p in preset.glob("model-*.safetensors"))
    assert len(shards) > 1 and (preset / "model.safetensors.index.json").is_file()

    azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)

    assert remote_files(hub) == published_hashes(preset)
    assert len([p for p in puts(hub) if p.startswith("/lfs-upload/")]) == len(shards)
    loaded = azk.models.BertTextClassifier.from_preset(f"hf://{REPO}")
    np.testing.assert_array_equal(loaded.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0))


def test_publishing_the_same_files_twice_makes_no_second_commit(hub, tmp_path):
    _, preset = saved_preset(tmp_path / "preset")
    first = azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)
    puts_before, requests_before = len(puts(hub)), len(hub.requests)

    second = azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)

    assert second.oid == first.oid == hub.commit_hash(REPO)
    assert len(hub.commits) == 1
    assert len(puts(hub)) == puts_before  # nothing uploaded again
    assert not any(m == "POST" and "/commit/" in p for m, p in hub.requests[requests_before:])  # no commit call


def test_a_changed_file_makes_a_new_commit(hub, tmp_path):
    _, preset = saved_preset(tmp_path / "preset")
    first = azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)
    weight_uploads = len(puts(hub))
    with (preset / "README.md").open("a", encoding="utf-8") as card:
        card.write("\nFine-tuned on nothing at all.\n")

    second = azk.upload_preset(f"hf://{REPO}", preset, token=WRITER, commit_message="Better card")

    assert second.oid != first.oid and second.oid == hub.commit_hash(REPO)
    assert [c["parent"] for c in hub.commits] == [hub.commits[0]["parent"], first.oid]
    assert hub.commits[-1]["summary"] == "Better card"
    assert remote_files(hub) == published_hashes(preset)
    assert len(puts(hub)) == weight_uploads  # the unchanged weights were not sent again


def test_new_weights_replace_the_old_layout_without_stale_files(hub, tmp_path):
    _, single = saved_preset(tmp_path / "single")
    azk.upload_preset(f"hf://{REPO}", single, token=WRITER)
    classifier, sharded = saved_preset(tmp_path / "sharded", seed=2, max_shard_size="20KB")

    azk.upload_preset(f"hf://{REPO}", sharded, token=WRITER)

    assert remote_files(hub) == published_hashes(sharded)  # model.safetensors was deleted
    loaded = azk.models.BertTextClassifier.from_preset(f"hf://{REPO}")
    np.testing.assert_array_equal(loaded.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0))


@pytest.mark.parametrize("how", ["argument", "handle"])
def test_revision_goes_to_that_branch_and_loads_from_it(hub, tmp_path, how):
    main_model, main_preset = saved_preset(tmp_path / "main", seed=1)
    v1_model, v1_preset = saved_preset(tmp_path / "v1", seed=2)
    azk.upload_preset(f"hf://{REPO}", main_preset, token=WRITER)
    main_commit = hub.commit_hash(REPO)

    if how == "argument":
        info = azk.upload_preset(f"hf://{REPO}", v1_preset, revision="v1", token=WRITER)
    else:
        info = azk.upload_preset(f"hf://{REPO}@v1", v1_preset, token=WRITER)

    assert info.oid == hub.commit_hash(REPO, "v1")
    assert hub.commit_hash(REPO) == main_commit  # main untouched
    assert remote_files(hub, revision="v1") == published_hashes(v1_preset, f"hf://{REPO}@v1")
    from_v1 = azk.models.BertTextClassifier.from_preset(f"hf://{REPO}@v1").predict(TEXTS, verbose=0)
    from_main = azk.models.BertTextClassifier.from_preset(f"hf://{REPO}").predict(TEXTS, verbose=0)
    np.testing.assert_array_equal(from_v1, v1_model.predict(TEXTS, verbose=0))
    np.testing.assert_array_equal(from_main, main_model.predict(TEXTS, verbose=0))


def test_revision_of_a_new_repo(hub, tmp_path):
    classifier, preset = saved_preset(tmp_path / "preset")

    azk.upload_preset("hf://my-org/fresh@v1", preset, token=WRITER)

    assert remote_files(hub, "my-org/fresh") == {}  # main is the new repo's empty branch
    loaded = azk.models.BertTextClassifier.from_preset("hf://my-org/fresh@v1")
    np.testing.assert_array_equal(loaded.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0))


def test_create_pr_opens_a_pull_request_and_leaves_main(hub, tmp_path):
    _, first = saved_preset(tmp_path / "first", seed=1)
    _, second = saved_preset(tmp_path / "second", seed=2)
    azk.upload_preset(f"hf://{REPO}", first, token=WRITER)
    main_commit = hub.commit_hash(REPO)

    info = azk.upload_preset(f"hf://{REPO}", second, token=WRITER, create_pr=True)

    assert info.pr_url.endswith(f"/{REPO}/discussions/1")
    assert hub.commit_hash(REPO) == main_commit
    assert info.oid == hub.commit_hash(REPO, "refs/pr/1")
    assert remote_files(hub, revision="refs/pr/1") == published_hashes(second)


def test_private_is_recorded_by_the_hub(hub, tmp_path):
    _, preset = saved_preset(tmp_path / "preset")

    azk.upload_preset(f"hf://{REPO}", preset, token=WRITER, private=True)

    assert hub.is_private(REPO)
    assert HfApi(token=WRITER).model_info(REPO).private is True
    with pytest.raises(RepositoryNotFoundError):  # invisible without a token of its namespace
        HfApi(token=False).model_info(REPO)
    # private only applies to a repo the call creates
    azk.upload_preset("hf://me/public", preset, token=WRITER)
    assert not hub.is_private("me/public")


def test_the_logged_in_token_is_used(hub, tmp_path, monkeypatch):
    _, preset = saved_preset(tmp_path / "preset")
    monkeypatch.setenv("HF_TOKEN", WRITER)

    info = azk.upload_preset(f"hf://{REPO}", preset)

    assert info.oid == hub.commit_hash(REPO) and hub.commits[0]["token"] == WRITER


def test_weights_larger_than_the_chunk_size_go_up_in_parts(multipart_hub, tmp_path):
    hub = multipart_hub
    classifier, preset = saved_preset(tmp_path / "preset")
    weights = preset / "model.safetensors"
    oid, size = sha256_of(weights), weights.stat().st_size
    assert size > 2 * CHUNK
    before = file_hashes(preset)

    info = azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)

    assert info.oid == hub.commit_hash(REPO) and len(hub.commits) == 1
    parts = part_puts(hub)
    assert len(parts) == -(-size // CHUNK) > 1  # one PUT per part, each once
    assert [p.split("?")[0] for p in parts] == [f"/lfs-multipart/{oid}/part/{n}" for n in range(1, len(parts) + 1)]
    assert [p.split("?")[0] for p in completions(hub)] == [f"/lfs-multipart/{oid}/complete"]
    assert not any(p.startswith("/lfs-upload/") for p in puts(hub))  # no single PUT of the weights
    assert ("POST", f"/{REPO}.git/info/lfs/objects/verify") in hub.requests
    assert hub.has_lfs_object(oid)
    assert remote_files(hub) == published_hashes(preset)
    assert file_hashes(preset) == before
    assert not hub.cache_dir.exists() or not any(hub.cache_dir.iterdir())

    loaded = azk.models.BertTextClassifier.from_preset(f"hf://{REPO}")

    np.testing.assert_array_equal(loaded.predict(TEXTS, verbose=0), classifier.predict(TEXTS, verbose=0))
    assert ("GET", f"/{REPO}/resolve/main/model.safetensors") in hub.requests


def test_small_objects_still_go_up_in_one_put_on_a_multipart_hub(multipart_hub, tmp_path):
    hub = multipart_hub
    _, preset = saved_preset(tmp_path / "preset", max_shard_size="8KB")
    shards = sorted(preset.glob("model-*.safetensors"))
    small = [s for s in shards if s.stat().st_size <= CHUNK]
    large = [s for s in shards if s.stat().st_size > CHUNK]
    assert small and large  # shards of both kinds

    azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)

    assert remote_files(hub) == published_hashes(preset)
    assert len([p for p in puts(hub) if p.startswith("/lfs-upload/")]) == len(small)
    assert sorted(p.split("/")[2] for p in completions(hub)) == sorted(sha256_of(s) for s in large)


def test_a_part_failing_once_is_sent_again_by_the_client(multipart_hub, tmp_path, monkeypatch):
    _no_backoff(monkeypatch)
    hub = multipart_hub
    _, preset = saved_preset(tmp_path / "preset")
    num_parts = -(-(preset / "model.safetensors").stat().st_size // CHUNK)
    hub.fail_next("lfs-part", status=503)

    azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)

    assert len(part_puts(hub)) == num_parts + 1 and len(completions(hub)) == 1
    assert remote_files(hub) == published_hashes(preset)


# --- errors -------------------------------------------------------------------


def test_missing_token_raises_saying_how_to_log_in(hub, tmp_path):
    _, preset = saved_preset(tmp_path / "preset")

    with pytest.raises(PresetUploadError, match=r"no Hugging Face token.*hf auth login.*HF_TOKEN"):
        azk.upload_preset(f"hf://{REPO}", preset)
    assert hub.requests == []


def test_invalid_token_raises(hub, tmp_path):
    _, preset = saved_preset(tmp_path / "preset")
    before = file_hashes(preset)

    with pytest.raises(PresetUploadError, match=r"hf://me/tiny: invalid token"):
        azk.upload_preset(f"hf://{REPO}", preset, token="hf_not_a_token")
    assert hub.commits == [] and file_hashes(preset) == before


@pytest.mark.parametrize("existing", [False, True])
def test_token_without_rights_raises_naming_the_repo(hub, tmp_path, existing):
    _, preset = saved_preset(tmp_path / "preset")
    if existing:  # create_repo(exist_ok=True) lets the 403 pass for an existing repo; the upload must not
        hub.add_repo(REPO, {"config.json": "{}"})

    with pytest.raises(PresetUploadError, match=r"this token cannot write to me/tiny\b"):
        azk.upload_preset(f"hf://{REPO}", preset, token=OUTSIDER)
    assert hub.commits == []


def _no_backoff(monkeypatch):
    """The client waits 1+2+4+8+8 s retrying 5xx answers of some calls: skip the waits."""
    from huggingface_hub.utils import _http

    monkeypatch.setattr(_http, "time", types.SimpleNamespace(**{**vars(time), "sleep": lambda seconds: None}))


def _upload_fails_saying_the_preset_is_intact(preset):
    expected = rf"(?s)Uploading '.*{preset.name}' to hf://{REPO} failed.*local preset is intact"
    with pytest.raises(PresetUploadError, match=expected):
        azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)


def _retry_completes(hub, preset, model, head):
    """After the failures stop, publishing `preset` again makes the commit, and `model`'s outputs load back."""
    hub.clear_failures()
    info = azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)
    assert info.oid == hub.commit_hash(REPO) != head
    assert remote_files(hub) == published_hashes(preset)
    loaded = azk.models.BertTextClassifier.from_preset(f"hf://{REPO}")
    np.testing.assert_array_equal(loaded.predict(TEXTS, verbose=0), model.predict(TEXTS, verbose=0))


@pytest.mark.parametrize(
    "endpoint, status, times",
    [
        ("commit", 500, 1),  # the commit call is not retried: once is enough
        ("lfs-upload", 500, None),  # retried with back-off: fail every time
        ("lfs-batch", 503, None),
        ("preupload", 502, None),
    ],
)
def test_server_error_mid_upload_leaves_local_and_remote_as_they_were(hub, tmp_path, monkeypatch, endpoint, status,
                                                                      times):
    _no_backoff(monkeypatch)
    _, first = saved_preset(tmp_path / "first", seed=1)
    azk.upload_preset(f"hf://{REPO}", first, token=WRITER)
    published = remote_files(hub)
    head = hub.commit_hash(REPO)
    classifier, second = saved_preset(tmp_path / "second", seed=2, max_shard_size="20KB")
    local = file_hashes(second)
    hub.fail(endpoint, status=status, times=times)

    _upload_fails_saying_the_preset_is_intact(second)

    assert file_hashes(second) == local  # byte for byte, no file added or removed
    assert hub.commit_hash(REPO) == head and remote_files(hub) == published  # no partial commit
    assert len(hub.commits) == 1

    _retry_completes(hub, second, classifier, head)


@pytest.mark.parametrize("endpoint", ["lfs-part", "lfs-complete"])
def test_server_error_mid_multipart_upload_leaves_local_and_remote_as_they_were(multipart_hub, tmp_path, monkeypatch,
                                                                                endpoint):
    _no_backoff(monkeypatch)
    hub = multipart_hub
    _, first = saved_preset(tmp_path / "first", seed=1)
    azk.upload_preset(f"hf://{REPO}", first, token=WRITER)
    published = remote_files(hub)
    head = hub.commit_hash(REPO)
    classifier, second = saved_preset(tmp_path / "second", seed=2)
    oid = sha256_of(second / "model.safetensors")
    local = file_hashes(second)
    hub.fail(endpoint, status=500, times=None)  # the client retries parts and completions: fail every time
    requests_before = len(hub.requests)

    _upload_fails_saying_the_preset_is_intact(second)

    attempted = completions(hub) if endpoint == "lfs-complete" else part_puts(hub)
    assert any(f"/lfs-multipart/{oid}/" in p for p in attempted)  # the failure was reached
    assert not hub.has_lfs_object(oid)  # no object assembled
    assert not any(m == "POST" and "/commit/" in p for m, p in hub.requests[requests_before:])
    assert file_hashes(second) == local
    assert hub.commit_hash(REPO) == head and remote_files(hub) == published
    assert len(hub.commits) == 1

    _retry_completes(hub, second, classifier, head)


def test_retry_after_a_failed_commit_does_not_upload_the_weights_again(hub, tmp_path):
    _, preset = saved_preset(tmp_path / "preset", max_shard_size="20KB")
    hub.fail_next("commit")
    with pytest.raises(PresetUploadError):
        azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)
    uploads = len(puts(hub))
    assert uploads > 0 and hub.commits == []

    azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)

    assert len(puts(hub)) == uploads
    assert remote_files(hub) == published_hashes(preset)


def test_non_native_directory_is_refused(hub, tmp_path, tiny_bert_checkpoints):
    transformers_dir = tiny_bert_checkpoints["model"]
    with pytest.raises(ValueError, match=rf"'{transformers_dir}'.*not a native attention_zoo_keras preset"):
        azk.upload_preset(f"hf://{REPO}", transformers_dir, token=WRITER)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty'.*not a native attention_zoo_keras preset"):
        azk.upload_preset(f"hf://{REPO}", tmp_path / "empty", token=WRITER)
    with pytest.raises(ValueError, match=r"missing'.*not a directory"):
        azk.upload_preset(f"hf://{REPO}", tmp_path / "missing", token=WRITER)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"broken'.*config.json is unreadable"):
        azk.upload_preset(f"hf://{REPO}", tmp_path / "broken", token=WRITER)
    assert hub.requests == []


@pytest.mark.parametrize(
    "handle",
    ["me/tiny", "bert_base", "hf://me", "hf://a/b/c", "hf:///tiny", "hf://me/", "hf://me/tiny@", "s3://me/tiny"],
)
def test_other_handles_are_refused(hub, tmp_path, handle):
    with pytest.raises(ValueError, match=r"expected 'hf://org/name' or 'hf://org/name@revision'"):
        azk.upload_preset(handle, tmp_path, token=WRITER)
    assert hub.requests == []


def test_contradicting_revisions_are_refused(hub, tmp_path):
    _, preset = saved_preset(tmp_path / "preset")
    with pytest.raises(ValueError, match="contradicts"):
        azk.upload_preset(f"hf://{REPO}@v1", preset, revision="v2", token=WRITER)
    with pytest.raises(ValueError, match="pull request against 'main'"):
        azk.upload_preset(f"hf://{REPO}", preset, revision="v2", create_pr=True, token=WRITER)
    assert hub.requests == []


def test_hidden_files_are_not_published(hub, tmp_path):
    _, preset = saved_preset(tmp_path / "preset")
    (preset / ".model.safetensors.partial").write_bytes(b"half")
    (preset / ".DS_Store").write_bytes(b"junk")

    azk.upload_preset(f"hf://{REPO}", preset, token=WRITER)

    assert not any(name.startswith(".") for name in remote_files(hub))


def test_exported_names():
    assert azk.upload_preset is azk.hub.upload_preset
    assert issubclass(PresetUploadError, OSError) and azk.hub.PresetUploadError is PresetUploadError


# --- LocalHub's upload endpoints, beyond what the client does ----------------


def _raw(hub, method, path, body=b"", headers=None):
    """(status, headers, JSON body) of a raw request, bypassing any proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(hub.url + path, data=body, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, response.headers, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, error.headers, json.loads(error.read() or b"null")


def _auth(token=WRITER):
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def _batch(hub, content, repo_id=REPO, transfers=("basic",)):
    oid = hashlib.sha256(content).hexdigest()
    payload = {"operation": "upload", "transfers": list(transfers), "objects": [{"oid": oid, "size": len(content)}]}
    status, _, answer = _raw(hub, "POST", f"/{repo_id}.git/info/lfs/objects/batch", json.dumps(payload).encode(),
                             _auth())
    assert status == 200
    return oid, answer["objects"][0]


def test_lfs_put_checks_its_signature_and_the_content_hash(hub):
    HfApi(token=WRITER).create_repo(REPO)
    content = b"\0weights" * 100
    oid, obj = _batch(hub, content)
    href = obj["actions"]["upload"]["href"]
    path = href[len(hub.url):]

    assert _raw(hub, "PUT", path.replace("sig=", "sig=0"), content)[0] == 403  # a forged URL
    assert _raw(hub, "PUT", path, content[:-1] + b"x")[0] == 400  # bytes that are not the oid's
    assert not hub.has_lfs_object(oid)
    assert _raw(hub, "PUT", path, content)[0] == 200  # no Authorization needed: the URL is signed
    assert hub.has_lfs_object(oid)
    # Now stored: the batch API asks for no upload.
    assert "actions" not in _batch(hub, content)[1]


def test_lfs_put_accepts_a_chunked_body(hub):
    HfApi(token=WRITER).create_repo(REPO)
    content = bytes(range(256)) * 50
    oid, obj = _batch(hub, content)

    def chunks():
        for start in range(0, len(content), 3000):
            yield content[start:start + 3000]

    import httpx2 as httpx  # the client's HTTP library

    response = httpx.put(obj["actions"]["upload"]["href"], content=chunks(), trust_env=False)
    assert response.status_code == 200 and response.request.headers.get("transfer-encoding") == "chunked"
    assert hub.has_lfs_object(oid)


def test_commit_of_an_lfs_object_never_uploaded_changes_nothing(hub):
    api = HfApi(token=WRITER)
    api.create_repo(REPO)
    api.upload_file(path_or_fileobj=b"{}", path_in_repo="config.json", repo_id=REPO)
    head = hub.commit_hash(REPO)
    lines = [
        {"key": "header", "value": {"summary": "bad", "description": ""}},
        {"key": "file", "value": {"path": "new.txt", "content": base64.b64encode(b"x").decode(), "encoding": "base64"}},
        {"key": "lfsFile", "value": {"path": "w.safetensors", "algo": "sha256", "oid": "ab" * 32, "size": 3}},
    ]
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)

    status, headers, _ = _raw(hub, "POST", f"/api/models/{REPO}/commit/main", body,
                              {**_auth(), "Content-Type": "application/x-ndjson"})

    assert status == 422 and "never uploaded" in headers["X-Error-Message"]
    assert hub.commit_hash(REPO) == head and remote_files(hub).keys() == {"config.json"}


def test_commit_checks_the_parent_commit_and_deletes_files(hub):
    api = HfApi(token=WRITER)
    api.create_repo(REPO)
    api.upload_folder(repo_id=REPO, folder_path=_folder(hub, {"a.txt": "a", "sub/b.txt": "b", "c.txt": "c"}))
    head = hub.commit_hash(REPO)

    with pytest.raises(HfHubHTTPError) as raised:
        api.create_commit(REPO, [CommitOperationDelete("a.txt")], commit_message="x", parent_commit="0" * 40)
    assert raised.value.response.status_code == 412 and hub.commit_hash(REPO) == head

    api.create_commit(
        REPO, [CommitOperationDelete("a.txt"), CommitOperationDelete("sub/", is_folder=True),
               CommitOperationAdd("d.txt", b"d")],
        commit_message="tidy", parent_commit=head,
    )
    assert sorted(remote_files(hub)) == ["c.txt", "d.txt"]
    assert not (hub._revision_dir(REPO, "main") / "sub").exists()


def _folder(hub, files):
    folder = hub.root.parent / "folder"
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(content)
    return folder


def test_repo_creation_and_whoami(hub):
    api = HfApi(token=WRITER)
    url = api.create_repo("my-org/model", private=True)
    assert url.repo_id == "my-org/model" and hub.is_private("my-org/model")
    assert api.create_repo("my-org/model", exist_ok=True).repo_id == "my-org/model"  # a 409, swallowed
    with pytest.raises(HfHubHTTPError) as raised:
        api.create_repo("my-org/model")
    assert raised.value.response.status_code == 409
    with pytest.raises(HfHubHTTPError) as raised:
        HfApi(token=OUTSIDER).create_repo("my-org/other")
    assert raised.value.response.status_code == 403
    assert "my-org/other" in raised.value.response.headers["X-Error-Message"]
    assert not hub._revisions("my-org/other")

    assert api.whoami()["name"] == "me"
    assert [org["name"] for org in api.whoami()["orgs"]] == ["my-org"]
    with pytest.raises(HfHubHTTPError) as raised:
        HfApi(token="hf_nobody").whoami()
    assert raised.value.response.status_code == 401


def test_branch_creation(hub):
    api = HfApi(token=WRITER)
    api.create_repo(REPO)
    api.upload_file(path_or_fileobj=b"1", path_in_repo="f.txt", repo_id=REPO)
    api.create_branch(REPO, branch="v1")
    api.create_branch(REPO, branch="v1", exist_ok=True)
    with pytest.raises(HfHubHTTPError) as raised:
        api.create_branch(REPO, branch="v1")
    assert raised.value.response.status_code == 409
    assert remote_files(hub, revision="v1") == remote_files(hub)
    refs = api.list_repo_refs(REPO)
    assert {b.name for b in refs.branches} == {"main", "v1"}
    assert {b.target_commit for b in refs.branches} == {hub.commit_hash(REPO), hub.commit_hash(REPO, "v1")}


def test_failures_are_counted(hub):
    with pytest.raises(ValueError, match="endpoint must be one of"):
        hub.fail("nowhere")
    hub.fail("create-repo", status=500, times=2)
    api = HfApi(token=WRITER)
    for _ in range(2):
        with pytest.raises(HfHubHTTPError):
            api.create_repo(REPO)
    assert api.create_repo(REPO).repo_id == REPO


# --- LocalHub's multipart LFS uploads -----------------------------------------

# 20480 bytes, no two parts alike: parts of CHUNK, CHUNK and 4096 bytes
BIG = b"".join(hashlib.sha256(b"%d" % i).digest() for i in range(640))


def _multipart(hub, content=BIG):
    """(oid, part paths by number, completion path) of a multipart upload of `content`."""
    oid, obj = _batch(hub, content, transfers=("basic", "multipart"))
    upload = obj["actions"]["upload"]
    header = upload["header"]
    assert header["chunk_size"] == str(CHUNK)
    numbers = sorted(key for key in header if key.isdigit())
    assert numbers == [f"{n:05d}" for n in range(1, -(-len(content) // CHUNK) + 1)]
    parts = {int(key): header[key][len(hub.url):] for key in numbers}
    return oid, parts, upload["href"][len(hub.url):]


def _put_parts(hub, parts, content=BIG):
    """{part number: etag} after uploading every part of `content`."""
    etags = {}
    for number, path in parts.items():
        status, headers, _ = _raw(hub, "PUT", path, content[(number - 1) * CHUNK:number * CHUNK])
        assert status == 200 and headers["ETag"]
        etags[number] = headers["ETag"]
    return etags


def _complete(hub, path, oid, etags):
    payload = {"oid": oid, "parts": [{"partNumber": n, "etag": e} for n, e in sorted(etags.items())]}
    return _raw(hub, "POST", path, json.dumps(payload).encode(), {"Content-Type": "application/vnd.git-lfs+json"})


def test_batch_offers_multipart_only_for_large_objects_and_clients_that_ask(multipart_hub):
    hub = multipart_hub
    HfApi(token=WRITER).create_repo(REPO)
    assert "chunk_size" not in _batch(hub, BIG)[1]["actions"]["upload"]["header"]  # "basic" only: one PUT
    small = BIG[:CHUNK]
    small_action = _batch(hub, small, transfers=("basic", "multipart"))[1]["actions"]["upload"]
    assert small_action["header"] == {} and small_action["href"].startswith(hub.url + "/lfs-upload/")
    oid, parts, complete = _multipart(hub)
    assert len(parts) == 3 and complete.startswith(f"/lfs-multipart/{oid}/complete?")


def test_multipart_upload_assembles_the_parts_and_verifies(multipart_hub):
    hub = multipart_hub
    HfApi(token=WRITER).create_repo(REPO)
    oid, parts, complete = _multipart(hub)
    etags = _put_parts(hub, parts)
    assert etags[1] == f'"{hashlib.md5(BIG[:CHUNK]).hexdigest()}"'
    assert not hub.has_lfs_object(oid)  # parts alone are no object

    status, _, _ = _complete(hub, complete, oid, etags)  # no Authorization: the URL is signed

    assert status == 200 and hub.has_lfs_object(oid)
    assert (hub._lfs_dir / oid).read_bytes() == BIG
    verify = {"oid": oid, "size": len(BIG)}
    assert _raw(hub, "POST", f"/{REPO}.git/info/lfs/objects/verify", json.dumps(verify).encode(), _auth())[0] == 200
    assert "actions" not in _batch(hub, BIG, transfers=("basic", "multipart"))[1]  # stored: nothing to upload


def test_multipart_part_urls_are_signed_and_parts_must_have_the_chunk_size(multipart_hub):
    hub = multipart_hub
    HfApi(token=WRITER).create_repo(REPO)
    oid, parts, _ = _multipart(hub)

    assert _raw(hub, "PUT", parts[1].replace("sig=", "sig=0"), BIG[:CHUNK])[0] == 403  # a forged URL
    assert _raw(hub, "PUT", parts[1].replace("/part/1?", "/part/2?"), BIG[:CHUNK])[0] == 403  # another part's
    status, headers, answer = _raw(hub, "PUT", parts[1], BIG[:CHUNK - 1])
    assert status == 400 and f"must have {CHUNK} bytes" in answer["error"] == headers["X-Error-Message"]
    assert _raw(hub, "PUT", parts[3], BIG[:CHUNK])[0] == 400  # the last part is what is left: 4096 bytes
    assert _raw(hub, "PUT", parts[3], BIG[2 * CHUNK:])[0] == 200
    assert not hub.has_lfs_object(oid)


@pytest.mark.parametrize("fault", ["missing part", "unlisted part", "wrong etag", "wrong oid"])
def test_multipart_completion_with_bad_parts_is_refused_and_stores_nothing(multipart_hub, fault):
    hub = multipart_hub
    HfApi(token=WRITER).create_repo(REPO)
    oid, parts, complete = _multipart(hub)
    etags = _put_parts(hub, {n: p for n, p in parts.items() if n != 2} if fault == "missing part" else parts)
    payload_oid = oid
    if fault == "missing part":
        etags[2] = '"' + "0" * 32 + '"'
    elif fault == "unlisted part":
        del etags[3]
    elif fault == "wrong etag":
        etags[2] = etags[1]
    else:
        payload_oid = "ab" * 32

    status, headers, answer = _complete(hub, complete, payload_oid, etags)

    assert status == 400 and answer["error"] == headers["X-Error-Message"]
    message = {"missing part": "Part 2 of .* was never uploaded", "unlisted part": r"must list parts 1\.\.3",
               "wrong etag": "Part 2 of .* does not match", "wrong oid": "oid 'abab.*' is not"}[fault]
    assert re.search(message, answer["error"])
    assert not hub.has_lfs_object(oid)


def test_multipart_content_that_is_not_the_oid_is_refused(multipart_hub):
    hub = multipart_hub
    HfApi(token=WRITER).create_repo(REPO)
    oid, parts, complete = _multipart(hub)
    forged = BIG[:-1] + b"x"  # the right sizes, the wrong bytes
    etags = _put_parts(hub, parts, forged)

    status, _, answer = _complete(hub, complete, oid, etags)

    assert status == 422 and "do not match oid" in answer["error"]
    assert not hub.has_lfs_object(oid)
    assert _raw(hub, "POST", complete.replace("sig=", "sig=0"), b"{}")[0] == 403  # a forged completion URL
    # The right bytes for the last part make it whole.
    etags[3] = _raw(hub, "PUT", parts[3], BIG[2 * CHUNK:])[1]["ETag"]
    assert _complete(hub, complete, oid, etags)[0] == 200 and hub.has_lfs_object(oid)


def test_multipart_endpoints_can_be_made_to_fail(multipart_hub):
    hub = multipart_hub
    HfApi(token=WRITER).create_repo(REPO)
    oid, parts, complete = _multipart(hub)
    hub.fail_next("lfs-part", status=503)
    assert _raw(hub, "PUT", parts[1], BIG[:CHUNK])[0] == 503
    etags = _put_parts(hub, parts)
    hub.fail("lfs-complete", status=500, times=2)
    assert [_complete(hub, complete, oid, etags)[0] for _ in range(3)] == [500, 500, 200]
    assert hub.has_lfs_object(oid)
