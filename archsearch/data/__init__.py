"""Data sources: text corpora, synthetic tasks and mixes of them, one protocol."""

from __future__ import annotations

import dataclasses

from archsearch.data._base import IGNORE, Batch, Source
from archsearch.errors import SpecError, did_you_mean


def make_source(data: dict) -> Source:
    """The Source a study's (dumped) data config describes."""
    kind = data["kind"]
    if kind == "text":
        from archsearch.data.text import open_text

        return open_text(data)
    if kind == "mqar":
        from archsearch.data.synthetic import MQAR

        return MQAR(seq_len=data["seq_len"], vocab_size=data["vocab_size"], num_pairs=data["num_pairs"])
    if kind == "task":
        return task_source(data)
    if kind == "mix":
        from archsearch.data.mix import Mix

        return Mix(sources=[make_source(part["source"]) for part in data["sources"]],
                   weights=[part["weight"] for part in data["sources"]], labels=_mix_labels(data))
    raise ValueError(f"unknown data kind {kind!r}")


def task_source(data: dict) -> Source:
    """The synthetic task a dumped ``TaskData`` names, built with its params (cheap: no data is drawn)."""
    from archsearch.data.synthetic import TASKS

    name, params = data["name"], data.get("params") or {}
    if name not in TASKS:
        raise SpecError(f"unknown task {name!r}", field="data.name",
                        hint=did_you_mean(name, TASKS) or f"one of {', '.join(TASKS)}")
    task = TASKS[name]
    types = {f.name: f.type for f in dataclasses.fields(task)}
    for key, value in params.items():
        if key not in types:
            raise SpecError(f"task {name!r} has no parameter {key!r}", field=f"data.params.{key}",
                            hint=did_you_mean(key, types) or f"allowed: {', '.join(types)}")
        _check_param(name, key, value, types[key])
    try:
        return task(**params)
    except ValueError as err:
        raise SpecError(str(err), field="data.params", hint=f"fix the parameters of task {name!r}") from None


# Task parameters are checked as the schema checks its own fields: no text for
# numbers, and sizes a machine can hold.
_PARAM_LIMITS = {"seq_len": 1 << 16, "seed": 2**31 - 1}
_PARAM_LIMIT = 1 << 20


def _check_param(task: str, key: str, value, type_name: str) -> None:
    field = f"data.params.{key}"
    if type_name == "bool":
        if not isinstance(value, bool):
            raise SpecError(f"task {task!r} takes true or false for {key!r}, got {value!r}", field=field,
                            hint="write true or false without quotes")
        return
    numeric = (int,) if type_name == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, numeric):
        what = "a whole number" if type_name == "int" else "a number"
        raise SpecError(f"task {task!r} takes {what} for {key!r}, got {value!r}", field=field,
                        hint="write the number without quotes" if isinstance(value, str) else f"write {what}")
    limit = _PARAM_LIMITS.get(key, _PARAM_LIMIT)
    if type_name == "int" and abs(value) > limit:
        raise SpecError(f"task {task!r} takes {key!r} up to {limit:,}, got {value:,}", field=field,
                        hint="use a smaller value")


def vocab_size_of(data: dict) -> int:
    """The vocabulary a dumped data config implies, without reading or drawing any data.

    Text: 256 bytes, or the configured BPE size. A task: its class's. A mix:
    the one its sources share (a SpecError when they differ).
    """
    kind = data["kind"]
    if kind == "text":
        from archsearch.space.training import BYTE_VOCAB, DEFAULT_BPE_VOCAB

        return (data.get("vocab_size") or DEFAULT_BPE_VOCAB) if data.get("tokenizer") == "bpe" else BYTE_VOCAB
    if kind == "mqar":
        return data["vocab_size"]
    if kind == "task":
        return task_source(data).vocab_size
    if kind == "mix":
        from archsearch.data.mix import check_one_vocab

        return check_one_vocab([vocab_size_of(part["source"]) for part in data["sources"]], _mix_labels(data))
    raise ValueError(f"unknown data kind {kind!r}")


def seq_len_of(data: dict) -> int:
    """The sequence length a dumped data config trains on, without reading or drawing any data.

    A task's comes from its class, the one place that knows its default (Mano
    derives it from max_ops); a mix's is its longest source's.
    """
    kind = data["kind"]
    if kind == "task":
        return task_source(data).seq_len
    if kind == "mix":
        return max(seq_len_of(part["source"]) for part in data["sources"])
    return data["seq_len"]


def _mix_labels(data: dict) -> list[str]:
    labels = []
    for index, part in enumerate(data["sources"]):
        source = part["source"]
        what = source.get("name") or source.get("tokenizer") or ""
        labels.append(f"sources[{index}] ({source['kind']} {what})".replace(" )", ")"))
    return labels


__all__ = ["IGNORE", "Batch", "Source", "make_source", "seq_len_of", "task_source", "vocab_size_of"]
