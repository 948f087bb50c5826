"""What the database backend declares without a database: URL schemes, OPTIONS from a URL, endpoints, SQL versions."""

from __future__ import annotations

import hashlib
import urllib.parse

import pytest
from django.db import connections

from django_esdlock.backends.database import DatabaseLockBackend
from django_esdlock.backends.database.postgresql.functions import CURRENT, SQL_DIR, function_sql
from django_esdlock.conf import parse_url

URLS = [
    "sqlite:////tmp/locks.sqlite3",
    "sqlite:////tmp/locks.sqlite3?ttl=5",
    "sqlite:///relative/locks.sqlite3",
    "sqlite:///locks.sqlite3?timeout=9&deadlock_timeout=3&max_ids_per_request=7",
    "postgres://postgres@127.0.0.1:5432/test",
    "postgres://user:p%40ss@db.example:5433/locks?ttl=9&sslmode=require&token_floor=1000&application_name=a%20b",
    "postgresql://u@h/d?token_floor=3&token_floor=4",
    "psql://h/d?sslmode=verify-full&sslrootcert=/x/y%20z.pem",
    "pgsql://u:secret@h:6000/d",
    "postgis://h/gis",
]


@pytest.mark.parametrize("url", URLS)
def test_options_from_url_are_those_of_the_settings_url(url):
    assert DatabaseLockBackend.options_from_url(url) == parse_url(url)["OPTIONS"]


def test_url_schemes_are_the_databases():
    assert DatabaseLockBackend.url_schemes == {"postgres", "postgresql", "pgsql", "psql", "postgis", "sqlite"}


def test_options_from_url_keep_the_databases_query_and_take_the_token_floor():
    options = DatabaseLockBackend.options_from_url("postgres://u@db/locks?ttl=9&sslmode=require&token_floor=12")
    assert options == {"url": "postgres://u@db/locks?sslmode=require", "token_floor": "12"}
    assert DatabaseLockBackend.options_from_url("sqlite:////abs/path.sqlite3?ttl=1") == {
        "url": "sqlite:////abs/path.sqlite3"
    }


def test_endpoints_of_a_url():
    assert DatabaseLockBackend(url="postgres://u:p%40ss@DB.example:6543/locks?sslmode=require").endpoints() == (
        [("db.example", 6543)],
        "",
    )
    assert DatabaseLockBackend(url="postgres://u@db/locks").endpoints() == ([("db", 5432)], "")
    assert DatabaseLockBackend(url="postgresql://[::1]:7000/l").endpoints() == ([("::1", 7000)], "")
    assert DatabaseLockBackend(url="sqlite:////tmp/x.sqlite3").endpoints() == (
        [],
        "SQLite is a local file: there is no connection to cut",
    )


def test_endpoints_of_an_alias():
    settings = connections.settings["postgres"]
    expected = [(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))]
    assert DatabaseLockBackend(using="postgres").endpoints() == (expected, "")
    assert DatabaseLockBackend(using="default").endpoints() == (
        [],
        "SQLite is a local file: there is no connection to cut",
    )


def test_options_through_a_proxy_keep_the_credentials_and_the_query():
    options = {"url": "postgres://u:p%40ss@db.example:6543/locks?sslmode=require", "token_floor": 5}
    backend = DatabaseLockBackend(**options)
    assert backend.options_through(options, [7001]) == {
        "url": "postgres://u:p%40ss@127.0.0.1:7001/locks?sslmode=require",
        "token_floor": 5,
    }
    assert options["url"].startswith("postgres://u:p%40ss@db.example")  # the caller's options are left alone


def test_options_through_a_proxy_turn_an_alias_into_its_url():
    settings = connections.settings["postgres"]
    options = DatabaseLockBackend(using="postgres").options_through({"using": "postgres"}, [7001])
    parts = urllib.parse.urlsplit(options["url"])
    assert set(options) == {"url"}
    assert (parts.scheme, parts.hostname, parts.port) == ("postgres", "127.0.0.1", 7001)
    assert parts.path == "/" + urllib.parse.quote(settings["NAME"], safe="")
    assert urllib.parse.unquote(parts.username or "") == (settings["USER"] or "")


