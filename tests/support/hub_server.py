"""A local stand-in for the Hugging Face Hub, for tests that use the real client.

`LocalHub` serves model repositories from a directory over HTTP on 127.0.0.1,
speaking the subset of the Hub protocol that `huggingface_hub` (checked against
2.4.0) uses to download files, and to create repos and upload to them.

Download side (anonymous, except for private repos):

* ``HEAD``/``GET /{org}/{name}/resolve/{revision}/{filename}``: the file, with
  the headers `hf_hub_download` insists on (``X-Repo-Commit``, ``ETag``,
  ``Content-Length``) and byte ``Range`` support (the client resumes
  interrupted downloads with ``Range: bytes=N-``). No ``X-Xet-Hash`` header is
  ever sent, so the client never tries Xet storage and downloads over plain HTTP.
* ``GET /api/models/{org}/{name}[/revision/{revision}]``: a minimal repo info
  JSON (``id``, ``sha``, ``siblings``), for `model_info` / `repo_info`.
* ``GET /api/models/{org}/{name}/tree/{revision}[/{path}]``: the file listing
  that `snapshot_download` asks for.

* ``GET /api/models/{org}/{name}/refs``: branches (and ``refs/pr/N`` pull
  requests with ``include_prs=1``), for `list_repo_refs`.

Upload side (`create_repo`, `create_branch`, `upload_folder`, `upload_file`,
`create_commit`, with Xet off: the legacy LFS protocol):

* ``POST /api/repos/create`` (JSON ``name``, ``organization``, ``type`` and
  ``visibility``, ``"private"`` or ``"public"``; older clients send a boolean
  ``private``): creates an empty repo (an empty ``main``); 409 if it exists,
  which the client swallows when ``exist_ok=True``. ``private`` is recorded
  (`LocalHub.is_private`): a private repo is a 404 for any request without a
  token of its namespace.
* ``POST /api/models/{org}/{name}/branch/{branch}`` (JSON ``startingPoint``,
  default ``main``): a new branch with the files of its starting point; 409 if
  it exists.
* ``POST /api/models/{org}/{name}/preupload/{revision}`` (JSON ``files``:
  ``path``, ``size``, base64 ``sample``): answers each file's ``uploadMode``:
  ``"lfs"`` for weights-like suffixes (``.safetensors``, ``.bin``, ``.h5``...),
  files over 10 MB and files whose sample holds a NUL byte, ``"regular"``
  otherwise; ``shouldIgnore`` is always false. For a file the revision already
  has, ``oid`` is its current id (sha256 for LFS, git blob sha1 for regular
  files): the client drops unchanged files from the commit, and makes no
  commit at all when nothing changed.
* ``POST /{org}/{name}.git/info/lfs/objects/batch`` (git-lfs batch API, upload,
  ``basic`` transfer, plus ``multipart`` when the client offers it and the hub
  has a ``multipart_chunk_size``): an object the server already stores gets no
  ``actions`` (the client skips its upload); the others get an ``upload``
  action and a ``verify`` action. The ``upload`` action is a signed ``PUT``
  URL on this server, without ``chunk_size`` (a single PUT), unless the object
  is larger than ``multipart_chunk_size``: then it is a multipart upload, as
  the Hub answers for large files: its ``header`` holds ``chunk_size`` and one
  signed part URL per part (keys ``"00001"``, ``"00002"``...; parts of
  ``chunk_size`` bytes, the last one shorter), and its ``href`` is the signed
  completion URL.
* ``PUT /lfs-upload/{oid}?size=N&sig=...``: the object's bytes (plain or
  chunked body, no ``Authorization`` header needed: the signature is the
  authorisation, as with a pre-signed storage URL); 400 unless the bytes have
  that size and sha256. Objects are stored by sha256 outside the repos.
* ``PUT /lfs-multipart/{oid}/part/{n}?size=N&chunk=C&sig=...``: part ``n``
  (1-based) of a multipart upload, signed as the single PUT is; 400 unless it
  has ``C`` bytes (the last part: what is left). Stored aside (a part sent
  again replaces it) and answered with an empty body and an ``ETag`` header,
  the quoted md5 of the part, as S3 does.
* ``POST /lfs-multipart/{oid}/complete?size=N&chunk=C&sig=...`` (JSON ``oid``,
  ``parts``: ``[{"partNumber": 1, "etag": ...}, ...]``; the client sends no
  ``Authorization`` here either, the signature authorises): needs every part,
  each once, with the etag its PUT was answered (quotes optional), else 400;
  assembles them and, if the result has the object's size and sha256 (422
  otherwise), stores it as the single PUT does, so that the verify call, the
  commit and downloads work alike. A refused completion stores no object.
* ``POST /{org}/{name}.git/info/lfs/objects/verify`` (JSON ``oid``, ``size``).
* ``POST /api/models/{org}/{name}/commit/{revision}[?create_pr=1]``: the ndjson
  body of ``header`` (``summary``, ``description``, optional
  ``parentCommit``: 412 if it is not the head), ``file`` (base64 content),
  ``lfsFile`` (``oid`` of an uploaded object; 422 if it was never uploaded),
  ``deletedFile`` and ``deletedFolder`` lines. The new file set is built aside
  and swapped in whole, so a failing commit changes nothing. Answers
  ``commitOid``, ``commitUrl`` (and ``pullRequestUrl``: ``create_pr`` commits
  go to a new ``refs/pr/N`` revision based on ``main``). A commit that changes
  the files is recorded in `LocalHub.commits`.
* ``POST /api/validate-yaml`` (the client checks a ``README.md``'s metadata
  before uploading it): always valid.
* ``GET /api/whoami-v2``: the token's user (its first namespace, sorted) and orgs.

Every upload-side call except the LFS ``PUT`` requests and the multipart completion needs ``Authorization: Bearer
<token>``: no token or an unknown one is a 401 (an unknown one with the
message ``Invalid credentials in Authorization header``, which the client
does not mistake for a missing repo), a valid token without write rights on
the repo's namespace a 403. ``LocalHub.fail`` makes a named endpoint answer an
error (once, a given number of times, or until `LocalHub.clear_failures`) to
test failures in the middle of an upload; note that the client retries 429 and
5xx answers of preupload, LFS batch, upload (single, part and multipart
completion) and verify calls with back-off, but not of the commit call.

Errors carry the ``X-Error-Code`` header that `hf_raise_for_status` maps to an
exception: ``RepoNotFound`` -> `RepositoryNotFoundError`, ``RevisionNotFound``
-> `RevisionNotFoundError`, ``EntryNotFound`` -> `RemoteEntryNotFoundError`
(alias `EntryNotFoundError`); and ``X-Error-Message``, which the client puts in
its 401/403 messages.

Layout of the served directory (``root``)::

    root/<org>/<name>/<files...>               repo "org/name" at revision "main"
    root/<org>/<name>@<revision>/<files...>    the same repo at another revision

A revision containing characters that cannot appear in a directory name (such
as ``refs/pr/1``) is stored url-quoted: ``name@refs%2Fpr%2F1``; `LocalHub.add_repo`
does this for you. A revision may also be requested by its commit hash.

Commit hashes are deterministic: sha1 of the repo id, the revision name and the
content of every file. The same repo, revision and files always give the same
hash, and changing a file changes it (as a new commit on the Hub would), so the
client notices the change instead of returning its cached snapshot. Uploads
keep to this: a commit that leaves the files as they were leaves the hash as
it was (and is not recorded in `LocalHub.commits`). ETags are
the sha256 of the file content, as the Hub sends for LFS files.

`configure_client` and `set_offline` point the real client, in-process, at a
`LocalHub` and a cache directory, and switch its offline mode; both undo
everything through the `pytest.MonkeyPatch` they are given
(`close_client_session` drops the client's pooled HTTP session).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import http.server
import importlib
import json
import os
import pathlib
import re
import secrets
import shutil
import tempfile
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = ["LocalHub", "close_client_session", "configure_client", "set_offline"]

_HOST = "127.0.0.1"
_REPO_TYPE_PREFIXES = ("datasets", "spaces", "kernels")  # only model repos are served

#: Endpoints `LocalHub.fail` can make fail, by name.
FAILABLE_ENDPOINTS = (
    "create-repo", "branch", "preupload", "lfs-batch", "lfs-upload", "lfs-part", "lfs-complete", "lfs-verify",
    "commit", "validate-yaml",
)
#: Files stored through LFS whatever their size, as the Hub's default ``.gitattributes`` says.
_LFS_SUFFIXES = (
    ".safetensors", ".bin", ".h5", ".keras", ".msgpack", ".onnx", ".pt", ".pth", ".ckpt", ".npy", ".npz",
    ".pkl", ".pickle", ".model", ".tflite", ".ot", ".zip", ".gz", ".tar", ".tgz", ".xz", ".zst", ".parquet",
    ".arrow",
)
_LFS_SIZE_THRESHOLD = 10 * 1024 * 1024  # larger files always go through LFS
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_INVALID_TOKEN = "Invalid credentials in Authorization header"


class _Error(Exception):
    """An error response: HTTP status plus the Hub's ``X-Error-Code``."""

    def __init__(
        self, status: int, code: str | None, message: str, commit: str | None = None,
        extra: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit
        self.extra = extra or {}  # more fields of the JSON body


def _check_repo_id(repo_id: str) -> None:
    parts = repo_id.split("/")
    if len(parts) != 2 or any(p in ("", ".", "..") or "@" in p for p in parts):
        raise ValueError(f"repo_id must look like 'org/name', got {repo_id!r}")


def _safe_relative(filename: str) -> pathlib.PurePosixPath | None:
    """`filename` as a relative POSIX path, or None if it could escape its repo."""
    path = pathlib.PurePosixPath(filename)
    if not filename or path.is_absolute() or any(p in ("", ".", "..") for p in filename.split("/")):
        return None
    return path


class LocalHub:
    """Serves repos from a directory as the Hugging Face Hub does, for tests.

    Args:
        root: the served directory (see the module docstring for its layout).
        tokens: the valid access tokens, each mapped to the namespaces (users or
            organizations) it may write to: ``{"hf_writer": {"me", "my-org"}}``.
            A token may read the private repos of the namespaces it can write to.
        multipart_chunk_size: when set, the LFS batch API answers a multipart
            upload (parts of this many bytes) for objects larger than this, as
            the Hub does for large files; otherwise every object is one PUT.

    Attributes:
        root: the served directory.
        tokens: ``{token: frozenset of namespaces}``.
        url: ``http://127.0.0.1:PORT`` once started.
        requests: ``(method, path)`` of every request received, in order; ``path``
            is the raw request target, url-encoding and query string included.
        commits: one dict per commit that changed a revision, in order:
            ``repo_id``, ``revision``, ``oid`` (the new commit hash), ``parent``
            (the previous one, None for a new revision), ``summary``, ``pr``
            (the pull-request number or None) and ``token``.
        cache_dir: the client cache directory, when `configure_client` set one.
    """

    def __init__(
        self, root: pathlib.Path, tokens: Mapping[str, Iterable[str]] | None = None,
        multipart_chunk_size: int | None = None,
    ):
        if multipart_chunk_size is not None and multipart_chunk_size < 1:
            raise ValueError(f"multipart_chunk_size must be positive, got {multipart_chunk_size}")
        self.root = pathlib.Path(root)
        self.multipart_chunk_size = multipart_chunk_size
        self.root.mkdir(parents=True, exist_ok=True)
        self.tokens: dict[str, frozenset[str]] = {
            token: frozenset([namespaces] if isinstance(namespaces, str) else namespaces)
            for token, namespaces in (tokens or {}).items()
        }
        self.requests: list[tuple[str, str]] = []
        self.commits: list[dict[str, Any]] = []
        self.cache_dir: pathlib.Path | None = None
        self._private: set[str] = set()
        self._failures: dict[str, list[Any]] = {}  # endpoint -> [status, remaining count or None]
        self._lfs_dir: pathlib.Path | None = None  # uploaded LFS objects by sha256, while started
        self._secret = secrets.token_bytes(16)  # signs the LFS upload URLs
        self._write_lock = threading.RLock()  # one commit / repo creation at a time
        # (filename, status) of every GET that served file content (200 or 206).
        self._served: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        self._hashes: dict[tuple[str, int, int], tuple[str, str]] = {}
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ repos

    def add_repo(
        self,
        repo_id: str,
        files_dir_or_mapping: os.PathLike | str | Mapping[str, bytes | str],
        revision: str = "main",
    ) -> None:
        """Publish ``repo_id`` at ``revision`` with exactly the given files.

        ``files_dir_or_mapping`` is a directory to copy, or a mapping from
        repo-relative POSIX paths (``"sub/file.bin"``) to content (``str`` is
        utf-8 encoded). Replaces whatever that repo had at that revision.
        """
        _check_repo_id(repo_id)
        if not revision:
            raise ValueError("revision must not be empty")
        target = self._revision_dir(repo_id, revision)
        if target.exists():
            shutil.rmtree(target)
        if isinstance(files_dir_or_mapping, Mapping):
            target.mkdir(parents=True)
            for name, content in files_dir_or_mapping.items():
                rel = _safe_relative(name)
                if rel is None:
                    raise ValueError(f"invalid repo filename {name!r}")
                dest = target.joinpath(*rel.parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(content.encode() if isinstance(content, str) else bytes(content))
        else:
            shutil.copytree(files_dir_or_mapping, target)

    def is_private(self, repo_id: str) -> bool:
        """Whether ``repo_id`` was created private (``create_repo(private=True)``)."""
        with self._lock:
            return repo_id in self._private

    def set_private(self, repo_id: str, private: bool = True) -> None:
        """Make ``repo_id`` private (readable only with a token of its namespace) or public."""
        _check_repo_id(repo_id)
        with self._lock:
            (self._private.add if private else self._private.discard)(repo_id)

    def has_lfs_object(self, oid: str) -> bool:
        """Whether an LFS object with this sha256 was uploaded (committed or not)."""
        return self._lfs_dir is not None and bool(_SHA256_RE.match(oid)) and (self._lfs_dir / oid).is_file()

    def fail(self, endpoint: str, status: int = 500, times: int | None = 1) -> None:
        """Make the next ``times`` requests to ``endpoint`` fail with ``status``.

        ``endpoint`` is one of `FAILABLE_ENDPOINTS` (``"lfs-upload"`` is the PUT
        of a whole LFS object, ``"lfs-part"`` the PUT of a part of a multipart
        upload, ``"lfs-complete"`` its completion POST, ``"commit"`` the
        commit call). ``times=None`` fails
        every request until `clear_failures`: the client retries 429 and 5xx
        answers of some calls (preupload, LFS batch, upload and verify) with
        back-off, so a single failure would go unnoticed there (parts and
        completions included). A failing
        request changes nothing on the server.
        """
        if endpoint not in FAILABLE_ENDPOINTS:
            raise ValueError(f"endpoint must be one of {FAILABLE_ENDPOINTS}, got {endpoint!r}")
        with self._lock:
            self._failures[endpoint] = [status, times]

    def fail_next(self, endpoint: str, status: int = 500) -> None:
        """Make only the next request to ``endpoint`` fail with ``status``."""
        self.fail(endpoint, status, times=1)

    def clear_failures(self) -> None:
        """Forget every failure set up with `fail`."""
        with self._lock:
            self._failures.clear()

    def _take_failure(self, endpoint: str) -> int | None:
        with self._lock:
            failure = self._failures.get(endpoint)
            if failure is None:
                return None
            status, remaining = failure
            if remaining is not None:
                if remaining <= 1:
                    del self._failures[endpoint]
                else:
                    failure[1] = remaining - 1
            return status

    def _namespaces(self, token: str | None) -> frozenset[str]:
        return self.tokens.get(token, frozenset()) if token else frozenset()

    def _upload_url_signature(self, oid: str, size: int, *more: Any) -> str:
        message = ":".join(str(x) for x in (oid, size, *more))
        return hmac.new(self._secret, message.encode(), hashlib.sha256).hexdigest()

    def commit_hash(self, repo_id: str, revision: str = "main") -> str:
        """The 40-hex commit the server reports for ``repo_id`` at ``revision``."""
        return self._commit(repo_id, revision, self._revision_dir(repo_id, revision))

    def downloads_of(self, filename: str) -> int:
        """How many GET requests served the content of ``filename`` (any repo).

        ``filename`` is the repo-relative path, e.g. ``"sub/weights.bin"``.
        HEAD requests and error responses do not count.
        """
        with self._lock:
            return sum(1 for name, _ in self._served if name == filename)

    def _record(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))

    def _revision_dir(self, repo_id: str, revision: str) -> pathlib.Path:
        if revision == "main":
            return self.root / repo_id
        org, name = repo_id.split("/")
        return self.root / org / f"{name}@{quote(revision, safe='')}"

    def _revisions(self, repo_id: str) -> dict[str, pathlib.Path]:
        """All revisions of ``repo_id`` that exist on disk, by name."""
        org, name = repo_id.split("/")
        found = {}
        if (self.root / repo_id).is_dir():
            found["main"] = self.root / repo_id
        org_dir = self.root / org
        if org_dir.is_dir():
            for child in org_dir.glob(f"{name}@*"):
                if child.is_dir():
                    found[unquote(child.name[len(name) + 1 :])] = child
        return found

    def _file_hashes(self, path: pathlib.Path) -> tuple[str, str]:
        """(sha256, git blob sha1) of a file, cached while it is unchanged."""
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self._lock:
            cached = self._hashes.get(key)
        if cached is None:
            data = path.read_bytes()
            git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            cached = (hashlib.sha256(data).hexdigest(), git)
            with self._lock:
                self._hashes[key] = cached
        return cached

    def _files(self, rev_dir: pathlib.Path) -> list[str]:
        """Repo-relative POSIX paths of all files of a revision, sorted."""
        return sorted(p.relative_to(rev_dir).as_posix() for p in rev_dir.rglob("*") if p.is_file())

    def _commit(self, repo_id: str, revision: str, rev_dir: pathlib.Path) -> str:
        digest = hashlib.sha1(f"{repo_id}\0{revision}\0".encode())
        for name in self._files(rev_dir):
            digest.update(f"{name}\0{self._file_hashes(rev_dir / name)[0]}\0".encode())
        return digest.hexdigest()

    def _resolve(self, repo_id: str, revision: str) -> tuple[pathlib.Path, str]:
        """(directory, commit hash) of a repo revision, or raise the Hub's error."""
        try:
            _check_repo_id(repo_id)
        except ValueError:
            raise _Error(404, "RepoNotFound", f"Repository {repo_id!r} not found") from None
        revisions = self._revisions(repo_id)
        if not revisions:
            raise _Error(404, "RepoNotFound", f"Repository {repo_id!r} not found")
        if revision in revisions:
            return revisions[revision], self._commit(repo_id, revision, revisions[revision])
        for name, rev_dir in revisions.items():  # a commit hash?
            commit = self._commit(repo_id, name, rev_dir)
            if commit == revision:
                return rev_dir, commit
        raise _Error(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    # ------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("LocalHub is not started")
        return f"http://{_HOST}:{self._server.server_address[1]}"

    @property
    def server_address(self) -> tuple[str, int]:
        """The (host, port) the listening socket is bound to."""
        if self._server is None:
            raise RuntimeError("LocalHub is not started")
        return self._server.socket.getsockname()[:2]

    def start(self) -> LocalHub:
        if self._server is not None:
            return self
        self._lfs_dir = pathlib.Path(tempfile.mkdtemp(prefix="localhub-lfs-"))
        handler = type("_BoundHandler", (_Handler,), {"hub": self})
        self._server = http.server.ThreadingHTTPServer((_HOST, 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="LocalHub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None
        if self._lfs_dir is not None:  # committed files live in the repos
            shutil.rmtree(self._lfs_dir, ignore_errors=True)
            self._lfs_dir = None

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Request handler; ``hub`` is set on a per-server subclass."""

    hub: LocalHub
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    timeout = 30  # drop idle keep-alive connections eventually

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep tests quiet
        pass

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def _not_allowed(self) -> None:
        self.hub._record(self.command, self.path)
        self._read_body()
        self._send_error(_Error(405, None, f"{self.command} is not supported by LocalHub"))

    do_PATCH = do_DELETE = _not_allowed

    def _dispatch(self) -> None:
        self.hub._record(self.command, self.path)
        url = urlsplit(self.path)
        segments = url.path.lstrip("/").split("/")
        query = parse_qs(url.query)
        try:
            # Read the whole body first, so that an error answer leaves the
            # keep-alive connection usable.
            body = self._read_body() if self.command in ("POST", "PUT") else b""
            repo_type = segments[1] if segments[0] == "api" and len(segments) > 1 else segments[0]
            if repo_type in _REPO_TYPE_PREFIXES:
                raise _Error(404, "RepoNotFound", "LocalHub only serves model repos")
            if self.command == "POST" and segments == ["api", "repos", "create"]:
                self._create_repo(_json_body(body))
            elif self.command == "POST" and segments == ["api", "validate-yaml"]:
                self._failure_point("validate-yaml")
                self._send_json({"errors": [], "warnings": []})
            elif self.command == "GET" and segments == ["api", "whoami-v2"]:
                self._whoami()
            elif segments[:2] == ["api", "models"]:
                self._api(segments[2:], query, body)
            elif self.command == "PUT" and len(segments) == 2 and segments[0] == "lfs-upload":
                self._lfs_upload(segments[1], query, body)
            elif (self.command == "PUT" and len(segments) == 4 and segments[0] == "lfs-multipart"
                  and segments[2] == "part"):
                self._lfs_part(segments[1], segments[3], query, body)
            elif (self.command == "POST" and len(segments) == 3 and segments[0] == "lfs-multipart"
                  and segments[2] == "complete"):
                self._lfs_complete(segments[1], query, body)
            elif (self.command == "POST" and len(segments) == 6 and segments[1].endswith(".git")
                  and segments[2:5] == ["info", "lfs", "objects"] and segments[5] in ("batch", "verify")):
                repo_id = unquote(segments[0]) + "/" + unquote(segments[1][: -len(".git")])
                if segments[5] == "batch":
                    self._lfs_batch(repo_id, _json_body(body))
                else:
                    self._lfs_verify(repo_id, _json_body(body))
            elif self.command in ("GET", "HEAD") and len(segments) >= 5 and segments[2] == "resolve":
                repo_id = unquote(segments[0]) + "/" + unquote(segments[1])
                self._check_readable(repo_id)
                self._resolve_file(repo_id, unquote(segments[3]), unquote("/".join(segments[4:])))
            else:
                raise _Error(404, None, f"Not found: {self.command} {url.path}")
        except _Error as error:
            self._send_error(error)

    def _read_body(self) -> bytes:
        """The request body, plain (``Content-Length``) or chunked."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after each chunk
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    # ---------------------------------------------------------------- auth

    def _token(self) -> str | None:
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        return token.strip() or None if scheme.lower() == "bearer" else None

    def _authenticated(self) -> str:
        """The request's valid token, or raise 401."""
        token = self._token()
        if token is None:
            raise _Error(401, None, "You must be authenticated to access this resource: no token given")
        if token not in self.hub.tokens:
            raise _Error(401, None, _INVALID_TOKEN)
        return token

    def _check_writable(self, repo_id: str) -> str:
        """The request's token if it may write to ``repo_id``'s namespace; 401 / 403 otherwise."""
        token = self._authenticated()
        namespace = repo_id.split("/")[0]
        if namespace not in self.hub.tokens[token]:
            raise _Error(403, None, f"You don't have the rights to write to {repo_id} (namespace {namespace!r})")
        return token

    def _check_readable(self, repo_id: str) -> None:
        """A private repo is invisible (404) without a token that can write to its namespace."""
        if self.hub.is_private(repo_id):
            namespace = repo_id.split("/")[0]
            if namespace not in self.hub._namespaces(self._token()):
                raise _Error(404, "RepoNotFound", f"Repository {repo_id!r} not found")

    def _failure_point(self, endpoint: str) -> None:
        status = self.hub._take_failure(endpoint)
        if status is not None:
            raise _Error(status, None, f"LocalHub: injected failure of {endpoint}")

    def _whoami(self) -> None:
        token = self._authenticated()
        namespaces = sorted(self.hub.tokens[token])
        name = namespaces[0] if namespaces else "anonymous"
        self._send_json({
            "type": "user", "name": name, "fullname": name,
            "orgs": [{"type": "org", "name": org, "roleInOrg": "write"} for org in namespaces[1:]],
            "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": "write"}},
        })

    # -------------------------------------------------------- repo creation

    def _create_repo(self, payload: dict[str, Any]) -> None:
        repo_type = payload.get("type") or "model"
        name, organization = payload.get("name"), payload.get("organization")
        if repo_type != "model":
            raise _Error(400, None, "LocalHub only serves model repos")
        token = self._authenticated()
        if not isinstance(name, str) or not name:
            raise _Error(400, None, "'name' is required")
        if organization is None:
            namespaces = sorted(self.hub.tokens[token])
            organization = namespaces[0] if namespaces else ""
        repo_id = f"{organization}/{name}"
        try:
            _check_repo_id(repo_id)
        except ValueError:
            raise _Error(400, None, f"Invalid repo name {repo_id!r}") from None
        visibility = payload.get("visibility")  # huggingface_hub 2.x; older clients send "private"
        if visibility not in (None, "public", "private"):
            raise _Error(400, None, f"Model repos cannot be {visibility!r}")
        private = visibility == "private" if visibility is not None else bool(payload.get("private"))
        self._check_writable(repo_id)
        self._failure_point("create-repo")
        with self.hub._write_lock:
            if self.hub._revisions(repo_id):
                # The client reads the repo's url from this answer when `exist_ok=True`.
                raise _Error(409, None, "You already created this model repo",
                             extra={"url": f"{self.hub.url}/{repo_id}"})
            self.hub._revision_dir(repo_id, "main").mkdir(parents=True)
            self.hub.set_private(repo_id, private)
        self._send_json({"url": f"{self.hub.url}/{repo_id}", "name": repo_id, "id": repo_id})

    def _create_branch(self, repo_id: str, branch: str, payload: dict[str, Any]) -> None:
        self._check_writable(repo_id)
        self._failure_point("branch")
        with self.hub._write_lock:
            revisions = self.hub._revisions(repo_id)
            if not revisions:
                raise _Error(404, "RepoNotFound", f"Repository {repo_id!r} not found")
            if branch in revisions:
                raise _Error(409, None, f"Reference already exists: refs/heads/{branch}")
            if not branch or branch.startswith("refs/") or any(p in ("", ".", "..") for p in branch.split("/")):
                raise _Error(400, None, f"Invalid branch name {branch!r}")
            source, _ = self.hub._resolve(repo_id, payload.get("startingPoint") or "main")
            shutil.copytree(source, self.hub._revision_dir(repo_id, branch))
        self._send_json({})

    def _refs(self, repo_id: str, include_prs: bool) -> None:
        branches, prs = [], []
        for name, rev_dir in sorted(self.hub._revisions(repo_id).items()):
            commit = self.hub._commit(repo_id, name, rev_dir)
            if name.startswith("refs/pr/"):
                prs.append({"name": name, "ref": name, "targetCommit": commit})
            else:
                branches.append({"name": name, "ref": f"refs/heads/{name}", "targetCommit": commit})
        if not branches and not prs:
            raise _Error(404, "RepoNotFound", f"Repository {repo_id!r} not found")
        payload = {"branches": branches, "tags": [], "converts": []}
        if include_prs:
            payload["pullRequests"] = prs
        self._send_json(payload)

    # ------------------------------------------------------------- upload

    def _writable_revision(self, repo_id: str, revision: str, create_pr: bool) -> pathlib.Path:
        """The directory of the revision a commit goes onto (``main`` for a pull request)."""
        rev_dir, _ = self.hub._resolve(repo_id, "main" if create_pr else revision)
        if not create_pr and revision not in self.hub._revisions(repo_id):
            raise _Error(400, None, f"Commits go onto a branch; {revision!r} is a commit hash")
        return rev_dir

    def _preupload(self, repo_id: str, revision: str, payload: dict[str, Any], create_pr: bool) -> None:
        self._check_writable(repo_id)
        self._failure_point("preupload")
        files = payload.get("files")
        if not isinstance(files, list):
            raise _Error(400, None, "'files' must be a list")
        rev_dir = self._writable_revision(repo_id, revision, create_pr)
        answers = []
        for entry in files:
            path, size = entry.get("path"), entry.get("size")
            rel = _safe_relative(path) if isinstance(path, str) else None
            if rel is None or not isinstance(size, int):
                raise _Error(400, None, f"Invalid file entry {entry!r}")
            try:
                sample = base64.b64decode(entry.get("sample") or "", validate=True)
            except (binascii.Error, ValueError):
                raise _Error(400, None, f"Invalid sample for {path!r}") from None
            mode = _upload_mode(path, size, sample)
            answer = {"path": path, "uploadMode": mode, "shouldIgnore": False}
            existing = rev_dir.joinpath(*rel.parts)
            if existing.is_file():  # lets the client skip unchanged files
                sha256, git_oid = self.hub._file_hashes(existing)
                answer["oid"] = sha256 if mode == "lfs" else git_oid
            answers.append(answer)
        self._send_json({"files": answers, "commitOid": self.hub._commit(repo_id, revision, rev_dir)})

    def _lfs_batch(self, repo_id: str, payload: dict[str, Any]) -> None:
        self._check_writable(repo_id)
        self._failure_point("lfs-batch")
        self.hub._resolve(repo_id, "main")  # the repo must exist
        if payload.get("operation") != "upload":
            raise _Error(400, None, "LocalHub's LFS batch API only does uploads")
        if "basic" not in (payload.get("transfers") or ["basic"]):
            raise _Error(400, None, "LocalHub only offers the 'basic' LFS transfer")
        chunk_size = self.hub.multipart_chunk_size
        multipart = chunk_size is not None and "multipart" in (payload.get("transfers") or ["basic"])
        any_multipart = False
        objects = []
        for obj in payload.get("objects") or []:
            oid, size = obj.get("oid"), obj.get("size")
            if not isinstance(oid, str) or not _SHA256_RE.match(oid) or not isinstance(size, int) or size < 0:
                objects.append({"oid": str(oid), "size": size if isinstance(size, int) else 0,
                                "error": {"code": 422, "message": "invalid oid or size"}})
            elif self.hub.has_lfs_object(oid) and (self.hub._lfs_dir / oid).stat().st_size == size:
                objects.append({"oid": oid, "size": size})  # already stored: no actions, no upload
            else:
                if multipart and size > chunk_size:
                    any_multipart = True
                    upload = self._multipart_action(oid, size, chunk_size)
                else:
                    signature = self.hub._upload_url_signature(oid, size)
                    upload = {"href": f"{self.hub.url}/lfs-upload/{oid}?size={size}&sig={signature}", "header": {}}
                repo_url = f"{self.hub.url}/{quote(repo_id)}.git/info/lfs/objects"
                objects.append({
                    "oid": oid, "size": size, "authenticated": True,
                    "actions": {"upload": upload, "verify": {"href": f"{repo_url}/verify", "header": {}}},
                })
        transfer = "multipart" if any_multipart else "basic"
        self._send_json({"transfer": transfer, "objects": objects, "hash_algo": "sha256"},
                        content_type="application/vnd.git-lfs+json")

    def _multipart_action(self, oid: str, size: int, chunk_size: int) -> dict[str, Any]:
        """The ``upload`` action of a multipart upload: signed part URLs and the completion URL."""
        base = f"{self.hub.url}/lfs-multipart/{oid}"
        query = f"size={size}&chunk={chunk_size}"
        header: dict[str, str] = {"chunk_size": str(chunk_size)}
        for number in range(1, _num_parts(size, chunk_size) + 1):
            signature = self.hub._upload_url_signature(oid, size, chunk_size, "part", number)
            header[f"{number:05d}"] = f"{base}/part/{number}?{query}&sig={signature}"
        signature = self.hub._upload_url_signature(oid, size, chunk_size, "complete")
        return {"href": f"{base}/complete?{query}&sig={signature}", "header": header}

    def _lfs_upload(self, oid: str, query: dict[str, list[str]], body: bytes) -> None:
        # Like a pre-signed storage URL: no Authorization header, the signature authorises.
        try:
            size = int(query.get("size", [""])[0])
        except ValueError:
            raise _Error(403, None, "Invalid upload URL") from None
        signature = query.get("sig", [""])[0]
        if not hmac.compare_digest(signature, self.hub._upload_url_signature(oid, size)):
            raise _Error(403, None, "Invalid upload URL signature")
        self._failure_point("lfs-upload")
        if len(body) != size or hashlib.sha256(body).hexdigest() != oid:
            raise _Error(400, None, f"Uploaded content does not match oid {oid} and size {size}")
        self._store_lfs_object(oid, body)
        self._send_json({})

    def _store_lfs_object(self, oid: str, content: bytes) -> None:
        """Stores an uploaded LFS object under its oid, atomically."""
        target = self.hub._lfs_dir / oid
        temporary = target.with_name(f".{oid}.{secrets.token_hex(4)}")
        temporary.write_bytes(content)
        os.replace(temporary, target)

    def _multipart_query(self, oid: str, query: dict[str, list[str]], *signed: Any) -> tuple[int, int]:
        """(size, chunk size) of a signed multipart URL; 403 if it is not one this server signed."""
        try:
            size, chunk_size = int(query.get("size", [""])[0]), int(query.get("chunk", [""])[0])
        except ValueError:
            raise _Error(403, None, "Invalid upload URL") from None
        signature = query.get("sig", [""])[0]
        if not hmac.compare_digest(signature, self.hub._upload_url_signature(oid, size, chunk_size, *signed)):
            raise _Error(403, None, "Invalid upload URL signature")
        if not _SHA256_RE.match(oid) or size < 1 or chunk_size < 1:
            raise _Error(400, None, "Invalid multipart upload")
        return size, chunk_size

    def _parts_dir(self, oid: str, size: int, chunk_size: int) -> pathlib.Path:
        return self.hub._lfs_dir / ".multipart" / f"{oid}-{size}-{chunk_size}"

    def _lfs_part(self, oid: str, part: str, query: dict[str, list[str]], body: bytes) -> None:
        # Like a pre-signed storage URL: no Authorization header, the signature authorises.
        number = int(part) if part.isdigit() else 0
        size, chunk_size = self._multipart_query(oid, query, "part", number)
        self._failure_point("lfs-part")
        num_parts = _num_parts(size, chunk_size)
        if not 1 <= number <= num_parts:
            raise _Error(400, None, f"Part number {part} is not in 1..{num_parts}")
        expected = chunk_size if number < num_parts else size - chunk_size * (num_parts - 1)
        if len(body) != expected:
            raise _Error(400, None, f"Part {number} of {oid} must have {expected} bytes, got {len(body)}")
        parts_dir = self._parts_dir(oid, size, chunk_size)
        parts_dir.mkdir(parents=True, exist_ok=True)
        target = parts_dir / f"{number:05d}"
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
        temporary.write_bytes(body)
        os.replace(temporary, target)
        self.send_response(200)
        self.send_header("ETag", f'"{hashlib.md5(body).hexdigest()}"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _lfs_complete(self, oid: str, query: dict[str, list[str]], body: bytes) -> None:
        # The client posts the completion without an Authorization header: the signature authorises.
        size, chunk_size = self._multipart_query(oid, query, "complete")
        self._failure_point("lfs-complete")
        payload = _json_body(body)
        if payload.get("oid") != oid:
            raise _Error(400, None, f"The completion's oid {payload.get('oid')!r} is not {oid}")
        parts = payload.get("parts")
        if not isinstance(parts, list) or not all(
            isinstance(p, dict) and isinstance(p.get("partNumber"), int) and isinstance(p.get("etag"), str)
            for p in parts
        ):
            raise _Error(400, None, "'parts' must be a list of {'partNumber': int, 'etag': str}")
        num_parts = _num_parts(size, chunk_size)
        numbers = [p["partNumber"] for p in parts]
        if sorted(numbers) != list(range(1, num_parts + 1)):
            raise _Error(400, None, f"The completion must list parts 1..{num_parts} once each, got {numbers}")
        parts_dir = self._parts_dir(oid, size, chunk_size)
        chunks = []
        for entry in sorted(parts, key=lambda p: p["partNumber"]):
            number = entry["partNumber"]
            path = parts_dir / f"{number:05d}"
            if not path.is_file():
                raise _Error(400, None, f"Part {number} of {oid} was never uploaded")
            content = path.read_bytes()
            if entry["etag"].strip('"') != hashlib.md5(content).hexdigest():
                raise _Error(400, None, f"Part {number} of {oid}: etag {entry['etag']} does not match the upload")
            chunks.append(content)
        content = b"".join(chunks)
        if len(content) != size or hashlib.sha256(content).hexdigest() != oid:
            raise _Error(422, None, f"The assembled parts do not match oid {oid} and size {size}")
        self._store_lfs_object(oid, content)
        shutil.rmtree(parts_dir, ignore_errors=True)
        self._send_json({})

    def _lfs_verify(self, repo_id: str, payload: dict[str, Any]) -> None:
        self._check_writable(repo_id)
        self._failure_point("lfs-verify")
        oid, size = payload.get("oid"), payload.get("size")
        if not isinstance(oid, str) or not self.hub.has_lfs_object(oid):
            raise _Error(404, None, f"LFS object {oid} was not uploaded")
        if (self.hub._lfs_dir / oid).stat().st_size != size:
            raise _Error(422, None, f"LFS object {oid} does not have size {size}")
        self._send_json({})

    def _create_commit(self, repo_id: str, revision: str, body: bytes, create_pr: bool) -> None:
        token = self._check_writable(repo_id)
        self._failure_point("commit")
        try:
            lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        except json.JSONDecodeError as error:
            raise _Error(400, None, f"Invalid ndjson commit payload: {error}") from None
        if not lines or not isinstance(lines[0], dict) or lines[0].get("key") != "header":
            raise _Error(400, None, "The commit payload must start with a 'header' line")
        header = lines[0].get("value") or {}
        summary = header.get("summary")
        if not isinstance(summary, str) or not summary:
            raise _Error(400, None, "The commit needs a summary")
        with self.hub._write_lock:
            base_dir = self._writable_revision(repo_id, revision, create_pr)
            base_name = "main" if create_pr else revision
            parent = self.hub._commit(repo_id, base_name, base_dir)
            if header.get("parentCommit") not in (None, parent):
                raise _Error(412, None, f"Parent commit {header['parentCommit']} is not the head {parent}")
            staging = pathlib.Path(tempfile.mkdtemp(prefix=".commit-", dir=self.hub.root))
            try:
                shutil.rmtree(staging)
                shutil.copytree(base_dir, staging)
                for line in lines[1:]:
                    self._apply(staging, line)
                if create_pr:
                    numbers = [int(name[len("refs/pr/"):]) for name in self.hub._revisions(repo_id)
                               if re.fullmatch(r"refs/pr/\d+", name)]
                    number = max(numbers, default=0) + 1
                    target_name = f"refs/pr/{number}"
                else:
                    number, target_name = None, revision
                target = self.hub._revision_dir(repo_id, target_name)
                new_commit = self.hub._commit(repo_id, target_name, staging)
                old_commit = parent if not create_pr else None
                if new_commit != old_commit:
                    _replace_directory(staging, target)
                    with self.hub._lock:
                        self.hub._hashes.clear()
                        self.hub.commits.append({
                            "repo_id": repo_id, "revision": target_name, "oid": new_commit, "parent": old_commit,
                            "summary": summary, "pr": number, "token": token,
                        })
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        commit_url = f"{self.hub.url}/{repo_id}/commit/{new_commit}"
        answer = {"success": True, "commitOid": new_commit, "commitUrl": commit_url}
        if create_pr:
            answer["pullRequestUrl"] = f"{self.hub.url}/{repo_id}/discussions/{number}"
        self._send_json(answer)

    def _apply(self, staging: pathlib.Path, line: Any) -> None:
        """Applies one operation line of a commit to the staging copy of the revision."""
        key = line.get("key") if isinstance(line, dict) else None
        value = line.get("value") if isinstance(line, dict) else None
        path = value.get("path") if isinstance(value, dict) else None
        rel = _safe_relative(path.strip("/")) if isinstance(path, str) else None
        if rel is None:
            raise _Error(400, None, f"Invalid commit operation {line!r}")
        dest = staging.joinpath(*rel.parts)
        if key == "file":
            if value.get("encoding", "base64") != "base64":
                raise _Error(400, None, f"Unsupported encoding for {path!r}")
            try:
                content = base64.b64decode(value.get("content", ""), validate=True)
            except (binascii.Error, ValueError):
                raise _Error(400, None, f"Invalid base64 content for {path!r}") from None
            _write_file(dest, content)
        elif key == "lfsFile":
            oid = value.get("oid")
            if value.get("algo", "sha256") != "sha256" or not isinstance(oid, str) or not self.hub.has_lfs_object(oid):
                raise _Error(422, None, f"LFS object {oid} of {path!r} was never uploaded")
            if dest.is_dir():
                raise _Error(400, None, f"{path!r} is a folder")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.hub._lfs_dir / oid, dest)
        elif key == "deletedFile":
            if not dest.is_file():
                raise _Error(404, "EntryNotFound", f"A file with this name doesn't exist: {path}")
            dest.unlink()
        elif key == "deletedFolder":
            if not dest.is_dir():
                raise _Error(404, "EntryNotFound", f"A folder with this name doesn't exist: {path}")
            shutil.rmtree(dest)
        else:
            raise _Error(400, None, f"Unknown commit operation {key!r}")

    # ----------------------------------------------------------- /resolve

    def _resolve_file(self, repo_id: str, revision: str, filename: str) -> None:
        rev_dir, commit = self.hub._resolve(repo_id, revision)
        rel = _safe_relative(filename)
        path = rev_dir.joinpath(*rel.parts) if rel is not None else None
        if path is None or not path.is_file():
            raise _Error(404, "EntryNotFound", f"{filename} does not exist on {revision!r}", commit=commit)
        sha256, _ = self.hub._file_hashes(path)
        size = path.stat().st_size
        status, start, end = 200, 0, size  # serves bytes [start, end) of the file
        range_header = self.headers.get("Range")
        if range_header is not None:
            byte_range = _parse_range(range_header, size)
            if byte_range is None:
                raise _Error(416, None, f"Range {range_header!r} not satisfiable", commit=commit)
            status, (start, end) = 206, byte_range
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{sha256}"')
        self.send_header("X-Repo-Commit", commit)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if self.command == "GET":
            with self.hub._lock:
                self.hub._served.append((filename, status))
            with path.open("rb") as f:
                f.seek(start)
                self.wfile.write(f.read(end - start))

    # ---------------------------------------------------------------- /api

    def _api(self, segments: list[str], query: dict[str, list[str]], body: bytes = b"") -> None:
        if len(segments) < 2:
            raise _Error(404, None, "Not found")
        repo_id = unquote(segments[0]) + "/" + unquote(segments[1])
        rest = segments[2:]
        create_pr = query.get("create_pr", ["0"])[0].lower() in ("1", "true")
        if self.command == "POST":
            if len(rest) == 2 and rest[0] == "preupload":
                self._preupload(repo_id, unquote(rest[1]), _json_body(body), create_pr)
            elif len(rest) == 2 and rest[0] == "commit":
                self._create_commit(repo_id, unquote(rest[1]), body, create_pr)
            elif len(rest) == 2 and rest[0] == "branch":
                self._create_branch(repo_id, unquote(rest[1]), _json_body(body) if body else {})
            else:
                raise _Error(404, None, "Not found")
            return
        if self.command not in ("GET", "HEAD"):
            raise _Error(405, None, f"{self.command} is not supported on /api")
        self._check_readable(repo_id)
        if not rest:
            self._model_info(repo_id, "main")
        elif rest[0] == "revision" and len(rest) == 2:
            self._model_info(repo_id, unquote(rest[1]))
        elif rest == ["refs"]:
            self._refs(repo_id, query.get("include_prs", ["0"])[0] in ("1", "true"))
        elif rest[0] == "tree" and len(rest) >= 2:
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            self._tree(repo_id, unquote(rest[1]), unquote("/".join(rest[2:])), recursive)
        else:
            raise _Error(404, None, "Not found")

    def _model_info(self, repo_id: str, revision: str) -> None:
        rev_dir, commit = self.hub._resolve(repo_id, revision)
        siblings = [{"rfilename": name} for name in self.hub._files(rev_dir)]
        self._send_json(
            {"_id": commit, "id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0], "sha": commit,
             "private": self.hub.is_private(repo_id), "disabled": False, "gated": False, "tags": [],
             "siblings": siblings}
        )

    def _tree(self, repo_id: str, revision: str, path_in_repo: str, recursive: bool) -> None:
        rev_dir, commit = self.hub._resolve(repo_id, revision)
        base = rev_dir
        if path_in_repo:
            rel = _safe_relative(path_in_repo)
            base = rev_dir.joinpath(*rel.parts) if rel is not None else None
            if base is None or not base.is_dir():
                message = f"{path_in_repo} does not exist on {revision!r}"
                raise _Error(404, "EntryNotFound", message, commit=commit)
        entries = []
        for path in sorted(base.rglob("*") if recursive else base.iterdir()):
            name = path.relative_to(rev_dir).as_posix()
            if path.is_dir():
                oid = hashlib.sha1(name.encode()).hexdigest()
                entries.append({"type": "directory", "oid": oid, "size": 0, "path": name})
            else:
                _, oid = self.hub._file_hashes(path)
                entries.append({"type": "file", "oid": oid, "size": path.stat().st_size, "path": name})
        self._send_json(entries)

    # ------------------------------------------------------------ responses

    def _send_json(self, payload: Any, content_type: str = "application/json") -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_error(self, error: _Error) -> None:
        body = json.dumps({"error": error.message, **error.extra}).encode()
        self.send_response(error.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if error.code is not None:
            self.send_header("X-Error-Code", error.code)
        self.send_header("X-Error-Message", error.message)
        if error.commit is not None:  # lets the client cache the file's absence
            self.send_header("X-Repo-Commit", error.commit)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise _Error(400, None, f"Invalid JSON body: {error}") from None
    if not isinstance(payload, dict):
        raise _Error(400, None, "The JSON body must be an object")
    return payload


def _num_parts(size: int, chunk_size: int) -> int:
    return -(-size // chunk_size)


def _upload_mode(path: str, size: int, sample: bytes) -> str:
    """``"lfs"`` for weights-like, large or binary files, ``"regular"`` (a git blob) otherwise."""
    if size == 0:
        return "regular"  # the client commits empty files as regular files anyway
    if path.lower().endswith(_LFS_SUFFIXES) or size > _LFS_SIZE_THRESHOLD or b"\0" in sample:
        return "lfs"
    return "regular"


def _write_file(dest: pathlib.Path, content: bytes) -> None:
    if dest.is_dir():
        raise _Error(400, None, f"{dest.name!r} is a folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(content)


def _replace_directory(staging: pathlib.Path, target: pathlib.Path) -> None:
    """Moves ``staging`` to ``target``, replacing it: a reader sees the old or the new revision."""
    for directory in sorted((p for p in staging.rglob("*") if p.is_dir()), reverse=True):
        if not any(directory.iterdir()):  # a deletion's leftover empty folder
            directory.rmdir()
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        os.rename(staging, target)
        return
    backup = target.with_name(f".{target.name}.{secrets.token_hex(4)}.old")
    os.rename(target, backup)
    os.rename(staging, target)
    shutil.rmtree(backup, ignore_errors=True)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``(start, end)`` (end exclusive) of a single ``bytes=`` range, or None if unsatisfiable."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, _, last = (s.strip() for s in spec.partition("-"))
    try:
        if not first:  # suffix range: the last N bytes
            length = int(last)
            return (max(size - length, 0), size) if length > 0 and size > 0 else None
        start = int(first)
        end = min(int(last) + 1, size) if last else size
    except ValueError:
        return None
    return (start, end) if start < size and start < end else None


# ------------------------------------------------------------------ client side


def _module(name: str) -> Any:
    """The module ``name``, or None if this huggingface_hub version lacks it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _patch(monkeypatch, target: Any, name: str, value: Any) -> None:
    """Patch ``target.name`` if this huggingface_hub version has it."""
    if target is not None and hasattr(target, name):
        monkeypatch.setattr(target, name, value)


def configure_client(
    monkeypatch, hub: LocalHub, cache_dir: os.PathLike | str, home: os.PathLike | str
) -> None:
    """Point the real `huggingface_hub` client, in-process, at ``hub`` and ``cache_dir``.

    `huggingface_hub` reads its environment into ``huggingface_hub.constants``
    at import time, so the environment variables are set (for subprocesses and
    for code that reads them) *and* the module attributes the client consults
    at call time are patched. ``home`` becomes ``HF_HOME``: token, xet cache and
    other per-user files go there instead of ``~/.cache/huggingface``. The
    client is left online, never authenticated, with telemetry and Xet off.
    Everything is undone by ``monkeypatch``.
    """
    from huggingface_hub import constants, hf_api
    from huggingface_hub.utils import _http

    cache_dir, home = str(cache_dir), str(home)
    assets = os.path.join(home, "assets")
    endpoint = hub.url
    hub.cache_dir = pathlib.Path(cache_dir)

    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": home,
        "HF_HUB_CACHE": cache_dir,
        "HUGGINGFACE_HUB_CACHE": cache_dir,
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("TRANSFORMERS_OFFLINE", "HUGGINGFACE_CO_STAGING", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                 "HF_OIDC_RESOURCE", "HF_TOKEN_PATH", "HF_XET_CACHE", "HF_ASSETS_CACHE",
                 "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)

    # Endpoint: every URL is built from these at call time.
    _patch(monkeypatch, constants, "ENDPOINT", endpoint)
    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    _patch(monkeypatch, constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    # Hosts / origins trusted as the Hub (auth forwarded, redirects followed); computed at import time.
    hosts = frozenset({*getattr(constants, "HF_URL_HOSTS", ()), _HOST})
    _patch(monkeypatch, constants, "HF_URL_HOSTS", hosts)
    origins = frozenset({*getattr(_http, "_HUB_ORIGINS", ()), ("http", _HOST, hub.server_address[1])})
    _patch(monkeypatch, _http, "_HUB_ORIGINS", origins)
    # The module-level `HfApi` behind `huggingface_hub.model_info`, `repo_info`, ...
    # copied ENDPOINT when it was created.
    monkeypatch.setattr(hf_api.api, "endpoint", endpoint)

    # Cache and per-user files.
    _patch(monkeypatch, constants, "HF_HOME", home)
    _patch(monkeypatch, constants, "HF_HUB_CACHE", cache_dir)
    _patch(monkeypatch, constants, "HUGGINGFACE_HUB_CACHE", cache_dir)
    _patch(monkeypatch, constants, "HF_ASSETS_CACHE", assets)
    _patch(monkeypatch, constants, "HUGGINGFACE_ASSETS_CACHE", assets)
    _patch(monkeypatch, constants, "HF_XET_CACHE", os.path.join(home, "xet"))
    _patch(monkeypatch, constants, "HF_TOKEN_PATH", os.path.join(home, "token"))
    _patch(monkeypatch, constants, "HF_STORED_TOKENS_PATH", os.path.join(home, "stored_tokens"))
    for name in ("CHECK_FOR_UPDATE_DONE_PATH", "CHECK_FOR_SKILL_UPDATE_DONE_PATH", "AGENT_HARNESSES_PATH"):
        if hasattr(constants, name):
            filename = os.path.basename(getattr(constants, name))
            monkeypatch.setattr(constants, name, os.path.join(home, filename))
    # Modules that did `from ..constants import HF_HUB_CACHE` (or HF_ASSETS_CACHE) at import time.
    _patch(monkeypatch, _module("huggingface_hub.utils._cache_manager"), "HF_HUB_CACHE", cache_dir)
    _patch(monkeypatch, _module("huggingface_hub.utils._cache_assets"), "HF_ASSETS_CACHE", assets)

    # No token, no telemetry, no Xet, no agent-registry fetch (it would GET {ENDPOINT}/api/agent-harnesses).
    _patch(monkeypatch, constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
    _patch(monkeypatch, constants, "HF_HUB_DISABLE_TELEMETRY", True)
    _patch(monkeypatch, constants, "HF_HUB_DISABLE_XET", True)
    detect_agent = _module("huggingface_hub.utils._detect_agent")
    _patch(monkeypatch, detect_agent, "_registry", getattr(detect_agent, "_EMPTY_REGISTRY", None))

    set_offline(monkeypatch, False)
    close_client_session()


def set_offline(monkeypatch, offline: bool = True) -> None:
    """Switch the real `huggingface_hub` client's offline mode, in-process.

    `constants.is_offline_mode()` (used by the request hook that refuses every
    HTTP call when offline, and by the download code) reads
    ``constants.HF_HUB_OFFLINE`` at call time, so patching that attribute (plus
    the env var, for subprocesses) is enough. Undone by ``monkeypatch``.
    """
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", bool(offline))


def close_client_session() -> None:
    """Drop the client's shared HTTP session; the next request creates a new one.

    The session is created lazily and keeps what it was created with (proxy
    settings read from the environment, pooled connections): call this after
    changing the environment and again after restoring it.
    """
    from huggingface_hub.utils import _http

    close = getattr(_http, "close_session", None) or getattr(_http, "reset_sessions", None)
    if close is not None:
        close()


@contextlib.contextmanager
def serving(tmp_path: pathlib.Path, monkeypatch, **hub_options: Any):
    """A running `LocalHub` over ``tmp_path / "hub"`` (``hub_options`` as
    `LocalHub` takes them: ``tokens``, ``multipart_chunk_size``) with the real
    client pointed at it (`configure_client`: downloads into
    ``tmp_path / "hf_cache"``, other per-user files under ``tmp_path / "hf_home"``).

    On exit the client's pooled connections to the server are dropped; it
    creates its next session lazily, after monkeypatch has restored the
    environment.
    """
    with LocalHub(tmp_path / "hub", **hub_options) as hub:
        configure_client(monkeypatch, hub, cache_dir=tmp_path / "hf_cache", home=tmp_path / "hf_home")
        try:
            yield hub
        finally:
            close_client_session()
