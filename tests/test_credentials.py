"""Credentials: never in any output (describe, errors, check, admin, lock_check, lock_bench, logs); only over TLS."""

from __future__ import annotations

import io
import json
import logging
import traceback
import urllib.parse
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_esdlock import InvalidLockBackend, LockError, lock_tree
from django_esdlock.conf import get_backend, load_backend

from .dbstores import database_url
from .stores import ES_BACKEND, free_port

DB_BACKEND = "django_esdlock.backends.database.DatabaseLockBackend"
ADMIN_PAGES = ["/admin/django_esdlock/heldlock/", "/admin/django_esdlock/heldlock/tree/?path=/a"]
ADMIN_PAGES.append("/admin/django_esdlock/heldlock/waiting/")


def _es(*hosts, **options):
    return {"BACKEND": ES_BACKEND, "OPTIONS": {"hosts": list(hosts), "index": "locks", **options}, "TTL": 30}


# Every form a secret can take in LOCK_BACKEND: name -> config of a store at 127.0.0.1:port with that secret.
FORMS = {
    "es_url_user_info": lambda port, s: f"elasticsearch+https://elastic:{s}@127.0.0.1:{port}/locks",
    "es_url_trusted_http": lambda port, s: (
        f"elasticsearch://elastic:{s}@127.0.0.1:{port}/locks?allow_plain_http_credentials=true"
    ),
    "es_hosts_user_info": lambda port, s: _es(f"https://elastic:{s}@127.0.0.1:{port}"),
    "es_basic_auth": lambda port, s: _es(f"https://127.0.0.1:{port}", basic_auth=("elastic", s)),
    "es_api_key": lambda port, s: _es(f"https://127.0.0.1:{port}", api_key=s),
    "es_api_key_tuple": lambda port, s: _es(f"https://127.0.0.1:{port}", api_key=("key-id", s)),
    "es_bearer_auth": lambda port, s: _es(f"https://127.0.0.1:{port}", bearer_auth=s),
    "es_authorization_header": lambda port, s: _es(
        f"https://127.0.0.1:{port}", headers={"Authorization": f"ApiKey {s}"}
    ),
    "postgres_url_password": lambda port, s: f"postgres://postgres:{s}@127.0.0.1:{port}/locks",
    "postgres_password_query": lambda port, s: f"postgres://postgres@127.0.0.1:{port}/locks?password={s}",
    "postgres_dict_url": lambda port, s: {
        "BACKEND": DB_BACKEND,
        "OPTIONS": {"url": f"postgresql://app:{s}@127.0.0.1:{port}/app"},
    },
}


def _secret() -> str:
    return f"Zq{uuid.uuid4().hex[:14]}"


