"""A local CPU run says when its first trials will compile the C++ CPU kernels, told from
torch's extension cache without importing torch; and says nothing once they are built."""

from __future__ import annotations

import pytest
from archsearch_kernels import cpu_cache

from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.execute import preflight

VERSION = "2.13.0+cpu"


def spec(mixer: str) -> ArchSpec:
    layer = LayerSpec(mixer=mixer, mlp="swiglu" if mixer == "attention" else "none", mlp_width=16)
    return ArchSpec(family="tiny", vocab_size=20, d_model=16, num_heads=2, layers=(layer,))


def fake_build(root, extension: str, *, nested: bool, suffix: str = "") -> None:
    name = cpu_cache.build_name(extension, "AVX2", VERSION)
    folder = root / "py311_cpu" / name if nested else root / name
    folder.mkdir(parents=True)
    (folder / f"{name}{suffix}.so").write_bytes(b"")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv("ARCHSEARCH_KERNELS", raising=False)
    monkeypatch.setattr(preflight, "_no_cuda_here", lambda: True)
    monkeypatch.setattr(cpu_cache.importlib.metadata, "version", lambda package: VERSION)
    return tmp_path


def test_a_build_is_found_right_under_the_root_or_under_torchs_per_python_folder(cache):
    assert not cpu_cache.is_built("elementwise")
    fake_build(cache, "elementwise", nested=False)
    assert cpu_cache.is_built("elementwise") and cpu_cache.is_built("elementwise", "AVX2")
    assert not cpu_cache.is_built("elementwise", "AVX512")  # another vector ISA's build is not this one
    assert not cpu_cache.is_built("elementwise", torch_version="2.14.0+cpu")
    fake_build(cache, "selective_scan", nested=True, suffix="_v1")  # a rebuild after a source change
    assert cpu_cache.is_built("selective_scan")


def test_the_note_names_what_will_compile_and_goes_once_it_is_built(cache):
    note = preflight.cpu_build_note([spec("attention")], address=None)
    assert note.startswith("note: the first trials compile archsearch's C++ CPU kernels (RMSNorm")
    assert "Mamba" not in note
    assert "Mamba's scan" in preflight.cpu_build_note([spec("mamba")], address=None)
    fake_build(cache, "elementwise", nested=True)
    assert preflight.cpu_build_note([spec("attention")], address=None) is None
    assert preflight.cpu_build_note([spec("mamba")], address=None) == (
        "note: the first trials compile archsearch's C++ CPU kernels (Mamba's scan) for this machine, once: "
        "they start about half a minute late")
    fake_build(cache, "selective_scan", nested=True)
    assert preflight.cpu_build_note([spec("mamba")], address=None) is None


def test_no_note_where_the_kernels_would_not_run_here(cache, monkeypatch):
    assert preflight.cpu_build_note(None, address="auto") is None  # a cluster's workers build their own
    monkeypatch.setenv("ARCHSEARCH_KERNELS", "reference")
    assert preflight.cpu_build_note(None, address=None) is None
    monkeypatch.setenv("ARCHSEARCH_KERNELS", "auto")
    monkeypatch.setattr(preflight, "_no_cuda_here", lambda: False)  # a CUDA torch: Triton, not C++
    assert preflight.cpu_build_note(None, address=None) is None


def test_the_cache_is_asked_for_the_name_the_extension_compiles_under():
    """After a real build (or load) in the default cache, `is_built` finds it for this ISA."""
    import torch
    from archsearch_kernels import cpu_build

    if not cpu_build.ELEMENTWISE.available("rms_norm"):
        pytest.skip("the C++ kernels do not build here")
    assert cpu_cache.is_built("elementwise", cpu_build.capability(), torch.__version__)
