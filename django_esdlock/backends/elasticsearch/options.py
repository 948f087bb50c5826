"""What the Elasticsearch backend's OPTIONS and URLs mean: checks, credentials, host labels, lock index names.

Pure: no client and no ``elasticsearch`` import, so that a ``LOCK_BACKEND``
URL is read, and its options checked, where the client is not installed.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ...exceptions import InvalidLockBackend
from ...redaction import add_secrets, credential_values, redact, url_secrets

URL_SCHEMES = {"elasticsearch": "http", "es": "http", "elasticsearch+http": "http", "elasticsearch+https": "https"}
"""``LOCK_BACKEND`` URL scheme -> the scheme of the host it names."""

DEFAULT_PORT = 9200
"""The port of a host URL that names none (the client's default too)."""

TOKEN_FLOOR_LIMIT = 2**62
"""OPTIONS ``token_floor`` stays below this: a token (floor + term * 2**40 + seq_no) must fit a signed long."""

DEFAULT_REPLICAS = "0-2"
"""A copy of the lock index on every node up to three (``auto_expand_replicas``): 2 replicas on a cluster of
three or more, 1 on two nodes, none on a single development node (which stays green)."""

NESTED_OBJECTS_LIMIT = 10_000
"""Elasticsearch's default ``index.mapping.nested_objects.limit``: the most nested objects (here: holders) one
document may have; a write past it is refused with a 400."""

WRITE_TIMEOUT_CAP = 5.0
"""Longest wait, in seconds, of one lock write for its shard copies to be active (the ``_bulk`` ``timeout``).
Elasticsearch's default is a minute; past this the store answers 503, which reads as busy and is retried
within the caller's own deadline or lease."""

CREDENTIAL_OPTIONS = ("basic_auth", "api_key", "bearer_auth", "http_auth")
"""Client options that send credentials with every request."""

INCARNATION_MARK = ".floor-"
"""A lock index is an alias of one concrete index named ``<alias>.floor-<token floor>`` (see :func:`incarnation`)."""

_AUTO_EXPAND = re.compile(r"^\d+-(\d+|all)$")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def url_options(url: str) -> dict[str, Any]:
    """Return the OPTIONS of ``elasticsearch[+http|+https]://[user:password@]host[:port][/index][?option=value...]``.

    The user info becomes ``basic_auth``, the path the ``index``, and every
    query parameter an option of its own name (the lock settings' own, such
    as ``ttl``, are the caller's to take out first).
    """
    add_secrets(*url_secrets(url))
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname:
        raise InvalidLockBackend(f"LOCK_BACKEND URL names no host: {url!r}")
    netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    if ":" in parts.hostname:  # IPv6: back into brackets
        netloc = f"[{parts.hostname}]" + (f":{parts.port}" if parts.port else "")
    options: dict[str, Any] = {"hosts": [f"{URL_SCHEMES[parts.scheme]}://{netloc}"]}
    index = parts.path.strip("/")
    if index:
        options["index"] = index
    if parts.username:
        options["basic_auth"] = (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or ""))
    options.update(urllib.parse.parse_qsl(parts.query))
    return options


def host_endpoints(hosts: Sequence[Any]) -> tuple[list[tuple[str, int]], str]:
    """Return the (host, port) of each of ``hosts``, or ``[]`` and why a proxy on 127.0.0.1 cannot stand in."""
    found = []
    for url in hosts:
        if not isinstance(url, str):
            return [], "the Elasticsearch hosts are not given as URLs"
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http":
            return [], "the Elasticsearch URL is https (a proxy on 127.0.0.1 would fail certificate checks)"
        found.append((parts.hostname or "127.0.0.1", parts.port or DEFAULT_PORT))
    return found, ""


def hosts_through(hosts: Sequence[str], ports: Sequence[int]) -> list[str]:
    """Return ``hosts`` reaching each through a proxy on 127.0.0.1 at its port of ``ports``.

    A host's user info (its credentials, on a network the settings say is
    trusted) goes along.
    """
    auths = [urllib.parse.urlsplit(h if "://" in h else f"http://{h}").netloc.rpartition("@")[0] for h in hosts]
    return [f"http://{auth + '@' if auth else ''}127.0.0.1:{p}" for auth, p in zip(auths, ports, strict=True)]


