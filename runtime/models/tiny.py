"""Builds a tiny Qwen2 causal LM and its byte-level BPE tokenizer offline, as a Hugging Face folder."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from runtime.data.arith import tokenizer_corpus

EOS_TOKEN = "<|endoftext|>"  # ends a plain-text response; also the padding token
IM_START, IM_END = "<|im_start|>", "<|im_end|>"  # chat turns; <|im_end|> also stops generation
SPECIAL_TOKENS = [EOS_TOKEN, IM_START, IM_END]

# A Qwen-style ChatML template, so `apply-chat-template` works with the tiny model too; tools (`tool-key`)
# are listed in a leading system turn, as Qwen's template does.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n# Tools\n' + (tools | tojson) + '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The Qwen2 pre-tokenizer split (digits one per token). transformers loads a `qwen2` folder with this
# split whatever tokenizer.json says, so the tokenizer is trained with the same one.
QWEN2_SPLIT_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

# Extra text so the tokenizer also covers chat roles and common words beyond the arithmetic task.
GENERAL_TEXT = [
    "system user assistant",
    "You are a helpful assistant. Answer the question and put the final answer in \\boxed{}.",
    "The quick brown fox jumps over the lazy dog. Answer: 42. Therefore, the answer is",
]


@dataclass(frozen=True)
class TinyModelShape:
    """Defaults measured in docs/reference/runtime.md: big enough to learn the arithmetic task in minutes."""

    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 256
    vocab_size: int = 512  # the BPE trainer's target; the real size is what training yields


def train_tokenizer(corpus: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained in memory with Qwen2's pre-tokenizer split, so numbers are spelled one
    digit per token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, shape: TinyModelShape | None = None) -> Path:
    """Write a randomly initialised tiny Qwen2 model and its tokenizer to `out_dir`; return the folder.

    `AutoModelForCausalLM.from_pretrained(out_dir)` and `AutoTokenizer.from_pretrained(out_dir)` load it
    with no network. The same seed gives the same weights.
    """
    shape = shape or TinyModelShape()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(tokenizer_corpus() + GENERAL_TEXT, shape.vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # No hidden sampling defaults (GenerationConfig would otherwise imply top_k=50): the rollout engine
    # passes every sampling parameter explicitly.
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, im_end_id], pad_token_id=eos_id, bos_token_id=eos_id, do_sample=True, top_k=0
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "tiny_model.json").write_text(json.dumps({"seed": seed, **asdict(shape)}, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a tiny Qwen2 model + tokenizer (offline).")
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build_tiny_model(args.out_dir, seed=args.seed))


if __name__ == "__main__":
    main()
