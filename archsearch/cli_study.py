"""Commands on a study file that train nothing: ``plan`` (with its wall-time estimate from
a store), ``bench`` (a timed training step of each planned architecture) and ``schema``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from archsearch.cli_common import (
    DEFAULT_STORE,
    IgnoreMemoryOpt,
    JsonOpt,
    SetOpt,
    StudyArg,
    WideOpt,
    _fail,
    _memory_override,
    reading,
    user_errors,
)
from archsearch.jsontext import strict_json


@user_errors
def plan(study: StudyArg, as_json: JsonOpt = False, wide: WideOpt = False,
         layers: Annotated[bool, typer.Option("--layers", help="show each trial's per-layer plan")] = False,
         overrides: SetOpt = None, ignore_memory: IgnoreMemoryOpt = False,
         store: Annotated[Path, typer.Option("--store", help="a store whose completed trials' speed estimates the "
                                                             "plan's wall time (when it exists)")] = DEFAULT_STORE):
    """Every trial the study would run, widths solved; trains nothing. A search (a sampler, or
    fidelity rungs) also says what it proposes and the training FLOPs it implies."""
    import archsearch as A

    loaded = A.load_study(study, overrides=_memory_override(overrides, ignore_memory))
    search = loaded.search
    if search.probe is None and (search.sampler != "grid" or search.fidelity is not None):
        from archsearch.search.preview import plan_search

        preview = plan_search(loaded)
        if as_json:
            out = preview.to_dict() if search.sampler != "grid" else [t.to_dict() for t in preview.sample]
            typer.echo(strict_json(out, indent=2))
            return
        from archsearch.terminal_plan import search_plan

        search_plan(preview, layers=layers, wide=wide)
        return
    trials = A.plan(loaded)
    if as_json:
        typer.echo(strict_json([t.to_dict() for t in trials], indent=2))
        return
    from archsearch.terminal import lines
    from archsearch.terminal_plan import plan_table

    plan_table(trials, layers=layers, wide=wide)
    lines(_wall_time_line(trials, loaded, store))


def _wall_time_line(trials: list, study, store: Path) -> list[str]:
    """The plan's estimated training time from the completed trials of ``store``, if it exists."""
    import os

    from archsearch.analysis.walltime import duration, estimate

    if not store.is_file():
        return []
    with reading(store) as db:
        completed = db.sql("SELECT family, tokens_per_s, flops_per_token FROM trials WHERE status = 'completed'"
                           ).to_pylist()
    execution = study.execution
    at_once = execution.max_parallel if execution.max_parallel != "auto" else \
        max(1, (os.cpu_count() or 1) // max(1, int(execution.cpus or execution.threads_per_trial)))
    planned = [dict(family=t.spec.family, train_flops=t.train_flops) for t in trials if t.same_as is None]
    found = estimate(planned, completed, at_once=at_once)
    if found is None:
        return []
    left = f"; {found.trials - found.covered} of {found.trials} trials left out (a family {store} has not " \
           "trained)" if found.covered < found.trials else ""
    return [f"estimated training time: about {duration(found.wall_s)} at {found.at_once} trials at a time "
            f"(each trial's FLOPs over its family's median FLOP/s in {found.measured} completed trials of {store}; "
            f"evaluation and start-up not counted{left})"]


@user_errors
def bench(study: StudyArg,
          trial: Annotated[Optional[int], typer.Option("--trial", help="only trial N of `plan` (0-based; default all)")]
          = None,
          kernels: Annotated[str, typer.Option(
              help="on (Triton on CUDA, C++ kernels on a CPU), off (PyTorch) or both (default: both where a "
                   "kernel applies, else off)")] = "auto",
          rounds: Annotated[int, typer.Option(help="timed rounds, after one warm-up round")] = 5,
          hf: Annotated[bool, typer.Option(help="also time transformers' equivalent: Llama, Mamba, the gated delta rule")]
          = True,
          threads: Annotated[Optional[int], typer.Option(help="torch threads (default: the study's threads_per_trial)")]
          = None,
          batch_size: Annotated[Optional[int], typer.Option(help="override the recipe's batch size")] = None,
          compile_backend: Annotated[Optional[str], typer.Option(
              "--compile", help="also time each trial under torch.compile with this backend: inductor, aot_eager "
                                "or eager")] = None,
          as_json: JsonOpt = False):
    """Time a training step of the study's planned architectures: tokens/s, MFU, peak memory."""
    import archsearch as A
    from archsearch.train.bench import bench_trials

    loaded = A.load_study(study)
    trials = A.plan(loaded)
    if trial is not None and not 0 <= trial < len(trials):
        raise ValueError(f"{study}: --trial {trial}: the study plans {len(trials)} trials, numbered 0 to {len(trials) - 1}")
    choices = {"auto": None, "on": ["on"], "off": ["off"], "both": ["on", "off"]}
    if kernels not in choices:
        raise ValueError(f"--kernels {kernels!r}: choose on, off, both or auto")
    if rounds < 1:
        raise ValueError(f"--rounds {rounds}: time at least one round")
    result = bench_trials(trials, [trial] if trial is not None else list(range(len(trials))), rounds=rounds,
                          kernels=choices[kernels], compare_hf=hf,
                          threads=threads or loaded.execution.threads_per_trial, batch_size=batch_size,
                          compile_backend=compile_backend)
    if as_json:
        typer.echo(strict_json(result, indent=2))
        return
    from archsearch.terminal_plan import bench_table

    bench_table(loaded.name, result)


def schema(kind: Annotated[str, typer.Argument(help="study or space")] = "study"):
    """JSON Schema of study or space files, for editors."""
    from archsearch.space.schema import Space, Study

    models = {"study": Study, "space": Space}
    if kind not in models:
        _fail(f"unknown schema '{kind}'; choose study or space", 2)
    typer.echo(strict_json(models[kind].model_json_schema(), indent=2))
