"""The live dashboard: a Dash app over a store that redraws as trials finish.

Every few seconds (``REFRESH_MS``) the page polls the store (each read opens
DuckDB briefly, so a running study keeps writing) and redraws the report's
views (``report.views``) for the chosen study, families and axis values.
The callbacks' work lives in plain functions (``load``, ``filter_rows``,
``refresh``) that tests call without a browser. Dash is imported only here.

A client can post anything to a callback: every input's type and size is
checked (``bad_input``) and a wrong one is answered in the summary line, the
figures left as they are; a request Dash itself cannot parse is answered
400 in one logged line. With a password (``serve``), every route asks for
it by HTTP Basic authentication (dash-auth).
"""

from __future__ import annotations

import heapq
import json
import hmac
import logging
from pathlib import Path

import plotly.graph_objects as go
from archsearch_dashboards.arms import axis_text, group_labels, varying_axes
from archsearch_dashboards.figures import TEMPLATE, plan_figure
from archsearch_dashboards.report import completed_rows, curve_points, curve_trials, search_figures, views
from archsearch_dashboards.training import training_figure

import archsearch as A
from archsearch.store import Store

REFRESH_MS = 5_000
MAX_TRIAL_OPTIONS = 1_000
# the longest text and the most values a filter takes from a client: far past any store's names
MAX_INPUT_CHARS = 1_000
MAX_INPUT_VALUES = 10_000
VIEWS = ("training", "scaling", "comparison", "pareto", "parallel", "curves", "plan", "history", "importance")
SEARCH_VIEWS = ("history", "importance")  # a sampled search's; a grid's study has neither


def load(db: Store, study: str | None) -> tuple[list[dict], list[str]]:
    """Completed trials of ``study`` (None: all), and every study's name."""
    return completed_rows(db, study), db.studies().column("name").to_pylist()


def load_curves(db: Store, rows: list[dict], running: list[dict] = ()) -> tuple[list[dict], list[dict]]:
    """Thinned evaluation and training-loss rows of the trials whose curves are drawn (see
    ``report.curve_trials``) and of the ``running`` ones."""
    return curve_points(db, curve_trials(rows) + [t["trial_id"] for t in running])


def load_running(db: Store, study: str | None) -> list[dict]:
    """The trials of ``study`` (None: all) that train now and have reported, each with its latest
    ``progress`` report and its ``family`` and ``axes`` (decoded)."""
    progress = db.progress(study)
    if not progress:
        return []
    rows = db.sql("SELECT trial_id, family, axes FROM trials WHERE trial_id IN (SELECT unnest(?::VARCHAR[])) "
                  "ORDER BY trial_id", [list(progress)]).to_pylist()
    return [dict(row, axes=json.loads(row["axes"]), progress=progress[row["trial_id"]]) for row in rows]


def load_search(db: Store, study: str | None, studies: list[str]) -> dict[str, go.Figure]:
    """The search views of ``study`` (the store's one study when None), each an empty figure
    that says why where there is nothing to draw."""
    name = study or (studies[0] if len(studies) == 1 else None)
    if name is None:
        return {view: empty_figure("choose a study to see its search") for view in SEARCH_VIEWS}
    found = search_figures(db, name)
    why = "no search history: this study did not sample (or too few proposals for importance)"
    return {view: found.get(view) or empty_figure(why) for view in SEARCH_VIEWS}


def axis_names(rows: list[dict]) -> list[str]:
    """The axes a filter can choose from: those that vary, else every axis."""
    return varying_axes(rows) or sorted({a for r in rows for a in r["axes"]})


def axis_values(rows: list[dict], axis: str | None) -> list[str]:
    """The values ``axis`` takes among ``rows``, as the views show them
    (``arms.axis_text``: an iso-param and an iso-FLOP baseline are two
    values of ``arm``); trials without it are left out."""
    if not axis:
        return []
    return sorted({axis_text(r, axis) for r in rows if r["axes"].get(axis) is not None})


