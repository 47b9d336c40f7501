"""The job spec's SGLang passthrough as the engine servers' arguments.

Relax launch scripts pass SGLang server flags with a `--sglang-` prefix (`--sglang-mem-fraction-static 0.7`);
the job spec keeps them, prefix dropped and underscored, in its `sglang` mapping
(`{"mem_fraction_static": 0.7}`: a number or word, True for a bare switch, a list for several words).
Relax forwards each one to SGLang's server as `--mem-fraction-static 0.7`, and so does the platform
(`server_argv`): to `python -m sglang.launch_server` verbatim, and to the built-in engine's server, which
reads those it implements (`server.BUILTIN_READS`) and logs the others.

Which names are SGLang's comes from `server_flags_sglang` (generated from SGLang's `ServerArgs`). Besides
them the prefix carries a few flags of Relax's own (`RELAX_SGLANG_FLAGS`), which configure Relax's router
and rollout, not the server: they are never forwarded. The server flags the platform sets itself
(`PLATFORM_FLAGS`) are refused (`problems`), as is any name that is neither SGLang's nor Relax's.

Nothing here imports SGLang, torch or the runtime: the capability check (API process) uses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime.rollout.sglang.server_flags_sglang import SGLANG_SERVER_FLAGS, SGLANG_SWITCHES, SGLANG_VERSION

__all__ = [
    "BUILTIN_READS",
    "PLATFORM_FLAGS",
    "RELAX_SGLANG_FLAGS",
    "SGLANG_SERVER_FLAGS",
    "SGLANG_VERSION",
    "flag_of",
    "problems",
    "refused_flag_reasons",
    "server_argv",
]

#: The SGLang server flags the built-in engine's server (`runtime.rollout.sglang.server`) implements, as
#: SGLang does, besides the platform's own (PLATFORM_FLAGS); it names every other SGLang flag it is given
#: in one startup line.
BUILTIN_READS: tuple[str, ...] = (
    "context-length",  # a prompt at or beyond it refused, prompt + max_new_tokens beyond it refused...
    "allow-auto-truncate",  # ...or cut to fit, as SGLang's TokenizerManager does
    "max-running-requests",  # the largest batch one forward takes
    "random-seed",  # seeds torch before the model loads
    "tokenizer-path",
    "skip-tokenizer-init",
    "log-level",
)

_NO_ROUTER = "an SGLang router of Relax's; here the rollout reaches each engine directly"
#: Relax's own `--sglang-*` flags (Relax's relax/backends/sglang/arguments.py, from slime's
#: slime/backends/sglang_utils/arguments.py): read by Relax's router and rollout, not SGLang server flags.
RELAX_SGLANG_FLAGS: dict[str, str] = {
    "router-ip": _NO_ROUTER,
    "router-port": _NO_ROUTER,
    "router-request-timeout-secs": _NO_ROUTER,
    "server-concurrency": "Relax's cap on requests in flight to the engines; here the rollout sends each "
    "engine one batch request at a time",
}

#: ServerArgs fields the platform sets on every engine server's command line (all their flags and aliases
#: are refused as passthrough) -> why.
PLATFORM_FLAGS: dict[str, str] = {
    "host": "the platform picks the engine's address",
    "port": "the platform picks the engine's port",
    "api_key": "the platform gives every engine the job's engine secret",
    "config": "the platform passes the engine's --config file (it holds the engine secret)",
    "model_path": "the platform passes the weights to serve (--hf-checkpoint, then the trainer's)",
    "tp_size": "the platform sets the engine's tensor-parallel size (--rollout-num-gpus-per-engine)",
}

#: ServerArgs fields that need more than the one GPU each engine has (--rollout-num-gpus-per-engine 1) when
#: above 1 -> why.
MULTI_GPU_FLAGS: dict[str, str] = {
    "dp_size": "SGLang's data parallelism needs more than the one GPU each engine has",
    "pp_size": "SGLang's pipeline parallelism needs more than the one GPU each engine has",
    "ep_size": "SGLang's expert parallelism needs more than the one GPU each engine has",
}


#: ServerArgs fields that name files, folders, sockets, addresses or ports of the machine -> why. The
#: spec's own paths are confined to the team's area (docs/security.md); these would reach the engine
#: verbatim, so they are refused rather than opened as the platform's OS user or bound beside the platform.
_LOCATION_FIELDS = (
    "crash_dump_folder debug_tensor_dump_input_file debug_tensor_dump_output_folder decrypted_config_file "
    "decrypted_draft_config_file download_dir export_metrics_to_file_dir fastapi_root_path file_storage_path "
    "flexkv_config_file kt_weight_path lmcache_config_file log_requests_target lora_paths "
    "modelopt_checkpoint_restore_path modelopt_checkpoint_save_path modelopt_export_path pdmux_config_path "
    "quantization_param_path spec_trace_dir speculative_draft_model_path "
    "speculative_dspark_confidence_sts_path speculative_dspark_sps_table_path "
    "speculative_ngram_external_corpus_path ssl_certfile ssl_keyfile ssl_keyfile_password tokenizer_path "
    "weight_cache_socket"
).split()
_NETWORK_FIELDS = (
    "decoupled_spec_bind_endpoint decoupled_spec_connect_endpoints disaggregation_bootstrap_port "
    "dist_init_addr encoder_bootstrap_port encoder_register_urls encoder_urls engine_info_bootstrap_port "
    "grpc_port nccl_port otlp_traces_endpoint remote_instance_weight_loader_seed_instance_ip "
    "remote_instance_weight_loader_seed_instance_service_port "
    "remote_instance_weight_loader_send_weights_group_ports smg_http_sidecar_port"
).split()
CONFINED_FLAGS: dict[str, str] = {
    **{
        field: "a path the engine would open outside the team's area (spec paths are confined; "
        "docs/security.md): use the spec's own path fields"
        for field in _LOCATION_FIELDS
    },
    **{
        field: "an address or port the engine would bind or reach beyond the job's loopback engine "
        "(docs/security.md)"
        for field in _NETWORK_FIELDS
    },
}
#: Fields that take either a built-in name or a file: refused when the value is a path.
_NAME_OR_FILE_FIELDS = frozenset({"chat_template", "completion_template"})


def _entries(passthrough: Any) -> list[tuple[str, Any]]:
    """The mapping's entries (the job spec keeps a mapping; anything else has none)."""
    return list(passthrough.items()) if isinstance(passthrough, Mapping) else []


