"""``archsearch kernels``: the C++ CPU kernels' builds, made ahead of the first run."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from archsearch.cli_common import _fail, user_errors

kernels_app = typer.Typer(help="The C++ CPU kernels: build them ahead of the first run (docs/execution.md).",
                          no_args_is_help=True)


@kernels_app.command("build")
@user_errors
def build(only: Annotated[Optional[str], typer.Option(
              "--only", help="comma-separated extensions to build (default: all): elementwise, selective_scan, ssd, "
                          "gated_delta")]
          = None):
    """Build (or load) the C++ CPU kernels for this Python environment, check each against its
    reference and say where each build lives. A run builds what its trials need before they start;
    this builds all of them ahead, as after an install."""
    from archsearch_kernels.cpu_cache import EXTENSIONS, build_dir, build_name

    names = [name.strip() for name in only.split(",") if name.strip()] if only else list(EXTENSIONS)
    unknown = [name for name in names if name not in EXTENSIONS]
    if unknown:
        raise ValueError(f"--only {only}: no extension {', '.join(unknown)}; choose from {', '.join(EXTENSIONS)}")
    from archsearch_kernels.cpu_build import build_all, capability

    outcome = build_all(only=names)
    for name in names:
        typer.echo(f"{name} ({EXTENSIONS[name]}): {build_dir(build_name(name, capability()))}")
    failed = {op: why for op, why in outcome.items() if why is not None}
    for op, why in failed.items():
        typer.echo(f"{op}: not used here ({why}); it runs the PyTorch path", err=True)
    if failed:
        _fail(f"{len(failed)} of {len(outcome)} C++ CPU kernels cannot be used here; runs use the PyTorch path "
              "for them", 1)
