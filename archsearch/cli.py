"""The archsearch command line: the app, its options before any command, and the
order its commands are listed in. Each group of commands lives in its own module:
``cli_study`` (plan, bench, schema), ``cli_run`` (run, resume, submit, status),
``cli_results`` (pareto, fit, compare), ``cli_outputs`` (report, dashboard, export),
``cli_analyze`` and ``cli_kernels`` (sub-apps); ``cli_common`` holds what they share.
Heavy imports live inside each command so ``archsearch --help`` answers at once."""

from __future__ import annotations

from typing import Annotated

import typer

from archsearch.cli_analyze import analyze_app
from archsearch.cli_common import leave_now
from archsearch.cli_kernels import kernels_app
from archsearch.cli_outputs import dashboard, export, report
from archsearch.cli_results import compare, fit, pareto
from archsearch.cli_run import resume, run, status, submit
from archsearch.cli_study import bench, plan, schema

# Plain click help: rich help labels every flag `<bool>`.
app = typer.Typer(help="Declarative architecture search and scaling studies for language models.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)


def _version(value: bool) -> None:
    if value:
        from archsearch.store.values import code_version

        typer.echo(f"archsearch {code_version()}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="print the version and exit")] = False):
    """Options before any command (the app's help text is the Typer's)."""


# registered in the order `archsearch --help` lists them
app.command()(plan)
app.command()(run)
app.command()(resume)
app.command()(submit)
app.command()(status)
app.command("ls", help="Studies and trials in a store (same as status).")(status)
app.command()(pareto)
app.command()(fit)
app.command()(compare)
app.command()(report)
app.command()(dashboard)
app.command()(export)
app.command()(schema)
app.add_typer(analyze_app, name="analyze")
app.add_typer(kernels_app, name="kernels")
app.command()(bench)


def entry() -> None:
    """The ``archsearch`` console script and ``python -m archsearch.cli``: the
    command, then a prompt exit with its status (``cli_common.leave_now``).
    Tests call ``app`` in-process (CliRunner), never this."""
    try:
        app()
    except SystemExit as stop:
        leave_now(stop.code)
        raise


if __name__ == "__main__":
    entry()
