#!/usr/bin/env python3
"""Regenerate the golden tiny Hugging Face checkpoints and reference outputs.

Run with the pinned environment (see golden/requirements-golden.txt):

    .venv-golden/bin/python golden/make_golden.py

Writes (replacing any previous output):

    golden/hf/tiny-llama/   LlamaForCausalLM, float32, sharded safetensors + index
    golden/hf/tiny-qwen2/   Qwen2ForCausalLM, bfloat16, single model.safetensors, tied embeddings
    golden/hf/tiny-mistral/ MistralForCausalLM, bfloat16, single model.safetensors, sliding_window 4
    golden/hf/tiny-llama3/  LlamaForCausalLM, float32, single model.safetensors, Llama-3 rope scaling
    golden/hf/tiny-qwen3/   Qwen3ForCausalLM, bfloat16, per-head q/k RMSNorm, head_dim 32 (q_dim != hidden)
    golden/hf/tiny-qwen3-moe/  Qwen3MoeForCausalLM, bfloat16, 4 experts top-2 without renormalising,
                            layer 1 dense (mlp_only_layers)
    golden/hf/tiny-mixtral/ MixtralForCausalLM, bfloat16, 4 experts top-2 (per-expert w1/w2/w3 tensors)
    golden/hf/tiny-gpt-oss/ GptOssForCausalLM, bfloat16: sinks, sliding/full layer_types, YaRN,
                            q/k/v/o and expert biases, clamped SwiGLU (swiglu_limit 1.5 so the clamp binds)
    golden/hf/tiny-gemma3/  Gemma3ForCausalLM, bfloat16: (1 + w) and sandwich norms, q/k norms, GELU-tanh MLP,
                            sqrt(hidden) embedding scale, sliding (window 4, local RoPE base) and full
                            (linear-scaled RoPE) layers, query_pre_attn_scalar 32, tied
    golden/hf/tiny-gemma2/  Gemma2ForCausalLM, bfloat16: soft-capped scores and logits, sandwich norms, GELU,
                            sliding (window 4) and global layers by Gemma 2's period, tied
    golden/hf/tiny-gemma/   GemmaForCausalLM, bfloat16: Gemma's norms, embedding scale and GELU in Llama's layer,
                            one key head, head_dim 32, hidden_act "gelu" (the Hub's legacy spelling), tied
    golden/hf/tiny-arcee/   ArceeForCausalLM, bfloat16: Llama's layer with an MLP of up, ReLU squared and down (no
                            gate), YaRN (factor 4 of an original 32 positions), untied
    golden/hf/tiny-stablelm/ StableLmForCausalLM, bfloat16: LayerNorm with biases, RoPE over a quarter of each head,
                            q/k/v biases, untied
    golden/hf/tiny-starcoder2/ Starcoder2ForCausalLM, bfloat16: LayerNorms with biases, biases on every projection,
                            an MLP without a gate (GELU-tanh), sliding_window 4 on every layer, tied
    golden/hf/tiny-nemotron/ NemotronForCausalLM, bfloat16: LayerNorm1P (weights plus 1) with biases, RoPE over half
                            of each head, an MLP without a gate (ReLU squared), untied
    golden/hf/tiny-phi/     PhiForCausalLM, bfloat16: one LayerNorm (with bias) for the attention and the MLP in
                            parallel, biases on every projection and the head, RoPE over 6 of each 16-dim head, an
                            MLP without a gate (gelu_new), untied
    golden/hf/tiny-phi3/    Phi3ForCausalLM, bfloat16: fused qkv_proj and gate_up_proj, partial RoPE (half of
                            each 16-dim head), LongRoPE (short and long factors, original context 32 of 128),
                            sliding_window 6; ref/tiny-phi3/long.json: 40 tokens, past the original context
    golden/hf/tiny-smollm3/ SmolLM3ForCausalLM, bfloat16, 4 layers: the 4th without RoPE (no_rope_layers), tied
    golden/hf/tiny-granite/ GraniteForCausalLM, bfloat16: embedding, attention, residual multipliers and logits
                            scaling as Granite 3's (12, 1/head_dim, 0.22; logits / 4), tied
    golden/hf/tiny-olmo2/   Olmo2ForCausalLM, bfloat16: norms of the blocks' outputs only, q/k norms over the
                            whole projections, untied
    golden/hf/tiny-olmo3/   Olmo3ForCausalLM, bfloat16, 4 layers: three sliding (window 4, plain RoPE), the 4th full
                            (YaRN), OLMo 2's norms
    golden/hf/tiny-ministral3/  Ministral3ForCausalLM, bfloat16: YaRN from an original context of 4, Llama 4's
                            attention temperature (beta 0.5) past it, tied
    golden/hf/tiny-exaone4/ Exaone4ForCausalLM, bfloat16, 64 layers 32 wide: OLMo 2's output norms with per-head
                            q/k norms, every 4th layer full and unrotated, the others sliding (window 4), untied
    golden/hf/tiny-olmoe/   OlmoeForCausalLM, bfloat16: 4 experts top-2 without renormalising, q/k norms over the
                            whole projections, untied
    golden/hf/tiny-qwen2-moe/  Qwen2MoeForCausalLM, bfloat16: 4 experts top-2 without renormalising beside a
                            shared expert (48 channels) under a sigmoid gate, q/k/v biases, untied
    golden/hf/tiny-glm4-moe/  Glm4MoeForCausalLM, bfloat16: layer 0 dense; layer 1 4 experts, top 2 by sigmoid score
                            plus a correction bias, renormalised and x 2.5, beside a shared expert; per-head q/k norms,
                            q/k/v biases, RoPE over half of each head (rotate-half), untied; a seeded multi-token
                            prediction layer (model.layers.2) as GLM-4.5 stores one; ref/tiny-glm4-moe/
                            logits_grouped.npy: the same weights routed in 2 groups of 2 experts, 1 kept
    golden/hf/tiny-minimax-m2/  MiniMaxM2ForCausalLM, bfloat16: every layer 4 experts (Mixtral's names), top 2 by sigmoid
                            score plus a correction bias, renormalised; q/k norms over the whole projections, RoPE over
                            half of each head, untied
    golden/hf/tiny-seed-oss/ SeedOssForCausalLM, bfloat16: q/k/v biases (no o bias), untied
    golden/hf/tiny-hunyuan-dense/  HunYuanDenseV1ForCausalLM, bfloat16: per-head q/k norms after RoPE, the NTK-alpha
                            base (alpha 1000, as the Hub's configs), tied
    golden/hf/tiny-hunyuan-moe/  HunYuanMoEV1ForCausalLM, bfloat16: those norms, a shared MLP beside 2 of 4
                            softmax-routed experts (renormalised) in every layer, the per-layer keys as lists, untied
    golden/hf/tiny-hy-v3/   HYV3ForCausalLM (Hy3), bfloat16, the Hub's names: per-head q/k norms, a dense layer, then 4
                            experts (top 2 by sigmoid score plus a choice bias, renormalised, x 2.5) beside a shared
                            one; its MTP layer after the last (eh_proj, enorm, hnorm, final_layernorm), unread; untied
    golden/hf/tiny-glm4/    Glm4ForCausalLM, bfloat16: interleaved RoPE over half of each head, norms before and after
                            each block, gate_up_proj fused, q/k/v biases, untied; ids 318/319 GLM's special tokens
    golden/hf/tiny-cohere2/ Cohere2ForCausalLM, bfloat16, 4 layers: LayerNorm, attention and MLP in parallel, three
                            sliding layers with interleaved RoPE (window 4), the 4th full and unrotated, logits x 0.5
    golden/hf/tiny-cohere/  CohereForCausalLM, bfloat16: Cohere 2's layer with every layer full and rotated, logits x 0.5
    golden/hf/tiny-qwen3-fp8/  tiny-qwen3 as an FP8 checkpoint (quant_method fp8): every layer matrix e4m3fn codes with
                            float32 scales per 32 x 32 block; ref/tiny-qwen3-fp8/logits.npy: transformers' logits of it
                            dequantized (FineGrainedFP8Config(dequantize=True))
    golden/hf/tiny-ministral3-fp8/  tiny-ministral3 as Ministral 3 is published in FP8: one scale per matrix and a
                            static activation_scale beside it; ref/tiny-ministral3-fp8/logits.npy likewise
    golden/hf/tiny-ministral3-vl/  Mistral3ForConditionalGeneration: tiny-ministral3's language model beside a
                            tiny Pixtral vision tower (its text logits are tiny-ministral3's)
    golden/ref/mistral3-text-defaults.json  transformers' MistralConfig and Ministral3Config defaults
    golden/hf/tiny-mistral4/  Mistral4ForCausalLM, bfloat16: latent attention under YaRN and Llama 4's temperature,
                            softmax routing renormalised and scaled, the experts in two stacks;
                            ref/tiny-mistral4/logits_no_temperature.npy: the same without the temperature
    golden/hf/tiny-mistral4-vl/  Mistral3ForConditionalGeneration as Mistral Small 4 is published: tiny-mistral4's
                            language model and head beside a tiny Pixtral tower
    golden/ref/mistral4-text-defaults.json  transformers' Mistral4Config defaults
    golden/hf/tiny-gemma3-vl/  Gemma3ForConditionalGeneration: tiny-gemma3's language model beside a tiny
                            SigLIP vision tower (its text logits are tiny-gemma3's)
    golden/ref/gemma3-text-defaults.json   transformers' Gemma3TextConfig defaults (ieconv text-model fills them in)
    golden/ref/llama4-text-defaults.json   transformers' Llama4TextConfig defaults (likewise)
    golden/hf/tiny-gpt-oss-mxfp4/  the same model with its experts quantized to MXFP4 here and
                            stored as gpt-oss-20b publishes them (*_blocks + *_scales, quant_method mxfp4)
    golden/ref/<model>/     ids.json, logits.npy, greedy.json, greedy_text.json, versions.json,
                            cast_<dtype>.safetensors (torch's casts of every tensor)
    golden/ref/e4m3fn.npy   torch's float32 value of each float8 e4m3fn byte
    golden/ref/cast_edge.safetensors   rounding edge cases cast by torch to bf16/f16

Everything is deterministic: fixed seeds, explicit generators, no timestamps,
no absolute paths in any output.  Running it twice yields byte-identical files.
torch's CPU kernels are pinned to the AVX2 code path (ATEN_CPU_CAPABILITY), so
an AVX-512 machine writes the same logits bytes as an AVX2 one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

# Single-threaded, deterministic CPU math (set before importing torch).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# torch picks its vectorized CPU kernels by the machine's ISA; AVX-512 ones sum
# in another order and change the last bits of the logits.  The committed
# references were made with the AVX2 kernels.
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AfmoeConfig,
    AfmoeForCausalLM,
    Dots1Config,
    Dots1ForCausalLM,
    ExaoneMoeConfig,
    ExaoneMoeForCausalLM,
    Jais2Config,
    Jais2ForCausalLM,
    SolarOpenConfig,
    SolarOpenForCausalLM,
    YoutuConfig,
    YoutuForCausalLM,
    ApertusConfig,
    ApertusForCausalLM,
    ArceeConfig,
    ArceeForCausalLM,
    NemotronConfig,
    NemotronForCausalLM,
    PhiConfig,
    PhiForCausalLM,
    StableLmConfig,
    StableLmForCausalLM,
    Starcoder2Config,
    Starcoder2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MiniMaxM2Config,
    MiniMaxM2ForCausalLM,
    PreTrainedTokenizerFast,
    Gemma2Config,
    Gemma2ForCausalLM,
    GemmaConfig,
    GemmaForCausalLM,
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    GraniteConfig,
    GraniteForCausalLM,
    SiglipVisionConfig,
    GptOssConfig,
    GptOssForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Olmo3Config,
    Olmo3ForCausalLM,
    Ministral3Config,
    Llama4TextConfig,
    Ernie4_5Config,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3_5VisionConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
    Glm4vConfig,
    Glm4vForConditionalGeneration,
    Glm4vTextConfig,
    Glm4vVisionConfig,
    Glm4vMoeConfig,
    Glm4vMoeForConditionalGeneration,
    Glm4vMoeTextConfig,
    Glm4vMoeVisionConfig,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLTextConfig,
    Qwen2_5_VLVisionConfig,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
    Qwen3VLMoeTextConfig,
    Qwen3VLMoeVisionConfig,
    Qwen3VLTextConfig,
    Qwen3VLVisionConfig,
    Ernie4_5ForCausalLM,
    GraniteMoeConfig,
    GraniteMoeForCausalLM,
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    GraniteMoeSharedConfig,
    GraniteMoeSharedForCausalLM,
    Mamba2Config,
    Mamba2ForCausalLM,
    FalconH1Config,
    FalconH1ForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    FalconMambaConfig,
    FalconMambaForCausalLM,
    OlmoConfig,
    OlmoForCausalLM,
    GraniteSWAConfig,
    GraniteSWAForCausalLM,
    GraniteMoeSWAConfig,
    GraniteMoeSWAForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    Lfm2Config,
    Lfm2ForCausalLM,
    Lfm2MoeConfig,
    Lfm2MoeForCausalLM,
    Lfm2VlConfig,
    Lfm2VlForConditionalGeneration,
    Siglip2VisionConfig,
    Ernie4_5_MoeConfig,
    Ernie4_5_MoeForCausalLM,
    Llama4ForCausalLM,
    Llama4Config,
    Llama4VisionConfig,
    Llama4ForConditionalGeneration,
    Exaone4Config,
    OlmoeConfig,
    SeedOssConfig,
    Glm4Config,
    Cohere2Config,
    CohereConfig,
    CohereForCausalLM,
    Cohere2ForCausalLM,
    Glm4ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeLiteConfig,
    HunYuanDenseV1Config,
    HunYuanDenseV1ForCausalLM,
    HunYuanMoEV1Config,
    HunYuanMoEV1ForCausalLM,
    HYV3Config,
    HYV3ForCausalLM,
    Glm4MoeLiteForCausalLM,
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Glm4MoeForCausalLM,
    SeedOssForCausalLM,
    OlmoeForCausalLM,
    Exaone4ForCausalLM,
    Ministral3ForCausalLM,
    Mistral3Config,
    Mistral4Config,
    Mistral4ForCausalLM,
    Mistral3ForConditionalGeneration,
    PixtralVisionConfig,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

GOLDEN_DIR = Path(__file__).resolve().parent
HF_DIR = GOLDEN_DIR / "hf"
REF_DIR = GOLDEN_DIR / "ref"

# Seed chosen (by trying 1234..1249) so that both greedy cases of both models run
# the full 16 tokens without hitting EOS, with a top1-top2 logit gap >= 0.01 at
# every step.  make_golden asserts the no-EOS property.
SEED = 1239
# The same search (1240..1261) for the two models below: both seeds meet it,
# with margins of at least 0.016 (Mistral) and 0.023 (Llama-3).
MISTRAL_SEED = SEED + 3
LLAMA3_SEED = SEED + 4
QWEN3_SEED, QWEN3_MOE_SEED, MIXTRAL_SEED, GPT_OSS_SEED = SEED + 5, SEED + 6, SEED + 7, SEED + 8
GEMMA3_SEED = SEED + 9
GEMMA2_SEED = SEED + 11
ARCEE_SEED = SEED + 190  # the first from SEED + 186 whose greedy cases run 16 tokens with margins >= 0.04
# AFM-4.5B's RoPE on a toy: YaRN (factor 4 of an original 32 positions; AFM's is 20 of 4096)
ARCEE_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
              "beta_fast": 32.0, "beta_slow": 1.0}
STABLELM_SEED = SEED + 194  # its greedy cases run 16 tokens with margins >= 0.02
STARCODER2_SEED = SEED + 196  # its greedy cases run 16 tokens with margins >= 0.05
NEMOTRON_SEED = SEED + 200  # the first from SEED + 198 whose greedy cases run 16 tokens with margins >= 0.02
PHI_SEED = SEED + 204  # its greedy cases run 16 tokens with margins >= 0.03
GEMMA_SEED = SEED + 184  # its greedy cases run 16 tokens with margins >= 0.03
PHI3_SEED = SEED + 16  # the first from SEED + 12 whose greedy cases run 16 tokens with margins >= 0.01
# Phi-3.5 / Phi-4-mini's RoPE on a toy: the first half of each 16-dim head
# turns (partial_rotary_factor; Phi-4-mini's is 3/4), each pair's frequency
# divided by a short factor within the original context and a long one past
# it, cos/sin times sqrt(1 + ln(128/32) / ln 32). The greedy references stay
# within 32 positions (short); LONG_LEN ids run past them (long).
PHI3_ROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
             "short_factor": [1.0, 1.5, 2.5, 4.0], "long_factor": [1.0, 3.0, 8.0, 20.0]}
PHI3_ORIGINAL_CTX = 32
PHI3_WINDOW = 6
LONG_LEN = 40
GRANITE_SEED = SEED + 19  # its greedy cases run 16 tokens with margins >= 0.01
# Granite 3's multipliers (granite-3.x-2b: 12, 1/128 for its 128-dim heads, 0.22, 8), the logits' divisor
# smaller so the toy's greedy margins stay clear
GRANITE = {"embedding_multiplier": 12.0, "attention_multiplier": 1 / 16, "residual_multiplier": 0.22,
           "logits_scaling": 4.0}
OLMO3_SEED = SEED + 28  # the first from SEED + 23 whose greedy cases run 16 tokens with margins >= 0.01
# OLMo 3's RoPE on a toy: YaRN (factor 4 of an original 32 positions) on the full layer, the sliding ones unscaled
OLMO3_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
              "beta_fast": 32.0, "beta_slow": 1.0}
# Ministral 3's RoPE on a toy: YaRN (its mscale and mscale_all_dim 1) with an original context of 4 positions,
# so the 12 reference ids see Llama 4's attention temperature step twice (1 + beta ln 2, ln 3); beta 0.5, not
# its 0.1, so the step moves the logits clearly
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0, "original_max_position_embeddings": 4,
                   "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "llama_4_scaling_beta": 0.5}
MINISTRAL3_SEED = SEED + 34  # the first from SEED + 29 whose greedy cases run 16 tokens with margins >= 0.015
EXAONE4_SEED = SEED + 38  # the first from SEED + 36 whose greedy cases run 16 tokens with margins >= 0.015
# EXAONE 4.0 32B's layout (llama.cpp's exaone4 slides only in 64-layer models): 64 narrow layers, every 4th
# full and unrotated, the others sliding
EXAONE4_DIMS = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=64, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=16)
OLMOE_SEED = SEED + 40  # its greedy cases run 16 tokens with margins >= 0.03
SEED_OSS_SEED = SEED + 41  # its greedy cases run 16 tokens with margins >= 0.03
GLM4_SEED = SEED + 42  # its greedy cases run 16 tokens with margins >= 0.04
COHERE2_SEED = SEED + 47  # the first from SEED + 43 whose greedy cases run 16 tokens with margins >= 0.01
COHERE2_LOGIT_SCALE = 0.5  # Command R7B's is 0.25; the toy's logits are a few units, so its scale keeps them
MINIMAX_M2_SEED = SEED + 66  # its greedy cases run 16 tokens with margins >= 0.02
# Mistral Small 4's RoPE (YaRN over the rotated 8 of each 24-dim head, Llama 4's attention temperature) with the
# original context cut to 4 positions, so that the scaled frequencies and the temperature act within the toy's 12
MISTRAL4_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0, "original_max_position_embeddings": 4,
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                 "llama_4_scaling_beta": 0.5}
MISTRAL4_SEED = SEED + 210  # its greedy cases run 16 tokens with margins >= 0.02
DEEPSEEK_V3_SEED = SEED + 78  # the first from SEED + 70 whose greedy cases run 16 tokens with margins >= 0.015
DEEPSEEK_V2_SEED = SEED + 83  # the first from SEED + 80 whose greedy cases run 16 tokens with margins >= 0.014
# DeepSeek-V3's YaRN on a toy: factor 4 over an original context of 32 positions, mscale and mscale_all_dim 1 (its
# published values: the scores times (0.1 ln 4 + 1)^2, cos and sin unscaled)
DEEPSEEK_V3_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
                    "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
# Latent attention's dims on a toy: 4 heads of 16 unrotated + 8 rotated q/k dims and 12 value dims (v_head_dim
# apart from qk_nope_head_dim, as no real model has it, so a mix-up shows), a latent of 32
MLA_DIMS = dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, num_key_value_heads=4)
# Llama 4 Scout's RoPE (llama3 with equal low and high factors: each frequency scaled by 16 or kept), its original
# context cut to 64 positions so the toy's scaled frequencies turn visibly; chunks of 4 positions and a temperature
# that grows every 4 (Scout's: 8192 each, beyond a toy's reach; iebin-to-gguf holds an export to those)
LLAMA4_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
               "high_freq_factor": 1.0, "original_max_position_embeddings": 64}
QWEN3_5_MOE_SEED = SEED + 112  # its greedy cases run 16 tokens with margins >= 0.04
QWEN3_5_SEED = SEED + 108  # its greedy cases run 16 tokens with margins >= 0.04
QWEN3_NEXT_SEED = SEED + 116  # its greedy cases run 16 tokens with margins >= 0.04
QWEN3_VL_MOE_SEED = SEED + 122  # its greedy cases run 16 tokens with margins >= 0.013
LFM2_SEED = SEED + 140  # its greedy cases run 16 tokens with margins >= 0.01
LFM2_MOE_SEED = SEED + 144  # its greedy cases run 16 tokens with margins >= 0.01
GRANITE4_SEED = SEED + 150  # its greedy cases run 16 tokens with margins >= 0.04
GRANITE_MOE_SEED = SEED + 158  # its greedy cases run 16 tokens with margins >= 0.019
GRANITE_MOE_SHARED_SEED = SEED + 162  # its greedy cases run 16 tokens with margins >= 0.03
GRANITE4_DENSE_SEED = SEED + 154  # its greedy cases run 16 tokens with margins >= 0.1
NEMOTRON_H_SEED = SEED + 176  # the first from SEED + 170 whose greedy cases run 16 tokens with margins >= 0.05
QWEN2_VL_SEED = SEED + 180  # (its vision tower's: the language model is tiny-qwen2's)
NEMOTRON_H_MOE_SEED = SEED + 174  # its greedy cases run 16 tokens with margins >= 0.05
GLM4_VL_MOE_SEED = SEED + 132  # the first from SEED + 130 whose greedy cases run 16 tokens with margins >= 0.02
ERNIE4_5_SEED = SEED + 95  # its greedy cases run 16 tokens with margins >= 0.04
ERNIE4_5_MOE_SEED = SEED + 101  # the first from SEED + 96 whose greedy cases run 16 tokens with margins >= 0.03
LLAMA4_SEED = SEED + 94  # the first from SEED + 91 whose greedy cases run 16 tokens with margins >= 0.02
GLM4_MOE_LITE_SEED = SEED + 90  # its greedy cases run 16 tokens with margins >= 0.014
GLM4_MOE_SEED = SEED + 63  # the first from SEED + 60 whose greedy cases run 16 tokens with margins >= 0.02
QWEN2_MOE_SEED = SEED + 54  # the first from SEED + 52 whose greedy cases run 16 tokens with margins >= 0.02
COHERE_SEED = SEED + 51  # the first from SEED + 48 whose greedy cases run 16 tokens with margins >= 0.01
OLMO2_SEED = SEED + 22  # the first from SEED + 20 whose greedy cases run 16 tokens with margins >= 0.01
SMOLLM3_SEED = SEED + 18  # the first from SEED + 17 whose greedy cases run 16 tokens with margins >= 0.01
# Gemma 2's caps are 50 (scores) and 30 (logits); the toy's scores and logits are a few units, so its
# caps are too, or they would not bind
GEMMA2_CAPS = {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0}
# Gemma 3's RoPE: its published bases (1e6 global, 1e4 local) and the 4B's
# linear factor 8 on the global layers (the 1B has none; the toy tests both).
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
MOE = dict(num_experts_per_tok=2)  # of 4 experts, 32 channels each
# HunYuan's NTK-alpha RoPE as its published configs state it (the base 10000 stretched by alpha^(d / (d - 2)))
HUNYUAN_ROPE = {"rope_type": "dynamic", "alpha": 1000.0, "rope_theta": 10000.0, "factor": 1.0}
HUNYUAN_SEED = SEED + 198  # the first from SEED + 190 whose greedy cases run 16 tokens with margins >= 0.04
HY_V3_SEED = SEED + 213  # the first from SEED + 200 whose greedy cases run 16 tokens with margins >= 0.02
# Apertus's xIELU per layer (raw parameters, as its checkpoints store them: alpha_p and alpha_n before their
# softplus, beta, eps). The Hub's have beta 0.5 and eps -1e-6 in every layer; the second layer's differ so that
# reading each layer's own, and eps's cut, shows in the logits.
APERTUS_XIELU = ({"alpha_p": 0.6, "alpha_n": -0.4, "beta": 0.5, "eps": -1e-6},
                 {"alpha_p": -0.8, "alpha_n": 0.9, "beta": 0.3, "eps": -0.5})
AFMOE_SEED = SEED + 233  # the first from SEED + 230 whose greedy cases run 16 tokens with margins >= 0.04
APERTUS_SEED = SEED + 226  # the first from SEED + 220 whose greedy cases run 16 tokens with margins >= 0.05
EXAONE_MOE_SEED = SEED + 342  # the best of SEED + 340..351: its greedy cases run 16 tokens with margins >= 0.079
GRANITE_MOE_SWA_SEED = SEED + 404  # the best of SEED + 400..429: its greedy cases run 16 tokens with margins >= 0.01
GRANITE_SWA_SEED = SEED + 380  # the best of SEED + 370..395: its greedy cases run 16 tokens with margins >= 0.02
# Granite SWA's RoPE bases on a toy: layer 2 (sliding) without RoPE; and a second set, the sliding layers' own
# base, whose logits are frozen beside (ref/tiny-granite-swa/two_bases.npy)
GRANITE_SWA_THETAS = [10000.0, 10000.0, 0.0, 10000.0]
GRANITE_SWA_TWO_BASES = [10000.0, 10.0, 0.0, 10.0]
OLMO_SEED = SEED + 351  # the best of SEED + 350..361: its greedy cases run 16 tokens with margins >= 0.04
FALCON_H1_SEED = SEED + 462  # the best of SEED + 450..469: its greedy cases run 16 tokens with margins >= 0.017
# Falcon-H1's muP multipliers on a toy, each away from 1 so that a factor dropped or misplaced moves the logits
FALCON_H1_MULTIPLIERS = {"embedding_multiplier": 4.0, "lm_head_multiplier": 0.5, "key_multiplier": 0.5,
                         "attention_in_multiplier": 0.8, "attention_out_multiplier": 0.9, "ssm_in_multiplier": 2.5,
                         "ssm_out_multiplier": 4.0, "mlp_multipliers": [0.9, 0.6],
                         "ssm_multipliers": [0.35, 0.25, 0.5, 0.7, 0.6]}
MAMBA_SEED = SEED + 481  # the best of SEED + 480..491: its greedy cases run 16 tokens with margins >= 2.0
FALCON_MAMBA_SEED = SEED + 506  # the best of SEED + 500..511: its greedy cases run 16 tokens with margins >= 0.04
MAMBA2_SEED = SEED + 330  # the best of SEED + 330..341: its greedy cases run 16 tokens with margins >= 0.035
JAIS2_SEED = SEED + 321  # the best of SEED + 320..331: its greedy cases run 16 tokens with margins >= 0.17
YOUTU_SEED = SEED + 311  # the best of SEED + 300..311: its greedy cases run 16 tokens with margins >= 0.069
SOLAR_OPEN_SEED = SEED + 274  # the best of SEED + 270..295: its greedy cases run 16 tokens with margins >= 0.019
DOTS1_SEED = SEED + 253  # the best of SEED + 240..260: its greedy cases run 16 tokens with margins >= 0.047
HUNYUAN_MOE_SEED = SEED + 197  # the first from SEED + 190 whose greedy cases run 16 tokens with margins >= 0.05
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "original_max_position_embeddings": 4096, "truncate": False}  # gpt-oss-20b's own
GPT_OSS_LIMIT = 1.5  # gpt-oss-20b has 7.0; the tiny model's gate values rarely reach that
# e2m1's eight magnitudes (OCP MX v1.0), code = sign << 3 | index
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MISTRAL_WINDOW = 4       # well below SEQ_LEN, so most positions see a cut window
# Llama-3 rope scaling sized for head_dim 16 and theta 1e4: the wavelengths
# 2*pi*1e4^(2i/16) are 6.3, 19.9, 62.8, 199, ... and the bands split at
# original_max_position_embeddings / high_freq_factor = 16 and
# original_max_position_embeddings / low_freq_factor = 64: one frequency is
# kept, two are smoothed and five are divided by factor.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
VOCAB_TARGET = 320
INIT_STD = 0.15          # std for all weight matrices / embeddings / biases
NORM_STD = 0.1           # RMSNorm weights are 1 + N(0, NORM_STD)
LLAMA_MAX_SHARD = "200KB"  # ~450 KB of f32 weights -> 3 shards
SEQ_LEN = 12
GREEDY_PROMPT_LEN = 5
MAX_NEW_TOKENS = 16
PROMPT_TEXT = "The capital of France is"

SPECIAL_TOKENS = ["<s>", "</s>", "<unk>"]

CORPUS = [
    "The capital of France is Paris. The capital of Germany is Berlin. "
    "The capital of Italy is Rome. The capital of Spain is Madrid.",
    "Paris is a large city on the river Seine. Many people visit Paris "
    "every year to see the museums, the parks and the old streets.",
    "Once upon a time there was a small cat who lived in a quiet house "
    "near the sea. Every morning the cat walked to the window and watched "
    "the boats sail out of the harbour.",
    "A computer program is a list of instructions that tells a machine what "
    "to do. Programs are written in languages such as Python, C and C++. "
    "The program reads numbers, adds them together and prints the result.",
    "The quick brown fox jumps over the lazy dog. The dog does not move; "
    "it is sleeping in the warm afternoon sun.",
    "Water boils at one hundred degrees Celsius at sea level. Ice melts at "
    "zero degrees. The weather today is cold, but tomorrow it will be warm.",
    "She opened the book and began to read. The story was about a young "
    "girl who wanted to learn how the stars move across the night sky.",
    "One, two, three, four, five, six, seven, eight, nine, ten. "
    "Numbers like 1, 2, 3, 42 and 2024 appear in many texts.",
    "Language models predict the next word in a sentence. Given the words "
    "\"The capital of France is\", a good model predicts \"Paris\".",
]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def reset_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def versions() -> dict:
    return {
        "numpy": np.__version__,
        "safetensors": safetensors.__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


# --------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------

def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer, length=len(CORPUS))
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    return wrapped


# --------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------

@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Deterministic, fairly large init so logits are far from uniform."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    seen: set[int] = set()
    for name, p in sorted(model.named_parameters(remove_duplicate=True), key=lambda kv: kv[0]):
        if id(p) in seen:
            continue
        seen.add(id(p))
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if "norm" in name:
            p.copy_(1.0 + NORM_STD * noise)
        elif name.endswith("sinks"):  # gpt-oss: logits on the scale of the attention scores, so they matter
            p.copy_(noise)
        else:
            p.copy_(INIT_STD * noise)


def common_dims(vocab_size: int, bos_id: int, eos_id: int) -> dict:
    return dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        hidden_act="silu",
        initializer_range=0.02,
        use_cache=True,
    )


# --------------------------------------------------------------------------
# reference outputs
# --------------------------------------------------------------------------

def reference_ids(vocab_size: int) -> list[int]:
    """12 ids spread evenly over [0, vocab-1], in a fixed non-monotonic order."""
    spread = [round(i * (vocab_size - 1) / (SEQ_LEN - 1)) for i in range(SEQ_LEN)]
    order = [(5 * i) % SEQ_LEN for i in range(SEQ_LEN)]  # permutation since gcd(5,12)=1
    ids = [spread[j] for j in order]
    assert 0 in ids and vocab_size - 1 in ids and len(set(ids)) == SEQ_LEN
    return ids


@torch.no_grad()
def write_reference(model_cls, model_dir: Path, ref_dir: Path, tok) -> np.ndarray:
    reset_dir(ref_dir)
    model = model_cls.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", local_files_only=True
    )
    model = model.float().eval()
    vocab = model.config.get_text_config().vocab_size  # (a multimodal model's: its text model's)

    ids = reference_ids(vocab)
    write_json(ref_dir / "ids.json", ids)

    input_ids = torch.tensor([ids], dtype=torch.long)
    logits = model(input_ids=input_ids).logits[0].to(torch.float32).numpy()
    assert logits.shape == (SEQ_LEN, vocab)
    np.save(ref_dir / "logits.npy", np.ascontiguousarray(logits, dtype=np.float32))

    def greedy(prompt: list[int]) -> tuple[list[int], float]:
        x = torch.tensor([prompt], dtype=torch.long)
        out = model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=MAX_NEW_TOKENS,
            pad_token_id=model.config.eos_token_id,
        )
        gen = out[0, len(prompt):].tolist()
        # The golden cases are chosen so greedy never stops early on EOS.
        assert len(gen) == MAX_NEW_TOKENS and model.config.eos_token_id not in gen, gen
        # Smallest top-1 minus top-2 logit gap along the greedy path (full-sequence
        # recompute): tells consumers how much numeric slack the argmax has.
        full = model(input_ids=out[:, :-1]).logits[0, len(prompt) - 1:]
        top2 = torch.topk(full, 2, dim=-1).values
        assert torch.equal(full.argmax(-1), out[0, len(prompt):]), "KV-cache vs full recompute mismatch"
        margin = float((top2[:, 0] - top2[:, 1]).min())
        return gen, margin

    prompt = ids[:GREEDY_PROMPT_LEN]
    gen, margin = greedy(prompt)
    write_json(
        ref_dir / "greedy.json",
        {
            "prompt_ids": prompt,
            "max_new_tokens": MAX_NEW_TOKENS,
            "generated_ids": gen,
            "min_top2_margin": round(margin, 4),
        },
    )

    text_ids = tok(PROMPT_TEXT)["input_ids"]
    gen, margin = greedy(text_ids)
    write_json(
        ref_dir / "greedy_text.json",
        {
            "prompt_text": PROMPT_TEXT,
            "prompt_ids": text_ids,
            "max_new_tokens": MAX_NEW_TOKENS,
            "generated_ids": gen,
            "generated_text": tok.decode(gen),
            "min_top2_margin": round(margin, 4),
        },
    )
    write_json(ref_dir / "versions.json", versions())
    return logits


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------

def save_model(tok, name: str, model_cls, cfg, seed: int, dtype=torch.float32, after_init=None,
               **save_kw) -> np.ndarray:
    """Build ``model_cls(cfg)`` with its weights drawn from ``seed`` (and
    ``after_init(model)`` run on it: buffers init_weights leaves), cast to
    ``dtype``, save it and the tokenizer to hf/NAME, and write ref/NAME.
    Returns the reference logits."""
    out = HF_DIR / name
    reset_dir(out)
    seed_everything(seed)
    model = model_cls(cfg).to(torch.float32).eval()
    init_weights(model, seed)
    if after_init is not None:
        after_init(model)
    model.to(dtype).save_pretrained(out, **save_kw)
    tok.save_pretrained(out)
    return write_reference(model_cls, out, REF_DIR / name, tok)


def make_llama(tok) -> None:
    cfg = LlamaConfig(**common_dims(len(tok), tok.bos_token_id, tok.eos_token_id),
                      tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    save_model(tok, "tiny-llama", LlamaForCausalLM, cfg, SEED, max_shard_size=LLAMA_MAX_SHARD)


def make_qwen2(tok) -> None:
    cfg = Qwen2Config(**common_dims(len(tok), tok.bos_token_id, tok.eos_token_id),
                      tie_word_embeddings=True, use_sliding_window=False)
    save_model(tok, "tiny-qwen2", Qwen2ForCausalLM, cfg, SEED + 1, torch.bfloat16)  # one model.safetensors


@torch.no_grad()
def override_logits(model_cls, model_dir: Path, **override) -> np.ndarray:
    """The reference ids' logits of the saved weights with ``override`` applied to the config."""
    cfg = model_cls.config_class.from_pretrained(model_dir)
    for k, v in override.items():
        setattr(cfg, k, v)
    model = model_cls.from_pretrained(model_dir, config=cfg, dtype=torch.float32, attn_implementation="eager",
                                      local_files_only=True).float().eval()
    ids = torch.tensor([reference_ids(cfg.get_text_config().vocab_size)], dtype=torch.long)
    return model(input_ids=ids).logits[0].numpy()


