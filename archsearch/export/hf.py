"""archsearch models as Hugging Face transformers models: which specs map, and how each weight moves.

Three layouts, each a config and a table of weights:

    spec (structure "stack", every layer alike)     transformers class
    attention + swiglu, one MLP width                LlamaForCausalLM
    mamba, no MLP                                     MambaForCausalLM
    mamba2, no MLP                                    Mamba2ForCausalLM

Any other spec (another structure, a hybrid, tapered MLP widths that differ per layer, a
Mamba with SwiGLU MLPs, an inner width that is not a whole multiple of d_model) has no
transformers class that computes the same function; ``why_not_hf`` says which rule it breaks.

Weight layouts (archsearch name -> transformers name, per layer i; D model width, K head dim,
F MLP width, E inner width):

Llama (prefix ``model.layers.i.``)
    mixer_norm.weight [D]          -> input_layernorm.weight
    mixer.wqkv.weight [3D, D]      -> self_attn.{q,k,v}_proj.weight, rows [0:D], [D:2D], [2D:3D];
                                      within each, head h is rows [hK:(h+1)K] in both
    mixer.wo.weight                -> self_attn.o_proj.weight
    mlp_norm.weight                -> post_attention_layernorm.weight
    mlp.gate_up.weight [2F, D]     -> mlp.gate_proj.weight rows [0:F], mlp.up_proj.weight rows [F:2F]
    mlp.down.weight                -> mlp.down_proj.weight
  Rotary: archsearch rotates the half-split pairs (x[:K/2], x[K/2:]) (archsearch_kernels/rope/naive.py), and
  Llama's ``rotate_half`` is cat(-x2, x1) over the same halves with inv_freq = theta^(-2i/K):
  the same rotation, so q and k rows move unpermuted (the permutation other converters apply
  is for Meta's interleaved checkpoints, which archsearch never makes).

Mamba (prefix ``backbone.layers.i.``)
    mixer_norm.weight              -> norm.weight
    mixer.in_proj.weight [2E, D]   -> mixer.in_proj.weight (x rows then the gate z, in both)
    mixer.conv.weight [E, 1, k]    -> mixer.conv1d.weight; mixer.conv.bias -> mixer.conv1d.bias
    mixer.x_proj.weight            -> mixer.x_proj.weight (dt, B, C rows, in both)
    mixer.dt_proj.weight           -> mixer.dt_proj.weight; mixer.dt_bias [E] -> mixer.dt_proj.bias
    mixer.A_log [E, N], mixer.D [E], mixer.out_proj.weight -> the same names (A = -exp(A_log) in both)

Mamba-2 (prefix ``backbone.layers.i.``)
    mixer_norm.weight              -> norm.weight
    mixer.in_proj.weight           -> mixer.in_proj.weight (z, then x B C, then dt, in both)
    mixer.conv.{weight,bias}       -> mixer.conv1d.{weight,bias} (channels x, B, C)
    mixer.norm_weight [E]          -> mixer.norm.weight (gate first, RMSNorm over each group's E/G)
    mixer.A_log, mixer.dt_bias, mixer.D [H], mixer.out_proj.weight -> the same names

Every family: embed.weight -> the embedding (``model.embed_tokens`` / ``backbone.embeddings``),
norm.weight -> the final norm (``model.norm`` / ``backbone.norm_f``), and ``lm_head.weight`` is
head.weight, or the embedding itself with ``tie_word_embeddings`` when the spec ties them. The
residuals stay in the model's dtype (``residual_in_fp32=False``), as archsearch keeps them.
Torch-free until a model is converted; transformers is imported only by ``to_transformers``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from archsearch.arch.spec import ArchSpec

# None: the token ids of archsearch's tokenizers are not transformers' defaults (Llama's bos 1)
NO_SPECIAL_TOKENS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


@dataclass(frozen=True)
class Layout:
    """One transformers class: its config from a spec, and the spec's weights renamed for it."""

    hf_class: str
    config: Callable[[ArchSpec, int], dict]  # (spec, max positions) -> the config's keyword arguments
    weights: Callable[[ArchSpec, dict], dict]  # (spec, archsearch state dict) -> transformers state dict


