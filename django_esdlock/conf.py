"""Reads ``settings.LOCK_BACKEND`` lazily and loads the backend it names."""

from __future__ import annotations

import math
import urllib.parse
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from .exceptions import InvalidLockBackend
from .forks import ForkSafeLock
from .limits import Limits
from .redaction import add_secrets, url_secrets

ELASTICSEARCH_BACKEND = "django_esdlock.backends.elasticsearch.ElasticsearchLockBackend"
DATABASE_BACKEND = "django_esdlock.backends.database.DatabaseLockBackend"

DEFAULT_TTL = 30.0
DEFAULT_CONFIG: dict[str, Any] = {"BACKEND": DATABASE_BACKEND, "OPTIONS": {"using": "default"}, "TTL": DEFAULT_TTL}

DEFAULT_DEADLOCK_TIMEOUT = 1.0
"""Seconds a waiting request waits before it looks for a deadlock (PostgreSQL's default ``deadlock_timeout``)."""

_ALLOWED_KEYS = frozenset(
    {"BACKEND", "OPTIONS", "TTL", "DEADLOCK_TIMEOUT", "CLOCK_SKEW_MARGIN", "LOCK_DELAY", *Limits.SETTINGS}
)

BACKENDS = (DATABASE_BACKEND, ELASTICSEARCH_BACKEND)
"""The stores a ``LOCK_BACKEND`` URL may name: each answers to the schemes its class declares (``url_schemes``)."""

_LOCK_SETTINGS = (
    "ttl",
    "deadlock_timeout",
    "clock_skew_margin",
    "lock_delay",
    *(key.lower() for key in Limits.SETTINGS),
)
"""Query parameters of a ``LOCK_BACKEND`` URL that are the lock settings' own, not the store's."""


