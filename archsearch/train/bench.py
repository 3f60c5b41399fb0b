"""Time a training step of planned architectures: tokens/s, MFU, peak memory, kernels on or off,
and the same configuration in Hugging Face transformers where an equivalent exists.

Every configuration is timed in the same process, in interleaved rounds (one step of each
configuration per round, the median over rounds reported), so a noisy machine slows them all
alike and the ratios between them hold. MFU is measured against a bare square matmul timed
the same way, with the same threads and dtype, in the same rounds: the fraction of what this
machine's matmul reaches right now, not of a datasheet figure. Each archsearch row with a Hugging
Face twin also gets the median over rounds of the twin's step time over its own in the same
round, the ratio a slow spell disturbs least.

With `compile_backend` (a torch.compile backend: "inductor", or "eager" / "aot_eager" to check the
tracing alone), each archsearch configuration is timed a second time as ``torch.compile(model)``,
as ``recipe.compile`` trains it; its first step, which compiles, is run before the rounds and
reported apart.

A training step is forward, backward and an AdamW update on one random batch of the trial's
batch size and sequence length (timings do not depend on the tokens). FLOPs per token are the
planner's training count (3x the forward, head included).
Dimensions: B batch, T time, V vocabulary.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec
from archsearch.data import Batch
from archsearch.train.loop import training_loss

MATMUL_SIZE = {"cpu": 1024, "cuda": 8192}
# torch.compile backends worth timing: inductor generates code; the others only trace (eager
# replays the captured graph, aot_eager also the traced backward), to tell the two costs apart
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


@dataclass(frozen=True)
class BenchRow:
    """One configuration's timings (medians over rounds)."""

    trial: int  # index in the study's plan
    trial_id: str
    family: str
    impl: str  # archsearch | hf-llama | hf-mamba | hf-gdn-rule (this model, transformers' chunked rule)
    kernels: str  # on (Triton on CUDA, C++ on a CPU, where the op has one) | off (PyTorch) | - (transformers)
    compile: str  # the torch.compile backend, or - (eager)
    params: int  # every parameter of the built model
    step_ms: float
    tokens_per_s: float
    mfu: float  # achieved training FLOP/s over the bare matmul's
    peak_mb: float  # CUDA: max allocated in a step; CPU: weights, grads, AdamW moments and saved activations
    compile_s: float  # the first step's time beyond a timed step's (tracing and code generation); 0 eager
    vs_hf: float | None  # median over rounds of the HF twin's step time over this row's; None without a twin

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Config:
    row: dict  # BenchRow fields but the timings
    model: torch.nn.Module
    step: Callable[[], None]
    tokens: int
    flops: float  # training FLOPs of one step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _archsearch_step(model: torch.nn.Module, batch: Batch, setting: str, autocast: bool) -> Callable[[], None]:
    from archsearch_kernels import dispatch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    device_type = batch.inputs.device.type

    def step() -> None:
        with dispatch.forced(setting), torch.autocast(device_type, torch.bfloat16, enabled=autocast):
            loss = training_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _hf_step(model: torch.nn.Module, batch: Batch, autocast: bool) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    device_type = batch.inputs.device.type

    def step() -> None:
        with torch.autocast(device_type, torch.bfloat16, enabled=autocast):
            loss = model(input_ids=batch.inputs, labels=batch.targets).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _transformers_gated_delta_rule(q, k, v, g, beta, *, initial_state=None, return_last_state=False):
    """transformers' pure-PyTorch `torch_chunk_gated_delta_rule` behind this repo's rule signature."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    # transformers scales q by K^-1/2 itself; Gated DeltaNet hands the rule q already scaled
    o, state = torch_chunk_gated_delta_rule(q * q.shape[-1] ** 0.5, k, v, g, beta, initial_state=initial_state,
                                            output_final_state=return_last_state)
    return (o, state) if return_last_state else o


def hf_equivalent(spec: ArchSpec, seq_len: int) -> tuple[str, torch.nn.Module] | None:
    """The transformers model with this spec's configuration, or None when there is none
    (transformers missing, a hybrid, a structure other than the plain stack, uneven widths).

    transformers has no Gated DeltaNet model of this layout, only the chunked rule inside
    Qwen3-Next: a Gated DeltaNet stack comes back as this repo's model (built from the global
    seed, like ours) with that function as every layer's rule ("hf-gdn-rule"), trained as ours."""
    try:
        import transformers
    except ImportError:
        return None
    layers = spec.layers
    if spec.structure != "stack" or len({(lay.mixer, lay.mlp, lay.mlp_width) for lay in layers}) != 1:
        return None
    layer = layers[0]
    if layer.mixer == "attention" and layer.mlp == "swiglu" and not layer.options:
        config = transformers.LlamaConfig(
            vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=layer.mlp_width,
            num_hidden_layers=len(layers), num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads,
            max_position_embeddings=seq_len, rms_norm_eps=spec.norm_eps, rope_theta=spec.rope_theta,
            tie_word_embeddings=spec.tie_embeddings, attention_bias=False, mlp_bias=False)
        return "hf-llama", transformers.LlamaForCausalLM(config)
    if layer.mixer == "mamba" and layer.mlp == "none":
        from archsearch.arch.blocks.mamba import sizes

        s = sizes(spec, layer)
        config = transformers.MambaConfig(
            vocab_size=spec.vocab_size, hidden_size=spec.d_model, state_size=s.state, num_hidden_layers=len(layers),
            expand=s.inner // spec.d_model, conv_kernel=s.conv, time_step_rank=s.dt_rank, use_bias=False,
            use_conv_bias=True, layer_norm_epsilon=spec.norm_eps, tie_word_embeddings=spec.tie_embeddings)
        return "hf-mamba", transformers.MambaForCausalLM(config)
    if layer.mixer == "gated_deltanet" and layer.options.get("scan", "chunked") == "chunked":
        from archsearch.arch.blocks.gated_deltanet import GatedDeltaNet

        model = build_model(spec)
        for module in model.modules():
            if isinstance(module, GatedDeltaNet):
                module.rule = _transformers_gated_delta_rule
        return "hf-gdn-rule", model
    return None