def filter_rows(rows: list[dict], *, families: list[str] | None = None, axis: str | None = None,
                values: list[str] | None = None) -> list[dict]:
    """The rows of the chosen ``families`` (all when empty) whose ``axis`` is one of ``values`` (any when empty),
    a value as the views show it or as the study file wrote it (``baseline``: every protocol's baseline)."""
    if families:
        rows = [r for r in rows if r["family"] in families]
    if axis and values:
        rows = [r for r in rows if axis_text(r, axis) in values or str(r["axes"].get(axis)) in values]
    return rows


def bad_input(*, study=None, families=None, axis=None, values=None, trial=None) -> str | None:
    """What is wrong with the filters a client posted (None when nothing): each text a string
    (or nothing), each list a list of such strings, none past the size limits above."""
    def text(value) -> bool:
        return value is None or (isinstance(value, str) and len(value) <= MAX_INPUT_CHARS)

    for name, value in (("study", study), ("axis", axis), ("trial", trial)):
        if not text(value):
            return f"ignored a request whose '{name}' is not a name of at most {MAX_INPUT_CHARS:,} characters"
    for name, value in (("family", families), ("axis value", values)):
        if value is not None and not (isinstance(value, list) and len(value) <= MAX_INPUT_VALUES
                                      and all(isinstance(v, str) and text(v) for v in value)):
            return f"ignored a request whose '{name}' is not a list of at most {MAX_INPUT_VALUES:,} names"
    return None


def empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font=dict(size=16), xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_layout(template=TEMPLATE, xaxis_visible=False, yaxis_visible=False)
    return fig


def refresh(store: str | Path, *, study: str | None = None, families: list[str] | None = None,
            axis: str | None = None, values: list[str] | None = None, trial: str | None = None) -> dict:
    """Everything one redraw shows: the figures by view name, a summary line,
    and the options of each filter (families, axes, values, trials). Opens the store once."""
    with A.open_store(store, read_only=True) as db:
        return _refresh(db, study=study, families=families, axis=axis, values=values, trial=trial)


def _refresh(db: Store, *, study: str | None, families: list[str] | None, axis: str | None,
             values: list[str] | None, trial: str | None) -> dict:
    everything, studies = load(db, study)
    running = filter_rows(load_running(db, study), families=families, axis=axis, values=values)
    rows = filter_rows(everything, families=families, axis=axis, values=values)
    axes = varying_axes(rows)
    # the plan's dropdown offers the best trials only: a browser list of 100,000 would not open
    ranked = heapq.nsmallest(MAX_TRIAL_OPTIONS, rows, key=lambda r: r["val_loss"])
    out = {"studies": studies, "families": sorted({r["family"] for r in everything}),
           "axes": axis_names(everything), "values": axis_values(everything, axis),
           "trials": [{"label": f"{r['trial_id']} ({label})", "value": r["trial_id"]}
                      for r, label in zip(ranked, group_labels(ranked, axes))]}
    if not rows:
        what = "no completed trials yet" if not everything else "no trials match the filters"
        figures = {name: empty_figure(what) for name in VIEWS}
        if running:  # what trains now shows before anything has finished
            figures["training"] = training_figure([], load_curves(db, [], running)[1], running)
        out.update(summary=_summary(what, running), figures=figures)
        return out
    metrics, train = load_curves(db, rows, running)
    figures = {**views(rows, metrics, train), **load_search(db, study, studies)}
    figures["training"] = training_figure(rows, train, running)
    chosen = next((r for r in rows if r["trial_id"] == trial), None)
    if chosen is not None:
        figures["plan"] = plan_figure(chosen)
    out.update(figures=figures, summary=_summary(f"{len(rows)} of {len(everything)} completed trials shown "
                                                 f"({study or 'all studies'})", running))
    return out


def _summary(line: str, running: list[dict]) -> str:
    return f"{line}; {len(running)} training now" if running else line


def warm_up() -> None:
    """Draw every view once on two made-up trials, so that what loads on
    first use loads as the app starts, not on the first view a user opens:
    pandas (pyarrow loads it the first time it converts Python values, as the
    Pareto view does) and plotly's validators and template, about 1 s in all
    on a busy machine."""
    spec = '{"family": "transformer", "layers": [{"mixer": "attention", "mlp_width": 8}]}'
    rows = [dict(trial_id=f"warm-up-{i}", family="transformer", axes={"taper.shape": shape}, params=1000 * (i + 1),
                 total_params=1000 * (i + 1), target=1000.0 * (i + 1), match="params", achieved=1000.0 * (i + 1),
                 match_error=0.0, d_model=8, num_layers=1, val_loss=3.0 - i, tokens_per_s=1.0, spec=spec)
            for i, shape in enumerate(("uniform", "cosine"))]
    views(rows, [dict(trial_id="warm-up-0", step=1, tokens=8, val_loss=3.0)])
    empty_figure("")


