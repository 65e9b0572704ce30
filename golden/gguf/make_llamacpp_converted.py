"""golden/gguf/llamacpp/*.gguf: golden Hugging Face checkpoints as llama.cpp's
own converter (``convert_hf_to_gguf.py``, ``--outtype auto``) writes them.

The reference for both directions of the GGUF bridge on the files users
actually download (tests/test_llamacpp_converter.py): gguf-to-iebin of each
must be hf-to-iebin of its checkpoint, value for value, and iebin-to-gguf of
that checkpoint must write the same tensors, byte for byte. The converter is
the one llama-cpp-python 0.3.36 vendors (``make llamacpp`` unpacks it); it
needs torch and transformers, so this runs in the golden environment:

    .venv-golden/bin/pip install sentencepiece   # the converter imports it
    .venv-golden/bin/python golden/gguf/make_llamacpp_converted.py [NAME ...]   # all of MODELS and FUSED by default

These things are set for the toys, none of which touches a tensor:

- ``tokenizer.ggml.pre`` is ``gpt-2``: the converter names a split by
  hashing what a known real vocabulary makes of a test text, which a toy
  vocabulary cannot match; the toys' tokenizer is GPT-2's split;
- the tokenizer is loaded as ``PreTrainedTokenizerFast``: transformers 5's
  ``Qwen2Tokenizer`` adds an ``<|endoftext|>`` the toy vocabulary lacks, which
  the converter's vocabulary-size check refuses;
- gpt-oss's ``swiglu_limit`` is 7.0, llama.cpp's constant (the toy's 1.5,
  chosen so that the clamp binds, is what iebin-to-gguf refuses to export);
- ``tiny-exaone`` is tiny-llama laid out as an EXAONE 3.5 checkpoint
  (``exaone_dir``), which transformers cannot load but the converter reads;
- Cohere 2's ``rotary_pct`` is 1.0, as Command R7B's config states it (the
  converter requires it; transformers 5's Cohere2Config has no such key);
- ERNIE 4.5's, Gemma 1's and Nemotron's vocabularies are read as BPE
  (``_set_vocab_gpt2``): their converters read a SentencePiece ``tokenizer.model``, which the toys'
  byte-level BPE tokenizer has none of;
- Llama 4's chunks and temperature are Scout's (8192 positions, 8192 and
  0.1), which llama.cpp's llama4 graph fixes whatever the config says (the
  toy's 4, 4 and 0.5, chosen so that they act within 12 positions, are what
  iebin-to-gguf refuses to export);
- Granite 4's ``layer_types`` as the Hub's configs spell them ("mamba",
  "attention"; the converter reads those, transformers 5 writes
  ``linear_attention`` and ``full_attention``);
- Nemotron-H's blocks as the Hub's configs spell them (``hybrid_override_pattern``, ``num_hidden_layers``;
  the converter counts MLP blocks only under that spelling: transformers 5's ``layers_block_type`` list names
  them "mlp", which it does not read);
- Nemotron-H's config read as its config.json says it, as the converter reads it where transformers has no
  NemotronHConfig (before 5.x): transformers 5's ``to_dict`` adds ``num_experts_per_tok`` to a config without
  experts, which the converter takes for experts (a ``nemotron_h_moe`` file whose MLP blocks have no width, which
  llama.cpp cannot load);
- StarCoder2's ``sliding_window`` is none: the converter writes no window,
  and llama.cpp's starcoder2 attends to every position (the toy's window of
  4 acts within the 12 reference positions);
- HunYuan dense's ``max_position_embeddings`` is 32768, as the Hub's configs state it (the converter asserts it
  beside an NTK-alpha base, then writes a 256k context whatever it is);
- HunYuan-MoE's vocabulary is read as BPE (``_set_vocab_gpt2``): its converter reads a tiktoken vocabulary
  (``mergeable_ranks``) the toy's tokenizer has none of;
- MiniMax-M2's ``rotary_dim`` and ``scoring_func`` "sigmoid", as the Hub's
  config states them (the converter reads the rotated dims and the gating
  function from them; transformers 5 reads ``rotary_dim`` too);
- Solar Open's ``partial_rotary_factor`` is 1.0: its converter (GLM-4.5's) takes half of each head without the key,
  where transformers' Solar Open turns all of it.
"""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "llamacpp"
# Granite 4's layer types as the Hub's configs spell them, which the converter reads (transformers 5 writes
# linear_attention and full_attention)
GRANITE4_LAYERS = ["mamba", "attention", "mamba", "mamba"]
# golden/hf model -> config.json changes (see the docstring)
MODELS = {"tiny-qwen2": {}, "tiny-qwen3": {}, "tiny-mixtral": {}, "tiny-gpt-oss-mxfp4": {"swiglu_limit": 7.0},
          "tiny-phi3": {}, "tiny-gemma3": {}, "tiny-gemma": {}, "tiny-arcee": {}, "tiny-stablelm": {},
          "tiny-starcoder2": {"sliding_window": None}, "tiny-nemotron": {}, "tiny-phi": {},
          "tiny-smollm3": {},
          "tiny-granite": {}, "tiny-olmo2": {},
          "tiny-olmo3": {}, "tiny-ministral3": {}, "tiny-exaone4": {}, "tiny-olmoe": {}, "tiny-qwen2-moe": {},
          "tiny-seed-oss": {}, "tiny-apertus": {}, "tiny-afmoe": {}, "tiny-dots1": {}, "tiny-solar-open": {"partial_rotary_factor": 1.0}, "tiny-youtu": {}, "tiny-jais2": {}, "tiny-exaone-moe": {}, "tiny-glm4": {}, "tiny-glm4-moe": {}, "tiny-minimax-m2": {"rotary_dim": 8, "scoring_func": "sigmoid"},
          "tiny-deepseek-v3": {}, "tiny-deepseek-v2": {}, "tiny-glm4-moe-lite": {"scoring_func": "sigmoid"},
          "tiny-mistral4-vl": {},
          "tiny-llama4": {"attention_chunk_size": 8192, "floor_scale": 8192, "attn_scale": 0.1},
          "tiny-ernie4-5": {}, "tiny-ernie4-5-moe": {}, "tiny-qwen3-5": {}, "tiny-qwen3-5-moe": {}, "tiny-qwen3-next": {}, "tiny-qwen3-vl": {}, "tiny-qwen2-vl": {}, "tiny-qwen3-vl-moe": {}, "tiny-glm4-vl": {}, "tiny-glm4-vl-moe": {}, "tiny-lfm2": {}, "tiny-lfm2-moe": {},
          "tiny-granite4": {"layer_types": GRANITE4_LAYERS}, "tiny-granite4-dense": {"layer_types": GRANITE4_LAYERS},
          "tiny-granite-moe": {}, "tiny-granite-moe-shared": {},
          "tiny-nemotron-h": {"hybrid_override_pattern": "M-*-MM", "layers_block_type": None, "num_hidden_layers": 6},
          "tiny-nemotron-h-moe": {"hybrid_override_pattern": "MEM*E", "layers_block_type": None,
                                  "num_hidden_layers": 5},
          "tiny-cohere2": {"rotary_pct": 1.0}, "tiny-cohere": {}, "tiny-exaone": {},
          "tiny-hunyuan-dense": {"max_position_embeddings": 32768}, "tiny-hunyuan-moe": {}, "tiny-hy-v3": {},
          "tiny-mamba2": {}, "tiny-falcon-h1": {}, "tiny-mamba": {}, "tiny-falcon-mamba": {}, "tiny-olmo": {}, "tiny-granite-swa": {"no_rope_layers": [1, 1, 0, 1]},
          "tiny-granite-moe-swa": {"no_rope_layers": [1, 1, 0, 1]}}