def _configs(trials: list, indices: list[int], *, device: torch.device, kernels: list[str], compare_hf: bool,
             autocast: bool, batch_size: int | None, compile_backend: str | None) -> list[_Config]:
    configs = []
    generator = torch.Generator().manual_seed(0)
    for index in indices:
        trial = trials[index]
        seq_len, batch = trial.data["seq_len"], batch_size or trial.recipe["batch_size"]
        tokens_BT = torch.randint(0, trial.spec.vocab_size, (batch, seq_len + 1), generator=generator).to(device)
        data = Batch(inputs=tokens_BT[:, :-1], targets=tokens_BT[:, 1:])
        flops = trial.flops_per_token * batch * seq_len
        base = dict(trial=index, trial_id=trial.trial_id, family=trial.spec.family)
        for setting, backend in itertools.product(kernels, ["-"] + ([compile_backend] if compile_backend else [])):
            torch.manual_seed(trial.seed)
            model = build_model(trial.spec).to(device)
            mode = "auto" if setting == "on" else "reference"  # on: as a trial runs (preflight's turn-offs kept)
            # the compiled module shares the model's parameters, as in the training loop
            forward = model if backend == "-" else torch.compile(model, backend=backend)
            configs.append(_Config(row=dict(base, impl="archsearch", kernels=setting, compile=backend,
                                            params=_count(model)),
                                   model=model, step=_archsearch_step(forward, data, mode, autocast),
                                   tokens=batch * seq_len, flops=flops))
        torch.manual_seed(trial.seed)
        hf = hf_equivalent(trial.spec, seq_len) if compare_hf else None
        if hf is not None:
            impl, model = hf
            model = model.to(device)
            step = (_archsearch_step(model, data, "reference", autocast) if impl == "hf-gdn-rule"
                    else _hf_step(model, data, autocast))
            configs.append(_Config(row=dict(base, impl=impl, kernels="-", compile="-", params=_count(model)),
                                   model=model, step=step, tokens=batch * seq_len, flops=flops))
    return configs


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _matmul_step(device: torch.device, dtype: torch.dtype) -> tuple[Callable[[], None], float]:
    n = MATMUL_SIZE[device.type]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return (lambda: a @ b), 2.0 * n**3


