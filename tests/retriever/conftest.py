"""Shared fixtures: the sample corpus and its index, built once per test session."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from retriever_server.api.app import create_app
from retriever_server.indexing.indexer import build_index
from retriever_server.sample_corpus import write_sample_corpus


@pytest.fixture(scope="session")
def sample_pdfs(tmp_path_factory):
    return write_sample_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def sample_index(sample_pdfs, tmp_path_factory):
    return build_index(sample_pdfs, tmp_path_factory.mktemp("index") / "idx", progress=False)


@pytest.fixture(scope="session")
def app(sample_index):
    return create_app(sample_index)


@pytest.fixture(scope="session")
def client(app):
    with TestClient(app) as c:
        yield c
