"""The model of a Megatron job: its architecture (`ModelArgs`), `TransformerConfig`, layer spec and build.

`ModelArgs` names every field by its Megatron-LM dest. `model_args_for(values, hf_checkpoint)` combines the
spec's Megatron values with the checkpoint's `config.json`: a flag that is set wins, an unset one is filled
from the config, a set flag that disagrees with the config is an error naming both. "Set" means "differs from
Megatron-LM's default": the normalized spec carries every flag at its default, so a flag given explicitly at
its default value counts as unset (and the config's value is used).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.train.megatron.kernels import install_moe_permute_fusion, precompute_rope
from runtime.train.megatron.parallel import ParallelLayout

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "qwen3_moe")


@dataclass(frozen=True)
class ModelArgs:
    """A decoder-only transformer in Megatron-LM's terms (each field is the dest of its flag)."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int  # the tokenizer's (real) vocabulary
    max_position_embeddings: int
    padded_vocab_size: int | None = None  # None: `vocab_size` rounded up (see `padded_vocab`)
    make_vocab_size_divisible_by: int = 128
    rotary_base: float = 10000
    rotary_percent: float = 1.0
    use_rope_scaling: bool = False  # Llama 3.1 frequency scaling (factor `rope_scaling_factor`)
    rope_scaling_factor: float = 8.0
    norm_epsilon: float = 1e-5
    normalization: str = "RMSNorm"
    add_qkv_bias: bool = False
    add_bias_linear: bool = False
    qk_layernorm: bool = False
    untie_embeddings_and_output_weights: bool = True
    swiglu: bool = True
    position_embedding_type: str = "rope"
    # mixture of experts (num_experts None: dense)
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_aux_loss_coeff: float = 0.0
    moe_router_load_balancing_type: str = "aux_loss"
    moe_router_score_function: str = "softmax"
    moe_layer_freq: int | tuple[int, ...] = 1  # every Nth layer is MoE, or a 0/1 pattern per layer
    moe_router_pre_softmax: bool = False  # softmax over all experts before top-k (no renormalisation)
    moe_grouped_gemm: bool = False  # routed experts through torch's grouped GEMM (moe.GroupedGemmMLP)
    moe_token_dispatcher_type: str = "alltoall"  # Relax's (jobspec derives it: variable sequence lengths)
    model_type: str | None = None  # the Hugging Face `model_type` this came from (conversion needs it)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"--num-attention-heads {self.num_attention_heads} is not a multiple of "
                f"--num-query-groups {self.num_query_groups}"
            )

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def tied(self) -> bool:
        return not self.untie_embeddings_and_output_weights

    def padded_vocab(self, tp: int = 1) -> int:
        """Rows of the embedding / output layer: `padded_vocab_size`, else `vocab_size` rounded up to a
        multiple of `make_vocab_size_divisible_by * tp` (Megatron-LM's rule). Rows past `vocab_size` are
        zero after loading Hugging Face weights, so their logits are 0: mask them out of a softmax."""
        if self.padded_vocab_size is not None:
            if self.padded_vocab_size % tp:
                raise ValueError(
                    f"--padded-vocab-size {self.padded_vocab_size} is not divisible by "
                    f"--tensor-model-parallel-size {tp}"
                )
            return self.padded_vocab_size
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    def moe_layer_pattern(self) -> list[int]:
        """1 for an MoE layer, 0 for a dense one, per layer (all 0 for a dense model)."""
        if not self.is_moe:
            return [0] * self.num_layers
        if isinstance(self.moe_layer_freq, int):
            return [1 if i % self.moe_layer_freq == 0 else 0 for i in range(self.num_layers)]
        pattern = list(self.moe_layer_freq)
        if len(pattern) != self.num_layers:
            raise ValueError(f"--moe-layer-freq has {len(pattern)} entries for {self.num_layers} layers")
        return pattern

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelArgs:
        """The architecture of a Hugging Face `config.json` (Qwen2/2.5, Qwen3, Llama, Qwen3-MoE)."""
        return cls(**{name: value for name, (value, _) in _from_hf(config).items()})


# -- Hugging Face config.json -> ModelArgs fields --------------------------------------------------------------


