"""How a masked diffusion checkpoint reads an infill request: its canvas format and its stop tokens.

Each family was trained on one arrangement of prompt, masks and special tokens, and reads others worse, so
the format is chosen from the checkpoint (config.json and tokenizer) and can be overridden with
`masked.format`:

- `bos`: `[bos] prefix [mask]xN suffix`. dg-lsp's own masked models; LLaDA (its pretraining documents
  start with `<|startoftext|>`); Dream, Dream-Coder and DiffuCoder (Dream's and DreamOn's infill code put
  `<|beginoftext|>` first).
- `plain`: `prefix [mask]xN suffix`, no special token. Open-dCoder: its infill evaluation encodes the
  prefix with the Qwen2 tokenizer's own special tokens, which are none.
- `dreamon`: `[bos] prefix [mask]xN suffix [eos]` with variable length: a mask committed as `<|expand|>`
  becomes two masks, one committed as `<|delete|>` is removed with every mask after it (DreamOn's
  training; the canvas starts at `masked.expandStart` masks and grows up to the request's length, and
  stops growing at the last of the request's steps, so the latency budget holds; `masked.schedule: one`
  with entropy confidence decodes as DreamOn's own loop instead, one token per pass until full).
- `chat`: the tokenizer's chat template (instruction-tuned checkpoints): one user turn holding the code
  with a cursor marker, then the masks as the assistant's answer, as LLaDA's and Dream's chat generation
  lay them out. Never chosen automatically: instruct checkpoints also infill in place, without a turn.

Stop tokens are every end-of-text the checkpoint declares: the tokenizer's eos/pad, `eos_token_id` in
config.json and generation_config.json (an int or a list), and for the natively loaded families the
end-of-turn and padding tokens their vocabularies define (LLaDA's `<|eot_id|>` 126348 and `<|endoftext|>`
126081; Dream's `<|endoftext|>` and `<|im_end|>`; DiffuCoder's `<|dlm_pad|>`).
"""

from __future__ import annotations

import json
from pathlib import Path

FORMATS = ("auto", "bos", "plain", "dreamon", "chat")
EXPAND = "<|expand|>"
DELETE = "<|delete|>"
NAMED_STOPS = ("<|eot_id|>", "<|endoftext|>", "<|im_end|>", "<|dlm_pad|>", "<|eos|>")
"""End-of-text, end-of-turn and padding tokens of the native families' vocabularies."""
CHAT_INSTRUCTION = (
    "Fill in the code at {cursor}. Reply with only the code that replaces {cursor}, no explanation.\n\n"
)
CURSOR = "<CURSOR>"


def read_json(path: Path) -> dict:
    """A small side file (generation_config.json, tokenizer_config.json) or {} when absent or unreadable:
    these only refine defaults, they never stop a model from loading."""
    from dg_lsp.engine.loader import CONFIG_CAP
    from dg_lsp.files import read_regular_file

    try:
        data = json.loads(read_regular_file(path, CONFIG_CAP))
    except Exception:  # OSError, refused file, bad JSON
        return {}
    return data if isinstance(data, dict) else {}


def _ids(value) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list | tuple):
        return [int(v) for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def token_id(tokenizer, token: str) -> int | None:
    """The id of `token` when the vocabulary has it as one token (not the unknown token)."""
    try:
        tid = tokenizer.convert_tokens_to_ids(token)
    except Exception:
        return None
    if not isinstance(tid, int) or tid < 0 or tid == tokenizer.unk_token_id:
        return None
    return tid


def edit_tokens(tokenizer, generation_config: dict) -> tuple[int, int] | None:
    """DreamOn's (expand, delete) ids: from generation_config.json when it names them, else the vocabulary."""
    expand = generation_config.get("expand_token_id")
    delete = generation_config.get("delete_token_id")
    if not isinstance(expand, int) or isinstance(expand, bool):
        expand = token_id(tokenizer, EXPAND)
    if not isinstance(delete, int) or isinstance(delete, bool):
        delete = token_id(tokenizer, DELETE)
    if expand is None or delete is None:
        return None
    return int(expand), int(delete)


def detect_format(family: str | None, variant: str | None, edits: tuple[int, int] | None) -> str:
    """The format a checkpoint was trained on (see the module docstring)."""
    if variant == "open-dcoder":
        return "plain"
    if edits is not None and family == "dream":
        return "dreamon"
    return "bos"


def stop_ids(tokenizer, config: dict, generation_config: dict, named: bool, exclude: set[int]) -> set[int]:
    """Every token that ends the span (see the module docstring); `named` adds the families' named
    end-of-turn tokens. Never the mask, bos or edit tokens (`exclude`)."""
    out: set[int] = set()
    for value in (tokenizer.eos_token_id, tokenizer.pad_token_id):
        out.update(_ids(value))
    for source in (config, generation_config):
        for key in ("eos_token_id", "pad_token_id"):
            out.update(_ids(source.get(key)))
    if named:
        for token in NAMED_STOPS:
            tid = token_id(tokenizer, token)
            if tid is not None:
                out.add(tid)
    return out - exclude


def chat_head(tokenizer, prefix: str, suffix: str) -> list[int]:
    """The chat template's prompt up to the assistant's answer, for the `chat` format."""
    content = CHAT_INSTRUCTION.format(cursor=CURSOR) + "```\n" + prefix + CURSOR + suffix + "\n```"
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("masked.format 'chat' needs a tokenizer with a chat template")
    return user_turn_ids(tokenizer, content)


def user_turn_ids(tokenizer, content: str) -> list[int]:
    """`content` as one user turn with the assistant's answer opened, as plain ids: transformers returns a
    list, a batch of one, or a mapping with `input_ids` depending on the tokenizer class."""
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(out, dict) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(t) for t in out]