def _llama_config(spec: ArchSpec, max_positions: int) -> dict:
    return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, intermediate_size=spec.layers[0].mlp_width,
                num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                num_key_value_heads=spec.num_heads, head_dim=spec.head_dim, hidden_act="silu",
                max_position_embeddings=max_positions, rms_norm_eps=spec.norm_eps, rope_theta=spec.rope_theta,
                attention_bias=False, mlp_bias=False, tie_word_embeddings=spec.tie_embeddings,
                **NO_SPECIAL_TOKENS)


def _llama_weights(spec: ArchSpec, state: dict) -> dict:
    out = {"model.embed_tokens.weight": state["embed.weight"], "model.norm.weight": state["norm.weight"],
           "lm_head.weight": state["embed.weight" if spec.tie_embeddings else "head.weight"]}
    for i in range(spec.num_layers):
        ours, theirs = f"layers.{i}.", f"model.layers.{i}."
        q_DD, k_DD, v_DD = state[ours + "mixer.wqkv.weight"].chunk(3, dim=0)
        gate_FD, up_FD = state[ours + "mlp.gate_up.weight"].chunk(2, dim=0)
        out.update({
            theirs + "input_layernorm.weight": state[ours + "mixer_norm.weight"],
            theirs + "self_attn.q_proj.weight": q_DD,
            theirs + "self_attn.k_proj.weight": k_DD,
            theirs + "self_attn.v_proj.weight": v_DD,
            theirs + "self_attn.o_proj.weight": state[ours + "mixer.wo.weight"],
            theirs + "post_attention_layernorm.weight": state[ours + "mlp_norm.weight"],
            theirs + "mlp.gate_proj.weight": gate_FD,
            theirs + "mlp.up_proj.weight": up_FD,
            theirs + "mlp.down_proj.weight": state[ours + "mlp.down.weight"],
        })
    return out


def _mamba_config(spec: ArchSpec, max_positions: int) -> dict:
    from archsearch.arch.blocks.mamba_counts import sizes

    s = sizes(spec, spec.layers[0])
    return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, state_size=s.state,
                num_hidden_layers=spec.num_layers, layer_norm_epsilon=spec.norm_eps, expand=s.inner // spec.d_model,
                conv_kernel=s.conv, time_step_rank=s.dt_rank, use_bias=False, use_conv_bias=True,
                hidden_act="silu", residual_in_fp32=False, tie_word_embeddings=spec.tie_embeddings,
                **NO_SPECIAL_TOKENS)


def _mamba2_config(spec: ArchSpec, max_positions: int) -> dict:
    from archsearch.arch.blocks.mamba2_counts import sizes

    s = sizes(spec, spec.layers[0])
    return dict(vocab_size=spec.vocab_size, hidden_size=spec.d_model, num_heads=s.heads, head_dim=s.head_dim,
                state_size=s.state, n_groups=s.groups, num_hidden_layers=spec.num_layers,
                layer_norm_epsilon=spec.norm_eps, expand=s.inner // spec.d_model, conv_kernel=s.conv,
                chunk_size=spec.layers[0].options.get("chunk_size", 64), use_bias=False, use_conv_bias=True,
                hidden_act="silu", residual_in_fp32=False, tie_word_embeddings=spec.tie_embeddings,
                **NO_SPECIAL_TOKENS)


# archsearch mixer name -> transformers mixer name, for both Mamba generations (others are equal)
_MAMBA_RENAMED = {"conv.weight": "conv1d.weight", "conv.bias": "conv1d.bias",
                  "dt_bias": "dt_proj.bias", "norm_weight": "norm.weight"}


