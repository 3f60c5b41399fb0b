"""What a store becomes for people and other tools: ``report`` (HTML or PNG figures),
``dashboard`` (served live) and ``export`` (Parquet tables, or a trained model)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from archsearch.cli_common import (
    DEFAULT_STORE,
    StoreOpt,
    StudyOpt,
    _default_report,
    _fail,
    _writing,
    full_trial_id,
    reading,
    user_errors,
)


@user_errors
def report(output: Annotated[Optional[Path], typer.Option(
               "-o", "--output", help="HTML file to write [default: reports/STUDY.html, as run writes]")] = None,
           store: StoreOpt = DEFAULT_STORE, study: StudyOpt = None,
           png: Annotated[Optional[Path], typer.Option(
               "--png", help="folder to write each figure as NAME.png (needs the png extra); "
                             "then the HTML only with -o")] = None):
    """A self-contained interactive HTML report, or its figures as PNG files."""
    from archsearch_dashboards.report import write_pngs, write_report

    from archsearch.terminal import doing
    from archsearch.terminal_store import REPORT_WORK

    with reading(store, study) as db:
        if png is not None:
            with _writing(png, "PNG files to"), doing("drawing each figure as a PNG (through Chromium)"):
                for path in write_pngs(db, png, study=study):
                    typer.echo(f"png: {path}")
            if output is None:
                return
        names = db.studies().column("name").to_pylist()
        output = output or _default_report(study or (names[0] if len(names) == 1 else None))
        with _writing(output, "the report"), doing(REPORT_WORK):
            path = write_report(db, output, study=study)
    typer.echo(f"report: {path}")


@user_errors
def dashboard(store: StoreOpt = DEFAULT_STORE,
              host: Annotated[str, typer.Option(help="address to serve on (loopback by default)")] = "127.0.0.1",
              port: Annotated[int, typer.Option(min=1, max=65535, help="port to serve on")] = 8050,
              password: Annotated[Optional[str], typer.Option(
                  envvar="ARCHSEARCH_DASHBOARD_PASSWORD",
                  help="ask every visitor for this password (HTTP Basic, any user name); better set "
                       "ARCHSEARCH_DASHBOARD_PASSWORD than type it")] = None):
    """The live dashboard: figures that redraw as trials finish (Ctrl-C stops it)."""
    with reading(store):  # a store it cannot read: one line now, not an error on every redraw
        pass
    import importlib.util

    if importlib.util.find_spec("dash") is None:  # the app imports it only as it starts serving
        _fail("the dashboard needs Dash: pip install 'archsearch[dashboard]'", 2)
    if password and importlib.util.find_spec("dash_auth") is None:
        _fail("a dashboard password needs dash-auth: pip install 'archsearch[dashboard]'", 2)
    from archsearch_dashboards.app import serve

    if not _loopback(host):
        if password:
            typer.echo(f"note: the dashboard on {host} asks for the password, which HTTP sends unencrypted: serve "
                       "it on a trusted network or behind an HTTPS proxy", err=True)
        else:
            typer.echo(f"warning: the dashboard on {host} shows {store} to every machine that can reach port {port}, "
                       "with no password; set ARCHSEARCH_DASHBOARD_PASSWORD (or --password) to ask for one", err=True)
    # flushed: piped, the line would wait in a buffer while the server runs
    typer.echo(f"dashboard: http://{host}:{port}/ over {store} (Ctrl-C stops it)")
    sys.stdout.flush()
    serve(store, host=host, port=port, password=password)


def _loopback(host: str) -> bool:
    """Whether ``host`` is reached from this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


@user_errors
def export(parquet: Annotated[Optional[Path], typer.Option(
               "--parquet", help="folder to write one .parquet per table")] = None,
           hf: Annotated[Optional[tuple[str, Path]], typer.Option(
               "--hf", metavar="TRIAL DIR",
               help="write trial TRIAL (its id or a unique prefix) to the new folder DIR: a transformers "
                    "checkpoint (Llama, Mamba, Mamba-2; needs the hf extra), else safetensors and the spec "
                    "that rebuilds it")] = None,
           portable: Annotated[bool, typer.Option(
               "--portable", help="with --parquet: name study and data files relative to this folder "
                                  "(or by name outside it), not by this machine's paths, and add "
                                  "data_files.parquet with each data file's bytes and sha256")] = False,
           store: StoreOpt = DEFAULT_STORE):
    """The store as Parquet files, or a trained model as a transformers checkpoint."""
    if (parquet is None) == (hf is None):
        _fail("export needs one of --parquet DIR (the store) or --hf TRIAL DIR (a trained model)", 2)
    if portable and parquet is None:
        _fail("--portable goes with --parquet DIR: a model exported with --hf names no paths", 2)
    if parquet is not None:
        with reading(store) as db, _writing(parquet, "Parquet files to"):
            for path in db.export_parquet(parquet, portable=portable):
                typer.echo(path)
        return
    from archsearch.export import export_trial

    trial, folder = hf
    trial_id = full_trial_id(store, trial)
    with _writing(folder, "the model to"):
        done = export_trial(trial_id, folder, store=store)
    if done.status != "completed":
        typer.echo(f"{trial_id[:8]}: the trial is {done.status}; this is its newest checkpoint, not a final model")
    if done.kind == "transformers":
        typer.echo(f"{trial_id[:8]}: {done.hf_class} in {folder} (logits within {done.max_diff:.1e} of "
                   "archsearch's on a random batch); AutoModelForCausalLM.from_pretrained loads it")
    else:
        typer.echo(f"{trial_id[:8]}: not a transformers checkpoint: {done.reason}")
        typer.echo(f"{trial_id[:8]}: model.safetensors and spec.json in {folder}; "
                   "A.build_model(ArchSpec.from_dict(spec)) rebuilds it")
