"""``archsearch analyze``: analyses of trained trials (docs/inspect.md), a sub-app of the CLI."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from archsearch.cli_common import DEFAULT_STORE, JsonOpt, StoreOpt, full_trial_id, user_errors
from archsearch.jsontext import strict_json

analyze_app = typer.Typer(help="Analyses of trained trials, loaded from their checkpoints (docs/inspect.md).",
                          no_args_is_help=True)

TrialArg = Annotated[str, typer.Argument(help="trial id (see `archsearch status`)")]
BatchesOpt = Annotated[int, typer.Option(help="calibration batches, from the trial's validation data")]
BatchSizeOpt = Annotated[int, typer.Option(help="rows per calibration batch")]
SeedOpt = Annotated[int, typer.Option(help="seed of the calibration batches (and of injected noise)")]


def _analysis(run, title: str, columns: list[str], as_json: bool, fold: str | None = None, **kwargs) -> None:
    """Run one ``archsearch.inspect.runs`` analysis and show (or print as JSON) the rows it stored."""
    from archsearch.inspect.runs import Calibration

    calib = Calibration(batches=kwargs.pop("batches"), batch_size=kwargs.pop("batch_size"), seed=kwargs.pop("seed"))
    rows = run(calib=calib, **kwargs)
    if as_json:
        typer.echo(strict_json(rows, indent=2))
        return
    from archsearch.terminal_results import profile_table

    profile_table(title, rows, columns, fold)


@analyze_app.command("rho")
@user_errors
def analyze_rho(trial_id: TrialArg, store: StoreOpt = DEFAULT_STORE,
                mode: Annotated[str, typer.Option(help="noise, wanda, magnitude or int8")] = "noise",
                noise: Annotated[float, typer.Option(help="injected error, relative to the hidden state")] = 1e-2,
                sparsity: Annotated[float, typer.Option(help="for wanda and magnitude")] = 0.5,
                batches: BatchesOpt = 4, batch_size: BatchSizeOpt = 8, seed: SeedOpt = 0, as_json: JsonOpt = False):
    """Error contraction rho per layer, with predicted and measured amplification."""
    trial_id = full_trial_id(store, trial_id)  # a wrong store or id says so before torch loads
    from archsearch.inspect.runs import analyze_rho as run

    _analysis(run, f"rho of {trial_id} ({mode})", ["mode"], as_json, trial_id=trial_id, store=store, mode=mode,
              noise=noise, sparsity=sparsity, batches=batches, batch_size=batch_size, seed=seed)


@analyze_app.command("prune")
@user_errors
def analyze_prune(trial_id: TrialArg, store: StoreOpt = DEFAULT_STORE,
                  max_removed: Annotated[Optional[int], typer.Option(help="most layers removed (default L/2)")] = None,
                  alpha: Annotated[float, typer.Option(help="weight of Block Influence in the blend")] = 0.5,
                  batches: BatchesOpt = 4, batch_size: BatchSizeOpt = 8, seed: SeedOpt = 0, as_json: JsonOpt = False):
    """Depth pruning (stack models): perplexity and tokens/s with k layers removed, per ranking."""
    trial_id = full_trial_id(store, trial_id)  # a wrong store or id says so before torch loads
    from archsearch.inspect.runs import analyze_prune as run

    _analysis(run, f"depth pruning of {trial_id}", ["ranking", "removed"], as_json, fold="dropped",
              trial_id=trial_id, store=store, max_removed=max_removed, alpha=alpha, batches=batches,
              batch_size=batch_size, seed=seed)


@analyze_app.command("wanda")
@user_errors
def analyze_wanda(trial_id: TrialArg, store: StoreOpt = DEFAULT_STORE,
                  sparsity: Annotated[float, typer.Option(help="total share of weights pruned")] = 0.5,
                  spread: Annotated[float, typer.Option(help="depth schedule: first/last layer at (1 -/+ spread) x")]
                  = 0.5, method: Annotated[str, typer.Option(help="wanda or magnitude")] = "wanda",
                  batches: BatchesOpt = 4, batch_size: BatchSizeOpt = 8, seed: SeedOpt = 0, as_json: JsonOpt = False):
    """Wanda pruning: a uniform against a depth-decreasing schedule at the same total sparsity."""
    trial_id = full_trial_id(store, trial_id)  # a wrong store or id says so before torch loads
    from archsearch.inspect.runs import analyze_wanda as run

    _analysis(run, f"{method} at {sparsity:.0%} on {trial_id}", ["schedule"], as_json, trial_id=trial_id,
              store=store, sparsity=sparsity, spread=spread, method=method, batches=batches, batch_size=batch_size,
              seed=seed)


@analyze_app.command("exit")
@user_errors
def analyze_exit(trial_id: TrialArg, store: StoreOpt = DEFAULT_STORE,
                 thresholds: Annotated[str, typer.Option(help="comma-separated exit thresholds in (0, 1]")]
                 = "0.5,0.7,0.8,0.9,0.95,0.99,1.0",
                 adapt_steps: Annotated[int, typer.Option(help="steps of cache-hole adaptation (0: none)")] = 0,
                 cache_hole: Annotated[float, typer.Option(help="share of tokens taking sampled exits")] = 0.5,
                 lr: Annotated[float, typer.Option(help="learning rate of the adaptation")] = 1e-4,
                 batches: BatchesOpt = 4, batch_size: BatchSizeOpt = 8, seed: SeedOpt = 0, as_json: JsonOpt = False):
    """Early exit (looped models with exit gates): perplexity against the share of loop steps run."""
    try:
        values = tuple(float(t) for t in thresholds.split(","))
    except ValueError:
        raise ValueError(f"--thresholds: {thresholds!r} is not a comma-separated list of numbers") from None
    if any(not 0 < t <= 1 for t in values):
        raise ValueError(f"--thresholds: every threshold must be in (0, 1], got {thresholds}")
    trial_id = full_trial_id(store, trial_id)
    from archsearch.inspect.runs import analyze_exit as run  # torch: after the arguments and the store
    _analysis(run, f"early exit of {trial_id}", ["adapted", "threshold"], as_json, trial_id=trial_id, store=store,
              thresholds=values, adapt_steps=adapt_steps, cache_hole=cache_hole, lr=lr, batches=batches,
              batch_size=batch_size, seed=seed)


@analyze_app.command("probe")
@user_errors
def analyze_probe(trial_id: TrialArg, store: StoreOpt = DEFAULT_STORE,
                  state: Annotated[str, typer.Option(help="comma-separated: hidden:LAYER, gpn or memory")] = "hidden:0",
                  target: Annotated[str, typer.Option(help="comma-separated: position or lag:K")] = "position",
                  baseline: Annotated[Optional[str], typer.Option(help="another trial, probed the same way")] = None,
                  lam: Annotated[float, typer.Option(help="ridge penalty")] = 1e-3,
                  batches: BatchesOpt = 4, batch_size: BatchSizeOpt = 8, seed: SeedOpt = 0, as_json: JsonOpt = False):
    """Linear probes from states to targets (and on a baseline), and learned-decay half-lives."""
    trial_id = full_trial_id(store, trial_id)  # a wrong store or id says so before torch loads
    from archsearch.inspect.runs import analyze_probe as run

    _analysis(run, f"probes of {trial_id}", ["model", "state", "target"], as_json, trial_id=trial_id, store=store,
              states=tuple(state.split(",")), targets=tuple(target.split(",")), baseline=baseline, lam=lam,
              batches=batches, batch_size=batch_size, seed=seed)
