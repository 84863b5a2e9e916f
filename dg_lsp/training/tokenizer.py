"""Train the shipped byte-level BPE tokenizer and pre-tokenize the corpus into flat id arrays.

The special tokens come first so their ids are exactly those of `dg_lsp.models.tokens`; the
result is saved as a standard `PreTrainedTokenizerFast` directory loadable with `AutoTokenizer`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from dg_lsp.models import tokens
from dg_lsp.training.corpus import load_docs


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=tokens.SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for i, name in enumerate(tokens.SPECIAL_TOKENS):
        assert tok.token_to_id(name) == i, f"special token {name} not at id {i}"
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=tokens.BOS,
        eos_token=tokens.EOS,
        pad_token=tokens.PAD,
        mask_token=tokens.MASK,
        additional_special_tokens=[tokens.FIM_PREFIX, tokens.FIM_SUFFIX, tokens.FIM_MIDDLE],
        model_max_length=4096,
    )


def encode_docs(tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Flat uint16 ids plus int64 offsets (len(texts)+1) so document boundaries survive."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in ids])
    flat = np.fromiter((t for x in ids for t in x), dtype=np.uint16, count=int(offsets[-1]))
    return flat, offsets


def save_split(path: Path, flat: np.ndarray, offsets: np.ndarray) -> None:
    np.savez(path, ids=flat, offsets=offsets)


def load_split(path: Path) -> tuple[np.ndarray, np.ndarray]:
    z = np.load(path)
    return z["ids"], z["offsets"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--out", type=Path, default=Path("data/tokenizer"))
    ap.add_argument("--vocab-size", type=int, default=8192)
    args = ap.parse_args(argv)
    train = load_docs(args.corpus / "train.jsonl")
    valid = load_docs(args.corpus / "valid.jsonl")
    tokenizer = train_tokenizer((d.text for d in train), args.vocab_size)
    tokenizer.save_pretrained(args.out)
    manifest_path = args.corpus / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    counts: dict[str, int] = {}
    for name, docs in (("train", train), ("valid", valid)):
        flat, offsets = encode_docs(tokenizer, [d.text for d in docs])
        save_split(args.corpus / f"{name}.npz", flat, offsets)
        for d, n in zip(docs, np.diff(offsets), strict=True):
            counts[d.package] = counts.get(d.package, 0) + int(n)
        print(f"{name}: {len(docs)} files, {len(flat)} tokens")
    for p in manifest["packages"]:
        p["tokens"] = counts.get(p["package"], 0)
    manifest["tokenizer"] = f"byte-level BPE, vocab {len(tokenizer)}"
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
