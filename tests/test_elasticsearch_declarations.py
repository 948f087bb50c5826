"""What the Elasticsearch backend declares of itself: its URL schemes and their OPTIONS, its TCP endpoints.

Each is held against what ``conf.parse_url`` and ``lock_check``'s proxy give
today, which the declarations take over; no store needed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from django_esdlock import InvalidLockBackend
from django_esdlock.backends.elasticsearch import ElasticsearchLockBackend
from django_esdlock.checker.run import _proxy_targets, _through_proxy
from django_esdlock.conf import ELASTICSEARCH_BACKEND, parse_url


@pytest.mark.parametrize(
    "url",
    [
        "elasticsearch://es.example:9201/my-locks",
        "es://localhost",
        "elasticsearch+http://127.0.0.1:9200/",
        "elasticsearch+https://user:p%40ss@es.example/locks?verify_certs=false&request_timeout=3",
        "elasticsearch://[::1]:9200/locks?index_count=4",
        "elasticsearch://[fe80::1]/locks",
        "elasticsearch://user@es.example/locks?allow_plain_http_credentials=true&token_floor=1000",
        "es://es.example/a/b?number_of_replicas=0-all&wait_for_active_shards=all",
    ],
)
def test_options_from_url_are_those_parse_url_gives(url):
    assert ElasticsearchLockBackend.options_from_url(url) == parse_url(url)["OPTIONS"]


def test_options_from_url_leave_the_lock_settings_to_the_caller():
    options = ElasticsearchLockBackend.options_from_url("elasticsearch://es.example/locks?request_timeout=3")
    url = "elasticsearch://es.example/locks?ttl=5&deadlock_timeout=off&max_ids_per_request=10&request_timeout=3"
    assert options == parse_url(url)["OPTIONS"]


def test_a_url_without_a_host_is_refused_as_parse_url_refuses_it():
    url = "elasticsearch:///locks"
    with pytest.raises(InvalidLockBackend) as by_conf:
        parse_url(url)
    with pytest.raises(InvalidLockBackend) as by_backend:
        ElasticsearchLockBackend.options_from_url(url)
    assert str(by_backend.value) == str(by_conf.value)


def test_every_declared_scheme_names_the_elasticsearch_backend():
    assert ElasticsearchLockBackend.url_schemes == {"elasticsearch", "es", "elasticsearch+http", "elasticsearch+https"}
    for scheme in ElasticsearchLockBackend.url_schemes:
        assert parse_url(f"{scheme}://es.example")["BACKEND"] == ELASTICSEARCH_BACKEND


@pytest.mark.parametrize(
    "options",
    [
        {"hosts": ["http://es.example:9201"], "index": "locks"},
        {"hosts": "http://es.example:9201"},
        {"hosts": ["http://es1:9200", "http://es2"]},
        {"hosts": ["es.example:9300"]},
        {"hosts": ["https://es.example"]},
        {"hosts": [{"scheme": "http", "host": "es.example", "port": 9200}]},
        {"hosts": ["http://user:s3cret-pass@es.example:9201"], "allow_plain_http_credentials": True},
    ],
)
def test_endpoints_and_options_through_are_those_of_lock_checks_proxy(options):
    backend = ElasticsearchLockBackend(**options)
    config = {"BACKEND": ELASTICSEARCH_BACKEND, "OPTIONS": options, "TTL": 30}
    targets, why = backend.endpoints()
    assert (targets, why) == _proxy_targets(config)
    if targets:
        ports = list(range(4000, 4000 + len(targets)))
        assert backend.options_through(options, ports) == _through_proxy(config, ports)["OPTIONS"]


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
