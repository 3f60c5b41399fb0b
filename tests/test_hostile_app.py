"""The live dashboard facing a hostile network: a callback posted values of the wrong type or
size, a request body Dash cannot parse, a visitor without the password, and `--host` on an
interface other machines reach. Each is answered without a traceback; the app is driven by
Flask's test client (no server, no browser)."""

from __future__ import annotations

import base64
import logging

import pytest
from typer.testing import CliRunner

from tests.analysis_support import write_store

pytest.importorskip("dash")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return write_store(tmp_path_factory.mktemp("app") / "s.duckdb")


@pytest.fixture(scope="module")
def app(store):
    from archsearch_dashboards.app import create_app

    return create_app(store)


def redraw_body(app, values: list) -> dict:
    """The body Dash's page posts to redraw: the callback's outputs and its inputs set to ``values``."""
    client = app.server.test_client()
    (callback,) = client.get("/_dash-dependencies").get_json()
    outputs = [dict(zip(("id", "property"), o.split("."))) for o in callback["output"].strip(".").split("...")]
    inputs = [dict(id=i["id"], property=i["property"], value=v) for i, v in zip(callback["inputs"], values)]
    return {"output": callback["output"], "outputs": outputs, "inputs": inputs, "changedPropIds": ["study.value"],
            "state": []}


# tick, study, families, axis, values, trial
BAD_INPUTS = {
    "study-object": ([0, {"$gt": ""}, None, None, None, None], "'study'"),
    "study-list": ([0, ["scaling"], None, None, None, None], "'study'"),
    "study-huge": ([0, "s" * 100_000, None, None, None, None], "'study'"),
    "families-text": ([0, None, "transformer", None, None, None], "'family'"),
    "families-objects": ([0, None, [{"x": 1}], None, None, None], "'family'"),
    "families-numbers": ([0, None, [1, 2], None, None, None], "'family'"),
    "families-million": ([0, None, ["transformer"] * 1_000_000, None, None, None], "'family'"),
    "axis-number": ([0, None, None, 7, None, None], "'axis'"),
    "values-nested": ([0, None, None, "taper", [["uniform"]], None], "'axis value'"),
    "trial-list": ([0, None, None, None, None, ["t0"]], "'trial'"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_a_callback_input_of_the_wrong_type_is_answered_not_a_500(case, app, caplog):
    values, name = BAD_INPUTS[case]
    with caplog.at_level(logging.ERROR):
        response = app.server.test_client().post("/_dash-update-component", json=redraw_body(app, values))
    assert response.status_code == 200, response.data[:300]
    summary = response.get_json()["response"]["summary"]["children"]
    assert summary.startswith("ignored a request whose") and name in summary
    assert list(response.get_json()["response"]) == ["summary"]  # the figures stay as they are
    assert "Traceback" not in caplog.text


def test_good_inputs_still_redraw(app):
    response = app.server.test_client().post("/_dash-update-component",
                                             json=redraw_body(app, [0, "scaling", ["mamba"], None, None, None]))
    assert response.status_code == 200
    assert response.get_json()["response"]["summary"]["children"].startswith("7 of 14 completed trials shown")


@pytest.mark.parametrize("body", [{}, [1, 2], {"output": "summary.children"}, "text"], ids=["empty", "list",
                                                                                          "no-inputs", "text"])
def test_a_request_dash_cannot_parse_is_400_in_one_log_line(body, app, caplog):
    with caplog.at_level(logging.WARNING):
        response = app.server.test_client().post("/_dash-update-component", json=body)
    assert response.status_code == 400
    assert "Traceback" not in caplog.text and "bad request" in caplog.text


def test_a_password_is_asked_of_every_route(store, app):
    from archsearch_dashboards.app import create_app, require_password

    body = redraw_body(app, [0] + [None] * 5)
    app = create_app(store)
    require_password(app, "s3cret")
    client = app.server.test_client()

    def basic(user: str, password: str) -> dict:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

    for route in ("/", "/_dash-layout", "/_dash-dependencies"):
        assert client.get(route).status_code == 401
        assert client.get(route, headers=basic("me", "wrong")).status_code == 401
        assert client.get(route, headers=basic("anyone", "s3cret")).status_code == 200
    assert client.post("/_dash-update-component", json=body).status_code == 401
    assert client.post("/_dash-update-component", json=body, headers=basic("me", "s3cret")).status_code == 200


@pytest.mark.parametrize("host, warned", [("0.0.0.0", True), ("::", True), ("192.168.1.10", True),
                                          ("myhost.example", True), ("127.0.0.1", False), ("localhost", False),
                                          ("::1", False), ("127.0.0.2", False)])
@pytest.mark.parametrize("password", [None, "s3cret"])
def test_serving_beyond_loopback_warns_unless_a_password_is_asked(host, warned, password, store, monkeypatch):
    import archsearch_dashboards.app as dashboard_app

    from archsearch.cli import app

    served = {}
    monkeypatch.setattr(dashboard_app, "serve", lambda store, **kwargs: served.update(kwargs))
    monkeypatch.delenv("ARCHSEARCH_DASHBOARD_PASSWORD", raising=False)
    args = ["dashboard", "--store", str(store), "--host", host] + (["--password", password] if password else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert served == dict(host=host, port=8050, password=password)
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert bool(warning) == (warned and not password), result.stderr
    if warning:
        assert "no password" in warning[0] and "ARCHSEARCH_DASHBOARD_PASSWORD" in warning[0]
    if warned and password:
        assert "unencrypted" in result.stderr


def test_the_password_can_come_from_the_environment(store, monkeypatch):
    import archsearch_dashboards.app as dashboard_app

    from archsearch.cli import app

    served = {}
    monkeypatch.setattr(dashboard_app, "serve", lambda store, **kwargs: served.update(kwargs))
    monkeypatch.setenv("ARCHSEARCH_DASHBOARD_PASSWORD", "from-env")
    result = CliRunner().invoke(app, ["dashboard", "--store", str(store), "--host", "0.0.0.0"])
    assert result.exit_code == 0 and served["password"] == "from-env"
    assert "warning" not in result.stderr
