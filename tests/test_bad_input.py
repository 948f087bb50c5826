"""Bad input: a typed error before any request, and nothing written to the store."""

from __future__ import annotations

import math

import pytest

from django_esdlock import InvalidLockArgument, InvalidLockPath, global_lock, lock_documents, lock_tree
from django_esdlock.conf import load_backend

from .stores import es_config

BAD_CALLS = {
    "empty path": lambda b: lock_tree("", backend=b),
    "relative path": lambda b: lock_tree("clinton/README.txt", backend=b),
    "dot-dot": lambda b: lock_tree("/clinton/../bill", backend=b),
    "dot": lambda b: lock_tree("/clinton/./README.txt", backend=b),
    "double slash": lambda b: lock_tree("/clinton//README.txt", backend=b),
    "trailing slash": lambda b: lock_tree("/clinton/", backend=b),
    "root": lambda b: lock_tree("/", backend=b),
    "NUL": lambda b: lock_tree("/clinton/READ\x00ME", backend=b),
    "control character": lambda b: lock_tree("/clinton/\x1b[31m", backend=b),
    "over-long path": lambda b: lock_tree("/" + "a" * 5000, backend=b),
    "non-str path": lambda b: lock_tree(b"/clinton", backend=b),
    "bad namespace": lambda b: lock_tree("/clinton", namespace="fs/evil", backend=b),
    "non-str id": lambda b: lock_documents(["1", 2], backend=b),
    "None id": lambda b: lock_documents([None], backend=b),
    "ids as one string": lambda b: lock_documents("123", backend=b),
    "no ids": lambda b: lock_documents([], backend=b),
    "empty id": lambda b: lock_documents([""], backend=b),
    "control character id": lambda b: lock_documents(["a\nb"], backend=b),
    "empty lock name": lambda b: global_lock("", backend=b),
    "negative timeout": lambda b: lock_tree("/clinton", timeout=-1, backend=b),
    "NaN timeout": lambda b: lock_tree("/clinton", timeout=math.nan, backend=b),
    "str timeout": lambda b: lock_tree("/clinton", timeout="5", backend=b),
    "bool timeout": lambda b: lock_tree("/clinton", timeout=True, backend=b),
    "zero ttl": lambda b: global_lock(ttl=0, backend=b),
    "infinite ttl": lambda b: global_lock(ttl=math.inf, backend=b),
    "NaN ttl": lambda b: lock_documents(["1"], ttl=math.nan, backend=b),
    "intent without op": lambda b: lock_tree("/clinton", intent={"to": "/bill"}, backend=b),
    "intent not JSON": lambda b: lock_tree("/clinton", intent={"op": "rename", "at": object()}, backend=b),
    "intent on a shared lock": lambda b: lock_tree("/clinton", shared=True, intent={"op": "x"}, backend=b),
}


@pytest.fixture
def live_backend(es_url):
    config = es_config(es_url)
    backend = load_backend(config)
    yield backend
    backend.delete_indices()
    backend.close()


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_is_refused_before_any_request(live_backend, case):
    with pytest.raises(InvalidLockArgument) as info, BAD_CALLS[case](live_backend):
        pytest.fail("the block must not run")
    assert isinstance(info.value, ValueError)
    # Nothing written: the lock index was never even created.
    assert not live_backend.client.indices.exists(index=live_backend.index)


def test_path_errors_are_invalid_lock_path(live_backend):
    with pytest.raises(InvalidLockPath):
        lock_tree("/a/../b", backend=live_backend)
