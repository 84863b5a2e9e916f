"""Tiny, randomly initialised models with a real tokenizer, for tests and smoke benchmarks.

They exercise exactly the code paths of the shipped and user-supplied checkpoints (same classes,
same `from_pretrained` loading from a local directory) at a size that runs in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

from dg_lsp.models import tokens

_SAMPLE_CODE = '''
import os
import sys


def add(a, b):
    """Return the sum of a and b."""
    return a + b


class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()


function greet(name) {
  const message = `Hello, ${name}!`;
  console.log(message);
  return message;
}

fn main() {
    let xs: Vec<i32> = (0..10).collect();
    for x in xs.iter() {
        println!("{}", x);
    }
}

int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        printf("%s\\n", argv[i]);
    }
    return 0;
}
'''


def build_tokenizer(texts: list[str], vocab_size: int = 512):
    """The shipped tokenizer's recipe (byte-level BPE, our special tokens at our ids) on a tiny sample."""
    from dg_lsp.training.tokenizer import train_tokenizer

    return train_tokenizer(texts, vocab_size=vocab_size)


def tiny_diffusion_gemma_config(vocab_size: int, canvas_length: int = 32, **text_overrides):
    """A DiffusionGemma config small enough for tests; same architecture as the 26B-A4B checkpoint."""
    from transformers import DiffusionGemmaConfig

    text = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=32,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=64,
        max_position_embeddings=4096,
        sliding_window=256,
        layer_types=["sliding_attention", "full_attention"],
        pad_token_id=tokens.PAD_ID,
        eos_token_id=tokens.EOS_ID,
        bos_token_id=tokens.BOS_ID,
    )
    text.update(text_overrides)
    vision = dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=16,
    )
    return DiffusionGemmaConfig(
        text_config=text,
        vision_config=vision,
        canvas_length=canvas_length,
        boi_token_id=tokens.BOI_ID,
        eoi_token_id=tokens.EOI_ID,
        image_token_id=tokens.IMAGE_ID,
        pad_token_id=tokens.PAD_ID,
        eos_token_id=tokens.EOS_ID,
        bos_token_id=tokens.BOS_ID,
    )


def make_tiny_diffusion_gemma(path: str | Path, seed: int = 0, canvas_length: int = 32) -> Path:
    """Save a random tiny `DiffusionGemmaForBlockDiffusion` plus tokenizer to `path` and return it."""
    import torch
    from transformers import DiffusionGemmaForBlockDiffusion

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer([_SAMPLE_CODE] * 4)
    torch.manual_seed(seed)
    config = tiny_diffusion_gemma_config(len(tokenizer), canvas_length=canvas_length)
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