def _rope(config: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """(rope theta, scaling parameters) from either transformers 4 (`rope_theta`, `rope_scaling`) or 5
    (`rope_parameters`) style."""
    params = dict(config.get("rope_parameters") or {})
    scaling = dict(config.get("rope_scaling") or {})
    theta = params.pop("rope_theta", None) or config.get("rope_theta") or 10000.0
    merged = {**scaling, **params}
    kind = merged.get("rope_type") or merged.get("type") or "default"
    return float(theta), {**merged, "rope_type": kind}


def _from_hf(config: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """ModelArgs field -> (value, the config.json key it came from)."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"config.json model_type {model_type!r} is not supported by the Megatron backend "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if config.get("use_sliding_window"):
        raise ValueError(
            f"config.json use_sliding_window: sliding-window attention ({model_type}) is not supported"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(
            f"config.json hidden_act {config.get('hidden_act')!r}: only silu (SwiGLU) is supported"
        )
    if config.get("mlp_bias"):
        raise ValueError("config.json mlp_bias: MLP biases are not supported")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    theta, rope = _rope(config)
    out: dict[str, tuple[Any, str]] = {
        "model_type": (model_type, "model_type"),
        "num_layers": (int(config["num_hidden_layers"]), "num_hidden_layers"),
        "hidden_size": (hidden, "hidden_size"),
        "ffn_hidden_size": (int(config["intermediate_size"]), "intermediate_size"),
        "num_attention_heads": (heads, "num_attention_heads"),
        "num_query_groups": (int(config.get("num_key_value_heads") or heads), "num_key_value_heads"),
        "kv_channels": (int(config.get("head_dim") or hidden // heads), "head_dim"),
        "vocab_size": (int(config["vocab_size"]), "vocab_size"),
        "max_position_embeddings": (int(config["max_position_embeddings"]), "max_position_embeddings"),
        "rotary_base": (theta, "rope_theta"),
        "norm_epsilon": (float(config.get("rms_norm_eps", 1e-6)), "rms_norm_eps"),
        "normalization": ("RMSNorm", "model_type"),
        "swiglu": (True, "hidden_act"),
        "position_embedding_type": ("rope", "model_type"),
        "add_bias_linear": (False, "model_type"),
        "untie_embeddings_and_output_weights": (
            not bool(config.get("tie_word_embeddings", False)),
            "tie_word_embeddings",
        ),
        "add_qkv_bias": (
            True if model_type == "qwen2" else bool(config.get("attention_bias", False)),
            "attention_bias" if model_type != "qwen2" else "model_type",
        ),
        "qk_layernorm": (model_type in ("qwen3", "qwen3_moe"), "model_type"),
    }
    if rope["rope_type"] == "llama3":
        expected = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        if any(float(rope.get(k, v)) != v for k, v in expected.items()):
            raise ValueError(
                f"config.json rope scaling {rope}: megatron-core implements llama3 scaling {expected}"
            )
        out["use_rope_scaling"] = (True, "rope_scaling")
        out["rope_scaling_factor"] = (float(rope.get("factor", 8.0)), "rope_scaling.factor")
    elif rope["rope_type"] != "default":
        raise ValueError(f"config.json rope type {rope['rope_type']!r} is not supported (default or llama3)")
    if model_type == "qwen3_moe":
        experts_key = "num_experts" if config.get("num_experts") is not None else "num_local_experts"
        layers = out["num_layers"][0]
        step = int(config.get("decoder_sparse_step", 1) or 1)
        dense = set(config.get("mlp_only_layers") or [])
        pattern = tuple(0 if (i in dense or (i + 1) % step) else 1 for i in range(layers))
        out.update(
            {
                "num_experts": (int(config[experts_key]), experts_key),
                "moe_router_topk": (int(config["num_experts_per_tok"]), "num_experts_per_tok"),
                "moe_ffn_hidden_size": (int(config["moe_intermediate_size"]), "moe_intermediate_size"),
                # top-k of the softmax renormalised == softmax over the top-k logits (Megatron's default)
                "moe_router_pre_softmax": (not bool(config.get("norm_topk_prob", False)), "norm_topk_prob"),
                "moe_layer_freq": (1 if all(pattern) else pattern, "decoder_sparse_step/mlp_only_layers"),
                "moe_aux_loss_coeff": (
                    float(config.get("router_aux_loss_coef", 0.0)),
                    "router_aux_loss_coef",
                ),
                "moe_router_score_function": ("softmax", "model_type"),
            }
        )
    return out


# -- spec values + config.json -> ModelArgs --------------------------------------------------------------------


# Megatron-LM's defaults of the architecture flags (3714d81), for processes where jobspec does not import (it
# needs pydantic, which a bare GPU image may lack); a test keeps this equal to jobspec's field defaults.
FALLBACK_DEFAULTS: dict[str, Any] = {
    "num_query_groups": 1,
    "make_vocab_size_divisible_by": 128,
    "rotary_base": 10000,
    "rotary_percent": 1.0,
    "use_rope_scaling": False,
    "rope_scaling_factor": 8.0,
    "norm_epsilon": 1e-5,
    "normalization": "LayerNorm",
    "add_qkv_bias": False,
    "add_bias_linear": True,
    "qk_layernorm": False,
    "untie_embeddings_and_output_weights": False,
    "swiglu": False,
    "position_embedding_type": "learned_absolute",
    "moe_router_topk": 2,
    "moe_aux_loss_coeff": 0.0,
    "moe_router_load_balancing_type": "aux_loss",
    "moe_router_score_function": "softmax",
    "moe_layer_freq": 1,
    "moe_router_pre_softmax": False,
    "moe_grouped_gemm": False,
    "moe_token_dispatcher_type": "allgather",
}
_FLAG_NAMES = {"add_bias_linear": "--disable-bias-linear"}


def _megatron_defaults() -> dict[str, tuple[Any, str]]:
    """dest -> (the value a normalized spec carries when the flag is not given, its flag): jobspec's field
    defaults when jobspec imports, else `FALLBACK_DEFAULTS`."""
    try:
        from jobspec.spec import FIELDS
    except ImportError:
        names = {f.name for f in dataclasses.fields(ModelArgs)}
        return {
            dest: (FALLBACK_DEFAULTS.get(dest), _FLAG_NAMES.get(dest, "--" + dest.replace("_", "-")))
            for dest in names
        }
    return {dest: (field.default, "--" + field.flag) for dest, field in FIELDS.items()}


def _scalar(value: Any) -> Any:
    """Megatron-LM takes some MoE knobs as one value per loss (`nargs="+"`); one value is that value."""
    if isinstance(value, list | tuple) and len(value) == 1:
        return value[0]
    return value


def _parse_moe_layer_freq(value: Any) -> int | tuple[int, ...]:
    if isinstance(value, int | tuple):
        return value
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    text = str(value).strip()
    if text.startswith("("):  # Megatron's "([1]*3+[0]*1)*3" form is a Python expression of lists
        raise ValueError(f"--moe-layer-freq {text!r}: give a list like [1,0,1,0] or an integer")
    parsed = json.loads(text)
    return tuple(int(v) for v in parsed) if isinstance(parsed, list) else int(parsed)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        return abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(a)))
    return a == b


def model_args_for(values: Mapping[str, Any], hf_checkpoint: str | Path | None = None) -> ModelArgs:
    """The job's architecture: the spec's Megatron values (by dest) over `hf_checkpoint`'s config.json."""
    defaults = _megatron_defaults()
    config: dict[str, Any] = {}
    if hf_checkpoint is not None:
        path = Path(hf_checkpoint) / "config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
    from_config = _from_hf(config) if config else {}

    def flag_value(dest: str) -> Any:
        value = _scalar(values.get(dest))
        if dest == "num_query_groups" and not values.get("group_query_attention"):
            return None  # Megatron-LM reads --num-query-groups only with --group-query-attention
        if dest == "max_position_embeddings" and value is not None and value == values.get("seq_length"):
            # jobspec derives it from --seq-length on the megatron backend (Relax's placeholder,
            # rule.megatron_sequence_length_placeholders): not a statement about the architecture
            return None
        if dest == "moe_layer_freq" and value is not None:
            value = _parse_moe_layer_freq(value)
        default = _scalar(defaults.get(dest, (None, ""))[0])
        if dest == "moe_layer_freq" and default is not None:
            default = _parse_moe_layer_freq(default)
        if value is None or _same(value, default):
            return None
        return value

    fields = {f.name: f for f in dataclasses.fields(ModelArgs)}
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name == "model_type":
            continue
        flag = flag_value(name)
        if flag is not None and name in from_config and not _same(flag, from_config[name][0]):
            hf_value, hf_key = from_config[name]
            megatron_flag = defaults.get(name, (None, "--" + name.replace("_", "-")))[1]
            raise ValueError(
                f"{megatron_flag} {flag!r} conflicts with {hf_key} {hf_value!r} in {hf_checkpoint}/config.json"
            )
        if flag is not None:
            kwargs[name] = flag
        elif name in from_config:
            kwargs[name] = from_config[name][0]
        elif values.get(name) is not None and field.default is not dataclasses.MISSING:
            value = _scalar(values[name])  # a Megatron-only knob at its default
            kwargs[name] = _parse_moe_layer_freq(value) if name == "moe_layer_freq" else value
    if "model_type" in from_config:
        kwargs["model_type"] = from_config["model_type"][0]
    if kwargs.get("ffn_hidden_size") is None and kwargs.get("hidden_size") is not None:
        kwargs["ffn_hidden_size"] = 4 * int(kwargs["hidden_size"])  # Megatron-LM's default
    if kwargs.get("kv_channels") is None and kwargs.get("hidden_size") and kwargs.get("num_attention_heads"):
        kwargs["kv_channels"] = int(kwargs["hidden_size"]) // int(kwargs["num_attention_heads"])
    if kwargs.get("num_query_groups") is None and kwargs.get("num_attention_heads"):
        kwargs["num_query_groups"] = int(kwargs["num_attention_heads"])
    if kwargs.get("max_position_embeddings") is None and values.get("seq_length"):
        kwargs["max_position_embeddings"] = int(values["seq_length"])
    missing = [
        defaults.get(n, (None, "--" + n.replace("_", "-")))[1]
        for n, f in fields.items()
        if f.default is dataclasses.MISSING and kwargs.get(n) is None
    ]
    if missing:
        raise ValueError(f"the model needs {', '.join(missing)} (set the flags or give --hf-checkpoint)")
    return ModelArgs(**kwargs)


# -- TransformerConfig ---------------------------------------------------------------------------------------


def _dtype(values: Mapping[str, Any]) -> torch.dtype:
    if values.get("bf16") and values.get("fp16"):
        raise ValueError("--bf16 and --fp16 are mutually exclusive")
    if values.get("bf16"):
        return torch.bfloat16
    if values.get("fp16"):
        return torch.float16
    return torch.float32


def transformer_config(args: ModelArgs, layout: ParallelLayout, *, values: Mapping[str, Any] | None = None):
    """megatron-core's `TransformerConfig` for `args` on `layout`, with precision (`bf16`/`fp16`, else fp32),
    dropout, init std, recompute and MoE router options from the spec's `values`. Fusions that need
    TransformerEngine / Apex are off; megatron's jit fusions (SwiGLU, bias-dropout-add) are on with CUDA
    only."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    values = dict(values or {})
    layout.check_layers(args.num_layers)
    if args.is_moe and args.moe_token_dispatcher_type == "flex" and not torch.cuda.is_available():
        raise ValueError("--moe-token-dispatcher-type flex (DeepEP) needs CUDA; use alltoall or allgather")
    dtype = _dtype(values)
    cuda = torch.cuda.is_available()
    known = {f.name for f in dataclasses.fields(TransformerConfig)}

    def get(dest: str, default: Any) -> Any:
        value = values.get(dest)
        return default if value is None else value

    kwargs: dict[str, Any] = {
        "num_layers": args.num_layers,
        "hidden_size": args.hidden_size,
        "ffn_hidden_size": args.ffn_hidden_size,
        "num_attention_heads": args.num_attention_heads,
        "num_query_groups": args.num_query_groups,
        "kv_channels": args.kv_channels,
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "virtual_pipeline_model_parallel_size": layout.vpp,
        "context_parallel_size": layout.cp,
        "expert_model_parallel_size": layout.ep,
        "expert_tensor_parallel_size": layout.expert_tp,
        "sequence_parallel": layout.sequence_parallel,
        "normalization": args.normalization,
        "layernorm_epsilon": args.norm_epsilon,
        "add_bias_linear": args.add_bias_linear,
        "add_qkv_bias": args.add_qkv_bias,
        "qk_layernorm": args.qk_layernorm,
        "gated_linear_unit": args.swiglu,
        "activation_func": torch.nn.functional.silu if args.swiglu else torch.nn.functional.gelu,
        "hidden_dropout": float(get("hidden_dropout", 0.1)),
        "attention_dropout": float(get("attention_dropout", 0.1)),
        "init_method_std": float(get("init_method_std", 0.02)),
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        "bf16": dtype is torch.bfloat16,
        "fp16": dtype is torch.float16,
        "use_cpu_initialization": not cuda,
        "perform_initialization": True,
        # TransformerEngine / Apex kernels are absent: their fusions stay off. Megatron's own jit-compiled
        # SwiGLU and bias-dropout-add fusions run on CUDA (on by default, as in Megatron-LM; the
        # --no-bias-swiglu-fusion / --no-bias-dropout-fusion flags turn them off), never on CPU.
        "gradient_accumulation_fusion": False,
        "bias_activation_fusion": cuda and args.swiglu and bool(get("bias_swiglu_fusion", True)),
        "masked_softmax_fusion": False,
        "persist_layer_norm": False,
        "bias_dropout_fusion": cuda and bool(get("bias_dropout_fusion", True)),
        "apply_rope_fusion": False,
        "attention_softmax_in_fp32": True,
        # With 2 pipeline ranks and interleaving, a rank sends activations and gradients to the same peer;
        # batched p2p posts them in an order the peer's receives do not match (measured on gloo: micro-
        # batches swap silently). Unbatched p2p orders sends and receives by rank parity.
        "batch_p2p_comm": not (layout.vpp is not None and layout.pp == 2),
    }
    granularity = values.get("recompute_granularity")
    if granularity is not None:
        kwargs["recompute_granularity"] = granularity
        if granularity == "full":
            kwargs["recompute_method"] = values.get("recompute_method") or "uniform"
            kwargs["recompute_num_layers"] = int(values.get("recompute_num_layers") or 1)
        modules = values.get("recompute_modules")
        if modules is not None:
            if "recompute_modules" not in known:
                raise ValueError("--recompute-modules is not supported by the installed megatron-core")
            kwargs["recompute_modules"] = modules.split() if isinstance(modules, str) else list(modules)
    if args.is_moe:
        kwargs.update(
            {
                "num_moe_experts": args.num_experts,
                "moe_router_topk": args.moe_router_topk,
                "moe_ffn_hidden_size": args.moe_ffn_hidden_size or args.ffn_hidden_size,
                "moe_shared_expert_intermediate_size": args.moe_shared_expert_intermediate_size,
                "moe_aux_loss_coeff": args.moe_aux_loss_coeff,
                "moe_router_load_balancing_type": args.moe_router_load_balancing_type,
                "moe_router_score_function": args.moe_router_score_function,
                "moe_layer_freq": list(args.moe_layer_pattern()),
                "moe_router_pre_softmax": args.moe_router_pre_softmax,
                # megatron's own grouped experts need TransformerEngine or the grouped_gemm package; ours are
                # chosen in the layer spec (`layer_spec`), so megatron's switch stays off
                "moe_grouped_gemm": False,
                "moe_token_dispatcher_type": args.moe_token_dispatcher_type,
            }
        )
        if values.get("moe_permute_fusion"):
            # TransformerEngine's permutation kernels, or ours bound in their place (kernels.py) before the
            # config is built: megatron refuses the flag while those names are empty
            install_moe_permute_fusion()
            kwargs["moe_permute_fusion"] = True
        router_dtype = values.get("moe_router_dtype")
        if router_dtype is not None:
            kwargs["moe_router_dtype"] = router_dtype
        scaling = values.get("moe_router_topk_scaling_factor")
        if scaling is not None:
            kwargs["moe_router_topk_scaling_factor"] = float(scaling)
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        raise ValueError(f"the installed megatron-core's TransformerConfig lacks {', '.join(unknown)}")
    config = TransformerConfig(**kwargs)
    # Megatron's rope fusion (on unless --no-rope-fusion): here `kernels.precompute_rope` fills megatron's
    # fused-RoPE hook on CUDA; --no-rope-fusion keeps megatron's own RoPE in every layer
    config._relax_rope_fusion = bool(get("apply_rope_fusion", True))
    return config


# -- layer spec and build ------------------------------------------------------------------------------------


class TorchNorm:
    """LayerNorm / RMSNorm for megatron's local spec (`config.normalization`), as megatron's
    `WrappedTorchNorm`, but usable with sequence parallelism: the weights are tagged `sequence_parallel`
    so that megatron's `finalize_model_grads` sums their gradients over the tensor-parallel group."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_: Any) -> torch.nn.Module:
        on_gpu = torch.cuda.is_available() and not config.use_cpu_initialization
        place = {"dtype": config.params_dtype, "device": torch.cuda.current_device() if on_gpu else "cpu"}
        if config.normalization == "RMSNorm":
            norm: torch.nn.Module = torch.nn.RMSNorm(hidden_size, eps=eps, **place)
        elif config.normalization == "LayerNorm":
            norm = torch.nn.LayerNorm(hidden_size, eps=eps, **place)
        else:
            raise ValueError(
                f"--normalization {config.normalization!r} is not supported (RMSNorm, LayerNorm)"
            )
        for param in norm.parameters():
            param.sequence_parallel = bool(config.sequence_parallel)
        return norm


def _with_local_modules(spec):
    """A copy of a local transformer-layer spec whose core attention is `SDPAttention` and whose norms are
    `TorchNorm`."""
    from megatron.core.transformer.identity_op import IdentityOp

    from runtime.train.megatron.attention import SDPAttention

    sub = spec.submodules
    attn = sub.self_attention
    attn_sub = attn.submodules
    qk_norm = {}
    for name in ("q_layernorm", "k_layernorm"):
        if getattr(attn_sub, name, IdentityOp) is not IdentityOp:
            qk_norm[name] = TorchNorm
    attn = dataclasses.replace(
        attn, submodules=dataclasses.replace(attn_sub, core_attention=SDPAttention, **qk_norm)
    )
    sub = dataclasses.replace(
        sub, self_attention=attn, input_layernorm=TorchNorm, pre_mlp_layernorm=TorchNorm
    )
    return dataclasses.replace(spec, submodules=sub)


def _with_grouped_experts(spec):
    """A copy of a local MoE layer spec whose routed experts are `moe.GroupedGemmMLP` instead of megatron's
    `SequentialMLP`. megatron 0.16 describes the MoE layer and its experts as `ModuleSpec`s, 0.19 as
    `functools.partial`s of the classes; both are handled, anything else is an error."""
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.spec_utils import ModuleSpec

    from runtime.train.megatron.moe import GroupedGemmMLP

    def grouped(experts):
        if isinstance(experts, ModuleSpec) and experts.module is SequentialMLP:
            return dataclasses.replace(experts, module=GroupedGemmMLP)
        if isinstance(experts, functools.partial) and experts.func is SequentialMLP:
            return functools.partial(GroupedGemmMLP, *experts.args, **experts.keywords)
        raise ValueError(f"--moe-grouped-gemm: unexpected experts in megatron's local MoE spec: {experts!r}")

    mlp = spec.submodules.mlp
    if isinstance(mlp, functools.partial):
        moe_sub = mlp.keywords["submodules"]
        moe_sub = dataclasses.replace(moe_sub, experts=grouped(moe_sub.experts))
        mlp = functools.partial(mlp.func, *mlp.args, **{**mlp.keywords, "submodules": moe_sub})
    else:
        mlp = dataclasses.replace(
            mlp, submodules=dataclasses.replace(mlp.submodules, experts=grouped(mlp.submodules.experts))
        )
    return dataclasses.replace(spec, submodules=dataclasses.replace(spec.submodules, mlp=mlp))


def layer_spec(args: ModelArgs, *, moe: bool | None = None):
    """megatron-core's local (TransformerEngine-free) spec of one layer, with `SDPAttention` as core
    attention, `TorchNorm` norms and, for an MoE layer (`moe`, default: the model is MoE), the routed experts
    on megatron's local `SequentialMLP`, or with `--moe-grouped-gemm` on `moe.GroupedGemmMLP` (the same
    parameters, computed with torch's grouped GEMM). megatron's spec builder is asked for its local experts
    (`moe_grouped_gemm=False`): its own grouped experts need TransformerEngine or the grouped_gemm package."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    moe = args.is_moe if moe is None else moe
    spec = get_gpt_layer_local_spec(
        num_experts=args.num_experts if moe else None,
        moe_grouped_gemm=False,
        qk_layernorm=args.qk_layernorm,
        normalization=args.normalization,
    )
    spec = _with_local_modules(spec)
    return _with_grouped_experts(spec) if moe and args.moe_grouped_gemm else spec


def decoder_spec(args: ModelArgs, config, *, vp_stage: int | None = None, pp_rank: int | None = None):
    """The block spec `GPTModel` takes: this chunk's layers (dense or MoE per `moe_layer_freq`, each from
    `layer_spec`) and a `TorchNorm` final norm (megatron's default final norm refuses sequence parallel)."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    try:
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
    except ImportError:  # pragma: no cover - moved between versions
        from megatron.core.transformer.transformer_layer import get_num_layers_to_build
    pattern = args.moe_layer_pattern()
    dense = layer_spec(args, moe=False) if 0 in pattern else None
    moe = layer_spec(args, moe=True) if 1 in pattern else None
    count = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=pp_rank)
    specs = [moe if pattern[i] else dense for i in range(offset, offset + count)]
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=TorchNorm)