def _outputs(command, *args, **options) -> tuple[str, str]:
    """Run a management command; return its stdout, and all it said (stdout, stderr, error), whatever happened."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(command, *args, stdout=out, stderr=err, **options)
    except (CommandError, SystemCheckError) as e:
        return out.getvalue(), f"{out.getvalue()}\n{err.getvalue()}\nERROR {e}"
    return out.getvalue(), f"{out.getvalue()}\n{err.getvalue()}"


def _run(command, *args, **options) -> str:
    return _outputs(command, *args, **options)[1]


@pytest.mark.django_db
@pytest.mark.parametrize("form", FORMS)
def test_no_secret_in_any_output_of_an_unreachable_store(form, admin_client, caplog, django_db_blocker):
    secret, port = _secret(), free_port()  # nothing listens there
    config = FORMS[form](port, secret)
    shown: dict[str, str] = {}
    with caplog.at_level(logging.DEBUG), override_settings(LOCK_BACKEND=config), django_db_blocker.unblock():
        backend = get_backend()
        shown["describe"] = backend.describe()
        with pytest.raises(LockError) as failed:
            with lock_tree("/a", timeout=0):
                pass
        shown["error"] = "".join(traceback.format_exception(failed.value))  # with the driver's error it came from
        with pytest.raises(LockError) as failed:
            backend.holders()
        shown["listing"] = "".join(traceback.format_exception(failed.value))
        shown["check"] = _run("check", tags=["django_esdlock"])
        shown["check --deploy"] = _run("check", deploy=True, tags=["django_esdlock"])
        for page in ADMIN_PAGES:
            shown[page] = admin_client.get(page).content.decode()
        shown["lock_check"] = _run("lock_check", "--seconds=1", "--processes=1", "--faults=none")
        shown["lock_check --json"] = _run("lock_check", "--seconds=1", "--processes=1", "--faults=none", "--json")
        if isinstance(config, str):
            shown["lock_check --backend-url"] = _run("lock_check", f"--backend-url={config}", "--json", "--seconds=1")
    shown["logs"] = caplog.text + "\n".join(r.getMessage() for r in caplog.records)

    leaks = [where for where, text in shown.items() if secret in text]
    assert leaks == [], f"the secret of {form} is shown by {leaks}: {shown[leaks[0]]}"
    # ... and the outputs still say what is wrong, and where.
    assert f"127.0.0.1:{port}" in shown["describe"]
    assert f"127.0.0.1:{port}" in shown["error"] and "E002" in shown["check --deploy"]
    assert "no issues" in shown["check"]
    assert "cannot be read" in shown[ADMIN_PAGES[0]] and f"127.0.0.1:{port}" in shown[ADMIN_PAGES[0]]
    assert "lock_check could not run" in shown["lock_check --json"]


@pytest.mark.django_db
def test_no_secret_in_the_outputs_of_a_lock_check_that_ran(es_url, tmp_path, django_db_blocker):
    """A run on live stores whose URLs carry passwords (the test servers ignore them): its JSON, text, history."""
    es, pg = urllib.parse.urlsplit(es_url), urllib.parse.urlsplit(database_url())
    secrets = {"es": _secret(), "pg": _secret()}
    es_with = f"elasticsearch://elastic:{secrets['es']}@{es.netloc}/lock-check-{uuid.uuid4().hex[:8]}"
    urls = [
        f"{es_with}?allow_plain_http_credentials=true",
        f"postgres://{pg.username or 'postgres'}:{secrets['pg']}@{pg.hostname}:{pg.port or 5432}{pg.path}",
    ]
    history = tmp_path / "history.jsonl"
    args = ["--seconds=1.5", "--processes=2", "--faults=store", f"--history={history}"]  # store: through proxies
    with django_db_blocker.unblock():
        output, everything = _outputs("lock_check", f"--backend-url={urls[0]}", "--json", *args)
        es_history = history.read_text()
        text = _run("lock_check", f"--backend-url={urls[1]}", *args)
    result = json.loads(output)
    assert result["ok"] and result["summary"]["grants"] > 0 and result["summary"]["faults"]["store"] > 0, everything
    assert "0 violations" in text and "PostgreSQL" in text, text
    for shown in (everything, es_history, text, history.read_text()):
        assert secrets["es"] not in shown and secrets["pg"] not in shown


@pytest.mark.django_db
def test_no_secret_in_lock_bench_output(es_url, django_db_blocker):
    """lock_bench --es-url / --database-url with credentials: refused or unreachable, said without them."""
    secret, es = _secret(), urllib.parse.urlsplit(es_url)
    plain = f"http://elastic:{secret}@{es.netloc}"  # the live node: lock_bench starts, the backend refuses http
    dead = f"postgres://postgres:{secret}@127.0.0.1:{free_port()}/postgres"
    quick = ["--quick", "--workers=1", "--depth=1", "--only=pairs"]  # pairs: a store stage, and no graph to compute
    with django_db_blocker.unblock():
        es_text = _run("lock_bench", "--backend=elasticsearch", f"--es-url={plain}", *quick)
        es_json, es_all = _outputs("lock_bench", "--backend=elasticsearch", f"--es-url={plain}", "--json", *quick)
        pg_json, pg_all = _outputs("lock_bench", "--backend=postgres", f"--database-url={dead}", "--json", *quick)
    for shown in (es_text, es_all, pg_all):
        assert secret not in shown
    es_report, pg_report = json.loads(es_json), json.loads(pg_json)
    assert es_report["options"]["es_url"].startswith("http://***@") and "***@" in pg_report["options"]["database_url"]
    assert [e["stage"] for e in es_report["errors"]] == ["setup"] and "plain http" in es_report["errors"][0]["error"]
    assert [e["stage"] for e in pg_report["errors"]] == ["setup"]
    assert "elasticsearch setup failed" in es_text and "allow_plain_http_credentials" in es_text


# --- credentials only over TLS ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        "elasticsearch://elastic:Zqsecret@es.example/locks",
        "es://elastic:Zqsecret@es.example:9200/locks",
        _es("http://elastic:Zqsecret@es.example:9200"),
        _es("http://es.example:9200", basic_auth=("elastic", "Zqsecret")),
        _es("http://es.example:9200", api_key="Zqsecret"),
        _es("http://es.example:9200", api_key=("id", "Zqsecret")),
        _es("http://es.example:9200", bearer_auth="Zqsecret"),
        _es("http://es.example:9200", headers={"authorization": "Basic Zqsecret"}),
        _es({"scheme": "http", "host": "es.example", "port": 9200}, api_key="Zqsecret"),
        _es("https://es1.example:9200", "http://es.example:9200", basic_auth=("elastic", "Zqsecret")),
        _es("http://elastic:Zqsecret@es.example:9200", allow_plain_http_credentials=False),
        "elasticsearch://elastic:Zqsecret@es.example/locks?allow_plain_http_credentials=false",
    ],
)
def test_credentials_over_plain_http_are_refused_naming_the_fix(config):
    with pytest.raises(InvalidLockBackend) as refused:
        load_backend(config)
    message = str(refused.value)
    assert "plain http" in message and "es.example" in message and "es1.example" not in message
    assert "elasticsearch+https://" in message and "allow_plain_http_credentials" in message
    assert "Zqsecret" not in message


@pytest.mark.parametrize(
    "config",
    [
        "elasticsearch+https://elastic:Zqsecret@es.example/locks",
        "elasticsearch://es.example/locks",  # no credentials
        _es("https://elastic:Zqsecret@es.example:9200", "https://es2.example:9200"),
        _es("https://es.example:9200", basic_auth=("elastic", "Zqsecret"), api_key="x"),
        _es({"scheme": "https", "host": "es.example", "port": 9200}, bearer_auth="Zqsecret"),
        _es("http://es.example:9200", headers={"x-opaque-id": "not a credential"}),
        _es("http://elastic:Zqsecret@es.example:9200", allow_plain_http_credentials=True),
        "elasticsearch://elastic:Zqsecret@es.example/locks?allow_plain_http_credentials=true",
        "elasticsearch://elastic:Zqsecret@es.example/locks?allow_plain_http_credentials=1",
    ],
)
def test_credentials_over_https_or_on_a_trusted_network_are_accepted(config):
    backend = load_backend(config)
    assert "Zqsecret" not in backend.describe()
    backend.close()


def test_the_trusted_network_option_takes_a_boolean():
    with pytest.raises(InvalidLockBackend, match="allow_plain_http_credentials"):
        load_backend("elasticsearch://es.example/locks?allow_plain_http_credentials=maybe")


def test_check_reports_credentials_over_plain_http_without_contacting_the_store():
    port = free_port()
    with override_settings(LOCK_BACKEND=f"elasticsearch://elastic:Zqsecret@127.0.0.1:{port}/locks"):
        shown = _run("check", tags=["django_esdlock"])
    assert "django_esdlock.E001" in shown and "elasticsearch+https://" in shown and "Zqsecret" not in shown
