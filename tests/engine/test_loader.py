from __future__ import annotations

import json
import os

import pytest

from dg_lsp.engine.loader import ModelLoadError, detect_backend, load_engine, resolve_model_dir
from dg_lsp.engine.types import InfillRequest
from dg_lsp.settings import Settings


@pytest.mark.parametrize(
    ("config", "backend"),
    [
        ({"architectures": ["DiffusionGemmaForBlockDiffusion"]}, "diffusion-gemma"),
        ({"architectures": ["LlamaForCausalLM"]}, "ar"),
        ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}, "ar"),
        ({"architectures": ["ModernBertForMaskedLM"]}, "masked"),
        ({"architectures": ["LLaDAModelLM"], "model_type": "llada"}, "masked"),
        ({"architectures": ["DreamModel"], "model_type": "Dream"}, "masked"),
        (
            {"architectures": ["Gemma3ForCausalLM"], "use_bidirectional_attention": True, "mask_token_id": 6},
            "masked",
        ),
    ],
)
def test_detect_backend(config, backend):
    assert detect_backend(config) == backend


def test_detect_backend_unknown_is_a_readable_error():
    with pytest.raises(ModelLoadError, match="backend"):
        detect_backend({"architectures": ["ResNetForImageClassification"]})


def test_load_engine_picks_backend_from_config(tiny_dg_dir, tiny_causal_dir):
    dg = load_engine(Settings(model=str(tiny_dg_dir), device="cpu"))
    assert dg.name == "diffusion-gemma"
    ar = load_engine(Settings(model=str(tiny_causal_dir), device="cpu"))
    assert ar.name == "ar" and ar.describe()["backend"] == "ar"


def test_load_engine_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        resolve_model_dir(str(tmp_path / "missing"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DiffusionGemmaForBlockDiffusion"]}))
    with pytest.raises(ModelLoadError, match="could not load"):
        load_engine(Settings(model=str(tmp_path), device="cpu"))
    with pytest.raises(ModelLoadError, match="CUDA"):
        load_engine(Settings(model=str(tmp_path), device="cuda"))


def test_dtype_setting(tiny_causal_dir):
    """`auto` keeps a small checkpoint in fp32 on a CPU (bf16 moved the 5M models' quality); an explicit
    dtype is obeyed and reported; an unknown one is a load error naming the choices."""
    import torch

    from dg_lsp.engine import quantization as quant

    assert quant.default_dtype("cpu", tiny_causal_dir) == torch.float32
    assert quant.default_dtype("cuda") == torch.bfloat16
    engine = load_engine(Settings(model=str(tiny_causal_dir), device="cpu", dtype="bfloat16"))
    assert engine.describe()["dtype"] == "bfloat16"
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    assert load_engine(Settings(model=str(tiny_causal_dir), device="cpu")).describe()["dtype"] == "float32"
    with pytest.raises(ModelLoadError, match="unknown dtype 'fp8'; expected auto or one of"):
        load_engine(Settings(model=str(tiny_causal_dir), device="cpu", dtype="fp8"))


def test_a_checkpoints_sampler_defaults_sit_under_the_users_options(tmp_path, caplog):
    """config.json's `dg_lsp_sampler` sets the sampler a model decodes best with; the user's `masked`
    options and `denoisingSteps` still win, and an invalid entry is logged and left out, not fatal."""
    import shutil

    from dg_lsp.engine.loader import EMBEDDED_TINY_DIR

    model = tmp_path / "model"
    shutil.copytree(EMBEDDED_TINY_DIR, model)
    config = json.loads((model / "config.json").read_text())
    config["dg_lsp_sampler"] = {"confidence": "leftmost", "trimMargin": 5, "steps": 7, "threshold": 5}
    (model / "config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING"):
        engine = load_engine(Settings(model=str(model), denoising_steps=0))
    cfg = engine.cfg
    assert (cfg.confidence, cfg.trim_margin, cfg.steps, cfg.threshold) == ("leftmost", 5, 7, 0.9)
    assert "dg_lsp_sampler: threshold" in caplog.text
    assert engine.infill(InfillRequest("def f(x):\n    return ", "\n", max_tokens=8)).candidates
    user, _ = Settings.merge({"model": str(model), "denoisingSteps": 9, "masked": {"confidence": "margin"}})
    cfg = load_engine(user).cfg
    assert (cfg.confidence, cfg.trim_margin, cfg.steps) == ("margin", 5, 9)
    config["dg_lsp_sampler"] = ["leftmost"]
    (model / "config.json").write_text(json.dumps(config))
    assert load_engine(Settings(model=str(model), denoising_steps=0)).cfg.confidence == "max_prob"


def test_a_refused_model_directory_never_imports_torch(tmp_path):
    """A server whose model cannot load keeps serving (and telling the user why) without the ~180 MiB that
    importing torch costs: the directory is checked first."""
    import subprocess
    import sys

    fifo_dir = tmp_path / "model"
    fifo_dir.mkdir()
    (fifo_dir / "config.json").write_text("{}")
    os.mkfifo(fifo_dir / "tokenizer.json")
    code = (
        "import sys\n"
        "from dg_lsp.engine.loader import ModelLoadError, load_engine\n"
        "from dg_lsp.settings import Settings\n"
        "for model in sys.argv[1:]:\n"
        "    try:\n"
        "        load_engine(Settings(model=model))\n"
        "    except ModelLoadError as exc:\n"
        "        print('refused:', exc)\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "missing"), str(fifo_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    assert len(out) == 3 and out[0].startswith("refused:") and out[1].startswith("refused:"), out
    assert out[-1] == "False"
