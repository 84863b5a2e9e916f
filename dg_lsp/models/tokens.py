"""Special tokens shared by the tokenizer, the trainer and the engine.

Ids 0-2 follow DiffusionGemma's config defaults (pad 0, eos 1, bos 2) so a model config built from
transformers' defaults agrees with our tokenizer without extra plumbing.
"""

PAD = "<pad>"
EOS = "<eos>"
BOS = "<bos>"
FIM_PREFIX = "<fim_prefix>"
FIM_SUFFIX = "<fim_suffix>"
FIM_MIDDLE = "<fim_middle>"
MASK = "<mask>"
# DiffusionGemma's config requires image token ids; reserve them so they never collide with text.
BOI = "<boi>"
EOI = "<eoi>"
IMAGE = "<image>"

SPECIAL_TOKENS = [PAD, EOS, BOS, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, MASK, BOI, EOI, IMAGE]
PAD_ID, EOS_ID, BOS_ID, FIM_PREFIX_ID, FIM_SUFFIX_ID, FIM_MIDDLE_ID, MASK_ID, BOI_ID, EOI_ID, IMAGE_ID = (
    range(len(SPECIAL_TOKENS))
)


def fim_prompt_ids(prefix_ids: list[int], suffix_ids: list[int]) -> list[int]:
    """The PSM infill prompt every dg-lsp model is trained on: `<bos><fim_prefix>P<fim_suffix>S<fim_middle>`.

    For DiffusionGemma the encoder reads this prompt and the decoder's canvas holds the middle,
    padded with EOS; for autoregressive models the middle is generated after it.
    """
    return [BOS_ID, FIM_PREFIX_ID, *prefix_ids, FIM_SUFFIX_ID, *suffix_ids, FIM_MIDDLE_ID]