def mark_expert_data_parallel(model: torch.nn.Module, layout: ParallelLayout) -> int:
    """With one expert-parallel rank and an expert-tensor size other than the tensor-parallel size
    (`--expert-tensor-parallel-size 1 --tensor-model-parallel-size 2`), mark the experts' parameters as
    megatron marks them under expert parallelism (`allreduce = False`), and return how many were marked.

    megatron-core (0.16 and 0.19) marks expert weights by `expert_model_parallel_size > 1` alone
    (`tensor_parallel/layers.py`, `moe/experts.py`), so with EP = 1 its DDP reduces their gradients over the
    dense data-parallel group. When ETP != TP the experts' replicas are the *expert* data-parallel group
    (world / (etp x ep x pp) ranks), a different one: with TP = 2, ETP = 1 each TP rank's experts then kept
    only its own tokens' share of the gradient and the replicas drifted apart (measured, gloo:
    tests/unit/runtime/megatron/test_parallel.py `tp2-sp-etp1-moe`). Marked, DDP puts them in its expert
    buffers over the expert data-parallel group and the optimizer takes their norm over the expert groups,
    as it does for EP > 1."""
    if layout.ep > 1 or layout.expert_tp == layout.tp:
        return 0
    from megatron.core.transformer.moe.experts import GroupedMLP

    marked = 0
    for module in model.modules():
        # routed experts' linear layers (`is_expert=True`; shared experts' are not), or grouped-GEMM experts
        if not (getattr(module, "is_expert", False) or isinstance(module, GroupedMLP)):
            continue
        for param in module.parameters(recurse=False):
            if getattr(param, "allreduce", True):
                param.allreduce = False
                marked += 1
    return marked