# The converter's layout options, which write files llama.cpp reads as well: --fuse-qkv (q, k, v rows in one
# attn_qkv) and --fuse-gate-up-exps (each expert's gate rows, then its up rows, in one ffn_gate_up_exps).
# output name -> (the golden/hf model, the options)
FUSED = {"tiny-mixtral-fused": ("tiny-mixtral", ["--fuse-qkv"]), "tiny-qwen2-fused": ("tiny-qwen2", ["--fuse-qkv"]),
         "tiny-qwen3-5-moe-fused": ("tiny-qwen3-5-moe", ["--fuse-qkv", "--fuse-gate-up-exps"]),
         "tiny-glm4-vl-fused": ("tiny-glm4-vl", ["--fuse-qkv"])}
# EXAONE 3.5 (ExaoneForCausalLM, remote code transformers does not ship) is a Llama under other names: tiny-llama
# laid out as LG publishes it, HF name -> EXAONE's (its config keys likewise)
EXAONE_NAMES = (("model.embed_tokens.", "transformer.wte."), ("model.norm.", "transformer.ln_f."),
                ("model.layers.", "transformer.h."), (".input_layernorm.", ".ln_1."),
                (".post_attention_layernorm.", ".ln_2."), (".self_attn.o_proj.", ".attn.attention.out_proj."),
                (".self_attn.", ".attn.attention."), (".mlp.gate_proj.", ".mlp.c_fc_0."),
                (".mlp.up_proj.", ".mlp.c_fc_1."), (".mlp.down_proj.", ".mlp.c_proj."))


