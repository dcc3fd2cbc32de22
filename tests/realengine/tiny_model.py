"""Build the tiny random-weight model the real-engine tests serve: no hub, no download, seeded.

Run with the real engine's interpreter (it has torch, transformers and tokenizers):

    VENV/bin/python tests/realengine/tiny_model.py OUT_DIR

OUT_DIR gets a byte-level BPE tokenizer (vocabulary 512, trained on a fixed text) with a chat template
and the special tokens the reasoning and tool-call parsers look for (``<think>``, ``</think>``,
``<tool_call>``, ``</tool_call>``), and a two-layer Llama with seeded random weights in float32
(hidden 128, head_dim 64: the CPU attention refuses head_dim 16). The same seed gives the same files.

DTYPE is the one dtype the tests and benchmarks serve it in (``--dtype DTYPE``; vLLM would turn a float32
config into bfloat16 under ``--dtype auto``). float32, not bfloat16: on CPUs with AMX (``amx_bf16``) in a
VM, vLLM 0.32's CPU worker dies at the first token of a very short prompt in bfloat16 (docs/testing.md,
"The tiny model's dtype"); float32 answers every prompt on every CPU, and for 0.4 M parameters costs nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SEED = 1234
DTYPE = "float32"
VOCAB = 512
SPECIAL = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
           "</tool_call>"]
# Qwen-style ChatML with tools, so vLLM's hermes tool parser and qwen3 reasoning parser see their tokens
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "</tools>\nCall a tool as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] if m['content'] is string else '' }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Say hi. Hello! What is the weather in Paris? Call get_weather with the city.",
    "<think>Let me think about it.</think> The answer is 4.",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 plus minus times equals",
] * 20


def build(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>",
                                   unk_token="<unk>", pad_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                         pad_token_id=fast.pad_token_id, torch_dtype=DTYPE, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(getattr(torch, DTYPE))
    model.save_pretrained(out, safe_serialization=True)
    (out / "envlayers-tiny-model.json").write_text(json.dumps({"seed": SEED, "vocab": len(fast)}) + "\n")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py OUT_DIR")
    print(build(Path(sys.argv[1])))