def _mamba_weights(spec: ArchSpec, state: dict) -> dict:
    """Mamba and Mamba-2 alike: every mixer weight keeps its name but those in ``_MAMBA_RENAMED``.
    Mamba-2 keeps ``dt_bias`` under its own name (its dt comes from in_proj, not a dt_proj)."""
    renamed = dict(_MAMBA_RENAMED)
    if spec.layers[0].mixer == "mamba2":
        renamed["dt_bias"] = "dt_bias"
    out = {"backbone.embeddings.weight": state["embed.weight"], "backbone.norm_f.weight": state["norm.weight"],
           "lm_head.weight": state["embed.weight" if spec.tie_embeddings else "head.weight"]}
    for i in range(spec.num_layers):
        ours, theirs = f"layers.{i}.", f"backbone.layers.{i}."
        out[theirs + "norm.weight"] = state[ours + "mixer_norm.weight"]
        for name, value in state.items():
            if name.startswith(ours + "mixer."):
                local = name[len(ours + "mixer."):]
                out[theirs + "mixer." + renamed.get(local, local)] = value
    return out


LAYOUTS = {"attention": Layout("LlamaForCausalLM", _llama_config, _llama_weights),
           "mamba": Layout("MambaForCausalLM", _mamba_config, _mamba_weights),
           "mamba2": Layout("Mamba2ForCausalLM", _mamba2_config, _mamba_weights)}


def why_not_hf(spec: ArchSpec) -> str | None:
    """Why no transformers class computes this spec's model, or None when one does."""
    if spec.structure != "stack":
        return f"its structure is {spec.structure!r}; transformers has plain stacks only"
    mixers = sorted({layer.mixer for layer in spec.layers})
    if len(mixers) > 1:
        return f"its layers mix {', '.join(mixers)}; a transformers class has one kind of layer"
    layer, mixer = spec.layers[0], mixers[0]
    if mixer not in LAYOUTS:
        return f"transformers has no model of {mixer!r} layers"
    if len({(lay.mlp, lay.mlp_width) for lay in spec.layers}) > 1:
        widths = sorted({lay.mlp_width for lay in spec.layers})
        return f"its MLP widths differ by layer ({', '.join(map(str, widths))}); transformers has one width"
    options = {key for key in layer.options if key not in ("scan", "chunk_size", "d_state", "expand", "head_dim",
                                                           "n_groups", "d_conv", "dt_rank")}
    if options:
        return f"its layers set {', '.join(sorted(options))}, which no transformers config has"
    if mixer == "attention":
        return None if layer.mlp == "swiglu" else f"its attention layers have a {layer.mlp!r} MLP; Llama's is SwiGLU"
    if layer.mlp != "none":
        return f"its {mixer} layers have a {layer.mlp} MLP; transformers' {mixer} layers have none"
    inner = _inner_width(spec)
    if inner % spec.d_model:
        return (f"its inner width {inner} is not a whole multiple of d_model {spec.d_model}, "
                "which transformers' integer expand needs")
    return None


def _inner_width(spec: ArchSpec) -> int:
    if spec.layers[0].mixer == "mamba":
        from archsearch.arch.blocks.mamba_counts import sizes
    else:
        from archsearch.arch.blocks.mamba2_counts import sizes
    return sizes(spec, spec.layers[0]).inner


def layout(spec: ArchSpec) -> Layout:
    """The transformers layout of a spec ``why_not_hf`` accepts."""
    reason = why_not_hf(spec)
    if reason is not None:
        raise ValueError(f"{spec.family}: not a transformers model: {reason}")
    return LAYOUTS[spec.layers[0].mixer]


def to_transformers(model, *, max_positions: int = 2048):
    """The transformers model computing what ``model`` (an archsearch model of a spec
    ``why_not_hf`` accepts) computes, with its weights, in eval mode.

    ``max_positions``: Llama's ``max_position_embeddings`` (RoPE has no limit of its own; the
    trial's sequence length is the honest value)."""
    import torch
    import transformers

    spec = model.spec
    chosen = layout(spec)
    config_class = getattr(transformers, chosen.hf_class.replace("ForCausalLM", "Config"))
    hf_model = getattr(transformers, chosen.hf_class)(config_class(**chosen.config(spec, max_positions)))
    state = {name: value.detach() for name, value in model.state_dict().items()}
    # strict: a weight the mapping leaves out, or one transformers does not have, is an error here
    with torch.no_grad():
        hf_model.load_state_dict(chosen.weights(spec, state), strict=True)
    return hf_model.to(next(model.parameters()).dtype).eval()
