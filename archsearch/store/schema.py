"""The store's tables: the SQL that makes them, the schema version with the migrations
that bring an older store to it, and the fixed column orders the writes use."""

from __future__ import annotations

from archsearch.store.live import LIVE_SCHEMA

# Bump when a table changes shape; an older store is refused with a clear line, unless
# MIGRATIONS takes it forward (done when it is opened for writing; a reader reads it as it is).
SCHEMA_VERSION = 4
# version -> the SQL that makes a store of that version the next one
MIGRATIONS = {
    "2": "ALTER TABLE trials ADD COLUMN IF NOT EXISTS same_as VARCHAR",  # 3: twins share one training
    "3": LIVE_SCHEMA,  # 4: training-loss curves and running trials' progress
}

# layer_profiles: analyses of trained models (archsearch inspect), one row per layer or
# setting and metric.
SCHEMA = """
CREATE TABLE IF NOT EXISTS layer_profiles (
    trial_id VARCHAR, analysis VARCHAR, setting JSON, layer INTEGER, metric VARCHAR, value DOUBLE,
    code_version VARCHAR, created_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS studies (
    name VARCHAR PRIMARY KEY, path VARCHAR, config JSON, code_version VARCHAR,
    created_at TIMESTAMPTZ, updated_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS trials (
    trial_id VARCHAR PRIMARY KEY, family VARCHAR, axes JSON, seed INTEGER,
    match VARCHAR, target DOUBLE, params BIGINT, total_params BIGINT,
    flops_per_token DOUBLE, match_error DOUBLE, achieved DOUBLE, state BIGINT, d_model INTEGER,
    num_layers INTEGER, sweep_group VARCHAR, sweep_best BOOLEAN,
    spec JSON, recipe JSON, data JSON,
    status VARCHAR, attempts INTEGER DEFAULT 0, error VARCHAR,
    train_loss DOUBLE, val_loss DOUBLE, val_accuracy DOUBLE, steps BIGINT, tokens BIGINT,
    wall_time_s DOUBLE, tokens_per_s DOUBLE,
    code_version VARCHAR, created_at TIMESTAMPTZ, finished_at TIMESTAMPTZ, same_as VARCHAR);
CREATE TABLE IF NOT EXISTS study_versions (
    study VARCHAR, version INTEGER, config_hash VARCHAR, config JSON, text VARCHAR, code_version VARCHAR,
    created_at TIMESTAMPTZ, PRIMARY KEY (study, version));
CREATE TABLE IF NOT EXISTS study_trials (
    study VARCHAR, trial_id VARCHAR, PRIMARY KEY (study, trial_id));
CREATE TABLE IF NOT EXISTS search_proposals (
    study VARCHAR, number INTEGER, point JSON, trial_ids JSON, objectives JSON, "values" JSON,
    state VARCHAR, finished_at TIMESTAMPTZ, PRIMARY KEY (study, number));
CREATE TABLE IF NOT EXISTS trial_rungs (
    trial_id VARCHAR, rung INTEGER, fraction DOUBLE, steps BIGINT, tokens BIGINT, val_loss DOUBLE,
    val_accuracy DOUBLE, finished_at TIMESTAMPTZ, PRIMARY KEY (trial_id, rung));
CREATE TABLE IF NOT EXISTS fidelity_ladders (
    study VARCHAR PRIMARY KEY, points INTEGER, spearman DOUBLE, low DOUBLE, high DOUBLE, finished_at TIMESTAMPTZ);
CREATE TABLE IF NOT EXISTS metrics (
    trial_id VARCHAR, step BIGINT, tokens BIGINT, train_loss DOUBLE, val_loss DOUBLE, val_accuracy DOUBLE,
    lr DOUBLE, loop_fraction DOUBLE, loop_time_ratio DOUBLE,
    PRIMARY KEY (trial_id, step));
""" + LIVE_SCHEMA


# The generalisation gap at the end of training, a column of every trials read: the last
# evaluation's validation loss minus the training loss beside it, the mean objective of the
# last 10 training steps (memory arms with aux and exit-gate models: their auxiliary terms
# included). Computed, not stored, so stores written before it have it too.
GEN_GAP = "val_loss - train_loss AS gen_gap"

# Every table of the store, in the order export writes them.
TABLES = ("studies", "study_versions", "trials", "study_trials", "metrics", "train_points", "trial_rungs",
          "search_proposals", "fidelity_ladders", "layer_profiles")

# the column order of the rows that add_trials and finish write
TRIAL_COLUMNS = ["trial_id", "family", "axes", "seed", "match", "target", "params", "total_params",
                 "flops_per_token", "match_error", "achieved", "state", "d_model", "num_layers", "sweep_group", "spec",
                 "recipe", "data", "status", "code_version", "created_at", "same_as"]
METRIC_COLUMNS = ["trial_id", "step", "tokens", "train_loss", "val_loss", "val_accuracy", "lr", "loop_fraction",
                  "loop_time_ratio"]