def build_model(args: ModelArgs, layout: ParallelLayout, config) -> list:
    """This rank's `GPTModel`s, one per virtual pipeline chunk (one without interleaving), each with the
    right embedding (first stage) and output layer (last stage); tied embeddings are shared by megatron
    between the first and last stage. `initialize_parallel()` must have run. The output layer is
    vocab-parallel (`parallel_output=True`): logits `[b, s, padded_vocab / tp]`."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    if (
        layout.tp != ps.get_tensor_model_parallel_world_size()
        or layout.pp != ps.get_pipeline_model_parallel_world_size()
    ):
        raise ValueError("build_model: the layout differs from megatron's initialised parallel state")
    pp_rank = ps.get_pipeline_model_parallel_rank()
    models = []
    for chunk in range(layout.virtual_stages):
        vp_stage = chunk if layout.vpp else None
        model = GPTModel(
            config=config,
            transformer_layer_spec=decoder_spec(args, config, vp_stage=vp_stage, pp_rank=pp_rank),
            vocab_size=args.padded_vocab(layout.tp),
            max_sequence_length=args.max_position_embeddings,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            parallel_output=True,
            share_embeddings_and_output_weights=args.tied,
            position_embedding_type=args.position_embedding_type,
            rotary_percent=args.rotary_percent,
            rotary_base=args.rotary_base,
            rope_scaling=args.use_rope_scaling,
            rope_scaling_factor=args.rope_scaling_factor,
            vp_stage=vp_stage,
        )
        if torch.cuda.is_available():  # as Megatron-LM's get_model: anything built on the host moves over
            model.cuda(torch.cuda.current_device())
        mark_expert_data_parallel(model, layout)
        models.append(model)
    precompute_rope(models)  # CUDA: cos/sin once per forward, not inside every compiled layer
    return models
