"""A local stand-in for the Hugging Face Hub, for tests that use the real client.

`LocalHub` serves model repositories from a directory over HTTP on 127.0.0.1,
speaking the subset of the Hub protocol that `huggingface_hub` (checked against
2.4.0) uses to download files:

* ``HEAD``/``GET /{org}/{name}/resolve/{revision}/{filename}``: the file, with
  the headers `hf_hub_download` insists on (``X-Repo-Commit``, ``ETag``,
  ``Content-Length``) and byte ``Range`` support (the client resumes
  interrupted downloads with ``Range: bytes=N-``). No ``X-Xet-Hash`` header is
  ever sent, so the client never tries Xet storage and downloads over plain HTTP.
* ``GET /api/models/{org}/{name}[/revision/{revision}]``: a minimal repo info
  JSON (``id``, ``sha``, ``siblings``), for `model_info` / `repo_info`.
* ``GET /api/models/{org}/{name}/tree/{revision}[/{path}]``: the file listing
  that `snapshot_download` asks for.

Errors carry the ``X-Error-Code`` header that `hf_raise_for_status` maps to an
exception: ``RepoNotFound`` -> `RepositoryNotFoundError`, ``RevisionNotFound``
-> `RevisionNotFoundError`, ``EntryNotFound`` -> `RemoteEntryNotFoundError`
(alias `EntryNotFoundError`).

Layout of the served directory (``root``)::

    root/<org>/<name>/<files...>               repo "org/name" at revision "main"
    root/<org>/<name>@<revision>/<files...>    the same repo at another revision

A revision containing characters that cannot appear in a directory name (such
as ``refs/pr/1``) is stored url-quoted: ``name@refs%2Fpr%2F1``; `LocalHub.add_repo`
does this for you. A revision may also be requested by its commit hash.

Commit hashes are deterministic: sha1 of the repo id, the revision name and the
content of every file. The same repo, revision and files always give the same
hash, and changing a file changes it (as a new commit on the Hub would), so the
client notices the change instead of returning its cached snapshot. ETags are
the sha256 of the file content, as the Hub sends for LFS files.

`configure_client` and `set_offline` point the real client, in-process, at a
`LocalHub` and a cache directory, and switch its offline mode; both undo
everything through the `pytest.MonkeyPatch` they are given
(`close_client_session` drops the client's pooled HTTP session).
"""

from __future__ import annotations

import hashlib
import http.server
import importlib
import json
import os
import pathlib
import shutil
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = ["LocalHub", "close_client_session", "configure_client", "set_offline"]

_HOST = "127.0.0.1"
_REPO_TYPE_PREFIXES = ("datasets", "spaces", "kernels")  # only model repos are served


class _Error(Exception):
    """An error response: HTTP status plus the Hub's ``X-Error-Code``."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


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

    Attributes:
        root: the served directory (see the module docstring for its layout).
        url: ``http://127.0.0.1:PORT`` once started.
        requests: ``(method, path)`` of every request received, in order; ``path``
            is the raw request target, url-encoding and query string included.
        cache_dir: the client cache directory, when `configure_client` set one.
    """

    def __init__(self, root: pathlib.Path):
        self.root = pathlib.Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.requests: list[tuple[str, str]] = []
        self.cache_dir: pathlib.Path | None = None
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

    def _not_allowed(self) -> None:
        self.hub._record(self.command, self.path)
        self._send_error(_Error(405, None, f"{self.command} is not supported by LocalHub"))

    do_POST = do_PUT = do_PATCH = do_DELETE = _not_allowed

    def _dispatch(self) -> None:
        self.hub._record(self.command, self.path)
        url = urlsplit(self.path)
        segments = url.path.lstrip("/").split("/")
        try:
            repo_type = segments[1] if segments[0] == "api" and len(segments) > 1 else segments[0]
            if repo_type in _REPO_TYPE_PREFIXES:
                raise _Error(404, "RepoNotFound", "LocalHub only serves model repos")
            if segments[:2] == ["api", "models"]:
                if self.command != "GET":
                    raise _Error(405, None, "Only GET is supported on /api")
                self._api(segments[2:], parse_qs(url.query))
            elif len(segments) >= 5 and segments[2] == "resolve":
                repo_id = unquote(segments[0]) + "/" + unquote(segments[1])
                self._resolve_file(repo_id, unquote(segments[3]), unquote("/".join(segments[4:])))
            else:
                raise _Error(404, None, f"Not found: {url.path}")
        except _Error as error:
            self._send_error(error)

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

    def _api(self, segments: list[str], query: dict[str, list[str]]) -> None:
        if len(segments) < 2:
            raise _Error(404, None, "Not found")
        repo_id = unquote(segments[0]) + "/" + unquote(segments[1])
        rest = segments[2:]
        if not rest:
            self._model_info(repo_id, "main")
        elif rest[0] == "revision" and len(rest) == 2:
            self._model_info(repo_id, unquote(rest[1]))
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
             "private": False, "disabled": False, "gated": False, "tags": [], "siblings": siblings}
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

    def _send_json(self, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_error(self, error: _Error) -> None:
        body = json.dumps({"error": error.message}).encode()
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