# The statement of each shipped version of a PL/pgSQL function: a migration
# installs it, so it never changes (a change is a new version and migration).
SHIPPED = {
    ("esdlock_acquire", 1): "ab7cb4232f42bfc1508fb46f97ffac2e0abb7367879998e1ef4caaa26e9bce93",
    ("esdlock_acquire", 2): "6d48c5e806f29a85b0638143082034e1edb31664e5f75149ad7ab75af6ecfbf9",
    ("esdlock_acquire", 3): "894b640e5e796d6fcf481c7839eb7e89d77a0d8a28c0aafc94e408bdd4962948",
    ("esdlock_acquire", 4): "80538144e93eaacc66162a758c26277a080739be0659a2fd3ddebffa4738912a",
    ("esdlock_acquire", 5): "d9ace9b65b9d33025eaa78ff7766b93a771a76a286f3393f9ca7b23397fa5071",
    ("esdlock_acquire", 6): "6147942e4ee2db4118e5b565fb7e44cc63f4f81c90b369bcea6ddd8d24be1586",
    ("esdlock_acquire", 7): "056aff742ed968319fa883ac15048a5541ad2378fdc70b7201ce0fc4eb6ae3fa",
    ("esdlock_release", 1): "a17690eb2ee2e365a9ea1f23d507c14cb8a613391338b238d005381ec93c6539",
    ("esdlock_release", 2): "b7f472dde3ce42e7b2f3fd851c82c47cee50041cb0a833411629dbef27f52f3d",
    ("esdlock_release", 3): "881d8609104bfba8ac358a7e8a5092da80f26b791b5c046c12922a8dbab050b7",
}


@pytest.mark.parametrize(("name", "version"), sorted(SHIPPED))
def test_a_shipped_function_version_never_changes(name, version):
    assert hashlib.sha256(function_sql(name, version).encode()).hexdigest() == SHIPPED[name, version]


def test_every_function_file_is_a_shipped_version_and_the_current_ones_are_the_latest():
    files = {(path.name.split(".")[0], int(path.name.split(".")[1][1:])) for path in SQL_DIR.glob("*.sql")}
    assert files == set(SHIPPED)
    assert {name: max(v for n, v in SHIPPED if n == name) for name, _ in SHIPPED} == CURRENT


@pytest.mark.parametrize("migration", ["0002", "0003", "0004", "0005", "0006", "0007", "0008"])
def test_migrations_load_the_files_and_rewrite_no_earlier_text(migration):
    """A migration names the versions it installs; none builds its SQL from another migration's."""
    (path,) = (SQL_DIR.parents[3] / "migrations").glob(f"{migration}_*.py")
    text = path.read_text()
    assert "function_sql(" in text
    assert ".replace(" not in text and "import_module" not in text and "CREATE OR REPLACE FUNCTION" not in text


def test_a_multi_host_database_is_every_server_of_its_list():
    """libpq's multi-host form (``HOST`` "h1,h2", ``PORT`` "p1,p2"): lock_check proxies each server, in order."""
    url = "postgres://u@db1:5001,db2:5002/locks?target_session_attrs=read-write"
    backend = DatabaseLockBackend(url=url)
    assert backend.endpoints() == ([("db1", 5001), ("db2", 5002)], "")
    assert "db1:5001,db2:5002" in backend.describe()
    assert backend.options_through({"url": url}, [7001, 7002]) == {
        "url": "postgres://u@127.0.0.1:7001,127.0.0.1:7002/locks?target_session_attrs=read-write"
    }
    settings = {
        "NAME": "locks",
        "USER": "u",
        "HOST": "db1,db2",
        "PORT": "5432",
        "OPTIONS": {"target_session_attrs": "read-write"},
    }
    dialect = backend.dialect
    assert dialect.endpoints(settings) == ([("db1", 5432), ("db2", 5432)], "")  # one port serves every host
    through = dialect.url_through(settings, "127.0.0.1", [7001, 7002])
    assert through == "postgres://u@127.0.0.1:7001,127.0.0.1:7002/locks?target_session_attrs=read-write"
