"""What the Elasticsearch backend declares of itself: its URL schemes and their OPTIONS, its TCP endpoints.

Each is held against what ``conf.parse_url`` and ``lock_check``'s proxy gave
before the declarations took them over; no store needed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from django_esdlock import InvalidLockBackend
from django_esdlock.backends.elasticsearch import ElasticsearchLockBackend
from django_esdlock.conf import ELASTICSEARCH_BACKEND, parse_url

URL_OPTIONS = [
    ("elasticsearch://es.example:9201/my-locks", {"hosts": ["http://es.example:9201"], "index": "my-locks"}),
    ("es://localhost", {"hosts": ["http://localhost"]}),
    ("elasticsearch+http://127.0.0.1:9200/", {"hosts": ["http://127.0.0.1:9200"]}),
    (
        "elasticsearch+https://user:p%40ss@es.example/locks?verify_certs=false&request_timeout=3",
        {
            "hosts": ["https://es.example"],
            "index": "locks",
            "basic_auth": ("user", "p@ss"),
            "verify_certs": "false",
            "request_timeout": "3",
        },
    ),
    (
        "elasticsearch://[::1]:9200/locks?index_count=4",
        {"hosts": ["http://[::1]:9200"], "index": "locks", "index_count": "4"},
    ),
    ("elasticsearch://[fe80::1]/locks", {"hosts": ["http://[fe80::1]"], "index": "locks"}),
    (
        "elasticsearch://user@es.example/locks?allow_plain_http_credentials=true&token_floor=1000",
        {
            "hosts": ["http://es.example"],
            "index": "locks",
            "basic_auth": ("user", ""),
            "allow_plain_http_credentials": "true",
            "token_floor": "1000",
        },
    ),
    (
        "es://es.example/a/b?number_of_replicas=0-all&wait_for_active_shards=all",
        {
            "hosts": ["http://es.example"],
            "index": "a/b",
            "number_of_replicas": "0-all",
            "wait_for_active_shards": "all",
        },
    ),
]
PROXIED = [
    (
        {"hosts": ["http://es.example:9201"], "index": "locks"},
        ([("es.example", 9201)], ""),
        {"hosts": ["http://127.0.0.1:4000"], "index": "locks"},
    ),
    ({"hosts": "http://es.example:9201"}, ([("es.example", 9201)], ""), {"hosts": ["http://127.0.0.1:4000"]}),
    (
        {"hosts": ["http://es1:9200", "http://es2"]},
        ([("es1", 9200), ("es2", 9200)], ""),
        {"hosts": ["http://127.0.0.1:4000", "http://127.0.0.1:4001"]},
    ),
    ({"hosts": ["es.example:9300"]}, ([("es.example", 9300)], ""), {"hosts": ["http://127.0.0.1:4000"]}),
    (
        {"hosts": ["https://es.example"]},
        ([], "the Elasticsearch URL is https (a proxy on 127.0.0.1 would fail certificate checks)"),
        None,
    ),
    (
        {"hosts": [{"scheme": "http", "host": "es.example", "port": 9200}]},
        ([], "the Elasticsearch hosts are not given as URLs"),
        None,
    ),
    (
        {"hosts": ["http://user:s3cret-pass@es.example:9201"], "allow_plain_http_credentials": True},
        ([("es.example", 9201)], ""),
        {"hosts": ["http://user:s3cret-pass@127.0.0.1:4000"], "allow_plain_http_credentials": True},
    ),
]
"""What the releases before the declarations gave (``conf.parse_url``, ``lock_check``'s proxy), kept as they were."""


@pytest.mark.parametrize(("url", "options"), URL_OPTIONS)
def test_options_from_url_are_those_the_setting_always_gave(url, options):
    assert ElasticsearchLockBackend.options_from_url(url) == options
    config = parse_url(url)
    assert (config["BACKEND"], config["OPTIONS"]) == (ELASTICSEARCH_BACKEND, options)


def test_the_lock_settings_are_read_by_conf_and_the_rest_of_the_url_by_the_store():
    url = "elasticsearch://es.example/locks?ttl=5&deadlock_timeout=off&max_ids_per_request=10&request_timeout=3"
    config = parse_url(url)
    assert config["OPTIONS"] == {"hosts": ["http://es.example"], "index": "locks", "request_timeout": "3"}
    assert (config["TTL"], config["DEADLOCK_TIMEOUT"], config["MAX_IDS_PER_REQUEST"]) == (5.0, None, 10)


def test_a_url_without_a_host_is_refused():
    url = "elasticsearch:///locks"
    with pytest.raises(InvalidLockBackend, match="LOCK_BACKEND URL names no host"):
        parse_url(url)
    with pytest.raises(InvalidLockBackend, match="LOCK_BACKEND URL names no host"):
        ElasticsearchLockBackend.options_from_url(url)


def test_every_declared_scheme_names_the_elasticsearch_backend():
    assert ElasticsearchLockBackend.url_schemes == {"elasticsearch", "es", "elasticsearch+http", "elasticsearch+https"}
    for scheme in ElasticsearchLockBackend.url_schemes:
        assert parse_url(f"{scheme}://es.example")["BACKEND"] == ELASTICSEARCH_BACKEND


@pytest.mark.parametrize(("options", "endpoints", "through"), PROXIED)
def test_endpoints_and_options_through_are_those_lock_check_always_used(options, endpoints, through):
    backend = ElasticsearchLockBackend(**options)
    assert backend.endpoints() == endpoints
    if through is not None:
        assert backend.options_through(options, list(range(4000, 4000 + len(endpoints[0])))) == through


def test_the_endpoints_say_why_there_is_none_to_cut():
    assert ElasticsearchLockBackend(hosts=["https://es.example"]).endpoints() == (
        [],
        "the Elasticsearch URL is https (a proxy on 127.0.0.1 would fail certificate checks)",
    )
    through = ElasticsearchLockBackend(hosts=["http://es1:9200", "http://es2:9200"]).options_through(
        {"hosts": ["http://es1:9200", "http://es2:9200"], "index": "locks"}, [4000, 4001]
    )
    assert through == {"hosts": ["http://127.0.0.1:4000", "http://127.0.0.1:4001"], "index": "locks"}


def test_urls_are_read_without_the_elasticsearch_client():
    """The URL code (options.py) imports where the client is not installed; the class then says what to install."""
    script = (
        "import sys; sys.modules['elasticsearch'] = None\n"
        "from django_esdlock.backends.elasticsearch import options\n"
        "print(options.url_options('es://es.example:9201/locks'))\n"
        "from django_esdlock.backends.elasticsearch import ElasticsearchLockBackend\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout == "{'hosts': ['http://es.example:9201'], 'index': 'locks'}\n"
    assert "ImproperlyConfigured" in done.stderr and "pip install 'django-esdlock[elasticsearch]'" in done.stderr
