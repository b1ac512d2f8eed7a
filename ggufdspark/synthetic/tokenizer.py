"""The synthetic checkpoints' tokenizer: a real byte-level BPE trained here on deterministic
pseudo-English with LFM2's pre-tokenizer, LFM2's special tokens and a ChatML chat template, saved in
Hub layout (``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``).

Needs the optional ``tokenizers`` package (the ``generate`` extra), imported only when training.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = [
    "<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|fim_pre|>", "<|fim_mid|>", "<|fim_suf|>",
    "<|im_start|>", "<|im_end|>", "<|tool_list_start|>", "<|tool_list_end|>", "<|tool_call_start|>",
    "<|tool_call_end|>", "<|tool_response_start|>", "<|tool_response_end|>", "<|image_start|>",
    "<|image_end|>", "<image>",
] + [f"<|reserved_{i}|>" for i in range(8)]
BOS, EOS, PAD = "<|startoftext|>", "<|im_end|>", "<|pad|>"
MASK_TOKEN = "<|reserved_0|>"

# LFM2's pre-tokenizer (llama.cpp maps the real tokenizer to "lfm2", which uses this regex).
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{- '<image>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)

_WORDS = ("the a model draft target token speed decode verify accept block layer head fast slow "
          "image chart table text answer question reason because therefore number value small large "
          "llama server metal cuda gpu cpu memory cache weight bias norm attention convolution "
          "markov confidence sample greedy output input prompt reply summary caption photo scene "
          "red green blue cat dog house tree river mountain city road car train plane ship bird "
          "one two three four five six seven eight nine ten hundred thousand percent year month day "
          "is are was were be been has have had do does did can could will would should may might "
          "and or but if then else when while for with without from into over under between").split()


def training_corpus(n_sentences: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic pseudo-English text (plus digits, punctuation, code and CJK) for BPE training."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_sentences):
        words = rng.choice(_WORDS, size=int(rng.integers(4, 16)))
        s = " ".join(words).capitalize()
        s += rng.choice([".", "?", "!", ",", ":", ";"])
        if i % 7 == 0:
            s += f" {int(rng.integers(0, 100000))} {rng.random():.3f}"
        if i % 11 == 0:
            s += "\n  def f(x):\n    return x * 2\n"
        if i % 13 == 0:
            s += " 我想在苹果工作 нещо на Български 🚀"
        out.append(s)
    return out


def make_tokenizer(out: Path, vocab_size: int, corpus: list[str] | None = None) -> dict[str, int]:
    """Train and save an LFM2-style byte-level BPE tokenizer on ``corpus`` (default: the
    deterministic pseudo-English of ``training_corpus``). Returns special token ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus if corpus is not None else training_corpus(), trainer=trainer)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, ids[BOS])])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "model_max_length": 128000,
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
        "legacy": False, "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, indent=2))
    return ids


def added_ids(tokenizer_json: Path) -> dict[str, int]:
    data = json.loads(tokenizer_json.read_text())
    return {t["content"]: t["id"] for t in data.get("added_tokens", [])}
