"""Each analysis run on a stored trial: load it, draw its calibration batches,
analyse, record the rows in the store's ``layer_profiles``, return them.

These back the ``archsearch analyze`` commands. Every stored row carries the
calibration it was read on (batches, batch size, seed) in its setting, so a
rerun with the same setting replaces it and another setting sits beside it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from archsearch.inspect import early_exit, probes, prune, rho, wanda
from archsearch.store import open_store


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Which calibration batches: ``batches`` of ``batch_size`` rows of the trial's validation data."""

    batches: int = 4
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self):
        if self.batches < 1 or self.batch_size < 1:
            raise ValueError(f"calibration needs at least one batch of one row, got {self.batches} x {self.batch_size}")


def _batches(trial_id: str, store: str | Path, calib: Calibration, split: str = "val"):
    from archsearch.inspect import calibration

    return calibration(trial_id, store=store, batches=calib.batches, batch_size=calib.batch_size, seed=calib.seed,
                       split=split)


def _load(trial_id: str, store: str | Path, calib: Calibration):
    """The trained model and its calibration batches."""
    from archsearch.inspect import load_trained

    return load_trained(trial_id, store=store), _batches(trial_id, store, calib)


def _record(store: str | Path, trial_id: str, analysis: str, calib: Calibration, rows: list[dict]) -> list[dict]:
    stored = [dict(row, setting={**asdict(calib), **row.get("setting", {})}) for row in rows]
    with open_store(store) as db:
        db.record_profile(trial_id, analysis, stored)
    return stored


def analyze_rho(trial_id: str, *, store: str | Path, mode: str = "noise", noise: float = 1e-2, sparsity: float = 0.5,
                calib: Calibration = Calibration()) -> list[dict]:
    """rho, errors and predicted/measured amplification per layer (``rho.error_contraction``)."""
    model, batches = _load(trial_id, store, calib)
    profile = rho.error_contraction(model, batches, mode=mode, noise=noise, sparsity=sparsity, seed=calib.seed)
    setting = {"mode": mode, **({"noise": noise} if mode == "noise" else {"sparsity": sparsity})}
    return _record(store, trial_id, "rho", calib, [dict(row, setting=setting) for row in profile.rows()])


def analyze_prune(trial_id: str, *, store: str | Path, max_removed: int | None = None, alpha: float = 0.5,
                  calib: Calibration = Calibration()) -> list[dict]:
    """Perplexity and tokens/s per ranking and number of layers removed (which ones: a ``dropped``
    row per layer), and the per-layer scores the rankings read."""
    model, batches = _load(trial_id, store, calib)
    prune.check_stack(model)
    scores = prune.layer_scores(model, batches)
    rows = [dict(setting={"scores": True}, layer=index, metric=name, value=value)
            for name, values in scores.items() for index, value in enumerate(values)]
    for point in prune.depth_pruning(model, batches, max_removed=max_removed, alpha=alpha, scores=scores):
        setting = {"ranking": point["ranking"], "removed": point["removed"], "alpha": alpha}
        rows += [dict(setting=setting, layer=None, metric=m, value=point[m]) for m in ("perplexity", "tokens_per_s")]
        rows += [dict(setting=setting, layer=index, metric="dropped", value=1.0) for index in point["layers"]]
    return _record(store, trial_id, "prune", calib, rows)


def analyze_wanda(trial_id: str, *, store: str | Path, sparsity: float = 0.5, spread: float = 0.5,
                  method: str = "wanda", calib: Calibration = Calibration()) -> list[dict]:
    """Perplexity of the dense model and of the uniform and depth schedules at one total sparsity."""
    model, batches = _load(trial_id, store, calib)
    points = wanda.compare_schedules(model, batches, sparsity=sparsity, spread=spread, method=method)
    rows = [dict(setting={"schedule": p["schedule"], "sparsity": sparsity, "spread": spread, "method": method},
                 layer=p["layer"], metric=p["metric"], value=p["value"]) for p in points]
    return _record(store, trial_id, "wanda", calib, rows)


def analyze_exit(trial_id: str, *, store: str | Path, thresholds: tuple[float, ...] = early_exit.THRESHOLDS,
                 adapt_steps: int = 0, cache_hole: float = 0.5, lr: float = 1e-4,
                 calib: Calibration = Calibration()) -> list[dict]:
    """Perplexity and loop fraction per exit threshold; with ``adapt_steps``, also after that many
    steps of cache-hole adaptation on the trial's training data."""
    model, batches = _load(trial_id, store, calib)
    early_exit.check_exit_model(model)
    models = {False: model}
    if adapt_steps > 0:
        train = _batches(trial_id, store, replace(calib, batches=adapt_steps), split="train")
        models[True] = early_exit.adapt_cache_holes(model, train, cache_hole=cache_hole, lr=lr, seed=calib.seed)
    rows = []
    for adapted, which in models.items():
        extra = {"adapt_steps": adapt_steps, "cache_hole": cache_hole, "lr": lr} if adapted else {}
        for point in early_exit.exit_curve(which, batches, thresholds):
            setting = {"threshold": point["threshold"], "adapted": adapted, **extra}
            rows += [dict(setting=setting, layer=None, metric=m, value=point[m])
                     for m in ("perplexity", "loop_fraction")]
    return _record(store, trial_id, "exit", calib, rows)


def analyze_probe(trial_id: str, *, store: str | Path, states: tuple[str, ...] = ("hidden:0",),
                  targets: tuple[str, ...] = ("position",), baseline: str | None = None, lam: float = 1e-3,
                  calib: Calibration = Calibration()) -> list[dict]:
    """Probe scores from each state to each target, on the trial and (``baseline``) another trial's
    same states; plus the decay half-lives of the trial's layers where it has any."""
    subjects = {trial_id: _load(trial_id, store, calib)}
    if baseline is not None:
        subjects[baseline] = _load(baseline, store, calib)
    rows = []
    for subject, (model, batches) in subjects.items():
        for state in states:
            for target in targets:
                result = probes.run_probe(model, batches, state=state, target=target, lam=lam, seed=calib.seed)
                setting = {"state": state, "target": target, "lam": lam, "model": subject}
                rows += [dict(setting=setting, layer=None, metric=m, value=getattr(result, m))
                         for m in ("score", "train_score", "tokens")]
    stored = _record(store, trial_id, "probe", calib, rows)
    lives = probes.half_lives(*subjects[trial_id])
    return stored + (_record(store, trial_id, "half_life", calib, lives) if lives else [])