def flag(name: str, value: Any) -> bool:
    """Return OPTIONS[name] as a bool: True/False, or a URL query's "true"/"1"/"false"/"0"."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise InvalidLockBackend(f"ElasticsearchLockBackend OPTIONS[{name!r}] must be true or false, not {value!r}")


def checked_pipeline(value: Any, default: str) -> str | None:
    """Return ``OPTIONS['grant_pipeline']``: an ingest pipeline id, or None (a URL's ``none``): no pipeline."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "false", "0")):
        return None
    if value is True or (isinstance(value, str) and value.strip().lower() in ("true", "1")):
        return default
    if isinstance(value, str) and re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,199}", value):
        return value
    raise InvalidLockBackend(
        "ElasticsearchLockBackend OPTIONS['grant_pipeline'] must be an ingest pipeline id (lower case letters, "
        f"digits, '_', '.', '-') or None, not {value!r}"
    )


def check_index_names(index: str, namespace_indices: Mapping[str, str]) -> None:
    """Refuse a lock index name Elasticsearch would refuse (upper case, a leading ``_``, ``-`` or ``+``)."""
    for name in (index, *namespace_indices.values()):
        if not isinstance(name, str) or not name or name != name.lower() or name.startswith(("_", "-", "+")):
            raise ImproperlyConfigured(f"ElasticsearchLockBackend OPTIONS: not a valid index name: {name!r}")


def check_durability(number_of_replicas: Any, wait_for_active_shards: Any) -> None:
    """Refuse ``number_of_replicas`` and ``wait_for_active_shards`` values Elasticsearch would not take."""
    replicas_ok = isinstance(number_of_replicas, int) and number_of_replicas >= 0
    if not (replicas_ok or (isinstance(number_of_replicas, str) and _AUTO_EXPAND.match(number_of_replicas))):
        raise ImproperlyConfigured(
            "ElasticsearchLockBackend OPTIONS['number_of_replicas'] must be an int >= 0 or a range like "
            f"'0-2' or '0-all', not {number_of_replicas!r}"
        )
    if not (
        wait_for_active_shards in ("auto", "all")
        or (type(wait_for_active_shards) is int and wait_for_active_shards >= 1)
    ):
        raise ImproperlyConfigured(
            "ElasticsearchLockBackend OPTIONS['wait_for_active_shards'] must be 'auto', 'all' or an int >= 1, "
            f"not {wait_for_active_shards!r}"
        )


def checked_token_floor(token_floor: Any) -> int:
    """Return OPTIONS ``token_floor`` (an int, or its digits from a URL) if it is from 0 to 2**62."""
    if isinstance(token_floor, str) and token_floor.strip().isdigit():
        token_floor = int(token_floor)
    if type(token_floor) is not int or not 0 <= token_floor < TOKEN_FLOOR_LIMIT:
        raise ImproperlyConfigured(
            f"ElasticsearchLockBackend OPTIONS['token_floor'] must be an int from 0 to 2**62, not {token_floor!r}"
        )
    return token_floor


def check_positive(name: str, value: Any) -> None:
    """Refuse OPTIONS[name] unless it is an int >= 1 (``index_count``, ``max_holders_per_node``)."""
    if type(value) is not int or value < 1:
        raise ImproperlyConfigured(f"ElasticsearchLockBackend OPTIONS[{name!r}] must be an int >= 1, not {value!r}")


def host_label(host: Any) -> str:
    """Return ``host`` (a URL, a ``{"scheme", "host", "port"}`` mapping or a NodeConfig) as a redacted URL."""
    if isinstance(host, str):
        return redact(host)
    if isinstance(host, Mapping):
        scheme, name, port = host.get("scheme", "?"), host.get("host", "?"), host.get("port")
    else:
        scheme, name, port = getattr(host, "scheme", "?"), getattr(host, "host", "?"), getattr(host, "port", None)
    return redact(f"{scheme}://{name}" + (f":{port}" if port else ""))


