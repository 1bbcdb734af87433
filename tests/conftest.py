"""Shared pytest fixtures."""

from __future__ import annotations

import pytest

from tests.hub_server import LocalHub, close_client_session, configure_client, set_offline


@pytest.fixture
def local_hub(tmp_path, monkeypatch):
    """A running `LocalHub` that the real `huggingface_hub` client talks to.

    Serves ``tmp_path / "hub"`` (publish repos with ``local_hub.add_repo``);
    the client downloads into ``local_hub.cache_dir`` (``tmp_path / "hf_cache"``)
    and keeps its other per-user files under ``tmp_path / "hf_home"``. The
    endpoint, cache, offline flag, environment and HTTP session are restored
    after the test.
    """
    with LocalHub(tmp_path / "hub") as hub:
        configure_client(monkeypatch, hub, cache_dir=tmp_path / "hf_cache", home=tmp_path / "hf_home")
        try:
            yield hub
        finally:
            # Drop pooled connections to this server; the client creates its next
            # session lazily, after monkeypatch has restored the environment.
            close_client_session()


@pytest.fixture
def hub_offline(monkeypatch):
    """A function ``hub_offline(offline=True)`` that switches the real client's offline mode.

    Offline mode is not switched on by merely requesting the fixture, so a test
    can download first and go offline afterwards. Restored after the test.
    """

    def switch(offline: bool = True) -> None:
        set_offline(monkeypatch, offline)

    return switch