def _cpu_step_mb(model: torch.nn.Module, step: Callable[[], None]) -> float:
    """What one training step holds at its peak, on a CPU: the weights with their gradients and
    AdamW's two moments, plus every tensor saved for the backward (counted once per storage,
    weights left out). The process's peak RSS cannot tell interleaved configurations apart, and
    the saved activations are what the kernels change (the fused loss saves no logits)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    state = sum(4 * p.numel() * p.element_size() for p in model.parameters())
    return (state + sum(saved.values())) / 2**20


def _timed(step: Callable[[], None], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    step()
    _sync(device)
    return time.perf_counter() - start


def _vs_hf(configs: list[_Config], times: list[list[float]], i: int) -> float | None:
    """The median over rounds of the HF twin's step time over configuration i's, round by round."""
    row = configs[i].row
    if row["impl"] != "archsearch":
        return None
    twins = [j for j, config in enumerate(configs)
             if config.row["trial"] == row["trial"] and config.row["impl"].startswith("hf-")]
    if not twins:
        return None
    return statistics.median(theirs / ours for theirs, ours in zip(times[twins[0]], times[i]))


def _cpu_kernel_ops(trials: list, indices: list[int]) -> tuple[list[str], list[str]]:
    """The ops of these trials with a C++ kernel for CPU tensors: those that built here and
    passed their check (building them on first call), and why each of the others did not."""
    from archsearch.arch.kernel_ops import kernels_used
    from archsearch_kernels import dispatch

    ops = [op for op in kernels_used(trials[i].spec for i in indices) if op in dispatch.CPU_KERNELS]
    built = [op for op in ops if dispatch.CPU_KERNELS[op].available()]
    return built, [f"{op}: {dispatch.CPU_KERNELS[op].build_error()}" for op in ops if op not in built]


def bench_trials(trials: list, indices: list[int], *, rounds: int = 5, warmup: int = 1, kernels: list[str] | None = None,
                 compare_hf: bool = True, threads: int | None = None, device: str | None = None,
                 batch_size: int | None = None, compile_backend: str | None = None) -> dict:
    """Time a training step of ``trials[i]`` for each i in `indices`; returns
    {"device", "threads", "dtype", "matmul_tflops", "rows": [BenchRow dicts]}.

    `kernels`: which of "on" (what a trial runs: Triton on CUDA, the C++ kernels on a CPU where
    they build) / "off" (the PyTorch paths) to time; default both on CUDA, and on a CPU both when a
    trial runs an op with a C++ kernel, "off" otherwise. bf16 autocast on CUDA, fp32 on a CPU (the matmul likewise).
    `compile_backend`: a torch.compile backend; each archsearch configuration is also timed compiled.
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if threads is not None:
        torch.set_num_threads(threads)
    built, not_built = _cpu_kernel_ops(trials, indices) if dev.type == "cpu" else ([], [])
    kernels = kernels or (["on", "off"] if dev.type == "cuda" or built else ["off"])
    if "on" in kernels and dev.type == "cpu" and not built:
        why = f" ({'; '.join(not_built)})" if not_built else ""
        raise ValueError(f"bench: --kernels on on a CPU times the compiled C++ kernels, and none that these trials "
                         f"run builds here{why}; use --kernels off, or a CUDA device for the Triton kernels")
    if compile_backend is not None and compile_backend not in COMPILE_BACKENDS:
        raise ValueError(f"bench: --compile {compile_backend!r}: choose one of {', '.join(COMPILE_BACKENDS)}")
    autocast = dev.type == "cuda"
    dtype = torch.bfloat16 if autocast else torch.float32
    configs = _configs(trials, indices, device=dev, kernels=kernels, compare_hf=compare_hf, autocast=autocast,
                       batch_size=batch_size, compile_backend=compile_backend)
    matmul, matmul_flops = _matmul_step(dev, dtype)
    steps = [matmul] + [config.step for config in configs]
    times: list[list[float]] = [[] for _ in steps]
    peaks = [0.0] * len(steps)
    # a compiled configuration compiles in its first step, kept out of the rounds
    first = [_timed(config.step, dev) if config.row["compile"] != "-" else 0.0 for config in configs]
    if dev.type == "cpu":  # one untimed step each, counted (the hook would slow a timed one)
        peaks[1:] = [_cpu_step_mb(config.model, config.step) for config in configs]
    for round_index in range(warmup + rounds):
        for i, step in enumerate(steps):
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            took = _timed(step, dev)
            if round_index >= warmup:
                times[i].append(took)
            if dev.type == "cuda":
                peaks[i] = max(peaks[i], torch.cuda.max_memory_allocated(dev) / 2**20)
    peak_flops = matmul_flops / statistics.median(times[0])
    rows = []
    for i, (config, took, peak) in enumerate(zip(configs, times[1:], peaks[1:])):
        seconds = statistics.median(took)
        rows.append(BenchRow(**config.row, step_ms=1e3 * seconds, tokens_per_s=config.tokens / seconds,
                             mfu=config.flops / seconds / peak_flops, peak_mb=peak,
                             compile_s=max(0.0, first[i] - seconds) if config.row["compile"] != "-" else 0.0,
                             vs_hf=_vs_hf(configs, times[1:], i)).to_dict())
    return dict(device=str(dev), threads=torch.get_num_threads(), dtype=str(dtype).removeprefix("torch."),
                matmul_tflops=peak_flops / 1e12, rounds=rounds, compile=compile_backend or "-", rows=rows)


__all__ = ["COMPILE_BACKENDS", "BenchRow", "bench_trials", "hf_equivalent"]
