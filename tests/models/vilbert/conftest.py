"""Fixtures of the ViLBERT tests: the authors' config of the golden fixture
(`tests/support/vilbert_golden.py`)."""

import json

import pytest

from tests.support.vilbert_golden import FIXTURE


@pytest.fixture(scope="module")
def authors_config():
    return json.loads((FIXTURE / "config.json").read_text())
