"""The golden toy models in configurations llama.cpp runs exactly as the
decoder does, one per architecture ``iebin-to-gguf`` exports: shared by the
export tests (tests/test_gguf_export.py, tests/test_llamacpp_runs.py) and
``make bench-gguf`` (benchmarks/gguf_parity.py), so both judge the same models.

Some golden checkpoints hold what llama.cpp cannot express (its qwen3moe has
experts in every layer and always renormalises the top-k; its gpt-oss clamps
SwiGLU at 7 and rounds YaRN's range), and the exporter refuses those; the
variants here change exactly that and nothing else (tiny-phi3 loses its
window of 6, which llama.cpp's phi3 does not apply; tiny-llama4 takes the
chunks and temperature llama.cpp's llama4 fixes; tiny-qwen3-5-moe and
tiny-qwen3-next run in float32, below). tiny-mistral is absent:
its 4-position sliding window is one the llama architecture does not have.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from gguf_build import hf_tensors

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
IECONV = Path(sys.executable).parent / "ieconv"
# toy -> the architecture llama.cpp runs it as
ARCH_OF = {"tiny-llama": "llama", "tiny-llama3": "llama", "tiny-qwen2": "qwen2", "tiny-qwen3": "qwen3",
           "tiny-mixtral": "llama", "tiny-qwen3-moe": "qwen3moe", "tiny-gpt-oss": "gpt-oss",
           "tiny-gpt-oss-mxfp4": "gpt-oss", "tiny-gemma3": "gemma3", "tiny-gemma2": "gemma2", "tiny-gemma": "gemma", "tiny-arcee": "arcee", "tiny-stablelm": "stablelm",
           "tiny-starcoder2": "starcoder2", "tiny-nemotron": "nemotron", "tiny-phi": "phi2",
           "tiny-phi3": "phi3",
           "tiny-smollm3": "smollm3", "tiny-granite": "granite",
           "tiny-olmo2": "olmo2", "tiny-olmo3": "olmo2", "tiny-ministral3": "mistral3",
           "tiny-exaone4": "exaone4", "tiny-olmoe": "olmoe", "tiny-qwen2-moe": "qwen2moe",
           "tiny-glm4-moe": "glm4moe", "tiny-minimax-m2": "minimax-m2", "tiny-deepseek-v3": "deepseek2",
           "tiny-deepseek-v2": "deepseek2", "tiny-glm4-moe-lite": "deepseek2",
           "tiny-mistral4": "mistral4", "tiny-llama4": "llama4",
           "tiny-ernie4-5": "ernie4_5", "tiny-ernie4-5-moe": "ernie4_5-moe",
           "tiny-seed-oss": "seed_oss", "tiny-apertus": "apertus", "tiny-afmoe": "afmoe", "tiny-dots1": "dots1",
           "tiny-solar-open": "glm4moe", "tiny-youtu": "deepseek2", "tiny-jais2": "jais2",
           "tiny-exaone-moe": "exaone-moe", "tiny-mamba2": "mamba2", "tiny-falcon-h1": "falcon-h1", "tiny-mamba": "mamba",
           "tiny-falcon-mamba": "mamba", "tiny-olmo": "olmo",
           "tiny-granite-swa": "granite_swa", "tiny-granite-moe-swa": "granite_swa",
           "tiny-glm4": "glm4",
           "tiny-cohere2": "cohere2", "tiny-cohere": "command-r", "tiny-qwen3-5": "qwen35",
           "tiny-qwen3-5-moe": "qwen35moe", "tiny-qwen3-next": "qwen3next", "tiny-lfm2": "lfm2", "tiny-lfm2-moe": "lfm2moe",
           "tiny-granite4": "granitehybrid", "tiny-granite4-dense": "granitehybrid", "tiny-granite-moe": "granitemoe",
           "tiny-granite-moe-shared": "granitemoe", "tiny-nemotron-h": "nemotron_h",
           "tiny-nemotron-h-moe": "nemotron_h_moe", "tiny-hunyuan-dense": "hunyuan-dense",
           "tiny-hunyuan-moe": "hunyuan-moe", "tiny-hy-v3": "hy_v3"}


def falcon_h1_stored(cfg: dict, name: str, values: np.ndarray) -> np.ndarray:
    """A Falcon-H1 tensor's float32 values [rows, ...] as llama.cpp's converter stores them: times each muP
    multiplier (gguf_names.falcon_h1_factors, in its order) in float32, rounded once to bfloat16 (the toy's type)
    by round-to-nearest-even, computed here apart from the export's bytes."""
    from iekit.convert.gguf_names import falcon_h1_factors

    rows = values.shape[0]
    w = values.astype(np.float32).reshape(rows, -1)
    for f in falcon_h1_factors(cfg, name, rows):
        w = w * (np.asarray(f, np.float32)[:, None] if np.ndim(f) else np.float32(f))
    bits = w.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16  # (no NaNs here)
    return bits.astype(np.uint32).view(np.float32).reshape(values.shape)


# Granite 4's layer types as the Hub's configs spell them, which llama.cpp's converter reads
GRANITE4_LAYERS = ["mamba", "attention", "mamba", "mamba"]
# Llama 4's chunks and temperature as llama.cpp's llama4 fixes them (the golden toy's act within 12 positions)
LLAMA4_FIXED = {"attention_chunk_size": 8192, "floor_scale": 8192, "attn_scale": 0.1}


def _hf_variant(tmp: Path, name: str, edit: dict, tensors=None) -> Path:
    """A copy of a golden checkpoint with its config edited (and, given
    ``tensors``, its weights replaced, written as f32 safetensors)."""
    from safetensors.numpy import save_file

    d = tmp / f"hf-{name}"
    shutil.copytree(GOLDEN / "hf" / name, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(edit)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    if tensors is not None:
        for f in [*d.glob("*.safetensors"), *d.glob("*.safetensors.index.json")]:
            f.unlink()
        # (np.array, not ascontiguousarray, which gives a tensor of no dimension one: xIELU's beta)
        save_file({k: np.array(v, np.float32, order="C") for k, v in tensors.items()}, str(d / "model.safetensors"))
    return d


def _convert(hf: Path, out: Path) -> Path:
    res = subprocess.run([str(IECONV), "hf-to-iebin", "-q", "--hf-dir", str(hf), "--out-dir", str(out)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"hf-to-iebin {hf.name}: {res.stderr.strip()}")
    return out


def _qwen3_moe_every_layer(tmp: Path) -> Path:
    """Qwen3-MoE as llama.cpp runs it: experts in every layer, top-k renormalised."""
    t = hf_tensors(GOLDEN / "hf" / "tiny-qwen3-moe")
    for k in [k for k in t if k.startswith("model.layers.1.mlp.")]:
        del t[k]
    for k in [k for k in t if k.startswith("model.layers.0.mlp.")]:
        t[k.replace("layers.0", "layers.1")] = t[k][::-1].copy() * np.float32(0.75)
    rp = json.loads((GOLDEN / "hf/tiny-qwen3-moe/config.json").read_text())["rope_parameters"]
    hf = _hf_variant(tmp, "tiny-qwen3-moe", {"mlp_only_layers": [], "norm_topk_prob": True, "rope_parameters": rp,
                                             "dtype": "float32"}, t)
    return _convert(hf, tmp / "qwen3moe")


def _without_mtp(tmp: Path, name: str) -> Path:
    """DeepSeek-V3 (ERNIE 4.5 MoE) as llama.cpp's converter writes it: without the MTP layer after the last
    (the MTP tensors beside the model), which its file has no place for, so that a round trip through GGUF is
    the same model."""
    cfg = json.loads((GOLDEN / "hf" / name / "config.json").read_text())
    t = {k: v for k, v in hf_tensors(GOLDEN / "hf" / name).items()
         if not k.startswith((f"model.layers.{cfg['num_hidden_layers']}.", "model.mtp_"))}
    return _convert(_hf_variant(tmp, name, {"num_nextn_predict_layers": 0, "dtype": "float32"}, t), tmp / name)


def _gpt_oss_llamacpp(tmp: Path, name: str) -> Path:
    """gpt-oss as llama.cpp runs it: SwiGLU limit 7, YaRN's range rounded."""
    cfg = json.loads((GOLDEN / "hf" / name / "config.json").read_text())
    rp = {**cfg["rope_parameters"], "truncate": True}
    return _convert(_hf_variant(tmp, name, {"swiglu_limit": 7.0, "rope_parameters": rp}), tmp / name)


def llamacpp_models(tmp: Path) -> dict[str, Path]:
    """ARCH_OF's toys as artifacts (the golden ones where they need no change; variants are converted under ``tmp``)."""
    out = {n: GOLDEN / "iebin" / n for n in ("tiny-llama", "tiny-llama3", "tiny-qwen2", "tiny-qwen3", "tiny-mixtral",
                                             "tiny-gemma3", "tiny-gemma2", "tiny-gemma", "tiny-arcee",
                                             "tiny-stablelm", "tiny-nemotron", "tiny-phi", "tiny-smollm3",
                                             "tiny-granite", "tiny-olmo2", "tiny-olmo3", "tiny-ministral3",
                                             "tiny-exaone4", "tiny-olmoe", "tiny-qwen2-moe", "tiny-glm4-moe",
                                             "tiny-minimax-m2", "tiny-deepseek-v2", "tiny-glm4-moe-lite",
                                             "tiny-mistral4",
                                             "tiny-ernie4-5",
                                             "tiny-seed-oss", "tiny-apertus", "tiny-afmoe", "tiny-dots1", "tiny-glm4",
                                             "tiny-solar-open", "tiny-youtu", "tiny-jais2", "tiny-exaone-moe",
                                             "tiny-cohere2", "tiny-cohere", "tiny-qwen3-5", "tiny-lfm2", "tiny-lfm2-moe",
                                             "tiny-granite4", "tiny-granite4-dense", "tiny-granite-moe",
                                             "tiny-granite-moe-shared", "tiny-nemotron-h",
                                             "tiny-nemotron-h-moe", "tiny-hunyuan-dense", "tiny-hunyuan-moe",
                                             "tiny-hy-v3", "tiny-mamba2", "tiny-falcon-h1", "tiny-mamba", "tiny-falcon-mamba",
                                             "tiny-olmo", "tiny-granite-swa",
                                             "tiny-granite-moe-swa")}
    out["tiny-qwen3-moe"] = _qwen3_moe_every_layer(tmp)
    out["tiny-deepseek-v3"] = _without_mtp(tmp, "tiny-deepseek-v3")
    out["tiny-ernie4-5-moe"] = _without_mtp(tmp, "tiny-ernie4-5-moe")
    out["tiny-gpt-oss"] = _gpt_oss_llamacpp(tmp, "tiny-gpt-oss")
    out["tiny-gpt-oss-mxfp4"] = _gpt_oss_llamacpp(tmp, "tiny-gpt-oss-mxfp4")
    out["tiny-phi3"] = _convert(_hf_variant(tmp, "tiny-phi3", {"sliding_window": None}), tmp / "phi3")
    out["tiny-starcoder2"] = _convert(_hf_variant(tmp, "tiny-starcoder2", {"sliding_window": None}), tmp / "starcoder2")
    out["tiny-llama4"] = _convert(_hf_variant(tmp, "tiny-llama4", LLAMA4_FIXED), tmp / "llama4")
    # (in float32: llama.cpp multiplies BF16 weights by activations rounded to bf16, which flips these random
    # toys' near-tied routing, KL 0.013-0.026 against ierun; in F32 the two compute the same, KL 0.000000)
    for name in ("tiny-qwen3-5-moe", "tiny-qwen3-next"):
        out[name] = _convert(_hf_variant(tmp, name, {"dtype": "float32"}, hf_tensors(GOLDEN / "hf" / name)),
                             tmp / name)
    return out