def exaone_dir(work: Path) -> Path:
    """tiny-llama as an EXAONE 3.5 checkpoint (EXAONE_NAMES), for the converter's ExaoneModel."""
    from safetensors.torch import load_file, save_file

    src, dst = ROOT / "golden/hf/tiny-llama", work / "tiny-exaone"
    dst.mkdir()
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        for name, t in load_file(str(f)).items():
            for a, b in EXAONE_NAMES:
                name = name.replace(a, b)
            tensors[name] = t
    save_file(tensors, str(dst / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    exaone = {"architectures": ["ExaoneForCausalLM"], "model_type": "exaone", "num_layers": cfg["num_hidden_layers"],
              "activation_function": "silu", "layer_norm_epsilon": cfg["rms_norm_eps"],
              # (this converter writes EXAONE's eps under LayerNorm's key alone, which llama.cpp's exaone graph does
              # not read; with the key below it writes the RMS one too, as the files LG publishes carry it)
              "rms_norm_eps": cfg["rms_norm_eps"],
              "rope_theta": cfg["rope_parameters"]["rope_theta"]}
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "max_position_embeddings", "vocab_size", "tie_word_embeddings", "bos_token_id", "eos_token_id")
    (dst / "config.json").write_text(json.dumps({**exaone, **{k: cfg[k] for k in keep}}, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, dst / f)
    return dst


def source_dir(name: str, work: Path) -> Path:
    """The checkpoint the converter reads: golden/hf's, with MODELS' config changes."""
    if name == "tiny-exaone":
        return exaone_dir(work)
    src = ROOT / "golden/hf" / name
    if not MODELS[name]:
        return src
    dst = work / name
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(MODELS[name])
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst


def convert(llama_cpp: Path, src: Path, out: Path, flags: list[str]) -> None:
    """Run in a child: the converter's module state is per process."""
    sys.path[:0] = [str(llama_cpp / "gguf-py"), str(llama_cpp)]
    import conversion.base as base
    import transformers

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    import conversion.ernie as ernie
    import conversion.gemma as gemma
    import conversion.hunyuan as hunyuan
    import conversion.nemotron as nemotron
    # (the toys' BPE: no tokenizer.model, and HunYuan-MoE's converter reads a tiktoken vocabulary only)
    for model in (ernie.Ernie4_5Model, gemma.GemmaModel, nemotron.NemotronModel, hunyuan.HunYuanMoEModel):
        model.set_vocab = base.TextModel._set_vocab_gpt2
    transformers.AutoTokenizer.from_pretrained = transformers.PreTrainedTokenizerFast.from_pretrained
    if json.loads((src / "config.json").read_text()).get("architectures") == ["NemotronHForCausalLM"]:
        def raw_config(*_args, **_kw):  # (the converter then reads config.json as it is)
            raise ValueError("read config.json as the Hub's")
        transformers.AutoConfig.from_pretrained = raw_config
    sys.argv = [str(llama_cpp / "convert_hf_to_gguf.py"), str(src), "--outfile", str(out), "--outtype", "auto", *flags]
    runpy.run_path(sys.argv[0], run_name="__main__")


def main() -> None:
    if len(sys.argv) >= 4 and Path(sys.argv[1]).is_dir():  # the child
        convert(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
        return
    llama_cpp = next((ROOT / "build/llamacpp-src").glob("llama_cpp_python-*/vendor/llama.cpp"))
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        for name in sys.argv[1:] or [*MODELS, *FUSED]:
            out = OUT / f"{name}.gguf"
            model, flags = FUSED.get(name, (name, []))
            subprocess.run([sys.executable, __file__, str(llama_cpp), str(source_dir(model, Path(d))), str(out),
                            *flags], check=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
            print(f"{out.relative_to(ROOT)}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