def _scheme_and_credentials(host: Any) -> tuple[str, bool]:
    """Return the scheme of ``host`` and whether it carries credentials of its own (user info, a header)."""
    if isinstance(host, str):
        try:
            parts = urllib.parse.urlsplit(host)
            return parts.scheme.lower(), bool(parts.username or parts.password)
        except ValueError:
            return "", False
    if isinstance(host, Mapping):
        return str(host.get("scheme", "")).lower(), False
    headers = getattr(host, "headers", None) or {}
    return str(getattr(host, "scheme", "")).lower(), any(str(k).lower() == "authorization" for k in headers)


def _header_credentials(headers: Any) -> list[str]:
    """Return the values of Authorization headers in ``headers`` and the credentials they carry."""
    found = []
    for key, value in headers.items() if isinstance(headers, Mapping) else ():
        if str(key).lower() == "authorization" and isinstance(value, str):
            found.extend([value, value.split(None, 1)[-1]])
    return found


def configured_secrets(hosts: Sequence[Any], client_options: Mapping[str, Any]) -> list[str]:
    """Return every secret value in the hosts and client options: what redaction must mask."""
    found: list[str] = []
    for host in hosts:
        if isinstance(host, str):
            found.extend(url_secrets(host))
        else:
            found.extend(_header_credentials(getattr(host, "headers", None)))
    for name in CREDENTIAL_OPTIONS:
        found.extend(credential_values(client_options.get(name)))
    found.extend(_header_credentials(client_options.get("headers")))
    return found


def plain_http_credentials(hosts: Sequence[Any], client_options: Mapping[str, Any]) -> list[str]:
    """Return the (redacted) hosts to which credentials would travel over plain http, unencrypted.

    Credentials are user info in a host URL, a client credential option
    (``basic_auth``, ``api_key``, ``bearer_auth``, ``http_auth``) or an
    Authorization header; the options' ones go to every host. ``cloud_id``
    is always https.
    """
    everywhere = any(client_options.get(name) not in (None, "") for name in CREDENTIAL_OPTIONS) or bool(
        _header_credentials(client_options.get("headers"))
    )
    plain = []
    for host in hosts:
        scheme, own = _scheme_and_credentials(host)
        if scheme != "https" and (own or everywhere):
            plain.append(host_label(host))
    return plain


def index_of_namespace(namespace: str, index: str, index_count: int, namespace_indices: Mapping[str, str]) -> str:
    """Return the lock index of ``namespace``: named in ``namespace_indices``, else hashed into ``index_count``.

    The hash (SHA-256 of the name) is stable across processes and versions;
    with one index it is always ``index`` itself.
    """
    named = namespace_indices.get(namespace)
    if named is not None:
        return named
    if index_count == 1:
        return index
    bucket = int.from_bytes(hashlib.sha256(namespace.encode()).digest()[:8], "big") % index_count
    return f"{index}-{bucket}"


def lock_index_names(index: str, index_count: int, namespace_indices: Mapping[str, str]) -> tuple[str, ...]:
    """Return every lock index: the hashed ones, then those ``namespace_indices`` names."""
    hashed = [index] if index_count == 1 else [f"{index}-{i}" for i in range(index_count)]
    return tuple(dict.fromkeys([*hashed, *namespace_indices.values()]))


def incarnation(alias: str, floor: int) -> str:
    """Return the name of the concrete lock index behind ``alias`` whose tokens all exceed ``floor``."""
    return f"{alias}{INCARNATION_MARK}{floor}"


def token_floor_of(index: str) -> int:
    """Return the token floor of concrete lock index ``index`` (0 for an index not named by :func:`incarnation`)."""
    _, mark, digits = index.rpartition(INCARNATION_MARK)
    return int(digits) if mark and digits.isdigit() else 0
