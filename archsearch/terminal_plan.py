"""What ``archsearch plan`` and ``archsearch bench`` print: the planned trials (of a study or
of a search's sample) with their sizes, FLOPs and memory, each trial's layers, and a bench's timings."""

from __future__ import annotations

from rich.table import Table

from archsearch.budget.memory import readable_bytes
from archsearch.terminal import (
    _all_names,
    _axis_cells,
    _fmt,
    _print,
    _shared_line,
    _table,
    console,
    plain,
    short_ids,
    split_axes,
)


def search_plan(preview, *, layers: bool = False, wide: bool = False) -> None:
    """``plan`` of a search (``search.preview.SearchPlan``): the grid's table, or a table of the
    trials of a sampler's drawn points, then what the search proposes and the FLOPs it implies."""
    out = console()
    if preview.sampler == "grid":
        plan_table(preview.sample, layers=layers, wide=wide)
        head = f"search: every one of the grid's {preview.space}"
    else:
        plan_table(preview.sample, layers=layers, wide=wide, title="trials of points drawn as the sampler draws them",
                   totals=False)
        head = (f"search: {preview.sampler} proposes {preview.proposals:,} points of a space of {preview.space}; "
                f"each is planned at every budget target and seed ({preview.trials_per_proposal:g} trials a point)")
    lines = [head]
    if preview.asked is not None and preview.asked > preview.proposals:
        lines.append(f"the space runs out: it holds {preview.proposals:,} points, fewer than search.trials "
                     f"({preview.asked:,}); every proposal is a point not proposed before")
    if preview.infeasible:
        lines.append(f"{preview.infeasible} of the points drawn reach no budget target (the sampler is told they "
                     "failed and draws again)")
    if preview.rungs is not None:
        shares = ", ".join(_share(r) for r in preview.rungs)
        lines.append(f"fidelity: {preview.fidelity}, trials stop at {shares} of their tokens; only the promoted go on")
    estimate = "" if preview.sampler == "grid" else " (from the points drawn)"
    lines.append(f"training FLOPs: at most {preview.most_flops:.3g} (every trial to its end), expected "
                 f"{preview.expected_flops:.3g}{estimate}")
    for text in lines:
        out.print(plain(text))


def _share(fraction: float) -> str:
    return "1" if fraction == 1 else f"1/{round(1 / fraction)}"


def plan_table(trials: list, *, layers: bool = False, wide: bool = False, title: str | None = None,
               totals: bool = True) -> None:
    """One row per planned trial: the axes that differ, params, match error,
    FLOPs/token (and state when matched on it); ``wide`` adds every axis,
    seed, target, achieved, d_model and MLP widths. ``totals``: the study's
    training FLOPs below (not for a sample of a search's trials)."""
    rows = [{**t.axes, "seed": t.seed} for t in trials]
    varying, shared = split_axes(rows)
    axes, axis_cells = _axis_cells(rows, _all_names(rows) if wide else varying, wide=wide)
    measures = ["params", "error", "FLOPs/token", "memory"]
    if wide:
        measures = ["match", "target", "achieved", "error", "params", "d_model", "MLP widths", "FLOPs/token", "state",
                    "memory"]
    elif trials and trials[0].match == "state":
        measures.append("state")
    matched = f", matched on {trials[0].match}" if trials and not wide else ""
    table = _table(f"{title or f'{len(trials)} planned trials'}{matched}", ["trial", *axes, *measures],
                   text=("trial", "axes"))
    shown = {t.trial_id: t.trial_id for t in trials} if wide else short_ids([t.trial_id for t in trials])
    for t, cells_of_axes in zip(trials, axis_cells):
        cells = {"match": t.match, "target": t.target, "achieved": t.achieved, "error": f"{t.match_error:+.2%}",
                 "params": t.params, "d_model": t.spec.d_model, "MLP widths": ",".join(map(str, t.spec.mlp_widths)),
                 "FLOPs/token": t.flops_per_token, "state": t.state,
                 "memory": readable_bytes(t.memory.total) if t.memory is not None else None}
        table.add_row(shown[t.trial_id], *cells_of_axes, *(_fmt(cells[m]) for m in measures))
    out = console()
    _print(out, table, wide=wide, note=None if wide else _shared_line(shared))
    from archsearch.planner import twin_lines

    for line in twin_lines(trials):
        out.print(plain(line))
    trained = [t for t in trials if t.same_as is None]
    if trials and totals:
        over = f"the {len(trials)} trials" if len(trained) == len(trials) else \
            f"the {len(trained)} trainings of the {len(trials)} trials"
        train, evaluation = sum(t.train_flops for t in trained), sum(t.eval_flops for t in trained)
        out.print(f"total FLOPs: {train + evaluation:.3g} = training {train:.3g} (FLOPs/token x tokens) + "
                  f"evaluation {evaluation:.3g} (forward FLOPs/token x evaluation tokens), summed over {over}")
        out.print("memory: each trial's estimated training peak (weights and gradients, AdamW state, activations "
                  "of a micro-batch, logits), without the Python and torch runtime")
        heavy = [t for t in trials if t.total_params > 2 * max(t.params, 1)]
        if heavy:
            t = max(heavy, key=lambda t: t.total_params / max(t.params, 1))
            out.print(f"note: embeddings hold {1 - t.params / t.total_params:.0%} of trial {t.trial_id}'s "
                      f"{t.total_params:,} parameters (vocabulary {t.spec.vocab_size:,}); budget.targets count "
                      "the rest only, unless budget.count_embeddings")
    memories = [t.to_dict() for t in trials if t.spec.structure == "memory"]
    if memories:
        out.print("memory overhead (its params over the rest, embeddings included): "
                  + ", ".join(f"{m['trial_id']} +{m['memory_overhead']:.2%}" for m in memories))
    if layers:
        for t in trials:
            out.print(layer_table(t))


def layer_table(trial) -> Table:
    """The per-layer plan of one trial."""
    from archsearch.arch.structures.stack import layer_params

    spec = trial.spec
    table = _table(f"trial {trial.trial_id}: d_model={spec.d_model}, heads={spec.num_heads}",
                   ["layer", "mixer", "mlp", "MLP width", "params"], text=("mixer", "mlp"))
    for i, layer in enumerate(spec.layers):
        table.add_row(str(i), _fmt(layer.mixer), _fmt(layer.mlp), _fmt(layer.mlp_width),
                      _fmt(layer_params(spec, layer)))
    return table


def bench_table(study: str, result: dict) -> None:
    """``archsearch bench``: one row per trial and implementation, the step's speed and memory."""
    title = (f"{study}: {result['device']}, {result['threads']} threads, {result['dtype']}, "
             f"matmul {result['matmul_tflops'] * 1e3:.1f} GFLOP/s, median of {result['rounds']} rounds")
    columns = ["trial", "family", "impl", "kernels", "compile", "params", "step ms", "tokens/s", "MFU", "peak MB",
               "x HF"]
    table = _table(title, columns, text=("family", "impl", "kernels", "compile"))
    for row in result["rows"]:
        compiled = "-" if row["compile"] == "-" else f"{row['compile']} ({row['compile_s']:.0f} s)"
        table.add_row(str(row["trial"]), plain(row["family"]), plain(row["impl"]), plain(row["kernels"]),
                      plain(compiled), _fmt(row["params"]), _fmt(row["step_ms"]), _fmt(row["tokens_per_s"]),
                      f"{row['mfu']:.1%}", _fmt(row["peak_mb"]), "-" if row["vs_hf"] is None else f"{row['vs_hf']:.2f}x")
    _print(console(), table, wide=True)
