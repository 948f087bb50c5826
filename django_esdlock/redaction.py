"""Masks secrets (URL user info, passwords, API keys, tokens) in every text the library shows or logs."""

from __future__ import annotations

import base64
import logging
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from .forks import ForkSafeLock

MASK = "***"

MIN_SECRET_LENGTH = 6
"""Shortest configured secret masked wherever it appears as is. Shorter ones are masked only where a pattern
finds them (a URL's user info, ``password=...``): masking every ``pw`` of a message would garble it."""

# scheme://user:password@host -> scheme://***@host. Greedy up to the last "@" before the path, so an
# unencoded "@" in the password is masked too.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#'\"<>]*@")

_SECRET_KEYS = (
    r"\w*(?:password|passwd|secret|secret_key|api_?key|apikey)|pwd|access_token|auth_token|refresh_token"
    r"|bearer_auth|basic_auth|http_auth|authorization"
)
# password=..., 'api_key': (...), "authorization": "Basic ...", as in query strings, DSNs, reprs and JSON.
_KEY_VALUE = re.compile(
    r"(?P<key>(?P<quote>['\"]?)\b(?:" + _SECRET_KEYS + r")(?P=quote)\s*[:=]\s*)"
    r"(?P<value>'[^']*'|\"[^\"]*\"|\([^)]*\)|\[[^\]]*\]|(?:(?:Basic|Bearer|ApiKey)\s+)?[^\s&;,)\]}]+)",
    re.IGNORECASE,
)
_SECRET_KEY_NAME = re.compile(r"^(?:" + _SECRET_KEYS + r")$", re.IGNORECASE)

_known: tuple[str, ...] = ()
"""Configured secret values, longest first (see :func:`add_secrets`)."""
_known_lock = ForkSafeLock()


def add_secrets(*values: Any) -> None:
    """Remember configured secret values so that :func:`redact` masks them wherever they appear.

    Strings shorter than :data:`MIN_SECRET_LENGTH` and non-strings are
    ignored; their percent-encoded forms are remembered too.
    """
    global _known
    new = set()
    for value in values:
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        if isinstance(value, str) and len(value) >= MIN_SECRET_LENGTH:
            new.update({value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)})
    with _known_lock:
        if new - set(_known):
            _known = tuple(sorted(set(_known) | new, key=len, reverse=True))


def basic_credentials(user: Any, password: Any) -> tuple[str, ...]:
    """Return the secret forms of a user and password: the password and the base64 of ``user:password``."""
    user, password = _text(user), _text(password)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return (password, token)


def credential_values(value: Any) -> tuple[str, ...]:
    """Return the secret strings in a client credential option (``basic_auth``, ``api_key``, ``bearer_auth``).

    A tuple is (user or id, password or key): its second part and the base64
    of both joined by ``:`` (what travels in the Authorization header); a
    string is the credential itself.
    """
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return basic_credentials(value[0], value[1])
    if isinstance(value, (str, bytes)):
        return (_text(value),)
    return ()


def url_secrets(url: str) -> tuple[str, ...]:
    """Return the secret parts of ``url``: its password (and user info), and the values of ``password=``-like
    query parameters."""
    try:
        parts = urllib.parse.urlsplit(url)
        query = urllib.parse.parse_qsl(parts.query)
        password = parts.password
    except ValueError:
        return ()
    found = [value for key, value in query if _SECRET_KEY_NAME.match(key)]
    if password:
        found.extend([password, urllib.parse.unquote(password)])
        found.extend(basic_credentials(urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(password)))
    return tuple(found)


def redact(text: Any) -> str:
    """Return ``text`` with every secret masked by ``***``.

    Masked: the user info of URLs (``https://***@host``), the values of
    password-, key- and token-like parameters (``password=***``,
    ``'api_key': ***``, ``authorization: ***``) and every configured secret
    :func:`add_secrets` was given. Masking twice changes nothing.
    """
    text = str(text)
    for secret in _known:
        if secret in text:
            text = text.replace(secret, MASK)
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    return _KEY_VALUE.sub(_mask_value, text)


def _mask_value(match: re.Match[str]) -> str:
    value = match["value"]
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{match['key']}{quote}{MASK}{quote}"


def redact_data(value: Any) -> Any:
    """Return a copy of JSON-like ``value`` with every string redacted and the values of secret keys masked."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {
            key: MASK if isinstance(key, str) and _SECRET_KEY_NAME.match(key) and value[key] else redact_data(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(redact_data(item) for item in value)
    return value


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class RedactingFilter(logging.Filter):
    """Masks secrets in a log record's message and traceback before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, ()
        if record.exc_info and not record.exc_text:
            formatted = logging.Formatter().formatException(record.exc_info)
            masked = redact(formatted)
            if masked != formatted:
                record.exc_text = masked
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


LOGGER_NAME = "django_esdlock"


def install_log_filter(logger_name: str = LOGGER_NAME) -> None:
    """Add one :class:`RedactingFilter` to the library's logger (idempotent)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())