def create_app(store: str | Path):
    """The Dash app over ``store`` (its views drawn once on made-up rows first: ``warm_up``)."""
    import dash
    from dash import Input, Output, dcc, html

    warm_up()

    app = dash.Dash(__name__, title="archsearch dashboard")

    def dropdown(id_: str, label: str, multi: bool = False):
        return html.Label([label, dcc.Dropdown(id=id_, multi=multi, options=[], placeholder="all")],
                          style={"flex": "1", "minWidth": "180px"})

    app.layout = html.Div([
        html.H1("archsearch dashboard", style={"fontSize": "1.6rem"}),
        html.P(id="summary"),
        html.Div([dropdown("study", "study"), dropdown("families", "family", multi=True),
                  dropdown("axis", "axis"), dropdown("values", "axis value", multi=True),
                  dropdown("trial", "trial (plan)")],
                 style={"display": "flex", "gap": "1rem", "flexWrap": "wrap"}),
        *[dcc.Graph(id=f"view-{name}", style={"height": "520px"}) for name in VIEWS],
        dcc.Interval(id="tick", interval=REFRESH_MS),
    ], style={"fontFamily": "system-ui, sans-serif", "maxWidth": "1200px", "margin": "1rem auto"})

    outputs = [Output("summary", "children"), Output("study", "options"), Output("families", "options"),
               Output("axis", "options"), Output("values", "options"), Output("trial", "options"),
               *[Output(f"view-{name}", "figure") for name in VIEWS]]
    inputs = [Input("tick", "n_intervals"), Input("study", "value"), Input("families", "value"),
              Input("axis", "value"), Input("values", "value"), Input("trial", "value")]

    @app.callback(outputs, inputs)
    def redraw(_tick, study, families, axis, values, trial):
        problem = bad_input(study=study, families=families, axis=axis, values=values, trial=trial)
        if problem is not None:
            return (problem, *[dash.no_update] * (len(outputs) - 1))
        view = refresh(store, study=study, families=families, axis=axis, values=values, trial=trial)
        return (view["summary"], view["studies"], view["families"], view["axes"], view["values"], view["trials"],
                *[view["figures"][name] for name in VIEWS])

    app.server.register_error_handler(Exception, _unparsed_request)
    return app


def _unparsed_request(err: Exception):
    """A request that fails inside Dash before any callback of ours runs (a body without
    ``output``, a list too short): 400 and one log line, not a 500 and a traceback. An error
    from our own code, or an HTTP error Flask chose, stays as it is."""
    from werkzeug.exceptions import HTTPException

    if isinstance(err, HTTPException):
        return err
    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    if any(Path(f).resolve().parent == Path(__file__).resolve().parent for f in frames):
        raise err  # ours: a bug, with its traceback
    logging.getLogger(__name__).warning("bad request: %s: %s", type(err).__name__, str(err)[:200])
    return f"bad request: {type(err).__name__}\n", 400


def require_password(app, password: str) -> None:
    """Every route of ``app`` asks for ``password`` (any user name) by HTTP Basic authentication."""
    import secrets

    import dash_auth

    app.server.secret_key = secrets.token_hex(32)  # dash-auth keeps its session in a signed cookie
    dash_auth.BasicAuth(app, auth_func=lambda _user, given: hmac.compare_digest(
        given.encode("utf-8", "surrogateescape"), password.encode("utf-8", "surrogateescape")))


def serve(store: str | Path, *, host: str = "127.0.0.1", port: int = 8050, password: str | None = None) -> None:
    """Serve the dashboard until interrupted (loopback only unless ``host`` says otherwise), asking
    every visitor for ``password`` when one is given."""
    app = create_app(store)
    if password:
        require_password(app, password)
    app.run(host=host, port=port, debug=False)