def validate_ttl(value: Any, what: str = "TTL") -> float:
    """Return ``value`` as seconds if it is a positive finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidLockBackend(f"{what} must be a positive number of seconds, not {value!r}")
    return float(value)


def _backend_of(scheme: str, url: str) -> tuple[str, type]:
    """Return the dotted path and class of the store of ``BACKENDS`` that answers to ``scheme``."""
    known: list[str] = []
    missing: list[str] = []
    for path in BACKENDS:
        try:
            cls = import_string(path)
        except (ImportError, ImproperlyConfigured) as e:  # an optional extra not installed
            missing.append(f"{path.rpartition('.')[2]}: {e}")
            continue
        if scheme in cls.url_schemes:
            return path, cls
        known.extend(sorted(cls.url_schemes))
    unavailable = f"; not available: {'; '.join(missing)}" if missing else ""
    raise InvalidLockBackend(f"LOCK_BACKEND URL scheme {scheme!r} is not one of {known}{unavailable}: {url!r}")


def parse_url(url: str) -> dict[str, Any]:
    """Turn ``elasticsearch://host:9200/locks`` or a database URL into a backend config.

    The lock settings' own query parameters (``ttl``, ``deadlock_timeout``,
    ``max_...``) are read here; the rest of the URL is the store's, whose
    class reads it (``options_from_url``).
    """
    add_secrets(*url_secrets(url))
    parts = urllib.parse.urlsplit(url)
    path, cls = _backend_of(parts.scheme, url)
    query = urllib.parse.parse_qsl(parts.query)
    ours = dict(pair for pair in query if pair[0] in _LOCK_SETTINGS)
    config: dict[str, Any] = {"TTL": ours.pop("ttl", DEFAULT_TTL)}
    if "deadlock_timeout" in ours:
        config["DEADLOCK_TIMEOUT"] = ours.pop("deadlock_timeout")
    if "clock_skew_margin" in ours:
        config["CLOCK_SKEW_MARGIN"] = ours.pop("clock_skew_margin")
    if "lock_delay" in ours:
        config["LOCK_DELAY"] = ours.pop("lock_delay")
    for key in Limits.SETTINGS:
        if key.lower() in ours:
            try:
                config[key] = int(ours.pop(key.lower()))
            except ValueError as e:
                raise InvalidLockBackend(f"LOCK_BACKEND URL has a {key.lower()} that is not an int: {url!r}") from e
    # The store's URL, without our parameters. (Cut the query by hand: urlunsplit
    # would turn sqlite:////abs/path into sqlite://abs/path.)
    rest = urllib.parse.urlencode([(k, v) for k, v in query if k not in _LOCK_SETTINGS])
    base = url.split("?", 1)[0]
    config.update(BACKEND=path, OPTIONS=cls.options_from_url(f"{base}?{rest}" if rest else base))
    if str(config.get("DEADLOCK_TIMEOUT", "")).lower() in ("none", "off"):
        config["DEADLOCK_TIMEOUT"] = None  # ?deadlock_timeout=off: never look
    for key in ("TTL", "DEADLOCK_TIMEOUT", "CLOCK_SKEW_MARGIN", "LOCK_DELAY"):
        if config.get(key) is None:
            continue
        try:
            config[key] = float(config[key])
        except ValueError as e:
            raise InvalidLockBackend(f"LOCK_BACKEND URL has a {key.lower()} that is not a number: {url!r}") from e
    return config


def backend_config(value: Any = None) -> dict[str, Any]:
    """Return the normalized setting: BACKEND, OPTIONS, TTL, DEADLOCK_TIMEOUT, CLOCK_SKEW_MARGIN, LOCK_DELAY, caps."""
    if value is None:
        value = getattr(settings, "LOCK_BACKEND", None) or DEFAULT_CONFIG
    if isinstance(value, str):
        value = parse_url(value)
    if not isinstance(value, dict):
        raise InvalidLockBackend(f"LOCK_BACKEND must be a dict or a URL string, not {type(value).__name__}")
    unknown = set(value) - _ALLOWED_KEYS
    if unknown:
        raise InvalidLockBackend(
            f"LOCK_BACKEND has unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_ALLOWED_KEYS))}"
        )
    if "BACKEND" not in value:
        raise InvalidLockBackend("LOCK_BACKEND has no 'BACKEND' (a dotted path to a backend class)")
    options = value.get("OPTIONS", {})
    if not isinstance(options, dict):
        raise InvalidLockBackend(f"LOCK_BACKEND['OPTIONS'] must be a dict, not {type(options).__name__}")
    return {
        "BACKEND": value["BACKEND"],
        "OPTIONS": dict(options),
        "TTL": validate_ttl(value.get("TTL", DEFAULT_TTL), "LOCK_BACKEND['TTL']"),
        "DEADLOCK_TIMEOUT": validate_deadlock_timeout(value.get("DEADLOCK_TIMEOUT", DEFAULT_DEADLOCK_TIMEOUT)),
        "CLOCK_SKEW_MARGIN": validate_clock_skew_margin(value.get("CLOCK_SKEW_MARGIN")),
        "LOCK_DELAY": validate_lock_delay(value.get("LOCK_DELAY", 0.0)),
        **{key: validate_cap(value.get(key, getattr(Limits, field)), key) for key, field in Limits.SETTINGS.items()},
    }


def validate_cap(value: Any, key: str) -> int:
    """Return ``value`` if it is a positive int (a cap of :class:`~django_esdlock.limits.Limits`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidLockBackend(f"LOCK_BACKEND[{key!r}] must be a positive int, not {value!r}")
    return value


def validate_deadlock_timeout(value: Any) -> float | None:
    """Return ``value`` as seconds, or None (never look for deadlocks)."""
    if value is None:
        return None
    return validate_ttl(value, "LOCK_BACKEND['DEADLOCK_TIMEOUT']")


def validate_clock_skew_margin(value: Any) -> float | None:
    """Return ``value`` as seconds (0 or more), or None: the store's own default (its class's ``clock_skew_margin``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidLockBackend(f"LOCK_BACKEND['CLOCK_SKEW_MARGIN'] must be 0 or more seconds, not {value!r}")
    return float(value)


def validate_lock_delay(value: Any) -> float:
    """Return ``value`` as seconds (0 or more): how long a node stays refused after its holder's lease ran out."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidLockBackend(f"LOCK_BACKEND['LOCK_DELAY'] must be 0 or more seconds, not {value!r}")
    return float(value)


def load_backend(value: Any = None):
    """Build the backend a setting value names: ``import_string`` then ``cls(**OPTIONS)``."""
    from .backends.base import BaseLockBackend

    config = backend_config(value)
    try:
        cls = import_string(config["BACKEND"])
    except ImportError as e:
        raise InvalidLockBackend(f"Could not import lock backend {config['BACKEND']!r}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, BaseLockBackend)):
        raise InvalidLockBackend(f"{config['BACKEND']!r} is not a subclass of BaseLockBackend")
    backend = cls(ttl=config["TTL"], **config["OPTIONS"])
    backend.deadlock_timeout = config["DEADLOCK_TIMEOUT"]
    if config["CLOCK_SKEW_MARGIN"] is not None:
        backend.clock_skew_margin = config["CLOCK_SKEW_MARGIN"]
    backend.lock_delay = config["LOCK_DELAY"]
    backend.limits = Limits(**{field: config[key] for key, field in Limits.SETTINGS.items()})
    return backend


_backend = None
_backend_lock = ForkSafeLock()


def get_backend():
    """Return the process-wide backend of ``settings.LOCK_BACKEND``, built on first use."""
    global _backend
    if _backend is None:
        with _backend_lock:
            if _backend is None:
                _backend = load_backend()
    return _backend


def reset_backend() -> None:
    """Forget the cached backend (closing it), so the next use reads the settings again."""
    global _backend
    with _backend_lock:
        backend, _backend = _backend, None
    if backend is not None:
        backend.close()


@receiver(setting_changed)
def _reset_on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "LOCK_BACKEND":
        reset_backend()
