"""The Elasticsearch lock backend: its settings, declarations and constructor, composed from the package's parts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from django.core.exceptions import ImproperlyConfigured

from ...exceptions import InvalidLockBackend
from ...forks import ForkSafeLock
from ...redaction import add_secrets
from ..base import BaseLockBackend, StoreFeatures
from .clocks import NodeClocks
from .grants import DEFAULT_PIPELINE, GrantPipeline
from .index import IndexSetup
from .maintenance import Maintenance
from .options import (
    DEFAULT_REPLICAS,
    NESTED_OBJECTS_LIMIT,
    URL_SCHEMES,
    WRITE_TIMEOUT_CAP,
    check_durability,
    check_index_names,
    check_positive,
    checked_pipeline,
    checked_token_floor,
    configured_secrets,
    flag,
    host_endpoints,
    host_label,
    hosts_through,
    index_of_namespace,
    lock_index_names,
    plain_http_credentials,
    url_options,
)
from .protocol import Protocol
from .transport import CLIENT_OPTIONS, Transport


class ElasticsearchLockBackend(
    IndexSetup, Maintenance, GrantPipeline, NodeClocks, Protocol, Transport, BaseLockBackend
):
    """Locks as documents of Elasticsearch lock indices (one by default), as the chapter builds them.

    OPTIONS: ``hosts`` (default ``["http://127.0.0.1:9200"]``), ``index``
    (default ``"locks"``), ``number_of_replicas`` (an int, or an
    ``auto_expand_replicas`` range; default ``"0-2"``),
    ``wait_for_active_shards`` (an int, ``"all"``, or ``"auto"``: a majority
    of the copies the lock index has on the cluster; the default),
    ``index_count`` (hash namespaces into that many lock indices; default 1),
    ``namespace_indices`` (namespace -> lock index, ahead of the hash),
    ``max_holders_per_node`` (the most holders one lock node keeps; a node
    that keeps that many refuses newcomers as a conflict would, until holders
    leave; default 10,000, Elasticsearch's ``index.mapping.nested_objects.limit``),
    ``token_floor`` (every fencing token exceeds it: see "Restoring a lock
    store" in docs/howto/operating.md; default 0), ``grant_pipeline`` (the ingest pipeline
    that stamps the lease of a node taken with a plain ``create``, installed
    at setup; None: take fresh nodes with a scripted upsert; default
    ``"esdlock-grant-v1"``, see :mod:`.grants`) and any keyword of
    ``elasticsearch.Elasticsearch`` (``basic_auth``, ``api_key``,
    ``ca_certs``, ``verify_certs``, ``request_timeout``, ...), passed through
    to the client.

    Each lock index is an alias of one concrete index,
    ``<index>.floor-<floor>``, whose tokens all exceed its floor; a lost one
    is recreated above every token this process saw (see
    :meth:`~.index.IndexSetup._lock_index_steps`).

    Credentials (user info in a host, ``basic_auth``, ``api_key``,
    ``bearer_auth``, an Authorization header) go only to https hosts:
    over plain http they are refused unless ``allow_plain_http_credentials``
    is True (a network you trust). They never appear in ``describe()``, a
    message or a log (see :mod:`django_esdlock.redaction`).
    """

    url_schemes: ClassVar[frozenset[str]] = frozenset(URL_SCHEMES)

    features = StoreFeatures(can_list_waiting=True, can_take_over=True, async_native=True, fails_over=True)

    lease_margin: float = 0.5
    """A lease is stamped with ``ctx._now``, a clock each node caches and advances every
    ``thread_pool.estimated_time_interval`` (200 ms by default): measured on 7.0, ``ctx._now`` was up to
    196 ms older than the moment the request was sent. 0.5 s covers that interval, the delays of the
    node's timer thread and the holder's own. Raise it with the interval."""

    clock_skew_margin: float = 0.5
    """Seconds the nodes' clocks may differ by (see the base class): a fresh lease is stamped by the ingest node's
    clock, renewals and every expiry by the primary's, and a failover moves the primary. 0.5 s is well above what
    NTP keeps nodes within; ``check --deploy`` measures the cluster's (``django_esdlock.W011``)."""

    busy_retry: float = 10.0
    """Seconds a release, a listing or maintenance keeps retrying a busy store, with backoff, before LockStoreBusy.

    Acquire and renew do not retry inside: their callers (the waiting loop, the
    renewer) retry them within the lock's own deadline or lease.
    """

    page_size = 5000
    """Nodes per search page (the base's is 500): a search costs a scan of the lock index on noida-db, the
    zero-setup store, whatever its size, so few large pages read faster there; a real cluster is as quick
    either way, and a page of nodes is what maintenance keeps in memory."""

    @classmethod
    def options_from_url(cls, url: str) -> dict[str, Any]:
        return url_options(url)

    def __init__(
        self,
        *,
        ttl: float = 30.0,
        hosts: Sequence[str] | str = ("http://127.0.0.1:9200",),
        index: str = "locks",
        number_of_replicas: int | str = DEFAULT_REPLICAS,
        wait_for_active_shards: int | str = "auto",
        index_count: int = 1,
        max_holders_per_node: int = NESTED_OBJECTS_LIMIT,
        namespace_indices: Mapping[str, str] | None = None,
        allow_plain_http_credentials: bool | str = False,
        token_floor: int | str = 0,
        grant_pipeline: str | None = DEFAULT_PIPELINE,
        **client_options: Any,
    ) -> None:
        super().__init__(ttl=ttl)
        unknown = set(client_options) - CLIENT_OPTIONS
        if unknown:
            raise ImproperlyConfigured(
                f"ElasticsearchLockBackend got unknown OPTIONS {', '.join(sorted(unknown))}; "
                "use 'hosts', 'index' or a keyword of elasticsearch.Elasticsearch"
            )
        host_list = [hosts] if isinstance(hosts, str) else list(hosts)
        add_secrets(*configured_secrets(host_list, client_options))
        trusted = flag("allow_plain_http_credentials", allow_plain_http_credentials)
        plain = plain_http_credentials(host_list, client_options)
        if plain and not trusted:
            raise InvalidLockBackend(
                f"ElasticsearchLockBackend would send credentials over plain http to {', '.join(plain)}: "
                "anyone on the network could read them. Use https: an https:// host in OPTIONS['hosts'], "
                "or elasticsearch+https:// in a LOCK_BACKEND URL. On a network you trust, say so: "
                "OPTIONS['allow_plain_http_credentials'] = True (URL: ?allow_plain_http_credentials=true)."
            )
        namespace_indices = dict(namespace_indices or {})
        check_index_names(index, namespace_indices)
        check_durability(number_of_replicas, wait_for_active_shards)
        check_positive("index_count", index_count)
        self.token_floor = checked_token_floor(token_floor)
        check_positive("max_holders_per_node", max_holders_per_node)
        self.hosts = host_list
        self.index = index
        self.number_of_replicas = number_of_replicas
        self.wait_for_active_shards = wait_for_active_shards
        self.index_count = index_count
        self.namespace_indices = namespace_indices
        self.max_holders_per_node = max_holders_per_node
        self.write_timeout = min(WRITE_TIMEOUT_CAP, ttl / 3)
        self.client_options = client_options
        self._sole_lock = ForkSafeLock()
        """Guards what this process learnt of the store (incarnations, nodes it alone holds, queue places)."""
        self._init_transport()
        self._init_index()
        self._init_protocol()
        self._init_grants(checked_pipeline(grant_pipeline, DEFAULT_PIPELINE))

    def describe(self) -> str:
        indices = self.lock_indices
        named = f"index {indices[0]!r}" if len(indices) == 1 else f"indices {', '.join(indices)}"
        return f"Elasticsearch {', '.join(host_label(h) for h in self.hosts)} {named}"

    def endpoints(self) -> tuple[list[tuple[str, int]], str]:
        return host_endpoints(self.hosts)

    def options_through(self, options: dict[str, Any], ports: Sequence[int]) -> dict[str, Any]:
        return {**options, "hosts": hosts_through(self.hosts, ports)}

    @property
    def lock_indices(self) -> tuple[str, ...]:
        """Every lock index of this backend: the hashed ones, then those ``namespace_indices`` names."""
        return lock_index_names(self.index, self.index_count, self.namespace_indices)

    def index_of(self, namespace: str) -> str:
        """Return the lock index that holds the nodes of ``namespace``."""
        return index_of_namespace(namespace, self.index, self.index_count, self.namespace_indices)

    def _indices_of(self, namespace: str | None) -> str:
        """Return the ``index`` argument of a search: ``namespace``'s lock index, or all of them."""
        return ",".join(self.lock_indices) if namespace is None else self.index_of(namespace)