def refused_flag_reasons() -> dict[str, str]:
    """Passthrough key (every flag and alias, underscored) -> why, for the server flags refused by name:
    those the platform sets, and the multi-GPU layouts (above 1)."""
    reasons = {**PLATFORM_FLAGS, **MULTI_GPU_FLAGS, **CONFINED_FLAGS}
    return {
        flag.replace("-", "_"): reasons[field]
        for flag, field in SGLANG_SERVER_FLAGS.items()
        if field in reasons
    }


def flag_of(key: str) -> str:
    """The flag (without `--`) of a passthrough key: `mem_fraction_static` -> `mem-fraction-static`."""
    return str(key).replace("_", "-")


def _words(value: Any) -> list[str]:
    return [str(item) for item in (value if isinstance(value, list) else [value])]


def problems(passthrough: Any) -> list[tuple[str, Any, str]]:
    """(key, value, why) for each passthrough entry the platform refuses: flags it sets itself, multi-GPU
    layouts, and names that are not SGLang server flags (nor Relax's own `--sglang-*`)."""
    out: list[tuple[str, Any, str]] = []
    for key, value in _entries(passthrough):
        flag = flag_of(key)
        if flag in RELAX_SGLANG_FLAGS:
            continue
        field = SGLANG_SERVER_FLAGS.get(flag)
        if field is None:
            out.append((key, value, f"--{flag} is not a server argument of SGLang {SGLANG_VERSION}"))
        elif field in PLATFORM_FLAGS:
            out.append((key, value, PLATFORM_FLAGS[field]))
        elif field in MULTI_GPU_FLAGS and _above_one(value):
            out.append((key, value, MULTI_GPU_FLAGS[field]))
        elif field in CONFINED_FLAGS:
            out.append((key, value, CONFINED_FLAGS[field]))
        elif field in _NAME_OR_FILE_FIELDS and any(sep in str(value) for sep in ("/", "\\")):
            out.append(
                (
                    key,
                    value,
                    "a template file the engine would open outside the team's area: name "
                    "one of SGLang's built-in templates, or leave it to the checkpoint's tokenizer",
                )
            )
    return out


def _above_one(value: Any) -> bool:
    try:
        return int(value) > 1
    except (TypeError, ValueError):
        return True


_SWITCH_WORDS = {
    "true": True,
    "1": True,
    "yes": True,
    "on": True,
    "false": False,
    "0": False,
    "no": False,
    "off": False,
}


def server_argv(passthrough: Any) -> tuple[str, ...]:
    """The engine server's arguments from the spec's `sglang` mapping, in the mapping's order: `--X value`,
    a bare `--X` for a switch that is on (True), nothing for one that is off (False/None), `--X a b c` for
    a list. Relax's own `--sglang-*` flags (`RELAX_SGLANG_FLAGS`) are not server arguments: left out."""
    argv: list[str] = []
    for key, value in _entries(passthrough):
        flag = flag_of(key)
        if flag in RELAX_SGLANG_FLAGS or value is None or value is False:
            continue
        if value is True:
            argv.append(f"--{flag}")
        elif flag in SGLANG_SWITCHES and str(value).lower() in _SWITCH_WORDS:
            # a switch given a word by an object spec (`enable_dp_attention: "true"`): SGLang's takes none
            argv += [f"--{flag}"] if _SWITCH_WORDS[str(value).lower()] else []
        else:
            argv += [f"--{flag}", *_words(value)]
    return tuple(argv)
