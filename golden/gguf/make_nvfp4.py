"""golden/hf/tiny-*-nvfp4/: NVFP4 checkpoints as NVIDIA's Model Optimizer
writes them; golden/gguf/llamacpp/tiny-*-nvfp4.gguf: as llama.cpp's
converter writes them; golden/ref/tiny-*-nvfp4/: transformers' logits of the
same weights, dequantized.

NVIDIA's NVFP4 checkpoints (TensorRT Model Optimizer's ``quant_algo`` NVFP4)
store each quantized linear as ``weight`` (e2m1 codes, two per byte, the
even element in the low nibble), ``weight_scale`` (float8 e4m3fn, one per
16 weights of a row), ``weight_scale_2`` (one float32 per matrix) and
``input_scale`` (the activation's, one float32); the weight is
e2m1 × weight_scale × weight_scale_2. ``convert_hf_to_gguf.py`` repacks
them into ggml's NVFP4 blocks bit for bit, writes ``weight_scale_2`` as a
``.scale`` tensor beside the weight (one per expert for an expert stack) and
``input_scale`` as ``.input_scale``: the file tests/test_nvfp4.py imports.
tiny-llama's is also written as llm-compressor writes NVFP4
(``tiny-llama-nvfp4-ct``: the codes as ``weight_packed``, the per-matrix
scales as their reciprocals ``weight_global_scale`` and
``input_global_scale``, compressed-tensors' quantization_config), and
converted too.

The toys are quantized here the way Model Optimizer does it: weight_scale_2
= max|W| / (6 × 448), each block's scale max|block| / 6 / weight_scale_2
rounded to e4m3fn, each code the nearest e2m1 value. Which layers: every
matrix of the layers (the embedding and head stay as they are, as Model
Optimizer leaves them). tiny-qwen3-moe's experts are 32 channels wide, and
ggml's NVFP4 blocks are 64 weights: its experts are widened to 64 channels
with zeros first (the same function: a zero gate and up row give a zero
activation, which a zero down column ignores); its dense layer 1, which
llama.cpp's qwen3moe cannot hold, becomes a copy of layer 0's experts, and
its top 2 are renormalised, as the real Qwen3-MoE's are (the toy's are not;
llama.cpp's qwen3moe always renormalises). The reference logits are
transformers' on the dequantized weights (the ids of golden/ref/<model>/).

    .venv-golden/bin/python golden/gguf/make_nvfp4.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODELS = ("tiny-llama", "tiny-qwen3-moe")
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
INPUT_SCALE = 0.0234375  # every matrix's activation scale (carried, read by nothing)


def quantize(w):
    """float weight [out, in] -> (packed uint8 [out, in/2], e4m3fn scales [out, in/16], scale_2, dequantized)."""
    import torch

    w = w.float()
    out, cols = w.shape
    scale_2 = (w.abs().max() / (6 * 448)).float()
    blocks = w.reshape(out, cols // 16, 16)
    sb = (blocks.abs().amax(dim=2) / 6 / scale_2).to(torch.float8_e4m3fn)
    d = sb.float() * scale_2
    grid = torch.tensor(E2M1)
    x = (blocks / torch.where(d > 0, d, 1)[..., None]).abs()
    mag = (x[..., None] - grid).abs().argmin(dim=-1)  # nearest magnitude (the first of equals)
    code = (mag | torch.where(blocks < 0, 8, 0)).to(torch.uint8).reshape(out, cols)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    deq = ((grid[mag] * torch.where(blocks < 0, -1.0, 1.0)) * sb.float()[..., None]).float() * scale_2
    return packed, sb, scale_2.reshape(()), deq.reshape(out, cols)


def widened_qwen3_moe(state: dict, cfg: dict) -> None:
    """Experts in every layer (llama.cpp's qwen3moe has no dense layer:
    layer 1's MLP is dropped and layer 0's experts and router copied to it,
    each halved), top-k renormalised, then 32 -> 64 channels with zeros
    (the same function)."""
    import torch

    for name in [n for n in state if n.startswith("model.layers.1.mlp.")]:
        del state[name]
    for name in [n for n in state if n.startswith("model.layers.0.mlp.")]:
        state[name.replace("layers.0.", "layers.1.")] = state[name] * 0.5
    cfg["mlp_only_layers"] = []
    cfg["norm_topk_prob"] = True  # (Qwen3-MoE's; llama.cpp's qwen3moe always renormalises)
    width = cfg["moe_intermediate_size"]
    for name in list(state):
        if ".mlp.experts." in name and name.endswith(("gate_proj.weight", "up_proj.weight")):
            state[name] = torch.cat([state[name], torch.zeros_like(state[name])], dim=0)
        elif ".mlp.experts." in name and name.endswith("down_proj.weight"):
            state[name] = torch.cat([state[name], torch.zeros_like(state[name])], dim=1)
    cfg["moe_intermediate_size"] = 2 * width


def compressed_tensors(ckpt: Path, src: Path) -> Path:
    """``ckpt`` as llm-compressor's ``nvfp4-pack-quantized`` checkpoint: the
    same codes and block scales under ``weight_packed`` / ``weight_scale``,
    the per-matrix scales as their reciprocals ``weight_global_scale`` and
    ``input_global_scale`` (float32), its quantization_config compressed-tensors'."""
    import torch
    from safetensors.torch import load_file, save_file

    out = ckpt.parent / f"{ckpt.name}-ct"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    tensors, renamed = load_file(str(ckpt / "model.safetensors")), {}
    for n, t in tensors.items():
        if n.endswith(".weight_scale_2"):
            renamed[n.removesuffix("_scale_2") + "_global_scale"] = (torch.tensor(1.0) / t).reshape(1)
        elif n.endswith(".input_scale"):
            renamed[n.removesuffix(".input_scale") + ".input_global_scale"] = (torch.tensor(1.0) / t).reshape(1)
        else:  # the codes as weight_packed
            renamed[n + "_packed" if n + "_scale" in tensors else n] = t
    save_file(renamed, str(out / "model.safetensors"))
    cfg = json.loads((ckpt / "config.json").read_text())
    group = {"targets": ["Linear"], "format": "nvfp4-pack-quantized",
             "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                         "symmetric": True, "dynamic": False},
             "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                                   "symmetric": True, "dynamic": "local"}}
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                                  "config_groups": {"group_0": group}, "ignore": ["lm_head"]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(src / f, out / f)
    return out


def make(name: str, work: Path) -> None:
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    src = ROOT / "golden/hf" / name
    state = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update(load_file(str(f)))
    cfg = json.loads((src / "config.json").read_text())
    if name == "tiny-qwen3-moe":
        widened_qwen3_moe(state, cfg)
    quantized = dict(state)
    # the reference's other matrices as the converter's --outtype auto stores them: F16 from float32 (tiny-llama's)
    floats = {n: w.half() if w.ndim == 2 and w.dtype == torch.float32 else w for n, w in state.items()}
    for n, w in state.items():
        if n.startswith("model.layers.") and n.endswith("_proj.weight") and w.ndim == 2 and ".gate." not in n:
            packed, sb, s2, deq = quantize(w)
            quantized[n] = packed
            quantized[n + "_scale"] = sb
            quantized[n + "_scale_2"] = s2
            quantized[n.removesuffix(".weight") + ".input_scale"] = torch.tensor(INPUT_SCALE)
            floats[n] = deq.to(torch.float32)
    out_name = f"{name}-nvfp4"
    ckpt, flt = ROOT / "golden/hf" / out_name, work / f"{out_name}-float"
    shutil.rmtree(ckpt, ignore_errors=True)
    for d, tensors, extra in ((ckpt, quantized, {"quantization_config": {
            "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}),
                              (flt, {k: v.float() for k, v in floats.items()}, {"dtype": "float32"})):
        d.mkdir()
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps({**cfg, **extra}, indent=2) + "\n")
        for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            shutil.copy(src / f, d / f)
    llama_cpp = next((ROOT / "build/llamacpp-src").glob("llama_cpp_python-*/vendor/llama.cpp"))
    made = [ckpt]
    if name == "tiny-llama":  # the same weights as llm-compressor writes them
        made.append(compressed_tensors(ckpt, src))
    for d in made:
        gguf = HERE / "llamacpp" / f"{d.name}.gguf"
        subprocess.run([sys.executable, str(HERE / "make_llamacpp_converted.py"), str(llama_cpp), str(d), str(gguf)],
                       check=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    ids = json.loads((ROOT / "golden/ref" / name / "ids.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(str(flt), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float32)
    ref = ROOT / "golden/ref" / out_name
    ref.mkdir(exist_ok=True)
    (ref / "ids.json").write_text(json.dumps(ids, indent=2) + "\n")
    np.save(ref / "logits.npy", logits)
    print(f"{', '.join(d.name for d in made)}: {ref.relative_to(ROOT)}: logits {logits.shape}")


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        for name in sys.argv[1:] or MODELS:
            make(name, Path(d))


if __name__ == "__main__":
    main()
