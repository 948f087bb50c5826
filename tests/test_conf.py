"""Settings: dicts, URLs, and typed errors for everything else."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_esdlock import InvalidLockBackend, get_backend
from django_esdlock.backends.elasticsearch import ElasticsearchLockBackend
from django_esdlock.conf import ELASTICSEARCH_BACKEND, backend_config, load_backend, parse_url

ES = {"BACKEND": ELASTICSEARCH_BACKEND, "OPTIONS": {"hosts": ["http://127.0.0.1:9"], "index": "locks"}}


def test_elasticsearch_url():
    config = parse_url("elasticsearch://user:p%40ss@es.example:9201/my-locks?ttl=12")
    assert config == {
        "BACKEND": ELASTICSEARCH_BACKEND,
        "OPTIONS": {"hosts": ["http://es.example:9201"], "index": "my-locks", "basic_auth": ("user", "p@ss")},
        "TTL": 12.0,
    }
    assert parse_url("elasticsearch+https://es.example/")["OPTIONS"] == {"hosts": ["https://es.example"]}


def test_database_urls_name_the_database_backend():
    assert parse_url("postgres://postgres@127.0.0.1:5432/test")["OPTIONS"] == {
        "url": "postgres://postgres@127.0.0.1:5432/test"
    }
    assert parse_url("sqlite:////tmp/locks.sqlite3")["BACKEND"].endswith("DatabaseLockBackend")
    config = parse_url("postgres://u@db/locks?ttl=9&sslmode=require")
    assert config["TTL"] == 9.0 and config["OPTIONS"] == {"url": "postgres://u@db/locks?sslmode=require"}
    assert parse_url("sqlite:////tmp/locks.sqlite3?ttl=5")["OPTIONS"] == {"url": "sqlite:////tmp/locks.sqlite3"}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({**ES, "TIMEOUT": 3}, "unknown key"),
        ({"OPTIONS": {}}, "no 'BACKEND'"),
        ({"BACKEND": "django_esdlock.backends.nope.NopeBackend"}, "Could not import"),
        ({"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}, "not a subclass"),
        ({**ES, "TTL": -1}, "positive"),
        ({**ES, "TTL": float("nan")}, "positive"),
        ({**ES, "TTL": "30"}, "positive"),
        ({**ES, "OPTIONS": ["hosts"]}, "must be a dict"),
        ("redis://127.0.0.1:6379", "scheme"),
        ("elasticsearch:///locks", "no host"),
        ("elasticsearch://h:9200/locks?ttl=soon", "not a number"),
        ({**ES, "DEADLOCK_TIMEOUT": 0}, "DEADLOCK_TIMEOUT.*positive"),
        ({**ES, "DEADLOCK_TIMEOUT": "1"}, "DEADLOCK_TIMEOUT.*positive"),
        ("sqlite:////tmp/x.sqlite3?deadlock_timeout=soon", "not a number"),
        ({**ES, "CLOCK_SKEW_MARGIN": -0.1}, "CLOCK_SKEW_MARGIN.*0 or more"),
        ({**ES, "CLOCK_SKEW_MARGIN": "1"}, "CLOCK_SKEW_MARGIN.*0 or more"),
        ("elasticsearch://h:9200/locks?clock_skew_margin=soon", "not a number"),
        (42, "dict or a URL"),
    ],
)
def test_bad_settings_are_typed_errors(value, message):
    with pytest.raises(InvalidLockBackend, match=message) as info:
        load_backend(value)
    assert isinstance(info.value, ImproperlyConfigured)


def test_deadlock_timeout_defaults_to_one_second_and_can_be_set_or_turned_off():
    assert load_backend(ES).deadlock_timeout == 1.0
    assert load_backend({**ES, "DEADLOCK_TIMEOUT": 0.25}).deadlock_timeout == 0.25
    assert load_backend({**ES, "DEADLOCK_TIMEOUT": None}).deadlock_timeout is None
    assert load_backend("elasticsearch://h:9200/locks?deadlock_timeout=2.5").deadlock_timeout == 2.5
    assert load_backend("elasticsearch://h:9200/locks?deadlock_timeout=off").deadlock_timeout is None
    sqlite = parse_url("sqlite:////tmp/x.sqlite3?deadlock_timeout=3&timeout=9")
    assert sqlite["DEADLOCK_TIMEOUT"] == 3.0 and sqlite["OPTIONS"] == {"url": "sqlite:////tmp/x.sqlite3?timeout=9"}


def test_the_clock_skew_margin_is_the_stores_own_unless_set_and_shortens_the_holders_view():
    es, sqlite = load_backend(ES), load_backend("sqlite:////tmp/x.sqlite3")
    assert (es.clock_skew_margin, sqlite.clock_skew_margin) == (0.5, 0.0)
    assert (es.held_for(30), sqlite.held_for(30)) == (29.0, 29.9)  # lease margin 0.5 / 0.1, plus the skew margin
    assert es.held_for(2) == 1.5  # never less than three quarters of the lease
    assert load_backend({**ES, "CLOCK_SKEW_MARGIN": 2}).held_for(30) == 27.5
    assert load_backend("sqlite:////tmp/x.sqlite3?clock_skew_margin=1.5").held_for(30) == 28.4
    assert load_backend({**ES, "CLOCK_SKEW_MARGIN": 0}).clock_skew_margin == 0.0


def test_unknown_backend_option_is_named():
    with pytest.raises(ImproperlyConfigured, match="shards"):
        load_backend({**ES, "OPTIONS": {**ES["OPTIONS"], "shards": 3}})


def test_client_options_pass_through():
    backend = load_backend({**ES, "OPTIONS": {**ES["OPTIONS"], "request_timeout": 3, "verify_certs": False}})
    assert backend.client_options == {"request_timeout": 3, "verify_certs": False}


def test_default_is_the_database_backend():
    assert backend_config(None)["BACKEND"].endswith("DatabaseLockBackend")


def test_override_settings_resets_the_cached_backend():
    with override_settings(LOCK_BACKEND=ES):
        first = get_backend()
        assert isinstance(first, ElasticsearchLockBackend)
        assert get_backend() is first
    with override_settings(LOCK_BACKEND="elasticsearch://127.0.0.1:9/other"):
        assert get_backend().index == "other"
