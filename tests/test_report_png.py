"""`archsearch report --png DIR`: every figure of the report written as a PNG
by kaleido in headless Chromium, on a store written by hand (no Ray), and
the one-line errors when kaleido or the browser is missing.

Planted mutations this catches: writing the PNGs at plotly's default size
(700 x 500) instead of the report's figure box fails the dimension check
(tried); letting kaleido's RuntimeError through fails the one-line test."""

from __future__ import annotations

import builtins
import os
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from tests.analysis_support import one_line_error
from tests.dashboard_support import write_store

CHROMIUM = os.environ.get("BROWSER_PATH") or shutil.which("chromium") or "/usr/bin/chromium"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; fails on anything that is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs chromium (apt-get install chromium)")
def test_report_png_writes_every_view_at_the_report_size(tmp_path, monkeypatch):
    pytest.importorskip("kaleido")
    monkeypatch.setenv("BROWSER_PATH", CHROMIUM)
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "s.duckdb"
    write_store(store)
    result = CliRunner().invoke(app, ["report", "--store", str(store), "--png", "png"])
    assert result.exit_code == 0, result.output
    names = {p.stem for p in (tmp_path / "png").glob("*.png")}
    assert names == {"scaling", "comparison", "pareto", "parallel", "curves", "training", "plan"}
    # stdout names each file; what it is doing goes to stderr
    assert [line.split(": ", 1)[0] for line in result.stdout.splitlines()] == ["png"] * len(names)
    for path in (tmp_path / "png").glob("*.png"):
        assert png_size(path) == (1000, 520), path
        # a blank canvas of this size compresses to a few kB; a drawn figure is larger but stays small
        assert 10_000 < path.stat().st_size < 400_000, (path, path.stat().st_size)
    assert not (tmp_path / "reports").exists(), "--png alone writes no HTML report"


def _hide_kaleido(monkeypatch):
    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name == "kaleido" or name.startswith("kaleido."):
            raise ImportError(f"No module named {name!r}", name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)


def test_report_png_without_kaleido_is_one_line(tmp_path, monkeypatch):
    store = tmp_path / "s.duckdb"
    write_store(store)
    _hide_kaleido(monkeypatch)
    line = one_line_error("report", "--store", str(store), "--png", str(tmp_path / "png"))
    assert line == "error: PNG export needs kaleido: pip install 'archsearch[png]'"


@pytest.mark.slow
def test_report_png_without_a_browser_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("kaleido")
    store = tmp_path / "s.duckdb"
    write_store(store)
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chrome"))
    line = one_line_error("report", "--store", str(store), "--png", str(tmp_path / "png"))
    assert "PNG export needs Chrome or Chromium" in line and "BROWSER_PATH" in line