def assert_feature_matters(model_cls, model_dir: Path, ref_logits: np.ndarray, what: str, **override) -> None:
    """The reference logits must differ clearly from the same weights with the
    feature switched off (``override`` applied to the config), or the golden
    would not test it."""
    off = override_logits(model_cls, model_dir, **override).astype(np.float64)
    rel = float(np.abs(off - ref_logits).max() / np.abs(ref_logits).max())
    assert rel > 1e-2, f"{what} barely changes the logits ({rel:.2e})"


def make_mistral(tok) -> None:
    cfg = MistralConfig(**common_dims(len(tok), tok.bos_token_id, tok.eos_token_id),
                        tie_word_embeddings=False, sliding_window=MISTRAL_WINDOW)
    out = HF_DIR / "tiny-mistral"
    logits = save_model(tok, out.name, MistralForCausalLM, cfg, MISTRAL_SEED, torch.bfloat16)
    assert_feature_matters(MistralForCausalLM, out, logits, "sliding_window", sliding_window=None)


def make_llama3(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = LlamaConfig(**dims, rope_parameters=dict(LLAMA3_ROPE), tie_word_embeddings=False,
                      attention_bias=False, mlp_bias=False)
    out = HF_DIR / "tiny-llama3"
    logits = save_model(tok, out.name, LlamaForCausalLM, cfg, LLAMA3_SEED)  # ~460 KB: one model.safetensors
    assert_feature_matters(LlamaForCausalLM, out, logits, "llama3 rope scaling",
                           rope_parameters={"rope_type": "default", "rope_theta": LLAMA3_ROPE["rope_theta"]})


def make_qwen3(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    cfg = Qwen3Config(**dims, head_dim=32, tie_word_embeddings=False, attention_bias=False, use_sliding_window=False)
    save_model(tok, "tiny-qwen3", Qwen3ForCausalLM, cfg, QWEN3_SEED, torch.bfloat16)


def make_qwen3_moe(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    cfg = Qwen3MoeConfig(**dims, **MOE, num_experts=4, moe_intermediate_size=32, norm_topk_prob=False,
                         mlp_only_layers=[1], decoder_sparse_step=1, tie_word_embeddings=False,
                         use_sliding_window=False)
    out = HF_DIR / "tiny-qwen3-moe"
    logits = save_model(tok, out.name, Qwen3MoeForCausalLM, cfg, QWEN3_MOE_SEED, torch.bfloat16)
    assert_feature_matters(Qwen3MoeForCausalLM, out, logits, "norm_topk_prob", norm_topk_prob=True)


def make_mixtral(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    dims["intermediate_size"] = 32
    cfg = MixtralConfig(**dims, **MOE, num_local_experts=4, tie_word_embeddings=False, sliding_window=None)
    out = HF_DIR / "tiny-mixtral"
    logits = save_model(tok, out.name, MixtralForCausalLM, cfg, MIXTRAL_SEED, torch.bfloat16)
    assert_feature_matters(MixtralForCausalLM, out, logits, "top-2 routing", num_experts_per_tok=1)


def make_gemma3(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"], dims["hidden_act"]  # in rope_parameters; Gemma's is hidden_activation
    cfg = Gemma3TextConfig(**dims, head_dim=32, query_pre_attn_scalar=32, sliding_window=MISTRAL_WINDOW,
                           layer_types=["sliding_attention", "full_attention"],
                           rope_parameters={k: dict(v) for k, v in GEMMA3_ROPE.items()},
                           hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=None)
    cfg.architectures = ["Gemma3ForCausalLM"]
    out = HF_DIR / "tiny-gemma3"
    logits = save_model(tok, out.name, Gemma3ForCausalLM, cfg, GEMMA3_SEED, torch.bfloat16)
    assert_feature_matters(Gemma3ForCausalLM, out, logits, "the sliding window", sliding_window=64)
    local = {k: dict(v) for k, v in GEMMA3_ROPE.items()}
    local["sliding_attention"]["rope_theta"] = 1_000_000.0
    assert_feature_matters(Gemma3ForCausalLM, out, logits, "the local RoPE base", rope_parameters=local)
    unscaled = {k: dict(v) for k, v in GEMMA3_ROPE.items()}
    unscaled["full_attention"] = {"rope_type": "default", "rope_theta": 1_000_000.0}
    assert_feature_matters(Gemma3ForCausalLM, out, logits, "linear RoPE scaling", rope_parameters=unscaled)
    assert_feature_matters(Gemma3ForCausalLM, out, logits, "query_pre_attn_scalar", query_pre_attn_scalar=256)


def make_gemma2(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["hidden_act"]  # Gemma's is hidden_activation
    cfg = Gemma2Config(**dims, head_dim=32, query_pre_attn_scalar=32, sliding_window=MISTRAL_WINDOW,
                       hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=None,
                       **GEMMA2_CAPS)
    cfg.architectures = ["Gemma2ForCausalLM"]
    assert cfg.layer_types == ["sliding_attention", "full_attention"]
    out = HF_DIR / "tiny-gemma2"
    logits = save_model(tok, out.name, Gemma2ForCausalLM, cfg, GEMMA2_SEED, torch.bfloat16)
    assert_feature_matters(Gemma2ForCausalLM, out, logits, "the scores' soft-cap", attn_logit_softcapping=None)
    assert_feature_matters(Gemma2ForCausalLM, out, logits, "the logits' soft-cap", final_logit_softcapping=None)
    assert_feature_matters(Gemma2ForCausalLM, out, logits, "the sliding window", sliding_window=64)


def make_gemma(tok) -> None:
    """Gemma 1 (Gemma 2B and 7B, Gemma 1.1, CodeGemma): Gemma's (1 + w) norms, embedding scale and GELU-tanh MLP in
    Llama's layer (no sandwich, no window, no soft-caps), scores by 1/sqrt(head_dim); one key head (Gemma 2B's
    multi-query attention), head_dim 32 (4 heads 128 wide in a 64-wide model); its config.json says "gelu", as
    the Hub's Gemma 2B and 7B do, which transformers reads as the tanh approximation."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["hidden_act"]
    cfg = GemmaConfig(**{**dims, "num_key_value_heads": 1}, head_dim=32, hidden_act="gelu_pytorch_tanh",
                      tie_word_embeddings=True, pad_token_id=None)
    cfg.architectures = ["GemmaForCausalLM"]
    out = HF_DIR / "tiny-gemma"
    logits = save_model(tok, out.name, GemmaForCausalLM, cfg, GEMMA_SEED, torch.bfloat16)
    write_json(out / "config.json", {**json.loads((out / "config.json").read_text()), "hidden_act": "gelu"})
    check = REF_DIR / "tiny-gemma-check"
    assert np.array_equal(logits, write_reference(GemmaForCausalLM, out, check, tok))
    reset_dir(check)
    check.rmdir()


def make_arcee(tok) -> None:
    """Arcee's AFM-4.5B: Llama's attention and norms, an MLP of up, ReLU squared and down without a gate, YaRN."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"], dims["hidden_act"]
    cfg = ArceeConfig(**dims, hidden_act="relu2", rope_parameters=dict(ARCEE_ROPE), tie_word_embeddings=False,
                      pad_token_id=None)
    _save_toy(tok, "tiny-arcee", ArceeForCausalLM, cfg, ARCEE_SEED, None, "YaRN",
              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _centred_norms(weights: bool = False):
    """A save_model hook drawing the norms' biases about 0, as trained ones are (init_weights draws every norm
    parameter about 1); with ``weights``, the norms' weights too (LayerNorm1P's, which it adds 1 to)."""
    @torch.no_grad()
    def hook(model) -> None:
        for name, p in model.named_parameters():
            if "norm" in name and (weights or name.endswith(".bias")):
                p.sub_(1.0)
    return hook


def _rope(partial: float) -> dict:
    """Default RoPE (base 10000) over ``partial`` of each head, as transformers 5's rope_parameters."""
    return {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial}


def _layernorm_dims(tok) -> dict:
    """common_dims without the keys the LayerNorm models' configs spell otherwise or set themselves."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    for key in ("rope_theta", "rms_norm_eps", "hidden_act"):
        del dims[key]
    return dims


def _save_toy(tok, name: str, model_cls, cfg, seed: int, after_init, feature: str, **override) -> None:
    """hf/NAME and ref/NAME of ``cfg`` (bfloat16, ``after_init`` run on the drawn weights), checking that
    ``feature`` (``override`` undoing it) changes the logits."""
    cfg.architectures = [model_cls.__name__]
    logits = save_model(tok, name, model_cls, cfg, seed, torch.bfloat16, after_init=after_init)
    assert_feature_matters(model_cls, HF_DIR / name, logits, feature, **override)


def make_stablelm(tok) -> None:
    """StableLM 2 1.6B's and StableLM 3B's layer (Stable Code 3B's): LayerNorm with a bias before the attention, the
    MLP and the head; RoPE over a quarter of each head (partial_rotary_factor 0.25, 4 of 16 dims); q/k/v biases
    (use_qkv_bias, StableLM 2's), SwiGLU; untied."""
    cfg = StableLmConfig(**_layernorm_dims(tok), layer_norm_eps=1e-5, use_qkv_bias=True, tie_word_embeddings=False,
                         rope_parameters=_rope(0.25), pad_token_id=None)
    _save_toy(tok, "tiny-stablelm", StableLmForCausalLM, cfg, STABLELM_SEED, _centred_norms(), "partial RoPE",
              rope_parameters=_rope(1.0))


def make_starcoder2(tok) -> None:
    """StarCoder2 3B / 7B / 15B's layer: LayerNorms with biases, biases on every projection (use_bias), an MLP of
    c_fc, GELU-tanh and c_proj without a gate, a sliding window on every layer (window 4: StarCoder2's 4096 on a
    toy), tied."""
    cfg = Starcoder2Config(**_layernorm_dims(tok), norm_epsilon=1e-5, use_bias=True, hidden_act="gelu_pytorch_tanh",
                           sliding_window=MISTRAL_WINDOW, tie_word_embeddings=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, pad_token_id=None)
    _save_toy(tok, "tiny-starcoder2", Starcoder2ForCausalLM, cfg, STARCODER2_SEED, _centred_norms(),
              "the sliding window", sliding_window=None)


def make_nemotron(tok) -> None:
    """Nemotron-4 and Minitron's layer (Nemotron-Mini-4B, Minitron 4B and 8B): LayerNorm1P (its weights plus 1, with
    biases) before the attention, the MLP and the head; RoPE over half of each head (partial_rotary_factor 0.5); an
    MLP of up, ReLU squared and down without a gate; untied."""
    cfg = NemotronConfig(**_layernorm_dims(tok), norm_eps=1e-5, hidden_act="relu2", tie_word_embeddings=False,
                         rope_parameters=_rope(0.5), pad_token_id=None)
    _save_toy(tok, "tiny-nemotron", NemotronForCausalLM, cfg, NEMOTRON_SEED, _centred_norms(weights=True),
              "partial RoPE", rope_parameters=_rope(1.0))


def make_phi(tok) -> None:
    """Phi-2's and Phi-1.5's layer: one LayerNorm (with its bias) whose output the attention and the MLP both read,
    their outputs added to the residual together; biases on every projection, the output head's too; RoPE over
    int(0.4 head_dim) = 6 of each 16-dim head (Phi-2's partial_rotary_factor 0.4); an MLP of fc1, GELU (gelu_new,
    the tanh approximation) and fc2 without a gate, 4 x hidden wide, and a key head per head, as Phi-2's (which
    llama.cpp's converter writes whatever the config says); untied."""
    dims = {**_layernorm_dims(tok), "num_key_value_heads": 4, "intermediate_size": 256}
    cfg = PhiConfig(**dims, layer_norm_eps=1e-5, hidden_act="gelu_new", tie_word_embeddings=False,
                    rope_parameters=_rope(0.4), pad_token_id=None)
    _save_toy(tok, "tiny-phi", PhiForCausalLM, cfg, PHI_SEED, _centred_norms(), "partial RoPE",
              rope_parameters=_rope(1.0))


@torch.no_grad()
def phi3_tokenizer(out: Path) -> None:
    """The toy vocabulary as llama.cpp's converter takes it for a Phi-3: its
    last token is Phi-3's <|endoftext|> (id 319, "il" before, and the merge
    making it dropped), which llama.cpp looks up in every model named
    Phi-3, and the tokenizer class Phi-4's GPT2Tokenizer (a byte-level
    vocabulary, read as llama.cpp's gpt2)."""
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    assert vocab.pop("il") == 319
    vocab["<|endoftext|>"] = 319
    tok["model"]["merges"] = [m for m in tok["model"]["merges"] if m not in (["i", "l"], "i l")]
    tok["added_tokens"].append({"id": 319, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": True})
    (out / "tokenizer.json").write_text(json.dumps(tok))
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps({**tok_cfg, "tokenizer_class": "GPT2Tokenizer"}))


@torch.no_grad()
def make_phi3(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = Phi3Config(**dims, rope_parameters=dict(PHI3_ROPE), original_max_position_embeddings=PHI3_ORIGINAL_CTX,
                     sliding_window=PHI3_WINDOW, tie_word_embeddings=False, pad_token_id=None)
    cfg.architectures = ["Phi3ForCausalLM"]
    out = HF_DIR / "tiny-phi3"
    logits = save_model(tok, out.name, Phi3ForCausalLM, cfg, PHI3_SEED, torch.bfloat16)
    phi3_tokenizer(out)
    assert_feature_matters(Phi3ForCausalLM, out, logits, "the sliding window", sliding_window=None)
    assert_feature_matters(Phi3ForCausalLM, out, logits, "the short factors",
                           rope_parameters={**PHI3_ROPE, "short_factor": [1.0] * 4})
    # Past the original context transformers turns by the long factors (the whole sequence, no cache).
    model = Phi3ForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                            local_files_only=True).float().eval()
    ids = [(7 * i + 3) % cfg.vocab_size for i in range(LONG_LEN)]
    long = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    np.save(REF_DIR / out.name / "logits_long.npy", np.ascontiguousarray(long, dtype=np.float32))
    write_json(REF_DIR / out.name / "ids_long.json", ids)
    short = model(input_ids=torch.tensor([ids[:PHI3_ORIGINAL_CTX]])).logits[0].numpy()
    rel = float(np.abs(short - long[:PHI3_ORIGINAL_CTX]).max() / np.abs(long).max())
    assert rel > 1e-2, f"the long factors barely change the logits ({rel:.2e})"


def make_smollm3(tok) -> None:
    """SmolLM3's layer is Llama's; every no_rope_layer_interval-th (4th)
    layer leaves q and k unrotated (NoPE), as llama.cpp's smollm3 does."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims["num_hidden_layers"] = 4
    cfg = SmolLM3Config(**dims, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        tie_word_embeddings=True, pad_token_id=None)
    cfg.architectures = ["SmolLM3ForCausalLM"]
    assert cfg.no_rope_layers == [1, 1, 1, 0]
    out = HF_DIR / "tiny-smollm3"
    logits = save_model(tok, out.name, SmolLM3ForCausalLM, cfg, SMOLLM3_SEED, torch.bfloat16)
    assert_feature_matters(SmolLM3ForCausalLM, out, logits, "the layer without RoPE", no_rope_layers=[1, 1, 1, 1])


def make_granite(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = GraniteConfig(**dims, **GRANITE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        tie_word_embeddings=True, pad_token_id=None)
    cfg.architectures = ["GraniteForCausalLM"]
    out = HF_DIR / "tiny-granite"
    logits = save_model(tok, out.name, GraniteForCausalLM, cfg, GRANITE_SEED, torch.bfloat16)
    for key, plain in (("embedding_multiplier", 1.0), ("attention_multiplier", 0.25), ("residual_multiplier", 1.0),
                       ("logits_scaling", 1.0)):
        assert_feature_matters(GraniteForCausalLM, out, logits, key, **{key: plain})


OLMO_CLIP = 1.6  # q, k and v clamped to [-1.6, 1.6]: about a fifth of the toy's projected values


def make_olmo(tok) -> None:
    """OLMo 1 (OLMo-7B-0424's layer) on a toy: Llama's layer under LayerNorms without weights (eps 1e-5, which
    the config cannot state), q, k and v clamped to OLMO_CLIP as projected, tied (OLMo-1B's)."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    for key in ("rope_theta", "rms_norm_eps"):  # (rope_parameters; no eps)
        del dims[key]
    cfg = OlmoConfig(**dims, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, clip_qkv=OLMO_CLIP,
                     tie_word_embeddings=True, pad_token_id=None)
    cfg.architectures = ["OlmoForCausalLM"]
    out = HF_DIR / "tiny-olmo"
    logits = save_model(tok, out.name, OlmoForCausalLM, cfg, OLMO_SEED, torch.bfloat16)
    assert_feature_matters(OlmoForCausalLM, out, logits, "clip_qkv", clip_qkv=None)


def make_granite_swa(tok) -> None:
    """Granite SWA (granite-swash-2b's layer) on a toy: tiny-granite's multipliers, four layers, the first full and
    the others sliding over 4 positions (GraniteSWAConfig's default pattern), a learned sink per head in every layer
    (drawn, not zero), layer 2 without RoPE (layer_rope_theta 0); untied. The logits of the same weights with the
    sliding layers turning by their own base (GRANITE_SWA_TWO_BASES) are frozen beside them."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims["num_hidden_layers"] = 4
    cfg = GraniteSWAConfig(**dims, **GRANITE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                           sliding_window=4, layer_rope_theta=GRANITE_SWA_THETAS, tie_word_embeddings=False,
                           pad_token_id=None)
    cfg.architectures = ["GraniteSWAForCausalLM"]
    out = HF_DIR / "tiny-granite-swa"
    logits = save_model(tok, out.name, GraniteSWAForCausalLM, cfg, GRANITE_SWA_SEED, torch.bfloat16)
    assert_feature_matters(GraniteSWAForCausalLM, out, logits, "the window", sliding_window=4096)
    assert_feature_matters(GraniteSWAForCausalLM, out, logits, "the layer without RoPE",
                           layer_rope_theta=[10000.0] * 4)
    two = override_logits(GraniteSWAForCausalLM, out, layer_rope_theta=GRANITE_SWA_TWO_BASES)
    assert float(np.abs(two - logits).max() / np.abs(logits).max()) > 1e-2
    np.save(REF_DIR / "tiny-granite-swa" / "two_bases.npy", two)


def make_granite_moe_swa(tok) -> None:
    """Granite SWA with experts (GraniteMoeSWA) on a toy: tiny-granite-swa's attention (sinks, the window, layer 2
    without RoPE), in every layer 4 experts of 32 channels (their gate_up_proj stacks gate's rows, then up's), the
    top 2 by softmax over the chosen, beside a shared MLP 48 wide (its input_linear fused)."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims.update(num_hidden_layers=4, intermediate_size=32)
    cfg = GraniteMoeSWAConfig(**dims, **GRANITE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                              sliding_window=4, layer_rope_theta=GRANITE_SWA_THETAS, num_local_experts=4,
                              num_experts_per_tok=2, shared_intermediate_size=48, tie_word_embeddings=False,
                              pad_token_id=None)
    cfg.architectures = ["GraniteMoeSWAForCausalLM"]
    save_model(tok, "tiny-granite-moe-swa", GraniteMoeSWAForCausalLM, cfg, GRANITE_MOE_SWA_SEED, torch.bfloat16)


def make_olmo2(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = Olmo2Config(**dims, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      tie_word_embeddings=False, pad_token_id=None)
    cfg.architectures = ["Olmo2ForCausalLM"]
    out = HF_DIR / "tiny-olmo2"
    save_model(tok, out.name, Olmo2ForCausalLM, cfg, OLMO2_SEED, torch.bfloat16)


def make_olmo3(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims["num_hidden_layers"] = 4
    cfg = Olmo3Config(**dims, sliding_window=MISTRAL_WINDOW, tie_word_embeddings=False, pad_token_id=None,
                      rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                       "full_attention": dict(OLMO3_ROPE)})
    cfg.architectures = ["Olmo3ForCausalLM"]
    assert cfg.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    out = HF_DIR / "tiny-olmo3"
    logits = save_model(tok, out.name, Olmo3ForCausalLM, cfg, OLMO3_SEED, torch.bfloat16)
    assert_feature_matters(Olmo3ForCausalLM, out, logits, "the sliding window", sliding_window=64)
    plain = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
             "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    assert_feature_matters(Olmo3ForCausalLM, out, logits, "YaRN on the full layer", rope_parameters=plain)


def make_ministral3(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = Ministral3Config(**dims, head_dim=16, rope_parameters=dict(MINISTRAL3_ROPE), tie_word_embeddings=True,
                           pad_token_id=None)
    cfg.architectures = ["Ministral3ForCausalLM"]
    out = HF_DIR / "tiny-ministral3"
    logits = save_model(tok, out.name, Ministral3ForCausalLM, cfg, MINISTRAL3_SEED, torch.bfloat16)
    assert_feature_matters(Ministral3ForCausalLM, out, logits, "the attention temperature",
                           rope_parameters={**MINISTRAL3_ROPE, "llama_4_scaling_beta": 0.0})


def make_exaone4(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims.update(EXAONE4_DIMS)
    cfg = Exaone4Config(**dims, sliding_window=MISTRAL_WINDOW, sliding_window_pattern=4, tie_word_embeddings=False,
                        pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["Exaone4ForCausalLM"]
    assert cfg.layer_types == (["sliding_attention"] * 3 + ["full_attention"]) * 16
    out = HF_DIR / "tiny-exaone4"
    logits = save_model(tok, out.name, Exaone4ForCausalLM, cfg, EXAONE4_SEED, torch.bfloat16)
    assert_feature_matters(Exaone4ForCausalLM, out, logits, "the window and the global layers' NoPE",
                           sliding_window=None, layer_types=["full_attention"] * 64)


def make_olmoe(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims.update(num_key_value_heads=4, intermediate_size=32)  # (OLMoE has no GQA; each expert 32 channels)
    cfg = OlmoeConfig(**dims, **MOE, num_experts=4, norm_topk_prob=False, tie_word_embeddings=False,
                      pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["OlmoeForCausalLM"]
    out = HF_DIR / "tiny-olmoe"
    logits = save_model(tok, out.name, OlmoeForCausalLM, cfg, OLMOE_SEED, torch.bfloat16)
    assert_feature_matters(OlmoeForCausalLM, out, logits, "norm_topk_prob", norm_topk_prob=True)


def make_qwen2_moe(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    # every layer sparse, as llama.cpp's qwen2moe graph has them; the shared expert wider than a routed one
    cfg = Qwen2MoeConfig(**dims, **MOE, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                         norm_topk_prob=False, qkv_bias=True, tie_word_embeddings=False, use_sliding_window=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["Qwen2MoeForCausalLM"]
    out = HF_DIR / "tiny-qwen2-moe"
    logits = save_model(tok, out.name, Qwen2MoeForCausalLM, cfg, QWEN2_MOE_SEED, torch.bfloat16)
    assert_feature_matters(Qwen2MoeForCausalLM, out, logits, "norm_topk_prob", norm_topk_prob=True)


def choice_biases(seed: int, language_model: bool = False):
    """The after_init of a model with DeepSeek-V3's router (GLM-4.5's, dots.llm1's, Solar Open's; in a multimodal
    model's ``language_model``): each router's e_score_correction_bias, a buffer init_weights leaves zero, drawn
    from ``seed`` on the scale of the sigmoid scores' gaps, so that it moves the choice of experts."""
    @torch.no_grad()
    def draw(model) -> None:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        for layer in (model.model.language_model if language_model else model.model).layers:
            if hasattr(layer.mlp, "gate"):
                b = layer.mlp.gate.e_score_correction_bias
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    return draw


def add_mtp_layer(out: Path, layer: int, like: int, seed: int, head_norm: str = "shared_head.norm") -> None:
    """GLM-4.5's multi-token prediction layer, as the Hub's checkpoints store it after the last one
    (model.layers.{num_hidden_layers}: a whole MoE layer, eh_proj, enorm, hnorm, shared_head.norm; Hy3's names
    the last final_layernorm: ``head_norm``), with seeded values shaped as layer ``like``'s: transformers leaves
    it unread, converters carry it. The correction biases are stored float32, as GLM-4.5's are (the bf16 values,
    exactly)."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(path)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    pre = f"model.layers.{layer}."
    mtp = {pre + k[len(f"model.layers.{like}."):]: v for k, v in tensors.items() if k.startswith(f"model.layers.{like}.")}
    mtp.update({pre + "eh_proj.weight": torch.empty(hidden, 2 * hidden, dtype=torch.bfloat16),
                **{pre + n: torch.empty(hidden, dtype=torch.bfloat16)
                   for n in ("enorm.weight", "hnorm.weight", f"{head_norm}.weight")}})
    for k in sorted(mtp):
        noise = torch.randn(mtp[k].shape, generator=gen, dtype=torch.float32)
        value = 1.0 + NORM_STD * noise if "norm" in k else INIT_STD * noise
        mtp[k] = value.to(tensors.get(k.replace(pre, f"model.layers.{like}."), mtp[k]).dtype)
    out_tensors = {k: v.float() if k.endswith(("e_score_correction_bias", "expert_bias")) else v
                   for k, v in {**tensors, **mtp}.items()}
    save_file(dict(sorted(out_tensors.items())), path, metadata={"format": "pt"})


def make_glm4_moe(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    # layer 0 dense, layer 1 4 routed experts (top 2 by sigmoid score plus correction bias, renormalised, x 2.5)
    # beside a shared one; then the multi-token prediction layer transformers leaves unread
    cfg = Glm4MoeConfig(**dims, head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                        n_group=1, topk_group=1, use_qk_norm=True, attention_bias=True, tie_word_embeddings=False,
                        num_nextn_predict_layers=1, pad_token_id=None,
                        rope_parameters=_rope(0.5))
    cfg.architectures = ["Glm4MoeForCausalLM"]
    out = HF_DIR / "tiny-glm4-moe"
    logits = save_model(tok, out.name, Glm4MoeForCausalLM, cfg, GLM4_MOE_SEED, torch.bfloat16,
                        after_init=choice_biases(GLM4_MOE_SEED))
    add_mtp_layer(out, 2, 1, GLM4_MOE_SEED)
    glm4_tokenizer(out, ("[gMASK]", "<|endoftext|>", "<|user|>", "<|observation|>"))  # GLM-4.5's converter reads four
    assert_feature_matters(Glm4MoeForCausalLM, out, logits, "routed_scaling_factor", routed_scaling_factor=1.0)
    # DeepSeek-V3's grouped choice on the same weights: 2 groups of 2 experts, the better one kept
    grouped = override_logits(Glm4MoeForCausalLM, out, n_group=2, topk_group=1)
    assert np.abs(grouped - logits).max() > 1e-2 * np.abs(logits).max(), "grouping barely changes the logits"
    np.save(REF_DIR / out.name / "logits_grouped.npy", np.ascontiguousarray(grouped, dtype=np.float32))


def make_deepseek_v3(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    # latent attention with q_lora_rank; YaRN; layer 0 dense, layer 1 4 routed experts in 2 groups (the better
    # group kept, top 2 by sigmoid score plus correction bias, renormalised, x 2.5) beside a shared one; then
    # the multi-token prediction layer transformers leaves unread. scoring_func and topk_method as the Hub's
    # configs state them (llama.cpp's converter reads scoring_func)
    cfg = DeepseekV3Config(**{**dims, **MLA_DIMS}, q_lora_rank=24, n_routed_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                           routed_scaling_factor=2.5, norm_topk_prob=True, n_group=2, topk_group=1,
                           tie_word_embeddings=False, num_mtp_layers=1, pad_token_id=None,
                           rope_parameters=DEEPSEEK_V3_ROPE)
    cfg.architectures = ["DeepseekV3ForCausalLM"]
    cfg.scoring_func, cfg.topk_method = "sigmoid", "noaux_tc"
    out = HF_DIR / "tiny-deepseek-v3"
    logits = save_model(tok, out.name, DeepseekV3ForCausalLM, cfg, DEEPSEEK_V3_SEED, torch.bfloat16,
                        after_init=choice_biases(DEEPSEEK_V3_SEED))
    add_mtp_layer(out, 2, 1, DEEPSEEK_V3_SEED)
    assert_feature_matters(DeepseekV3ForCausalLM, out, logits, "YaRN's mscale on the scores",
                           rope_parameters={**DEEPSEEK_V3_ROPE, "mscale_all_dim": 0.0})
    assert_feature_matters(DeepseekV3ForCausalLM, out, logits, "the groups of experts", n_group=1, topk_group=1)


def make_mistral4(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    # Mistral Small 4's layer: DeepSeek-V3's latent attention (q_lora) under YaRN and Llama 4's temperature; layer 0
    # dense, layer 1 4 routed experts (top 2 of their softmax, renormalised, x 1.5) beside a shared one, stored as
    # transformers keeps them: gate_up_proj [experts, 2 inter, hidden] (gate's rows, then up's; 2 inter is not
    # hidden, so a stack read the other way round is refused, not misread), down_proj [experts, hidden, inter]
    cfg = Mistral4Config(**{**dims, **MLA_DIMS}, q_lora_rank=24, n_routed_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=24, n_shared_experts=1, first_k_dense_replace=1,
                         routed_scaling_factor=1.5, norm_topk_prob=True, n_group=1, topk_group=1,
                         tie_word_embeddings=False, pad_token_id=None, rope_parameters=dict(MISTRAL4_ROPE))
    cfg.architectures = ["Mistral4ForCausalLM"]
    out = HF_DIR / "tiny-mistral4"
    logits = save_model(tok, out.name, Mistral4ForCausalLM, cfg, MISTRAL4_SEED, torch.bfloat16)
    # (llama.cpp's converter writes no temperature, so llama.cpp runs its file without one: those logits too)
    cool = override_logits(Mistral4ForCausalLM, out,
                           rope_parameters={**cfg.rope_parameters, "llama_4_scaling_beta": 0.0})
    assert np.abs(cool - logits).max() > 1e-2 * np.abs(logits).max(), "the attention temperature barely matters"
    np.save(REF_DIR / out.name / "logits_no_temperature.npy", np.ascontiguousarray(cool, dtype=np.float32))
    assert_feature_matters(Mistral4ForCausalLM, out, logits, "routed_scaling_factor", routed_scaling_factor=1.0)
    assert_feature_matters(Mistral4ForCausalLM, out, logits, "renormalising the top k", norm_topk_prob=False)


def make_mistral4_vl(tok) -> None:
    """tiny-mistral4's language model in a Mistral3ForConditionalGeneration
    beside a tiny Pixtral vision tower: the layout Mistral Small 4 is
    published in (and the one llama.cpp's converter reads). Also freezes
    Mistral4Config's defaults (its text_config takes them for what it leaves
    out)."""
    text = Mistral4Config.from_pretrained(HF_DIR / "tiny-mistral4")
    text.architectures = None  # (as the Hub's text_config: llama.cpp's converter goes by the one it names)
    vision = PixtralVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 head_dim=8, image_size=28, patch_size=14)
    cfg = Mistral3Config(text_config=text, vision_config=vision, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=None, tie_word_embeddings=False)
    save_multimodal(tok, Mistral3ForConditionalGeneration, cfg, MISTRAL4_SEED + 1, Mistral4ForCausalLM,
                    "tiny-mistral4", head=True)
    write_json(REF_DIR / "mistral4-text-defaults.json",
               {k: v for k, v in sorted(Mistral4Config().to_dict().items()) if k not in MULTIMODAL_SKIP})


def make_glm4_moe_lite(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    # GLM-4.7-Flash's layer: DeepSeek-V3's latent attention (q_lora) with GLM-4.5's router (x 1.8, one group)
    # beside a shared expert; layer 0 dense (mlp_layer_types); then the MTP layer transformers leaves unread.
    # first_k_dense_replace and num_nextn_predict_layers as the Hub's config states them beside mlp_layer_types
    # (llama.cpp's converter reads those)
    cfg = Glm4MoeLiteConfig(**{**dims, **MLA_DIMS}, q_lora_rank=24, n_routed_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=32, n_shared_experts=1, routed_scaling_factor=1.8,
                            norm_topk_prob=True, n_group=1, topk_group=1, mlp_layer_types=["dense", "sparse"],
                            tie_word_embeddings=False, pad_token_id=None,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["Glm4MoeLiteForCausalLM"]
    cfg.first_k_dense_replace, cfg.num_nextn_predict_layers = 1, 1
    out = HF_DIR / "tiny-glm4-moe-lite"
    logits = save_model(tok, out.name, Glm4MoeLiteForCausalLM, cfg, GLM4_MOE_LITE_SEED, torch.bfloat16,
                        after_init=choice_biases(DEEPSEEK_V3_SEED))
    add_mtp_layer(out, 2, 1, GLM4_MOE_LITE_SEED)
    glm4_tokenizer(out, ("[gMASK]", "<|endoftext|>", "<|user|>", "<|observation|>"))
    assert_feature_matters(Glm4MoeLiteForCausalLM, out, logits, "routed_scaling_factor", routed_scaling_factor=1.0)


def make_llama4(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    # 4 layers: 0-2 rotated with chunked attention and q/k norms, 3 unrotated with full attention and the
    # temperature; experts at 1 and 3 (interleave_moe_layer_step 2, Maverick's), 4 of 24 channels, the top 2
    # (Scout's 1 would leave the weights' sum untested) beside a shared one; dense layers 128 wide
    cfg = Llama4TextConfig(**{**dims, "intermediate_size": 24, "num_hidden_layers": 4}, head_dim=16,
                           intermediate_size_mlp=128, num_local_experts=4, num_experts_per_tok=2,
                           interleave_moe_layer_step=2, attention_chunk_size=4, floor_scale=4, attn_scale=0.5,
                           rope_parameters=dict(LLAMA4_ROPE), tie_word_embeddings=False, pad_token_id=None)
    cfg.architectures = ["Llama4ForCausalLM"]
    out = HF_DIR / "tiny-llama4"
    logits = save_model(tok, out.name, Llama4ForCausalLM, cfg, LLAMA4_SEED, torch.bfloat16)
    assert_feature_matters(Llama4ForCausalLM, out, logits, "the attention chunks", attention_chunk_size=128)
    assert_feature_matters(Llama4ForCausalLM, out, logits, "the temperature", attn_temperature_tuning=False)
    assert_feature_matters(Llama4ForCausalLM, out, logits, "the q/k norms", use_qk_norm=False)


def make_ernie4_5(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    # ERNIE 4.5 0.3B's layer: GLM-4's interleaved RoPE over whole heads, head_dim stated (Ernie4_5Config's default
    # is 128, not hidden / heads), a tied head
    cfg = Ernie4_5Config(**dims, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                         tie_word_embeddings=True, pad_token_id=None)
    cfg.architectures = ["Ernie4_5ForCausalLM"]
    save_model(tok, "tiny-ernie4-5", Ernie4_5ForCausalLM, cfg, ERNIE4_5_SEED, torch.bfloat16)


# Qwen3.5's layers on a toy: three gated-DeltaNet (linear attention) layers, then one of gated full attention
# (full_attention_interval 4); 2 key heads serving 4 value heads (its 16 and 32: the grouped order llama.cpp
# reorders shows), a causal convolution of 4 taps; the full layer's 32-dim heads rotate their first quarter
QWEN3_5_DIMS = dict(num_hidden_layers=4, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    rope_parameters=_rope(0.25),
                    tie_word_embeddings=False, pad_token_id=None)


def save_qwen3_5(tok, name: str, model_cls, config_cls, seed: int, drop: tuple[str, ...], **extra) -> None:
    """A Qwen3.5 toy (QWEN3_5_DIMS and ``extra``; the common dims less ``drop``) with its MTP block beside it
    (its count in the config, as Qwen3.5's say it and Qwen3-Next's do not)."""
    dims = {k: v for k, v in common_dims(len(tok), tok.bos_token_id, tok.eos_token_id).items() if k not in drop}
    cfg = config_cls(**{**dims, **QWEN3_5_DIMS, **extra})
    cfg.architectures = [model_cls.__name__]
    if model_cls is not Qwen3NextForCausalLM:
        cfg.mtp_num_hidden_layers = 1
    save_model(tok, name, model_cls, cfg, seed, torch.bfloat16)
    add_mtp_beside(HF_DIR / name, seed + 2)


def make_qwen3_5(tok) -> None:
    save_qwen3_5(tok, "tiny-qwen3-5", Qwen3_5ForCausalLM, Qwen3_5TextConfig, QWEN3_5_SEED, ("rope_theta",))


def make_qwen3_5_moe(tok) -> None:
    # Qwen3.5-35B-A3B's layers: 4 experts of 32 channels in every layer, the top 2 by softmax probability
    # renormalised, beside a shared expert of 48 under its sigmoid gate; its MTP block likewise
    save_qwen3_5(tok, "tiny-qwen3-5-moe", Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, QWEN3_5_MOE_SEED,
                 ("rope_theta", "intermediate_size"), num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                 shared_expert_intermediate_size=48)


def make_qwen3_next(tok) -> None:
    # Qwen3-Next-80B-A3B's layers on Qwen3.5-MoE's toy: its DeltaNet's q, k, v, z and b, a projections fused and
    # blocked by key head (in_proj_qkvz, in_proj_ba), experts in every layer renormalised (norm_topk_prob)
    save_qwen3_5(tok, "tiny-qwen3-next", Qwen3NextForCausalLM, Qwen3NextConfig, QWEN3_NEXT_SEED, ("rope_theta",),
                 intermediate_size=96, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                 shared_expert_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])


@torch.no_grad()
def add_mtp_beside(out: Path, seed: int, like: int | None = None) -> None:
    """Qwen3.5's (and EXAONE MoE's) multi-token prediction block, as the Hub's checkpoints store it beside the model
    (mtp.layers.0: a full-attention decoder layer shaped as layer ``like``, the last by default: EXAONE MoE's is
    dense; mtp.fc, mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm), seeded: transformers leaves it
    unread (_keys_to_ignore_on_load_unexpected), llama.cpp's converter writes it as a block after the last
    (nextn_predict_layers)."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(path)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    last = max(int(k.split(".")[2]) for k in tensors if k.startswith("model.layers.")) if like is None else like
    mtp = {"mtp.layers.0." + k[len(f"model.layers.{last}."):]: v for k, v in tensors.items()
           if k.startswith(f"model.layers.{last}.")}
    mtp.update({"mtp.fc.weight": torch.empty(hidden, 2 * hidden, dtype=torch.bfloat16),
                **{f"mtp.{n}.weight": torch.empty(hidden, dtype=torch.bfloat16)
                   for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}})
    for k in sorted(mtp):
        noise = torch.randn(mtp[k].shape, generator=gen, dtype=torch.float32)
        mtp[k] = (NORM_STD * noise if "norm" in k else INIT_STD * noise).to(mtp[k].dtype)  # (norms: 1 + w)
    save_file(dict(sorted({**tensors, **mtp}.items())), path, metadata={"format": "pt"})


@torch.no_grad()
def add_ernie_mtp(out: Path, seed: int) -> None:
    """ERNIE 4.5's multi-token prediction tensors, as the Hub's -PT checkpoints store them beside the model
    (model.mtp_block.0: a decoder layer shaped as layer 1; mtp_emb_norm, mtp_hidden_norm, mtp_linear_proj),
    seeded: transformers leaves them unread (_keys_to_ignore_on_load_unexpected), converters carry them."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(path)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    mtp = {"model.mtp_block.0." + k[len("model.layers.1."):]: v for k, v in tensors.items()
           if k.startswith("model.layers.1.")}
    mtp.update({"model.mtp_emb_norm.0.weight": torch.empty(hidden), "model.mtp_hidden_norm.0.weight": torch.empty(hidden),
                "model.mtp_linear_proj.0.weight": torch.empty(hidden, 2 * hidden)})
    for k in sorted(mtp):
        noise = torch.randn(mtp[k].shape, generator=gen, dtype=torch.float32)
        mtp[k] = (1.0 + NORM_STD * noise if "norm" in k else INIT_STD * noise).to(
            mtp[k].dtype if mtp[k].dtype != torch.float32 or "bias" in k or "gate.weight" in k else torch.bfloat16)
    save_file(dict(sorted({**tensors, **mtp}.items())), path, metadata={"format": "pt"})


@torch.no_grad()
def make_ernie4_5_moe(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    # ERNIE-4.5-21B-A3B's layer on a toy: layer 0 dense (moe_layer_start_index 1), layers 1 and 2 with 4 experts of
    # 32 channels, the top 2 chosen by softmax probability plus the seeded moe_statics correction bias and weighted
    # by their probabilities renormalised, beside 2 shared experts (64 channels: intermediate_size / KV heads, as
    # llama.cpp's converter derives it); an untied head; then seeded MTP tensors transformers leaves unread
    cfg = Ernie4_5_MoeConfig(**{**dims, "num_hidden_layers": 3}, rope_parameters={"rope_type": "default",
                                                                                   "rope_theta": 500000.0},
                             moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=2,
                             moe_layer_start_index=1, tie_word_embeddings=False, pad_token_id=None)
    cfg.architectures = ["Ernie4_5_MoeForCausalLM"]
    out = HF_DIR / "tiny-ernie4-5-moe"
    logits = save_model(tok, out.name, Ernie4_5_MoeForCausalLM, cfg, ERNIE4_5_MOE_SEED, torch.bfloat16)
    add_ernie_mtp(out, ERNIE4_5_MOE_SEED)
    model = Ernie4_5_MoeForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                                    local_files_only=True).eval()
    for layer in model.model.layers[1:]:
        layer.mlp.gate.moe_statics.e_score_correction_bias.zero_()
    ids = torch.tensor([json.loads((REF_DIR / out.name / "ids.json").read_text())])
    off = model(input_ids=ids).logits[0].numpy().astype(np.float64)
    rel = float(np.abs(off - logits).max() / np.abs(logits).max())
    assert rel > 1e-2, f"the correction bias barely changes the logits ({rel:.2e})"


def make_deepseek_v2(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    # DeepSeek-V2-Lite's layout: no q_lora_rank (q_proj), 27 layers (llama.cpp reads a model without q_lora_rank
    # only at that depth), the first dense, the others 4 routed experts (top 2 of the softmax over all, not
    # renormalised, x 1.0) beside 2 shared ones
    dims.update(num_hidden_layers=27, hidden_size=32, intermediate_size=64)
    cfg = DeepseekV2Config(**{**dims, **MLA_DIMS}, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=16, n_shared_experts=2, first_k_dense_replace=1,
                           routed_scaling_factor=1.0, norm_topk_prob=False, topk_method="greedy",
                           tie_word_embeddings=False, pad_token_id=None)
    cfg.architectures = ["DeepseekV2ForCausalLM"]
    cfg.scoring_func = "softmax"
    save_model(tok, "tiny-deepseek-v2", DeepseekV2ForCausalLM, cfg, DEEPSEEK_V2_SEED, torch.bfloat16)


def _minimax_m2_biases(model) -> None:
    """e_score_correction_bias (a buffer init_weights leaves zero), as choice_biases."""
    gen = torch.Generator(device="cpu").manual_seed(MINIMAX_M2_SEED)
    for layer in model.model.layers:
        b = layer.mlp.e_score_correction_bias
        b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def make_minimax_m2(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims["intermediate_size"] = 32  # each expert's
    # every layer 4 experts, top 2 by sigmoid score plus the correction bias, renormalised; q/k RMS-normed over the
    # whole projections; RoPE over half of each head (the Hub's configs say it as rotary_dim)
    cfg = MiniMaxM2Config(**dims, **MOE, head_dim=16, num_local_experts=4, tie_word_embeddings=False,
                          pad_token_id=None,
                          rope_parameters=_rope(0.5))
    cfg.architectures = ["MiniMaxM2ForCausalLM"]
    out = HF_DIR / "tiny-minimax-m2"
    logits = save_model(tok, out.name, MiniMaxM2ForCausalLM, cfg, MINIMAX_M2_SEED, torch.bfloat16,
                        after_init=_minimax_m2_biases)
    assert_feature_matters(MiniMaxM2ForCausalLM, out, logits, "RoPE over the whole head",
                           rope_parameters=_rope(1.0))


def make_hunyuan_dense(tok) -> None:
    """HunYuan dense: Llama's layer with per-head q/k norms after RoPE, the NTK-alpha base, tied (as Hunyuan-7B)."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = HunYuanDenseV1Config(**dims, head_dim=16, tie_word_embeddings=True, eod_token_id=tok.eos_token_id,
                               rope_parameters=dict(HUNYUAN_ROPE))
    cfg.architectures = ["HunYuanDenseV1ForCausalLM"]
    out = HF_DIR / "tiny-hunyuan-dense"
    logits = save_model(tok, out.name, HunYuanDenseV1ForCausalLM, cfg, HUNYUAN_SEED, torch.bfloat16)
    assert_feature_matters(HunYuanDenseV1ForCausalLM, out, logits, "NTK-alpha",
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def make_hunyuan_moe(tok) -> None:
    """HunYuan-MoE: the dense model's attention, a shared MLP beside 2 of 4 experts in every layer (renormalised
    softmax), the per-layer keys as lists as Hunyuan-A13B's config states them; untied, default RoPE (llama.cpp's
    converter asserts Hunyuan-A13B's 128-dim heads where the alpha is set)."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims["intermediate_size"] = 32
    n = dims["num_hidden_layers"]
    cfg = HunYuanMoEV1Config(**dims, head_dim=16, tie_word_embeddings=False, eod_token_id=tok.eos_token_id,
                             num_experts=4, moe_topk=[2] * n, moe_intermediate_size=[32] * n,
                             num_shared_expert=[1] * n,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["HunYuanMoEV1ForCausalLM"]
    save_model(tok, "tiny-hunyuan-moe", HunYuanMoEV1ForCausalLM, cfg, HUNYUAN_MOE_SEED, torch.bfloat16)


def _hy_v3_biases(model) -> None:
    """e_score_correction_bias (the Hub's mlp.expert_bias), as choice_biases."""
    gen = torch.Generator(device="cpu").manual_seed(HY_V3_SEED)
    for layer in model.model.layers:
        if hasattr(layer.mlp, "e_score_correction_bias"):
            layer.mlp.e_score_correction_bias.copy_(0.1 * torch.randn(layer.mlp.e_score_correction_bias.shape,
                                                                      generator=gen))


def make_hy_v3(tok) -> None:
    """Hy3 (HYV3ForCausalLM): Qwen3's attention (per-head q/k norms before RoPE); a dense layer, then 4 experts
    chosen by sigmoid score plus a choice bias, renormalised and scaled, beside a shared one; its MTP layer after
    the last (eh_proj, enorm, hnorm, final_layernorm), which transformers leaves unread; untied."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = HYV3Config(**dims, head_dim=16, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
                     moe_intermediate_size=32, router_scaling_factor=2.5, mlp_layer_types=["dense", "sparse"],
                     num_nextn_predict_layers=1, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["HYV3ForCausalLM"]
    out = HF_DIR / "tiny-hy-v3"
    logits = save_model(tok, out.name, HYV3ForCausalLM, cfg, HY_V3_SEED, torch.bfloat16, after_init=_hy_v3_biases)
    add_mtp_layer(out, 2, 1, HY_V3_SEED, head_norm="final_layernorm")
    assert_feature_matters(HYV3ForCausalLM, out, logits, "router_scaling_factor", router_scaling_factor=1.0)


def _apertus_xielu(model) -> None:
    """Each layer's xIELU parameters (APERTUS_XIELU), which init_weights draws as weights or leaves as buffers."""
    for layer, values in zip(model.model.layers, APERTUS_XIELU):
        for k, v in values.items():
            getattr(layer.mlp.act_fn, k).fill_(v)


def make_apertus(tok) -> None:
    """Apertus (8B, 70B): Llama's layer under its own norm names (attention_layernorm, feedforward_layernorm),
    per-head q/k RMSNorms before RoPE, an MLP of up, xIELU and down without a gate (the activation's four
    parameters per layer, APERTUS_XIELU), Llama-3 RoPE scaling; untied."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"], dims["hidden_act"]
    cfg = ApertusConfig(**dims, hidden_act="xielu", rope_parameters=dict(LLAMA3_ROPE), tie_word_embeddings=False,
                        pad_token_id=None)
    cfg.architectures = ["ApertusForCausalLM"]
    out = HF_DIR / "tiny-apertus"
    logits = save_model(tok, out.name, ApertusForCausalLM, cfg, APERTUS_SEED, torch.bfloat16,
                        after_init=torch.no_grad()(_apertus_xielu))
    assert_feature_matters(ApertusForCausalLM, out, logits, "Llama-3 scaling",
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = ApertusForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True).eval()
    with torch.no_grad():  # the second layer given the first's parameters
        for k in APERTUS_XIELU[0]:
            getattr(model.model.layers[1].mlp.act_fn, k).copy_(getattr(model.model.layers[0].mlp.act_fn, k))
        ids = torch.tensor([reference_ids(cfg.vocab_size)], dtype=torch.long)
        off = model(input_ids=ids).logits[0].double().numpy()
    rel = float(np.abs(off - logits).max() / np.abs(logits).max())
    assert rel > 1e-2, f"the second layer's own xIELU parameters barely change the logits ({rel:.2e})"


def _afmoe_biases(model) -> None:
    """The router's choice bias (mlp.expert_bias), which init_weights leaves at zero, as choice_biases."""
    gen = torch.Generator(device="cpu").manual_seed(AFMOE_SEED)
    for layer in model.model.layers:
        if hasattr(layer.mlp, "expert_bias"):
            layer.mlp.expert_bias.copy_(0.1 * torch.randn(layer.mlp.expert_bias.shape, generator=gen))


def make_afmoe(tok) -> None:
    """AFMoE (Arcee's Trinity): 4 layers, every 4th full and unrotated, the others sliding (window 4) and rotated;
    norms before and after each block, per-head q/k norms, each head's output times the sigmoid of gate_proj; a
    dense first layer, then 2 of 4 experts chosen by sigmoid score plus a choice bias, renormalised and times
    route_scale, beside a shared one, their sum normed; embeddings times sqrt(hidden) (mup_enabled); untied. Its
    config.json states route_norm, as the Hub's do (llama.cpp's converter reads it)."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = AfmoeConfig(**{**dims, "num_hidden_layers": 4}, head_dim=16, num_dense_layers=1, num_experts=4,
                      num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=32, route_scale=2.0,
                      global_attn_every_n_layers=4, sliding_window=4, mup_enabled=True, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["AfmoeForCausalLM"]
    out = HF_DIR / "tiny-afmoe"
    logits = save_model(tok, out.name, AfmoeForCausalLM, cfg, AFMOE_SEED, torch.bfloat16,
                        after_init=torch.no_grad()(_afmoe_biases))
    write_json(out / "config.json", {**json.loads((out / "config.json").read_text()), "route_norm": True})
    for what, override in (("mup_enabled", {"mup_enabled": False}), ("route_scale", {"route_scale": 1.0}),
                           ("the window", {"sliding_window": 64})):
        assert_feature_matters(AfmoeForCausalLM, out, logits, what, **override)


def make_dots1(tok) -> None:
    """dots.llm1 (rednote-hilab's Dots1ForCausalLM): Qwen3's attention (per-head q/k norms before RoPE; as many
    key/value heads as query heads, as the Hub's model and llama.cpp's loader have them); a dense
    first layer, then 4 experts in 2 groups (the better group kept, top 2 by sigmoid score plus a choice bias,
    renormalised, x 2.5) beside a shared one, DeepSeek-V3's router; untied. Its config.json states scoring_func and
    topk_method, as the Hub's does (llama.cpp's converter writes the gating it reads from scoring_func)."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims["num_key_value_heads"] = dims["num_attention_heads"]  # (llama.cpp's dots1 loads k and v as wide as q)
    cfg = Dots1Config(**dims, head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                      n_group=2, topk_group=1, sliding_window=None, tie_word_embeddings=False, pad_token_id=None,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["Dots1ForCausalLM"]
    out = HF_DIR / "tiny-dots1"
    logits = save_model(tok, out.name, Dots1ForCausalLM, cfg, DOTS1_SEED, torch.bfloat16,
                        after_init=choice_biases(DOTS1_SEED))
    write_json(out / "config.json", {**json.loads((out / "config.json").read_text()), "scoring_func": "sigmoid",
                                     "topk_method": "noaux_tc"})
    for what, override in (("routed_scaling_factor", {"routed_scaling_factor": 1.0}),
                           ("the groups", {"n_group": 1, "topk_group": 1}),
                           ("norm_topk_prob", {"norm_topk_prob": False})):
        assert_feature_matters(Dots1ForCausalLM, out, logits, what, **override)


def make_solar_open(tok) -> None:
    """Solar Open (Upstage's SolarOpenForCausalLM): Llama's attention, every dim rotated (base 1e6); in every layer 2
    of 4 experts chosen by sigmoid score plus a choice bias, renormalised and x 2.5, beside a shared one (GLM-4.5's
    router); untied. Its vocabulary's last tokens named as the converter looks them up (glm4_tokenizer)."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"], dims["intermediate_size"]  # (in rope_parameters; SolarOpenConfig has no dense MLP)
    cfg = SolarOpenConfig(**dims, head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, tie_word_embeddings=False,
                          rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
    cfg.architectures = ["SolarOpenForCausalLM"]
    out = HF_DIR / "tiny-solar-open"
    logits = save_model(tok, out.name, SolarOpenForCausalLM, cfg, SOLAR_OPEN_SEED, torch.bfloat16,
                        after_init=choice_biases(SOLAR_OPEN_SEED))
    glm4_tokenizer(out, ("<|startoftext|>", "<|endoftext|>"))  # (and <unk>, the toy's id 2)
    for what, override in (("routed_scaling_factor", {"routed_scaling_factor": 1.0}),
                           ("norm_topk_prob", {"norm_topk_prob": False})):
        assert_feature_matters(SolarOpenForCausalLM, out, logits, what, **override)


def make_youtu(tok) -> None:
    """Youtu-LLM (Tencent's YoutuForCausalLM): DeepSeek-V3's latent attention (q_lora_rank, interleaved RoPE over
    the rotated dims) with a dense SwiGLU MLP in every layer, no experts; tied, as the Hub's model is."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = YoutuConfig(**{**dims, **MLA_DIMS}, q_lora_rank=24, tie_word_embeddings=True, pad_token_id=None,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["YoutuForCausalLM"]
    out = HF_DIR / "tiny-youtu"
    logits = save_model(tok, out.name, YoutuForCausalLM, cfg, YOUTU_SEED, torch.bfloat16)
    assert_feature_matters(YoutuForCausalLM, out, logits, "rope_interleave", rope_interleave=False)


def make_jais2(tok) -> None:
    """Jais 2 (Inception's Jais2ForCausalLM): Llama's attention with biases on q, k, v and o, LayerNorms with
    biases, an MLP of up, ReLU squared and down with their biases, no gate; untied."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    # (in rope_parameters; Jais2Config's LayerNorm eps is its own key; its act ReLU squared, the default)
    del dims["rope_theta"], dims["rms_norm_eps"], dims["hidden_act"]
    cfg = Jais2Config(**dims, layer_norm_eps=1e-5, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                      pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["Jais2ForCausalLM"]
    out = HF_DIR / "tiny-jais2"
    save_model(tok, out.name, Jais2ForCausalLM, cfg, JAIS2_SEED, torch.bfloat16)


def make_exaone_moe(tok) -> None:
    """EXAONE MoE (LG's K-EXAONE: ExaoneMoeForCausalLM): EXAONE 4's attention (per-head q/k norms; every 4th layer
    full and unrotated, the others sliding, window 4) in pre-norm layers; a dense first layer, then 2 of 4 experts
    chosen by sigmoid score plus a choice bias, renormalised and x 2.5, beside a shared one (DeepSeek-V3's
    router); untied; its MTP layer beside the model (dense, as K-EXAONE's), which transformers leaves unread."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = ExaoneMoeConfig(**{**dims, "num_hidden_layers": 4}, head_dim=16, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, num_shared_experts=1, first_k_dense_replace=1,
                          routed_scaling_factor=2.5, norm_topk_prob=True, sliding_window=MISTRAL_WINDOW,
                          sliding_window_pattern=4, tie_word_embeddings=False, pad_token_id=None,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["ExaoneMoeForCausalLM"]
    assert cfg.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    out = HF_DIR / "tiny-exaone-moe"
    logits = save_model(tok, out.name, ExaoneMoeForCausalLM, cfg, EXAONE_MOE_SEED, torch.bfloat16,
                        after_init=choice_biases(EXAONE_MOE_SEED))
    add_mtp_beside(out, EXAONE_MOE_SEED + 1, like=0)
    # (its count and the router's scoring, as the Hub's config.json states them: llama.cpp's converter reads both)
    write_json(out / "config.json", {**json.loads((out / "config.json").read_text()), "num_nextn_predict_layers": 1,
                                     "scoring_func": "sigmoid", "topk_method": "noaux_tc"})
    for what, override in (("routed_scaling_factor", {"routed_scaling_factor": 1.0}),
                           ("the window", {"sliding_window": 64})):
        assert_feature_matters(ExaoneMoeForCausalLM, out, logits, what, **override)


def make_seed_oss(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = SeedOssConfig(**dims, head_dim=16, attention_bias=True, attention_out_bias=False,
                        tie_word_embeddings=False, pad_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["SeedOssForCausalLM"]
    save_model(tok, "tiny-seed-oss", SeedOssForCausalLM, cfg, SEED_OSS_SEED, torch.bfloat16)


def glm4_tokenizer(out: Path, names: tuple[str, ...] = ("<|endoftext|>", "<|user|>")) -> None:
    """The toy vocabulary as llama.cpp's converter takes it for a GLM-4: its
    last tokens are GLM's ``names`` (GLM-4's <|endoftext|> and <|user|>, ids
    318 and 319; GLM-4.5's four before them; the merges making the pieces
    before dropped), which the converter looks up by name for its special
    tokens."""
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    for tid, name in enumerate(names, start=320 - len(names)):
        piece = next(p for p, i in vocab.items() if i == tid)
        del vocab[piece]
        vocab[name] = tid
        tok["model"]["merges"] = [m for m in tok["model"]["merges"]
                                  if (m if isinstance(m, str) else " ".join(m)).replace(" ", "") != piece]
        tok["added_tokens"].append({"id": tid, "content": name, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    (out / "tokenizer.json").write_text(json.dumps(tok))


def make_glm4(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    cfg = Glm4Config(**dims, head_dim=16, attention_bias=True, tie_word_embeddings=False, pad_token_id=None,
                     rope_parameters=_rope(0.5))
    cfg.architectures = ["Glm4ForCausalLM"]
    out = HF_DIR / "tiny-glm4"
    logits = save_model(tok, out.name, Glm4ForCausalLM, cfg, GLM4_SEED, torch.bfloat16)
    glm4_tokenizer(out)
    assert_feature_matters(Glm4ForCausalLM, out, logits, "RoPE over the whole head",
                           rope_parameters=_rope(1.0))


def make_cohere2(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"], dims["rms_norm_eps"]  # in rope_parameters; a LayerNorm's eps is layer_norm_eps
    dims["num_hidden_layers"] = 4
    cfg = Cohere2Config(**dims, layer_norm_eps=1e-5, logit_scale=COHERE2_LOGIT_SCALE, sliding_window=MISTRAL_WINDOW,
                        tie_word_embeddings=True, pad_token_id=None,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["Cohere2ForCausalLM"]
    assert cfg.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    out = HF_DIR / "tiny-cohere2"
    logits = save_model(tok, out.name, Cohere2ForCausalLM, cfg, COHERE2_SEED, torch.bfloat16)
    assert_feature_matters(Cohere2ForCausalLM, out, logits, "the window", sliding_window=64)


def make_cohere(tok) -> None:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"], dims["rms_norm_eps"]  # in rope_parameters; a LayerNorm's eps is layer_norm_eps
    cfg = CohereConfig(**dims, layer_norm_eps=1e-5, logit_scale=COHERE2_LOGIT_SCALE, use_qk_norm=False,
                       tie_word_embeddings=True, pad_token_id=None,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg.architectures = ["CohereForCausalLM"]
    save_model(tok, "tiny-cohere", CohereForCausalLM, cfg, COHERE_SEED, torch.bfloat16)


# config keys a defaults table leaves out: provenance, and what no computation reads
MULTIMODAL_SKIP = ("transformers_version", "id2label", "label2id", "_name_or_path", "architectures", "dtype")


@torch.no_grad()
def save_multimodal(tok, model_cls, cfg, seed: int, text_cls, text_name: str, head: bool = False,
                    beside: tuple[str, ...] = ()) -> None:
    """``model_cls(cfg)`` with its weights drawn from ``seed`` and its
    language model's replaced by golden/hf/TEXT_NAME's (``head``: its head
    too; ``beside``: the prefixes of its tensors stored beside the model,
    copied), saved to hf/TEXT_NAME-vl with the tokenizer; transformers'
    logits on the text reference ids must be TEXT_NAME's."""
    from safetensors.torch import load_file, save_file

    cfg.architectures = [model_cls.__name__]
    seed_everything(seed)
    model = model_cls(cfg).to(torch.float32).eval()
    init_weights(model, seed)
    lm = text_cls.from_pretrained(HF_DIR / text_name, dtype=torch.float32, local_files_only=True)
    model.model.language_model.load_state_dict(lm.model.state_dict())
    if head:
        model.lm_head.load_state_dict(lm.lm_head.state_dict())
    out = HF_DIR / f"{text_name}-vl"
    reset_dir(out)
    model.to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    if beside:
        extra = {k: v for k, v in load_file(HF_DIR / text_name / "model.safetensors").items() if k.startswith(beside)}
        save_file(dict(sorted({**load_file(out / "model.safetensors"), **extra}.items())), out / "model.safetensors",
                  metadata={"format": "pt"})
    again = model_cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                      local_files_only=True).float().eval()
    ref = np.load(REF_DIR / text_name / "logits.npy")
    got = again(input_ids=torch.tensor([json.loads((REF_DIR / text_name / "ids.json").read_text())])).logits[0]
    assert np.abs(got.numpy() - ref).max() <= 1e-5 * np.abs(ref).max(), f"the text logits are not {text_name}'s"


FP8_MAX = 448.0  # e4m3fn's largest finite value


@torch.no_grad()
def make_fp8(base: str, name: str, model_cls, block: list[int] | None) -> None:
    """hf/NAME: hf/BASE's checkpoint as transformers' FineGrainedFP8 stores one (quant_method fp8): every
    layer's Linear weight as float8 e4m3fn codes with float32 weight_scale_inv per ``block`` [rows, cols]
    (DeepSeek-V3's, Qwen3-FP8's layout), or one per matrix with a static activation_scale beside it (block
    None: Ministral 3's); ref/NAME/logits.npy: transformers' logits of it loaded with dequantize=True (the
    weights dequantized to bfloat16, run in float32)."""
    from safetensors.torch import load_file, save_file
    from transformers import FineGrainedFP8Config

    src, out = HF_DIR / base, HF_DIR / name
    reset_dir(out)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    tensors = {}
    for k, v in sorted(load_file(src / "model.safetensors").items()):
        if ".layers." not in k or not k.endswith("_proj.weight"):
            tensors[k] = v
            continue
        w = v.float()
        bn, bk = block or list(w.shape)
        grid = w.reshape(w.shape[0] // bn, bn, w.shape[1] // bk, bk)
        scale = grid.abs().amax(dim=(1, 3)) / FP8_MAX
        codes = (grid / scale[:, None, :, None]).reshape(w.shape).to(torch.float8_e4m3fn)
        base_name = k.removesuffix("weight")
        tensors[k] = codes
        tensors[base_name + "weight_scale_inv"] = scale if block else scale.reshape(())
        if block is None:
            tensors[base_name + "activation_scale"] = torch.tensor(0.02)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static" if block is None else "dynamic",
                                  "weight_block_size": block, "modules_to_not_convert": None}
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    model = model_cls.from_pretrained(out, dtype=torch.bfloat16, local_files_only=True, attn_implementation="eager",
                                      quantization_config=FineGrainedFP8Config(dequantize=True,
                                                                               weight_block_size=block)).float().eval()
    ids = json.loads((REF_DIR / base / "ids.json").read_text())
    logits = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    ref = np.load(REF_DIR / base / "logits.npy")
    assert 1e-3 < np.abs(logits - ref).max() / np.abs(ref).max() < 0.3, "FP8 should change the logits a little"
    reset_dir(REF_DIR / name)
    np.save(REF_DIR / name / "logits.npy", np.ascontiguousarray(logits, dtype=np.float32))
    write_json(REF_DIR / name / "versions.json", versions())


def write_e4m3_table() -> None:
    """ref/e4m3fn.npy: torch's float32 value of every float8 e4m3fn byte (0..255; NaN at 0x7F and 0xFF), the
    reference for formats/hf_fp8.py's decoding."""
    table = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    np.save(REF_DIR / "e4m3fn.npy", table)


def make_ministral3_vl(tok) -> None:
    """tiny-ministral3's language model, weights and all, in a
    Mistral3ForConditionalGeneration beside a tiny Pixtral vision tower
    (drawn from its own seed): the layout Ministral 3, Mistral Small 3.x
    and Devstral Small 2 are published in. Its logits on text ids must be
    tiny-ministral3's. Also freezes MistralConfig's and Ministral3Config's
    defaults (a text_config of either model_type takes them for what it
    leaves out)."""
    text = Ministral3Config.from_pretrained(HF_DIR / "tiny-ministral3")
    vision = PixtralVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 head_dim=8, image_size=28, patch_size=14)
    cfg = Mistral3Config(text_config=text, vision_config=vision, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=None, tie_word_embeddings=True)
    save_multimodal(tok, Mistral3ForConditionalGeneration, cfg, MINISTRAL3_SEED + 1, Ministral3ForCausalLM,
                    "tiny-ministral3")
    write_json(REF_DIR / "mistral3-text-defaults.json",
               {c.model_type: {k: v for k, v in sorted(c().to_dict().items()) if k not in MULTIMODAL_SKIP}
                for c in (MistralConfig, Ministral3Config)})


@torch.no_grad()
def make_llama4_vl(tok) -> None:
    """tiny-llama4's language model, weights and all, in a
    Llama4ForConditionalGeneration beside a tiny vision model (drawn from its
    own seed): the layout Llama 4 Scout and Maverick are published in (the
    language model a Llama4ForCausalLM of its own, head included). Its
    logits on text ids must be tiny-llama4's. Also freezes Llama4TextConfig's
    defaults (a text_config takes them for what it leaves out)."""
    text = Llama4TextConfig.from_pretrained(HF_DIR / "tiny-llama4")
    vision = Llama4VisionConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                vision_output_dim=16, image_size=28, patch_size=14, projector_input_dim=16,
                                projector_output_dim=16)
    cfg = Llama4Config(text_config=text, vision_config=vision, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=None)
    cfg.architectures = ["Llama4ForConditionalGeneration"]
    seed = LLAMA4_SEED + 1
    seed_everything(seed)
    model = Llama4ForConditionalGeneration(cfg).to(torch.float32).eval()
    init_weights(model, seed)
    lm = Llama4ForCausalLM.from_pretrained(HF_DIR / "tiny-llama4", dtype=torch.float32, local_files_only=True)
    model.language_model.load_state_dict(lm.state_dict())
    out = HF_DIR / "tiny-llama4-vl"
    reset_dir(out)
    model.to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    again = Llama4ForConditionalGeneration.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                                           local_files_only=True).float().eval()
    ref = np.load(REF_DIR / "tiny-llama4" / "logits.npy")
    got = again(input_ids=torch.tensor([json.loads((REF_DIR / "tiny-llama4" / "ids.json").read_text())])).logits[0]
    assert np.abs(got.numpy() - ref).max() <= 1e-5 * np.abs(ref).max(), "the text logits are not tiny-llama4's"
    write_json(REF_DIR / "llama4-text-defaults.json",
               {k: v for k, v in sorted(Llama4TextConfig().to_dict().items()) if k not in MULTIMODAL_SKIP})


@torch.no_grad()
def qwen3_5_vl(tok, text_name: str, model_cls, config_cls, text_cls, text_config_cls, seed: int) -> None:
    """golden/hf/TEXT_NAME's language model, head and MTP block, weights and
    all, in a Qwen3.5 ``model_cls`` beside a tiny vision model (drawn from
    ``seed``): the layout Qwen3.5 is published in. Its logits on text ids
    must be TEXT_NAME's (text positions turn its MRoPE as one RoPE). Also
    freezes ``text_config_cls``' defaults (a text_config takes them for
    what it leaves out)."""
    text = text_config_cls.from_pretrained(HF_DIR / text_name)
    vision = Qwen3_5VisionConfig(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=14,
                                 out_hidden_size=text.hidden_size, num_position_embeddings=16)
    cfg = config_cls(text_config=text.to_dict(), vision_config=vision.to_dict(), bos_token_id=tok.bos_token_id,
                     eos_token_id=tok.eos_token_id, pad_token_id=None)
    save_multimodal(tok, model_cls, cfg, seed, text_cls, text_name, head=True, beside=("mtp.",))
    write_json(REF_DIR / f"{text_name.removeprefix('tiny-')}-text-defaults.json",
               {k: v for k, v in sorted(text_config_cls().to_dict().items()) if k not in MULTIMODAL_SKIP})


def make_qwen3_5_vl(tok) -> None:
    qwen3_5_vl(tok, "tiny-qwen3-5", Qwen3_5ForConditionalGeneration, Qwen3_5Config, Qwen3_5ForCausalLM,
               Qwen3_5TextConfig, QWEN3_5_SEED + 1)


# Qwen3-VL's interleaved MRoPE on a 32-dim head: sections of 6, 5 and 5 of its 16 frequencies
QWEN3_VL_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [6, 5, 5], "mrope_interleaved": True}


def qwen3_vl_config(tok, config_cls, vision_cls, text, tie: bool):
    """A Qwen3-VL(-MoE) config: the text config ``text`` beside a one-block 16-wide vision model whose deepstack
    feeds layer 0."""
    vision = vision_cls(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=14,
                        out_hidden_size=text.hidden_size, num_position_embeddings=16, deepstack_visual_indexes=[0])
    return config_cls(text_config=text.to_dict(), vision_config=vision.to_dict(), bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=None, tie_word_embeddings=tie)


def make_qwen3_vl(tok) -> None:
    """tiny-qwen3's language model, weights and all, in a Qwen3VLForConditionalGeneration beside a tiny vision
    model: Qwen3-VL 2B to 32B as published. Its interleaved MRoPE (QWEN3_VL_ROPE) turns text positions as one
    RoPE, so its text logits are tiny-qwen3's."""
    base = json.loads((HF_DIR / "tiny-qwen3" / "config.json").read_text())
    text = Qwen3VLTextConfig(**{k: base[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                     "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                                     "head_dim", "max_position_embeddings", "rms_norm_eps")},
                             rope_parameters=dict(QWEN3_VL_ROPE))
    cfg = qwen3_vl_config(tok, Qwen3VLConfig, Qwen3VLVisionConfig, text, tie=False)
    save_multimodal(tok, Qwen3VLForConditionalGeneration, cfg, QWEN3_SEED + 1, Qwen3ForCausalLM, "tiny-qwen3",
                    head=True)
    write_json(REF_DIR / "qwen3-vl-text-defaults.json",
               {k: v for k, v in sorted(Qwen3VLTextConfig().to_dict().items()) if k not in MULTIMODAL_SKIP})


# Qwen2.5-VL's MRoPE on tiny-qwen2's 16-wide heads (Qwen2.5-VL 7B's [16, 24, 24] of 64 pairs, scaled): not
# interleaved, each section a run of frequencies
QWEN2_5_VL_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}


def make_qwen2_5_vl(tok) -> None:
    """tiny-qwen2's language model, weights and all, in a Qwen2_5_VLForConditionalGeneration beside a one-block
    16-wide vision model: Qwen2.5-VL (and Qwen2-VL, the same language model) as published; tied, as the 3B. Its MRoPE
    (QWEN2_5_VL_ROPE) turns text positions as one RoPE, so its text logits are tiny-qwen2's."""
    base = json.loads((HF_DIR / "tiny-qwen2" / "config.json").read_text())
    text = Qwen2_5_VLTextConfig(**{k: base[k] for k in TEXT_DIMS}, rope_parameters=dict(QWEN2_5_VL_ROPE),
                                tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                                eos_token_id=tok.eos_token_id)
    vision = Qwen2_5_VLVisionConfig(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=14,
                                    out_hidden_size=text.hidden_size, fullatt_block_indexes=[0])
    cfg = Qwen2_5_VLConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), bos_token_id=tok.bos_token_id,
                           eos_token_id=tok.eos_token_id, pad_token_id=None, tie_word_embeddings=True)
    save_multimodal(tok, Qwen2_5_VLForConditionalGeneration, cfg, QWEN2_VL_SEED, Qwen2ForCausalLM, "tiny-qwen2")
    write_json(REF_DIR / "qwen2-5-vl-text-defaults.json",
               {k: v for k, v in sorted(Qwen2_5_VLTextConfig().to_dict().items()) if k not in MULTIMODAL_SKIP})


# common_dims' keys a multimodal model's text config takes as they are
TEXT_DIMS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "max_position_embeddings", "rms_norm_eps")


def make_qwen3_vl_moe(tok) -> None:
    """Qwen3-VL-30B-A3B's and 235B-A22B's layout on a toy: a Qwen3VLMoeForConditionalGeneration whose language
    model has Qwen3-MoE's layers (4 experts of 24 channels in each, the top 2 by softmax probability, always
    renormalised) under interleaved MRoPE, its experts stored as the Hub stores them (hub_expert_layout); a tied
    head (the 30B's). ref/: transformers' logits and greedy ids of the whole model on text."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    text = Qwen3VLMoeTextConfig(**{k: dims[k] for k in TEXT_DIMS}, head_dim=32, num_experts=4, num_experts_per_tok=2,
                                moe_intermediate_size=24, decoder_sparse_step=1, mlp_only_layers=[],
                                rope_parameters=dict(QWEN3_VL_ROPE))
    cfg = qwen3_vl_config(tok, Qwen3VLMoeConfig, Qwen3VLMoeVisionConfig, text, tie=True)
    cfg.architectures = ["Qwen3VLMoeForConditionalGeneration"]
    out = HF_DIR / "tiny-qwen3-vl-moe"
    logits = save_model(tok, out.name, Qwen3VLMoeForConditionalGeneration, cfg, QWEN3_VL_MOE_SEED, torch.bfloat16)
    hub_expert_layout(out)
    again = override_logits(Qwen3VLMoeForConditionalGeneration, out)
    assert np.abs(again - logits).max() <= 1e-6 * np.abs(logits).max(), "the Hub's layout is another model"
    write_json(REF_DIR / "qwen3-vl-moe-text-defaults.json",
               {k: v for k, v in sorted(Qwen3VLMoeTextConfig().to_dict().items()) if k not in MULTIMODAL_SKIP})


def hub_expert_layout(out: Path) -> None:
    """Qwen3-VL-MoE's expert stacks as the Hub's checkpoints hold them, [experts, in, out] (gate_up_proj [experts,
    hidden, 2 x inter], down_proj [experts, inter, hidden], which transformers transposes on load), where
    transformers 5.23 saves its own [experts, out, in]."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(path)
    for k in [k for k in tensors if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
        tensors[k] = tensors[k].transpose(1, 2).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})


def make_glm4_vl(tok) -> None:
    """tiny-glm4's language model, weights and all, in a Glm4vForConditionalGeneration (GLM-4.1V, GLM-4.6V-Flash)
    beside a tiny vision model. Its MRoPE (sections 2, 1, 1 of the 4 frequencies tiny-glm4 turns, GLM's
    interleaved pairs) turns text positions as GLM-4's one RoPE, so its text logits are tiny-glm4's."""
    base = json.loads((HF_DIR / "tiny-glm4" / "config.json").read_text())
    text = Glm4vTextConfig(**{k: base[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                   "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                                   "max_position_embeddings", "rms_norm_eps")},
                           rope_parameters={**base["rope_parameters"], "mrope_section": [2, 1, 1]})
    vision = Glm4vVisionConfig(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=14,
                               image_size=28, out_hidden_size=text.hidden_size)
    cfg = Glm4vConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=None, tie_word_embeddings=False)
    save_multimodal(tok, Glm4vForConditionalGeneration, cfg, GLM4_SEED + 1, Glm4ForCausalLM, "tiny-glm4", head=True)
    glm4_tokenizer(HF_DIR / "tiny-glm4-vl")
    write_json(REF_DIR / "glm4-vl-text-defaults.json",
               {k: v for k, v in sorted(Glm4vTextConfig().to_dict().items()) if k not in MULTIMODAL_SKIP})


def make_glm4_vl_moe(tok) -> None:
    """GLM-4.5V's and GLM-4.6V's layout on a toy: a Glm4vMoeForConditionalGeneration whose language model has
    GLM-4.5-Air's layers (layer 0 dense, then 4 routed experts, top 2 by sigmoid score plus correction bias,
    renormalised, x 2.5, beside a shared one; q/k/v biases, no q/k norms) under MRoPE (sections 2, 1, 1 of the 4
    frequencies its half-rotated 16-dim heads turn, rotate-half pairs), beside a tiny vision model; untied.
    ref/: transformers' logits and greedy ids of the whole model on text."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    text = Glm4vMoeTextConfig(**{k: dims[k] for k in TEXT_DIMS}, head_dim=16, n_routed_experts=4,
                              num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                              first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, n_group=1,
                              topk_group=1, attention_bias=True,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]})
    vision = Glm4vMoeVisionConfig(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=14,
                                  image_size=28, out_hidden_size=text.hidden_size)
    cfg = Glm4vMoeConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=None, tie_word_embeddings=False)
    cfg.architectures = ["Glm4vMoeForConditionalGeneration"]
    out = HF_DIR / "tiny-glm4-vl-moe"
    save_model(tok, out.name, Glm4vMoeForConditionalGeneration, cfg, GLM4_VL_MOE_SEED, torch.bfloat16,
               after_init=choice_biases(GLM4_VL_MOE_SEED, language_model=True))
    glm4_tokenizer(out, ("[gMASK]", "<|endoftext|>", "<|user|>", "<|observation|>"))  # as GLM-4.5's converter reads
    write_json(REF_DIR / "glm4-vl-moe-text-defaults.json",
               {k: v for k, v in sorted(Glm4vMoeTextConfig().to_dict().items()) if k not in MULTIMODAL_SKIP})


def make_lfm2(tok) -> None:
    """LFM2's layer mix on a toy: short gated convolutions (in_proj's B, C and x; B x through a causal depthwise
    convolution of 3 taps, times C; out_proj) in layers 0, 2 and 3, attention with per-head q/k norms in layer 1;
    the MLP's width by LFM2's rule (block_ff_dim 200: two thirds, 133, up to a multiple of 32: 160); the final
    norm named embedding_norm; a tied head, as every LFM2."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    cfg = Lfm2Config(**{k: dims[k] for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                             "max_position_embeddings", "bos_token_id", "eos_token_id")},
                     intermediate_size=200, block_auto_adjust_ff_dim=True, block_multiple_of=32,
                     block_ffn_dim_multiplier=1.0, num_hidden_layers=4, norm_eps=1e-5, conv_L_cache=3, conv_bias=False,
                     layer_types=["conv", "full_attention", "conv", "conv"], tie_word_embeddings=True,
                     pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
    cfg.architectures = ["Lfm2ForCausalLM"]
    save_model(tok, "tiny-lfm2", Lfm2ForCausalLM, cfg, LFM2_SEED, torch.bfloat16)


def make_lfm2_vl(tok) -> None:
    """tiny-lfm2's language model, weights and all, in an Lfm2VlForConditionalGeneration (LFM2-VL 450M, 1.6B, 3B)
    beside a tiny SigLIP2 vision tower; tied, as every LFM2-VL. Its text logits must be tiny-lfm2's."""
    text = json.loads((HF_DIR / "tiny-lfm2" / "config.json").read_text())
    vision = Siglip2VisionConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                 patch_size=4, num_patches=16)
    cfg = Lfm2VlConfig(text_config={k: v for k, v in text.items() if k not in ("architectures", "dtype",
                                                                                "transformers_version")},
                       vision_config=vision.to_dict(), projector_hidden_size=32, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=None, tie_word_embeddings=True)
    save_multimodal(tok, Lfm2VlForConditionalGeneration, cfg, LFM2_SEED + 1, Lfm2ForCausalLM, "tiny-lfm2")
    write_json(REF_DIR / "lfm2-vl-text-defaults.json",
               {k: v for k, v in sorted(Lfm2Config().to_dict().items()) if k not in MULTIMODAL_SKIP})


def _granite4_config(tok, experts: int):
    """Granite 4.0 H's layer mix on a toy: Mamba2 in layers 0, 2 and 3 (8 heads of 16 dims, states of 16, in
    2 or 1 groups, 4 taps), attention without RoPE in layer 1 (position_embedding_type "nope", as every
    Granite 4.0 H); Granite's four multipliers (the logits times 2, not divided by 4 as tiny-granite's, and the head
    untied: a tied toy's logits are its input embedding's, times 12, and near uniform once divided); a shared MLP 48 wide beside ``experts`` experts of 32 channels, the
    top 2 by softmax (none: the shared MLP alone, Granite 4.0 H Micro's, num_experts_per_tok 0: llama.cpp's loader
    asserts no more are used than there are)."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims.update(intermediate_size=32 if experts else 48, num_hidden_layers=4)
    return GraniteMoeHybridConfig(**dims, **{**GRANITE, "logits_scaling": 0.5}, num_local_experts=experts,
                                  num_experts_per_tok=2 if experts else 0, shared_intermediate_size=48, position_embedding_type="nope",
                                  layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=8,
                                  mamba_n_groups=2 if experts else 1, mamba_d_state=16, mamba_d_head=16,
                                  mamba_d_conv=4, mamba_expand=2, mamba_conv_bias=True, mamba_proj_bias=False,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                  tie_word_embeddings=False, pad_token_id=None)


def make_granite4(tok) -> None:
    """Granite 4.0 H Tiny's and Small's layout on a toy (_granite4_config): 4 experts beside the shared MLP, B and C
    in 2 groups."""
    cfg = _granite4_config(tok, 4)
    cfg.architectures = ["GraniteMoeHybridForCausalLM"]
    save_model(tok, "tiny-granite4", GraniteMoeHybridForCausalLM, cfg, GRANITE4_SEED, torch.bfloat16)


def make_granite4_dense(tok) -> None:
    """Granite 4.0 H Micro's, 1B's and 350M's layout on a toy (_granite4_config): the shared MLP alone, one group."""
    cfg = _granite4_config(tok, 0)
    cfg.architectures = ["GraniteMoeHybridForCausalLM"]
    save_model(tok, "tiny-granite4-dense", GraniteMoeHybridForCausalLM, cfg, GRANITE4_DENSE_SEED, torch.bfloat16)


# The MoE keys NemotronHConfig saves whatever the layers are; the Hub's configs of the models without experts
# (Nemotron-H 4B, 8B; Nemotron Nano 9B v2, 12B v2) have none, and llama.cpp's converter takes num_experts_per_tok
# for experts
NEMOTRON_MOE_KEYS = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                     "moe_shared_expert_intermediate_size", "moe_latent_size", "moe_shared_expert_overlap",
                     "n_shared_experts", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor",
                     "output_router_logits")


def _nemotron_h_config(tok, pattern: str, **extra):
    """Nemotron-H's blocks on a toy: one mixer each, by ``pattern`` (M Mamba2: 4 heads of 16 dims, 64 channels, not
    expand x hidden = 128, as Nemotron Nano 9B v2's 10240 are not 2 x 4480 (llama.cpp's converter asserts a multiple
    of 64); states of 16 in 2 groups, 4 taps; *
    attention without RoPE, 4 heads of 16 over 2 KV heads; - a ReLU-squared MLP 128 wide; E experts), an untied
    head."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    for key in ("rope_theta", "rms_norm_eps", "hidden_act", "num_hidden_layers"):
        del dims[key]
    return NemotronHConfig(**dims, head_dim=16, hybrid_override_pattern=pattern, layer_norm_epsilon=1e-5,
                           mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4,
                           use_conv_bias=True, mlp_hidden_act="relu2", tie_word_embeddings=False, pad_token_id=None,
                           **extra)


def make_nemotron_h(tok) -> None:
    """Nemotron-H 4B / 8B's and Nemotron Nano 9B v2's blocks on a toy (_nemotron_h_config): Mamba2, MLP,
    attention, MLP, then two Mamba2 blocks in a row (Nano 9B v2's "MM"); its config.json without the MoE keys, as
    the Hub's."""
    cfg = _nemotron_h_config(tok, "M-*-MM")
    cfg.architectures = ["NemotronHForCausalLM"]
    save_model(tok, "tiny-nemotron-h", NemotronHForCausalLM, cfg, NEMOTRON_H_SEED, torch.bfloat16)
    path = HF_DIR / "tiny-nemotron-h" / "config.json"
    write_json(path, {k: v for k, v in json.loads(path.read_text()).items() if k not in NEMOTRON_MOE_KEYS})
    assert np.array_equal(np.load(REF_DIR / "tiny-nemotron-h" / "logits.npy"),
                          write_reference(NemotronHForCausalLM, HF_DIR / "tiny-nemotron-h",
                                          REF_DIR / "tiny-nemotron-h-check", tok))
    reset_dir(REF_DIR / "tiny-nemotron-h-check")
    (REF_DIR / "tiny-nemotron-h-check").rmdir()


def make_mamba2(tok) -> None:
    """Mamba-2 (Mamba-Codestral-7B's layer) on a toy: three layers of Mamba2 alone, 4 heads of 32 dims (expand 2 x
    64), states of 16 in 2 groups, 4 taps, a convolution bias; RMSNorm eps 1e-5, an untied head. Its vocabulary is
    the tokenizer's, a multiple of 16, as llama.cpp's converter pads it."""
    assert len(tok) % 16 == 0
    cfg = Mamba2Config(vocab_size=len(tok), hidden_size=64, num_hidden_layers=3, num_heads=4, head_dim=32, expand=2,
                       state_size=16, n_groups=2, conv_kernel=4, use_conv_bias=True, use_bias=False,
                       layer_norm_epsilon=1e-5, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=None, tie_word_embeddings=False)
    cfg.architectures = ["Mamba2ForCausalLM"]
    save_model(tok, "tiny-mamba2", Mamba2ForCausalLM, cfg, MAMBA2_SEED, torch.bfloat16)


def make_falcon_h1(tok) -> None:
    """Falcon-H1's hybrid layer on a toy: three layers, each Mamba2 (6 heads of 16 dims: mamba_d_ssm 96, not
    mamba_expand x hidden = 128, as Falcon-H1's are not; states of 16 in 2 groups, 4 taps, a convolution bias, no
    gated norm: mamba_rms_norm false, as the Hub's) beside attention (4 heads of 24 dims over 2 KV heads: head_dim
    given, its q 96 wide), their outputs summed, then a SwiGLU MLP 96 wide; every muP multiplier away from 1
    (FALCON_H1_MULTIPLIERS); an untied head."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims.update(intermediate_size=96, num_hidden_layers=3)
    cfg = FalconH1Config(**dims, head_dim=24, mamba_d_ssm=96, mamba_n_heads=6, mamba_d_head=16, mamba_n_groups=2,
                         mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_conv_bias=True,
                         mamba_proj_bias=False, mamba_rms_norm=False, mamba_norm_before_gate=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
                         pad_token_id=None, **FALCON_H1_MULTIPLIERS)
    cfg.architectures = ["FalconH1ForCausalLM"]
    save_model(tok, "tiny-falcon-h1", FalconH1ForCausalLM, cfg, FALCON_H1_SEED, torch.bfloat16)
    # (every multiplier moves transformers' logits: none may be dropped unnoticed)
    base = np.load(REF_DIR / "tiny-falcon-h1" / "logits.npy")
    for key, value in FALCON_H1_MULTIPLIERS.items():
        one = [1.0] * len(value) if isinstance(value, list) else 1.0
        moved = override_logits(FalconH1ForCausalLM, HF_DIR / "tiny-falcon-h1", **{key: one})
        assert np.abs(moved - base).max() > 0.01 * np.abs(base).max(), key


def _mamba_config(cls, tok, **extra):
    """Mamba 1's layer on a toy: three layers of its selective scan alone (128 channels, expand 2 x 64, as llama.cpp
    requires; states of 16, a time-step rank of 8, 4 taps with a bias), no attention, no MLP; a tied head, as the
    Hub's Mamba checkpoints have it. Its vocabulary is the tokenizer's, a multiple of 8, as llama.cpp's converter
    pads it."""
    assert len(tok) % 8 == 0
    return cls(vocab_size=len(tok), hidden_size=64, num_hidden_layers=3, state_size=16, expand=2, conv_kernel=4,
               time_step_rank=8, use_conv_bias=True, use_bias=False, layer_norm_epsilon=1e-5,
               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=None,
               tie_word_embeddings=True, **extra)


def make_mamba(tok) -> None:
    """Mamba 1 (state-spaces/mamba-130m-hf ... 2.8b) on a toy (_mamba_config)."""
    cfg = _mamba_config(MambaConfig, tok)
    cfg.architectures = ["MambaForCausalLM"]
    save_model(tok, "tiny-mamba", MambaForCausalLM, cfg, MAMBA_SEED, torch.bfloat16)


def make_falcon_mamba(tok) -> None:
    """Falcon Mamba 7B on a toy (_mamba_config): dt's low rank, B and C RMS-normed without weights, with
    mixer_rms_eps the model's layer_norm_epsilon (llama.cpp norms them with that); untied, as Falcon Mamba 7B."""
    cfg = _mamba_config(FalconMambaConfig, tok, mixer_rms_eps=1e-5)
    cfg.tie_word_embeddings = False
    cfg.architectures = ["FalconMambaForCausalLM"]
    save_model(tok, "tiny-falcon-mamba", FalconMambaForCausalLM, cfg, FALCON_MAMBA_SEED, torch.bfloat16)


def make_nemotron_h_moe(tok) -> None:
    """Nemotron 3 Nano's blocks on a toy (_nemotron_h_config): Mamba2 and expert blocks around one attention
    block; 4 experts of 32 channels (ReLU-squared, no gate), the top 2 by sigmoid score plus the correction bias,
    renormalised and times 2.5 (Nemotron 3 Nano's routed_scaling_factor), beside a shared expert 48 wide."""
    cfg = _nemotron_h_config(tok, "MEM*E", n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             moe_shared_expert_intermediate_size=48, n_shared_experts=1, n_group=1, topk_group=1,
                             norm_topk_prob=True, routed_scaling_factor=2.5)
    cfg.architectures = ["NemotronHForCausalLM"]
    save_model(tok, "tiny-nemotron-h-moe", NemotronHForCausalLM, cfg, NEMOTRON_H_MOE_SEED, torch.bfloat16)


def _granite_moe_config(cls, tok, **extra):
    """Granite 3.x MoE's layer on a toy: Granite's four multipliers (tiny-granite4's: logits times 2, an untied
    head), RoPE, 4 experts of 32 channels in every layer, the top 2 by softmax (their input_linear stacks gate's rows,
    then up's)."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    del dims["rope_theta"]  # in rope_parameters
    dims["intermediate_size"] = 32
    return cls(**dims, **{**GRANITE, "logits_scaling": 0.5}, num_local_experts=4, num_experts_per_tok=2,
               rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
               pad_token_id=None, **extra)


def make_granite_moe(tok) -> None:
    """Granite 3.0's and 3.1's MoE (1B-A400M, 3B-A800M) on a toy (_granite_moe_config)."""
    cfg = _granite_moe_config(GraniteMoeConfig, tok)
    cfg.architectures = ["GraniteMoeForCausalLM"]
    save_model(tok, "tiny-granite-moe", GraniteMoeForCausalLM, cfg, GRANITE_MOE_SEED, torch.bfloat16)


def make_granite_moe_shared(tok) -> None:
    """GraniteMoeShared on a toy: tiny-granite-moe's layer beside a shared MLP 48 wide."""
    cfg = _granite_moe_config(GraniteMoeSharedConfig, tok, shared_intermediate_size=48)
    cfg.architectures = ["GraniteMoeSharedForCausalLM"]
    save_model(tok, "tiny-granite-moe-shared", GraniteMoeSharedForCausalLM, cfg, GRANITE_MOE_SHARED_SEED,
               torch.bfloat16)


def _lfm2_moe_biases(model) -> None:
    """expert_bias, a buffer init_weights leaves zero, as choice_biases."""
    gen = torch.Generator(device="cpu").manual_seed(LFM2_MOE_SEED)
    for layer in model.model.layers:
        if hasattr(layer.feed_forward, "expert_bias"):
            b = layer.feed_forward.expert_bias
            b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def make_lfm2_moe(tok) -> None:
    """LFM2-8B-A1B's layout on a toy: tiny-lfm2's layer mix, layer 0's MLP dense (intermediate_size as it is),
    the others 4 experts of 32 channels, the top 2 by sigmoid score plus expert_bias, renormalised (llama.cpp's
    lfm2moe always renormalises and never scales: routed_scaling_factor 1)."""
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    cfg = Lfm2MoeConfig(**{k: dims[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                                "num_key_value_heads", "max_position_embeddings", "bos_token_id",
                                                "eos_token_id")},
                        moe_intermediate_size=32, num_hidden_layers=4, num_dense_layers=1, num_experts=4,
                        num_experts_per_tok=2, use_expert_bias=True, routed_scaling_factor=1.0, norm_topk_prob=True,
                        norm_eps=1e-5, conv_L_cache=3, conv_bias=False,
                        layer_types=["conv", "full_attention", "conv", "conv"], tie_word_embeddings=True,
                        pad_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
    cfg.architectures = ["Lfm2MoeForCausalLM"]
    save_model(tok, "tiny-lfm2-moe", Lfm2MoeForCausalLM, cfg, LFM2_MOE_SEED, torch.bfloat16,
               after_init=_lfm2_moe_biases)


def make_qwen3_5_moe_vl(tok) -> None:
    qwen3_5_vl(tok, "tiny-qwen3-5-moe", Qwen3_5MoeForConditionalGeneration, Qwen3_5MoeConfig, Qwen3_5MoeForCausalLM,
               Qwen3_5MoeTextConfig, QWEN3_5_MOE_SEED + 1)


def make_gemma3_vl(tok) -> None:
    """tiny-gemma3's language model, weights and all, in a
    Gemma3ForConditionalGeneration beside a tiny SigLIP vision tower (drawn
    from its own seed): the multimodal layout Gemma 3 4B-27B are published
    in. Its logits on text ids must be tiny-gemma3's."""
    text = Gemma3TextConfig.from_pretrained(HF_DIR / "tiny-gemma3")
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=None)
    save_multimodal(tok, Gemma3ForConditionalGeneration, cfg, GEMMA3_SEED + 1, Gemma3ForCausalLM, "tiny-gemma3")
    write_json(REF_DIR / "gemma3-text-defaults.json",
               {k: v for k, v in sorted(Gemma3TextConfig().to_dict().items()) if k not in MULTIMODAL_SKIP})


def gpt_oss_config(tok) -> GptOssConfig:
    dims = common_dims(len(tok), tok.bos_token_id, tok.eos_token_id)
    dims["intermediate_size"] = 32
    del dims["rope_theta"], dims["hidden_act"]  # in rope_parameters; gpt-oss's unit is its own
    return GptOssConfig(**dims, **MOE, num_local_experts=4, head_dim=16, sliding_window=MISTRAL_WINDOW,
                        layer_types=["sliding_attention", "full_attention"], rope_parameters=dict(GPT_OSS_ROPE),
                        swiglu_limit=GPT_OSS_LIMIT, attention_bias=True, tie_word_embeddings=False)


def mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [..., rows, cols] (cols % 32 == 0) -> HF's blocks [..., rows, cols/32, 16]
    (byte k: element 2k low nibble, 2k + 1 high), scales [..., rows, cols/32]
    (E8M0, 2^(s - 127)) and the dequantized values. Shared exponent
    floor(log2 max|x|) - 2 (OCP MX: e2m1's largest exponent is 2), each value
    to the nearest e2m1 magnitude (ties to the smaller), 6 at most."""
    x = w.float().reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = x.abs().amax(-1, keepdim=True)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2, torch.full_like(amax, -127)).clamp(-127, 127)
    mag = (x.abs() / torch.exp2(exp)).clamp(max=6.0)
    idx = (mag[..., None] - E2M1).abs().argmin(-1)
    codes = (idx | ((x < 0) & (idx > 0)).to(torch.int64) << 3).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    deq = (E2M1[idx] * torch.where(x < 0, -1.0, 1.0) * torch.exp2(exp)).reshape(w.shape)
    return blocks.contiguous(), (exp[..., 0] + 127).to(torch.uint8).contiguous(), deq


@torch.no_grad()
def make_gpt_oss(tok) -> None:
    """tiny-gpt-oss (bf16), then its experts quantized to MXFP4 in gpt-oss-20b's
    published layout: rows are output features ([experts, 2I, H] for
    gate_up_proj, the bf16 parameter [experts, H, 2I] transposed), and
    config.json's quantization_config says mxfp4. transformers' own MXFP4
    loader (dequantizing on the CPU) must rebuild exactly our dequantized
    weights, and its logits are the MXFP4 model's reference."""
    out = HF_DIR / "tiny-gpt-oss"
    logits = save_model(tok, out.name, GptOssForCausalLM, gpt_oss_config(tok), GPT_OSS_SEED, torch.bfloat16)
    assert_feature_matters(GptOssForCausalLM, out, logits, "swiglu_limit", swiglu_limit=100.0)
    from safetensors.torch import load_file, save_file

    tensors = load_file(out / "model.safetensors")
    deq = {}
    for name in sorted(n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))):
        blocks, scales, deq[name] = mxfp4_quantize(tensors.pop(name).float().transpose(1, 2))
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    mx = HF_DIR / "tiny-gpt-oss-mxfp4"
    reset_dir(mx)
    save_file(dict(sorted(tensors.items())), mx / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    write_json(mx / "config.json", config)
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(out / f, mx / f)
    loaded = GptOssForCausalLM.from_pretrained(mx, dtype=torch.float32, local_files_only=True)
    for name, ref in deq.items():  # transformers' params are [experts, in, out]
        got = loaded.get_parameter(name).float().transpose(1, 2)
        assert torch.equal(got, ref), f"transformers dequantizes {name} differently"
    ref_logits = write_reference(GptOssForCausalLM, mx, REF_DIR / mx.name, tok)
    rel = float(np.abs(ref_logits - logits).max() / np.abs(logits).max())
    assert 1e-3 < rel < 0.5, f"MXFP4 experts change the logits by {rel:.2e} of max |logit|"


def cast_edge_values() -> torch.Tensor:
    """f32 values that stress rounding: ties, subnormals, overflow, NaN/inf."""
    f32 = torch.tensor([0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 1e6, -1e6, 3.0e38, -3.4e38,
                        1e-8, -1e-8, 6e-8, 1e-40, -1e-45, float("inf"), float("-inf"), float("nan"),
                        1.00390625, 1.01171875, 1.0078125, 0.33333334, 2.7182817, 3.1415927],
                       dtype=torch.float32)
    # Exact bf16 ties (low 16 bits == 0x8000) with even and odd kept LSB.
    # Also signalling/negative/payload NaNs, whose quieting differs between libraries.
    ties = torch.tensor([0x3F808000, 0x3F818000, 0xBF808000, 0x40490FDB, 0x7F7F8000,
                         0x7F800001, 0xFF812345, 0x7FFFFFFF, 0xFFC00000], dtype=torch.int64)
    ties = ties.to(torch.int32).view(torch.float32)
    g = torch.Generator().manual_seed(SEED)
    rnd = torch.randn(4096, generator=g, dtype=torch.float32) * torch.logspace(-30, 30, 4096, base=2.0)
    return torch.cat([f32, ties, rnd])


def write_cast_references() -> None:
    """torch's own casts, the independent reference for `ieconv --dtype`.

    cast_edge.safetensors holds `x` (f32) and torch's `x.to(bf16)`/`x.to(f16)`;
    <model>/cast_<dtype>.safetensors holds every tensor of a golden model as
    torch casts it (the converter must produce the same bytes).
    """
    from safetensors.torch import load_file, save_file

    x = cast_edge_values()
    save_file({"x": x, "x_bf16": x.to(torch.bfloat16), "x_f16": x.to(torch.float16)},
              REF_DIR / "cast_edge.safetensors")
    for model, dtype, torch_dtype in (("tiny-llama", "bf16", torch.bfloat16),
                                      ("tiny-qwen2", "f32", torch.float32),
                                      ("tiny-qwen2", "f16", torch.float16)):
        src = HF_DIR / model
        tensors = {}
        for shard in sorted(src.glob("*.safetensors")):
            tensors.update(load_file(shard))
        save_file({k: v.to(torch_dtype).contiguous() for k, v in sorted(tensors.items())},
                  REF_DIR / model / f"cast_{dtype}.safetensors")


def main() -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    tok = build_tokenizer()
    make_llama(tok)
    make_qwen2(tok)
    make_mistral(tok)
    make_llama3(tok)
    make_qwen3(tok)
    make_qwen3_moe(tok)
    make_mixtral(tok)
    make_gpt_oss(tok)
    make_gemma3(tok)
    make_gemma3_vl(tok)
    make_gemma2(tok)
    make_gemma(tok)
    make_arcee(tok)
    make_stablelm(tok)
    make_starcoder2(tok)
    make_nemotron(tok)
    make_phi(tok)
    make_phi3(tok)
    make_smollm3(tok)
    make_granite(tok)
    make_granite_swa(tok)
    make_granite_moe_swa(tok)
    make_olmo(tok)
    make_olmo2(tok)
    make_olmo3(tok)
    make_ministral3(tok)
    make_ministral3_vl(tok)
    make_exaone4(tok)
    make_olmoe(tok)
    make_qwen2_moe(tok)
    make_glm4_moe(tok)
    make_minimax_m2(tok)
    make_deepseek_v3(tok)
    make_deepseek_v2(tok)
    make_glm4_moe_lite(tok)
    make_mistral4(tok)
    make_mistral4_vl(tok)
    make_llama4(tok)
    make_llama4_vl(tok)
    make_ernie4_5(tok)
    make_ernie4_5_moe(tok)
    make_qwen3_5(tok)
    make_qwen3_5_vl(tok)
    make_qwen3_5_moe(tok)
    make_qwen3_5_moe_vl(tok)
    make_qwen3_next(tok)
    make_qwen3_vl(tok)
    make_qwen2_5_vl(tok)
    make_qwen3_vl_moe(tok)
    make_seed_oss(tok)
    make_hunyuan_dense(tok)
    make_hunyuan_moe(tok)
    make_hy_v3(tok)
    make_apertus(tok)
    make_afmoe(tok)
    make_dots1(tok)
    make_solar_open(tok)
    make_youtu(tok)
    make_jais2(tok)
    make_exaone_moe(tok)
    make_glm4(tok)
    make_glm4_vl(tok)
    make_glm4_vl_moe(tok)
    make_lfm2(tok)
    make_lfm2_moe(tok)
    make_lfm2_vl(tok)
    make_granite4(tok)
    make_granite4_dense(tok)
    make_granite_moe(tok)
    make_granite_moe_shared(tok)
    make_nemotron_h(tok)
    make_nemotron_h_moe(tok)
    make_mamba2(tok)
    make_falcon_h1(tok)
    make_mamba(tok)
    make_falcon_mamba(tok)
    make_cohere2(tok)
    make_cohere(tok)
    make_fp8("tiny-qwen3", "tiny-qwen3-fp8", Qwen3ForCausalLM, [32, 32])
    make_fp8("tiny-ministral3", "tiny-ministral3-fp8", Ministral3ForCausalLM, None)
    write_e4m3_table()
    write_cast_references()
    # safetensors writes 0600 files; normalise permissions for a stable tree.
    for root in (HF_DIR, REF_DIR):
        for path in root.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
    print("golden outputs written under", os.path.relpath(GOLDEN_DIR))


if __name__ == "__main__":
    main()
