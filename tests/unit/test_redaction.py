"""The redaction helper: what it masks, what it leaves, and where it is applied (errors, logs)."""

from __future__ import annotations

import base64
import logging

import pytest

from django_esdlock.exceptions import InvalidLockBackend, LockBackendUnavailable
from django_esdlock.redaction import (
    MASK,
    RedactingFilter,
    add_secrets,
    credential_values,
    install_log_filter,
    redact,
    redact_data,
    url_secrets,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Elasticsearch failed to read the cluster's health (Elasticsearch https://elastic:PASSWORD@127.0.0.1:9 "
            "index 'locks'): Connection error",
            "Elasticsearch failed to read the cluster's health (Elasticsearch https://***@127.0.0.1:9 "
            "index 'locks'): Connection error",
        ),
        ("elasticsearch+https://u:p%40ss@es:9200/locks", "elasticsearch+https://***@es:9200/locks"),
        ("https://apikeyonly@es:9200", "https://***@es:9200"),
        ("https://u:p@ss@es/path?x=a@b", "https://***@es/path?x=a@b"),  # an unencoded @ in the password
        ("postgres://app:pw@db/app?sslmode=require&password=pw2", "postgres://***@db/app?sslmode=require&password=***"),
        ("host=db password=hunter2 dbname=app", "host=db password=*** dbname=app"),
        ("host=db password='with space' dbname=app", "host=db password='***' dbname=app"),
        ("{'basic_auth': ('elastic', 'pw'), 'index': 'locks'}", "{'basic_auth': ***, 'index': 'locks'}"),
        ("{'api_key': 'abc', 'bearer_auth': 'tok'}", "{'api_key': '***', 'bearer_auth': '***'}"),
        ('{"authorization": "Basic ZWxhc3RpYzpwdw=="}', '{"authorization": "***"}'),
        ("Authorization: Bearer eyJhbGciOi.x.y then", "Authorization: *** then"),
        ("sslkey_password=a DB_PASSWORD: b", "sslkey_password=*** DB_PASSWORD: ***"),
    ],
)
def test_redact_masks_user_info_passwords_keys_and_tokens(text, expected):
    assert redact(text) == expected
    assert redact(expected) == expected  # masking twice changes nothing


@pytest.mark.parametrize(
    "text",
    [
        "https://es.example:9200/locks index 'locks'",
        "mail user@example.com, path /a/b@c",
        "fencing token=5 of holder 3f2a; lock_type=exclusive",
        'password authentication failed for user "app"',
        "the ticket is signed with SECRET_KEY",
    ],
)
def test_redact_leaves_text_without_secrets_alone(text):
    assert redact(text) == text


def test_configured_secrets_are_masked_wherever_they_appear_and_short_ones_only_by_pattern():
    add_secrets("xK9-configured-secret", "p@ss/word:9", "pw", None, 42)
    assert redact("echo xK9-configured-secret and xK9-configured-secret") == f"echo {MASK} and {MASK}"
    assert redact("as in a URL: p%40ss%2Fword%3A9") == f"as in a URL: {MASK}"  # percent-encoded too
    assert redact("the word pw stays") == "the word pw stays"


def test_secret_values_of_credentials_and_urls():
    token = base64.b64encode(b"key-id:the-api-key").decode()
    assert credential_values(("key-id", "the-api-key")) == ("the-api-key", token)
    assert credential_values("the-bearer-token") == ("the-bearer-token",)
    assert credential_values(None) == ()
    found = url_secrets("postgres://app:p%40ssword@db/app?password=other-one&ttl=3")
    assert "p@ssword" in found and "p%40ssword" in found and "other-one" in found and "3" not in found


def test_redact_data_masks_secret_keys_and_every_string():
    data = {"url": "https://u:pw@h", "password": "x", "api_key": None, "n": [1, ("api_key=zz",)], "ok": True}
    masked = {"url": "https://***@h", "password": MASK, "api_key": None, "n": [1, ("api_key=***",)], "ok": True}
    assert redact_data(data) == masked


def test_lock_errors_are_redacted_when_raised():
    error = LockBackendUnavailable("Elasticsearch https://elastic:PASSWORD@127.0.0.1:9 failed")
    assert "PASSWORD" not in str(error) and "PASSWORD" not in repr(error)
    assert "PASSWORD" not in str(InvalidLockBackend("bad URL 'elasticsearch://u:PASSWORD@h'"))


def test_the_log_filter_masks_messages_arguments_and_tracebacks(caplog):
    install_log_filter()
    install_log_filter()  # idempotent
    logger = logging.getLogger("django_esdlock")
    assert sum(isinstance(f, RedactingFilter) for f in logger.filters) == 1
    with caplog.at_level(logging.DEBUG, logger="django_esdlock"):
        logger.warning("could not reach %s", "https://elastic:LOGPASSWORD@es:9200")
        try:
            raise ValueError("connect to postgres://app:TRACEPASSWORD@db/app failed")
        except ValueError:
            logger.exception("failed")
    assert "LOGPASSWORD" not in caplog.text and "TRACEPASSWORD" not in caplog.text
    assert "https://***@es:9200" in caplog.text and "postgres://***@db/app" in caplog.text
