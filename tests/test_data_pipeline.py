"""Text pipeline: files and hub rows -> documents -> split -> tokens -> cached memory maps; tasks and mixes."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from archsearch.data import make_source, seq_len_of, task_source, vocab_size_of
from archsearch.data import text as text_module
from archsearch.data import vocab_size_of as vocab_size
from archsearch.data.documents import file_documents, is_validation, text_files
from archsearch.data.synthetic import TASKS
from archsearch.data.tokenize import BpeTokenizer
from archsearch.errors import SpecError
from archsearch.space.training import TASK_NAMES, TextData

WORDS = "the quick brown fox jumps over a lazy dog while small models learn to count".split()
DOCS = [f"<doc {i:03d}> " + " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(60)) for i in range(48)]


def text_data(**fields) -> dict:
    return TextData(**{"seq_len": 16, **fields}).model_dump()


def write(folder, fmt: str, docs=DOCS, ids=None):
    """The documents as one folder of .txt files, one .jsonl, or one FineWeb-Edu-shaped .parquet."""
    folder.mkdir(exist_ok=True)
    ids = ids or [f"<urn:uuid:{i:04d}>" for i in range(len(docs))]
    if fmt == "txt":
        for i, doc in enumerate(docs):
            (folder / f"d{i:03d}.txt").write_text(doc)
        return folder
    if fmt == "jsonl":
        path = folder / "docs.jsonl"
        path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for d, i in zip(docs, ids)))
        return path
    path = folder / "docs.parquet"
    # FineWeb-Edu's columns (a subset): the text, its id, and the classifier's score.
    pq.write_table(pa.table({"text": docs, "id": ids, "score": [3.0] * len(docs)}), path)
    return path


def split_text(source) -> tuple[str, str]:
    return tuple(source.tokenizer.decode(source.splits[s][:].tolist()) for s in ("train", "val"))


@pytest.mark.parametrize("fmt", ["txt", "jsonl", "parquet"])
def test_every_format_reads_every_document_into_exactly_one_split(tmp_path, fmt):
    path = write(tmp_path / "corpus", fmt)
    names = [doc.name for doc in file_documents(text_files([str(path)]))]
    assert len(names) == len(set(names)) == len(DOCS)
    train, val = split_text(make_source(text_data(paths=[str(path)], val_fraction=0.25)))
    for doc in DOCS:
        assert (doc in train) != (doc in val)
    assert 0 < len(val) < len(train)


def test_a_missing_text_field_names_the_columns(tmp_path):
    path = write(tmp_path / "corpus", "parquet")
    with pytest.raises(SpecError, match="no column 'content'.*text, id, score"):
        make_source(text_data(paths=[str(path)], text_field="content"))


def test_bpe_trained_locally_round_trips_text():
    tokenizer = BpeTokenizer.train(DOCS, vocab_size=320)
    for text in [DOCS[5], "café naïve — 😀\n\ttabs  and  spaces", "words it never saw: zyxwv"]:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        assert max(ids) < 320
    assert len(tokenizer.encode(DOCS[5])) < len(DOCS[5].encode()) / 2  # it learned merges


def test_bpe_sees_only_the_train_split(tmp_path, monkeypatch):
    seen = []
    real = BpeTokenizer.train.__func__
    monkeypatch.setattr(BpeTokenizer, "train", classmethod(lambda cls, texts, **kw: seen.extend(texts)
                                                           or real(cls, texts, **kw)))
    path = write(tmp_path / "corpus", "jsonl")
    source = make_source(text_data(paths=[str(path)], tokenizer="bpe", vocab_size=300, cache_dir=str(tmp_path)))
    train, val = split_text(source)
    assert seen and all(text in train and text not in val for text in seen)
    assert source.vocab_size == 300 and int(source.splits["train"].max()) < 300


def test_the_cache_is_reused_and_keyed_by_tokenizer(tmp_path, monkeypatch):
    builds = []
    real_build = text_module._build
    monkeypatch.setattr(text_module, "_build", lambda data, folder: builds.append(folder) or real_build(data, folder))
    path = write(tmp_path / "corpus", "parquet")
    bpe = text_data(paths=[str(path)], tokenizer="bpe", vocab_size=300, cache_dir=str(tmp_path / "cache"))
    first = make_source(bpe)
    mtime = os.stat(first.splits["train"].filename).st_mtime_ns
    second = make_source(bpe)
    assert len(builds) == 1, "the second construction re-tokenized"
    assert isinstance(second.splits["train"], np.memmap)
    assert first.splits["train"].filename == second.splits["train"].filename
    assert os.stat(second.splits["train"].filename).st_mtime_ns == mtime
    other = make_source({**bpe, "tokenizer": "byte", "vocab_size": None})
    bigger = make_source({**bpe, "vocab_size": 320})
    files = {s.splits["train"].filename for s in (first, other, bigger)}
    assert len(builds) == 3 and len(files) == 3
    assert not list((tmp_path / "cache" / "tokens").glob(".*-*")), "a temporary folder was left behind"


def test_the_stdlib_and_byte_text_are_tokenized_once_per_machine(tmp_path, monkeypatch):
    """The built-in corpus and a byte-level corpus without cache_dir go to the token cache too:
    a second trial in this process reuses the source it opened; one in a fresh process (the
    process's sources forgotten) maps the same files, tokenizing nothing. Fails if open_text keeps
    byte-level text in memory again (no memmap), or if the process keeps no sources."""
    builds = []
    real_build = text_module._build
    monkeypatch.setattr(text_module, "_build", lambda data, folder: builds.append(folder) or real_build(data, folder))
    monkeypatch.setattr(text_module, "_OPENED", {})
    stdlib = text_data(max_bytes=20_000)
    files = text_data(paths=[str(write(tmp_path / "corpus", "txt"))])
    for data in (stdlib, files):
        first = make_source(data)
        assert isinstance(first.splits["train"], np.memmap)
        mtime = os.stat(first.splits["train"].filename).st_mtime_ns
        assert make_source(data) is first, "a worker's second trial opened its corpus again"
        text_module._OPENED.clear()  # as a fresh worker process on the same machine
        again = make_source({**data, "seq_len": 8})
        assert again.splits["train"].filename == first.splits["train"].filename
        assert os.stat(again.splits["train"].filename).st_mtime_ns == mtime
        assert np.array_equal(again.splits["val"], first.splits["val"])
    assert len(builds) == 2, "a corpus was tokenized twice"


def test_parallel_trials_tokenize_once_and_read_one_whole_cache(tmp_path, monkeypatch):
    builds = []
    real_build = text_module._build
    monkeypatch.setattr(text_module, "_build", lambda data, folder: builds.append(folder) or real_build(data, folder))
    path = write(tmp_path / "corpus", "jsonl")
    data = text_data(paths=[str(path)], tokenizer="bpe", vocab_size=300, cache_dir=str(tmp_path / "cache"))
    with ThreadPoolExecutor(max_workers=4) as pool:
        sources = list(pool.map(lambda _: make_source(data), range(4)))
    assert len(builds) == 1
    assert len({s.splits["train"].filename for s in sources}) == 1
    assert all(np.array_equal(s.splits["val"], sources[0].splits["val"]) for s in sources)


def test_an_edited_file_is_tokenized_again(tmp_path):
    folder = write(tmp_path / "corpus", "txt")
    data = text_data(paths=[str(folder)], cache_dir=str(tmp_path / "cache"))
    before = make_source(data).splits["train"].filename
    (folder / "d000.txt").write_text(DOCS[0] + " and one more sentence")
    assert make_source(data).splits["train"].filename != before


def test_the_split_is_by_document_id_whatever_the_order(tmp_path):
    ids = [f"<urn:uuid:{i:04d}>" for i in range(len(DOCS))]
    one = write(tmp_path / "one", "parquet", DOCS, ids)
    two = write(tmp_path / "two", "parquet", DOCS[::-1], ids[::-1])
    splits = [split_text(make_source(text_data(paths=[str(p)], id_field="id", val_fraction=0.3)))
              for p in (one, two, one)]
    assert splits[0] == splits[2]  # same corpus, same split
    for doc, doc_id in zip(DOCS, ids):
        in_val = is_validation(doc_id, 0.3)
        assert all((doc in val) == in_val and (doc in train) != in_val for train, val in splits)


@pytest.fixture
def offline_datasets(monkeypatch):
    datasets = pytest.importorskip("datasets")
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")
        monkeypatch.setattr(datasets.config, name, True)
    return datasets


def test_fineweb_edu_through_the_hub_loader_offline(tmp_path, monkeypatch, offline_datasets):
    """The real loader with FineWeb-Edu's settings, its rows served from a local parquet of the same schema."""
    local = write(tmp_path / "corpus", "parquet")
    calls, real = [], offline_datasets.load_dataset

    def load_dataset(name, config=None, **kwargs):
        calls.append((name, config, kwargs))
        return real("parquet", data_files=[str(local)], split=kwargs["split"], streaming=kwargs["streaming"])

    monkeypatch.setattr(offline_datasets, "load_dataset", load_dataset)
    hub = {"name": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT", "revision": "v1.2.0"}
    source = make_source(text_data(hub=hub, id_field="id", cache_dir=str(tmp_path / "cache")))
    assert calls == [("HuggingFaceFW/fineweb-edu", "sample-10BT",
                      {"split": "train", "streaming": True, "revision": "v1.2.0"})]
    from_files = make_source(text_data(paths=[str(local)], id_field="id"))
    assert split_text(source) == split_text(from_files)


def test_local_files_through_the_hub_loader_and_max_bytes_stops_the_stream(tmp_path, offline_datasets):
    local = write(tmp_path / "corpus", "parquet")
    data = text_data(hub={"name": "parquet", "data_files": [str(local)]}, max_bytes=2048,
                     cache_dir=str(tmp_path / "cache"))
    train, val = split_text(make_source(data))
    assert len((train + val).replace("\n", "").encode()) <= 2048  # the text, without separators
    assert DOCS[0] in train + val and DOCS[-1] not in train + val


def test_task_names_are_the_registry():
    assert set(TASK_NAMES) == set(TASKS)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_builds_and_the_planner_knows_its_vocab(name):
    data = {"kind": "task", "name": name, "params": {}}
    source = make_source(data)
    assert vocab_size(data) == source.vocab_size == TASKS[name]().vocab_size
    batch = source.batch(split="val", batch_size=2, generator=torch.Generator().manual_seed(0))
    assert int(batch.inputs.max()) < source.vocab_size and batch.inputs.shape == batch.targets.shape


def test_a_misspelt_task_or_parameter_says_what_was_meant(tiny_study):
    from archsearch.space import load_study

    study = yaml.safe_load(tiny_study.read_text())
    study["data"] = {"kind": "task", "name": "mqr", "params": {"num_pairs": 4}}
    tiny_study.write_text(yaml.safe_dump(study))
    with pytest.raises(SpecError, match="did you mean 'mqar'"):
        load_study(tiny_study)
    with pytest.raises(SpecError, match="did you mean 'num_pairs'"):
        task_source({"kind": "task", "name": "mqar", "params": {"num_pair": 4}})
    with pytest.raises(SpecError, match="seq_len"):
        task_source({"kind": "task", "name": "mqar", "params": {"seq_len": 8, "num_pairs": 4}})


def test_a_mix_draws_rows_by_weight_and_pads_shorter_ones(corpus):
    data = {"kind": "mix", "sources": [
        {"weight": 3.0, "source": text_data(paths=[str(corpus)], seq_len=24)},
        {"weight": 1.0, "source": {"kind": "task", "name": "mqar",
                                   "params": {"vocab_size": 256, "seq_len": 32, "num_pairs": 4}}}]}
    source = make_source(data)
    assert vocab_size(data) == source.vocab_size == 256 and source.seq_len == 32
    batch = source.batch(split="train", batch_size=400, generator=torch.Generator().manual_seed(0))
    assert batch.inputs.shape == batch.targets.shape == (400, 32)
    text_rows = (batch.targets[:, 24:] == -100).all(dim=1) & (batch.targets[:, :24] != -100).all(dim=1)
    assert 250 < int(text_rows.sum()) < 350  # 3 of 4 rows, in expectation


def test_a_mix_of_vocabularies_is_a_clear_error():
    data = {"kind": "mix", "sources": [{"weight": 1.0, "source": text_data()},
                                       {"weight": 1.0, "source": {"kind": "task", "name": "mano", "params": {}}}]}
    with pytest.raises(SpecError, match=r"share one vocabulary.*text byte\) has 256.*task mano\) has 48"):
        vocab_size(data)


def test_the_planner_knows_the_bpe_vocab_without_reading_text():
    assert vocab_size(text_data()) == 256
    assert vocab_size(text_data(tokenizer="bpe")) == 8192
    assert vocab_size_of(text_data(tokenizer="bpe", vocab_size=512, paths=["/nowhere"])) == 512


def test_a_study_can_plan_a_task(tiny_study):
    from archsearch import plan
    from archsearch.space import load_study

    study = yaml.safe_load(tiny_study.read_text())
    study["data"] = {"kind": "task", "name": "mano", "params": {"max_ops": 6}}
    tiny_study.write_text(yaml.safe_dump(study))
    loaded = load_study(tiny_study)
    assert seq_len_of(loaded.data.model_dump()) == 2 * 6 + 4
    trials = plan(loaded)
    assert trials and all(t.spec.vocab_size == TASKS["mano"](max_ops=6).vocab_size for t in trials)
