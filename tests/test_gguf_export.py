"""``ieconv iebin-to-gguf``: every architecture the decoder runs comes out as
a GGUF file that gguf-py's own ``GGUFReader`` reads back with llama.cpp's
names, shapes, types and bytes; importing it gives the same model (the same
logits, bit for bit); exporting that again gives the same tensors and the
same key-values llama.cpp reads; int4w repacks losslessly; what llama.cpp
cannot express is one line and nothing written. Running the files in
llama.cpp itself: tests/test_llamacpp_runs.py (when llama.cpp is built)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import (GOLDEN_HF, GOLDEN_IEBIN, SMOLLM2_GGUF, assert_one_line_error, edited_artifact, max_rel,
                      needs_smollm2, reconfigure, run_tool)
from gguf_build import llama_permute
from llamacpp_models import ARCH_OF, falcon_h1_stored, llamacpp_models

from iekit.convert.gguf_names import DECAY_RATES
from iekit.formats.casting import decode_f32
from iekit.formats.delta_net import decay_rate
from iekit.formats.quant import SCHEMES

IDS = [5, 17, 42, 99, 3, 250, 7, 8, 1, 64, 200, 31]
# key-values that describe where a file came from, not the model llama.cpp runs
PROVENANCE = ("iekit.", "general.name", "general.basename", "general.finetune", "general.languages",
              "general.license", "general.organization", "general.size_label")


def _export(model: Path, out: Path, *args: str):
    return run_tool("ieconv", "iebin-to-gguf", "--model-dir", model, "--out", out, "-q", *args)


def _import(gguf: Path, out: Path, *args: str):
    return run_tool("ieconv", "gguf-to-iebin", "--gguf", gguf, "--out-dir", out, "-q", *args)


def _convert(hf: Path, out: Path, *args: str) -> Path:
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", out, "-q", *args)
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """One artifact per architecture, in configurations llama.cpp can run."""
    return llamacpp_models(tmp_path_factory.mktemp("export-models"))


def _reader_kv(path: Path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _reader_tensors(path: Path) -> dict:
    import gguf

    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def _iebin_bytes(model: Path) -> dict[str, tuple[dict, np.ndarray]]:
    meta = json.loads((model / "model.ie.json").read_text())
    blob = np.fromfile(model / "model.ie.bin", np.uint8)
    return {t["name"]: (t, blob[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]) for t in meta["tensors"]}


def _falcon_h1_bf16(cfg: dict, name: str, t: dict, raw: np.ndarray) -> np.ndarray:
    """A bfloat16 Falcon-H1 tensor's bytes as llama.cpp's converter stores them (falcon_h1_stored)."""
    assert t["dtype"] == "bf16"
    stored = falcon_h1_stored(cfg, name, _as_f32(t, raw).reshape(t["shape"]))
    return (stored.reshape(-1).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)


def _as_f32(t: dict, raw: np.ndarray) -> np.ndarray:
    if t["dtype"] == "f32":
        return raw.view(np.float32)
    if t["dtype"] == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return raw.view(np.float16).astype(np.float32)


def _paired_expert(src: dict, i: int, k: str, bias: bool, module: str = "mlp", halves: bool = False) -> np.ndarray:
    """What llama.cpp's blk.i.ffn_{k}_exps holds for gpt-oss: down as it is,
    gate/up the rows (the bias's elements, widened to F32) of one parity of
    the interleaved gate_up stack; for Llama 4 (``halves``) each expert's
    first or second half of rows."""
    t, raw = src[f"model.layers.{i}.{module}.experts.{'down_proj' if k == 'down' else 'gate_up_proj'}{'_bias' if bias else ''}"]
    x = _as_f32(t, raw).reshape(t["shape"]) if bias else raw.reshape(t["shape"][0], t["shape"][1], -1)
    if k == "down":
        return x
    if halves:
        n = x.shape[1] // 2
        return x[:, :n] if k == "gate" else x[:, n:]
    return x[:, (0 if k == "gate" else 1)::2]


@pytest.mark.parametrize("name", sorted(ARCH_OF))
def test_export_reads_back_with_gguf_reader(tmp_path, models, name):
    """Names from gguf-py's own TensorNameMap, the bytes of every tensor as
    the test restates llama.cpp's layout (q/k permuted with
    convert_hf_to_gguf's ``permute``, experts stacked, gpt-oss's gate/up
    split by parity), the hyperparameters llama.cpp reads."""
    import gguf

    model = models[name]
    res = _export(model, tmp_path / "m.gguf")
    assert res.returncode == 0, res.stderr
    kv = _reader_kv(tmp_path / "m.gguf")
    tensors = _reader_tensors(tmp_path / "m.gguf")
    a = ARCH_OF[name]
    assert kv["general.architecture"] == a
    cfg = json.loads((model / "config.json").read_text())
    assert kv[f"{a}.embedding_length"] == cfg["hidden_size"]
    # (GLM-4.5's and GLM-4.7-Flash's multi-token prediction layers are counted in llama.cpp's block_count;
    # DeepSeek-V3's are left out)
    mla = a in ("deepseek2", "mistral4")  # (llama.cpp's deepseek2 loader, mistral4's too)
    # (Qwen3.5's and Qwen3-Next's beside the model, mtp.layers.I, which Qwen3-Next's config does not count)
    beside = {t["name"].split(".")[2] for t in json.loads((model / "model.ie.json").read_text())["tensors"]
              if t["name"].startswith("mtp.layers.")}
    mtp = 0 if cfg["model_type"] == "deepseek_v3" else cfg.get("num_nextn_predict_layers", len(beside))
    nemotron = a in ("nemotron_h", "nemotron_h_moe")  # (transformers 5 saves its blocks, not their count)
    mamba1 = a == "mamba"  # (Mamba 1's scan alone: no attention, no MLP)
    mamba2 = a == "mamba2" or mamba1  # (Mamba2 alone: no attention, no MLP)
    trunk = len(cfg["layers_block_type"]) if nemotron else cfg["num_hidden_layers"]
    assert kv[f"{a}.block_count"] == trunk + mtp
    assert kv[f"{a}.attention.head_count"] == (0 if mamba2 else cfg["num_attention_heads"])
    n_kv = 1 if mla else None if mamba2 else cfg["num_key_value_heads"]  # (the latent: one head)
    if a in ("lfm2", "lfm2moe"):  # (one per layer, 0 where it convolves)
        n_kv = [0 if t == "conv" else n_kv for t in cfg["layer_types"]]
        assert kv[f"{a}.shortconv.l_cache"] == cfg["conv_L_cache"]
    if a == "granitehybrid":  # (one per layer, 0 where it runs Mamba2; the Mamba2 dims under ssm.*; no RoPE)
        n_kv = [0 if t == "linear_attention" else n_kv for t in cfg["layer_types"]]
        assert [kv[f"{a}.ssm.{k}"] for k in ("conv_kernel", "state_size", "group_count", "inner_size",
                                               "time_step_rank")] == \
            [cfg["mamba_d_conv"], cfg["mamba_d_state"], cfg["mamba_n_groups"], cfg["mamba_expand"] * cfg["hidden_size"],
             cfg["mamba_n_heads"]]
        assert kv[f"{a}.rope.scaling.finetuned"] is False and kv[f"{a}.residual_scale"] == pytest.approx(0.22)
    if nemotron:  # (per block: KV heads where it attends, the width where it is an MLP or experts; ssm.*; no RoPE)
        types = cfg["layers_block_type"]
        n_kv = [n_kv if t == "full_attention" else 0 for t in types]
        width = cfg.get("moe_intermediate_size") if a == "nemotron_h_moe" else cfg["intermediate_size"]
        assert kv[f"{a}.feed_forward_length"] == [width if t in ("mlp", "moe") else 0 for t in types]
        assert [kv[f"{a}.ssm.{k}"] for k in ("conv_kernel", "state_size", "group_count", "inner_size",
                                               "time_step_rank")] == \
            [cfg["conv_kernel"], cfg["ssm_state_size"], cfg["n_groups"], cfg["mamba_num_heads"] * cfg["mamba_head_dim"],
             cfg["mamba_num_heads"]]
        assert kv[f"{a}.rope.scaling.finetuned"] is False and f"{a}.rope.freq_base" not in kv
    if mamba2:  # (as Mamba2Model writes it: no KV heads, no width; the Mamba2 dims under ssm.*)
        assert f"{a}.attention.head_count_kv" not in kv and kv[f"{a}.feed_forward_length"] == 0
        if mamba1:  # (MambaModel's: no groups; dt's rank; Falcon Mamba's norms of dt, B and C)
            assert [kv[f"{a}.ssm.{k}"] for k in ("conv_kernel", "state_size", "inner_size", "time_step_rank",
                                                   "dt_b_c_rms")] == \
                [cfg["conv_kernel"], cfg["state_size"], cfg["intermediate_size"], cfg["time_step_rank"],
                 cfg["model_type"] == "falcon_mamba"]
        else:
            assert [kv[f"{a}.ssm.{k}"] for k in ("conv_kernel", "state_size", "group_count", "inner_size",
                                                   "time_step_rank")] == \
                [cfg["conv_kernel"], cfg["state_size"], cfg["n_groups"], cfg["num_heads"] * cfg["head_dim"],
                 cfg["num_heads"]]
        assert not any(k.startswith(f"{a}.rope.") for k in kv)
    else:
        assert kv[f"{a}.attention.head_count_kv"] == n_kv
    # (Granite 4 with Mamba2 layers: 2^20, convert_hf_to_gguf's arbitrary value for a model without RoPE)
    # (HunYuan's NTK-alpha models: 256k, as convert_hf_to_gguf's HunYuanModel states it, and the stretched base)
    ntk = cfg.get("rope_parameters", {}).get("rope_type") == "dynamic"
    assert kv[f"{a}.context_length"] == (2 ** 20 if a == "granitehybrid" or nemotron or mamba2 else 256 * 1024 if ntk else
                                         cfg["max_position_embeddings"])
    if ntk:
        rp, d = cfg["rope_parameters"], cfg["head_dim"]
        assert kv[f"{a}.rope.freq_base"] == np.float32(rp["rope_theta"] * rp["alpha"] ** (d / (d - 2)))
        assert (kv[f"{a}.rope.scaling.type"], kv[f"{a}.rope.scaling.factor"]) == ("none", 1.0)
    if a in ("cohere2", "command-r", "stablelm", "starcoder2", "nemotron", "phi2", "jais2", "olmo") or nemotron:
        # LayerNorm's (Nemotron-H's RMSNorm eps too, as its converter writes it; OLMo's, which no config states)
        eps = cfg["layer_norm_epsilon"] if nemotron else 1e-5 if a == "olmo" else cfg["norm_epsilon"] if a == "starcoder2" else \
            cfg["norm_eps"] if a == "nemotron" else cfg["layer_norm_eps"]
        assert kv[f"{a}.attention.layer_norm_epsilon"] == pytest.approx(eps, rel=1e-6)
    else:
        eps = cfg["norm_eps"] if a in ("lfm2", "lfm2moe") else cfg["layer_norm_epsilon"] if mamba2 else \
            cfg["rms_norm_eps"]
        assert kv[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(eps, rel=1e-6)
    assert kv["tokenizer.ggml.model"] == "gpt2" and len(kv["tokenizer.ggml.tokens"]) == cfg["vocab_size"]
    tok = json.loads((model / "tokenizer.json").read_text())
    assert kv["tokenizer.ggml.merges"][:5] == [m if isinstance(m, str) else " ".join(m)
                                               for m in tok["model"]["merges"][:5]]
    if a == "nemotron_h_moe":
        assert kv[f"{a}.expert_count"] == cfg["n_routed_experts"]
        assert kv[f"{a}.expert_used_count"] == cfg["num_experts_per_tok"]
        assert kv[f"{a}.expert_shared_feed_forward_length"] == cfg["moe_shared_expert_intermediate_size"]
        assert kv[f"{a}.expert_weights_scale"] == pytest.approx(cfg["routed_scaling_factor"])
        assert kv[f"{a}.expert_weights_norm"] is cfg["norm_topk_prob"]
    elif a == "hunyuan-moe":  # (its per-layer keys as lists, one value each; its shared MLP intermediate_size wide)
        assert kv[f"{a}.expert_count"] == cfg["num_experts"]
        assert [kv[f"{a}.expert_used_count"], kv[f"{a}.expert_feed_forward_length"], kv[f"{a}.expert_shared_count"]] \
            == [cfg["moe_topk"][0], cfg["moe_intermediate_size"][0], cfg["num_shared_expert"][0]]
        assert kv[f"{a}.expert_shared_feed_forward_length"] == cfg["intermediate_size"]
    elif "num_local_experts" in cfg or "num_experts" in cfg:
        assert kv[f"{a}.expert_count"] == cfg.get("num_local_experts", cfg.get("num_experts"))
        assert kv[f"{a}.expert_used_count"] == cfg["num_experts_per_tok"]
    if a == "gpt-oss":
        assert kv["gpt-oss.attention.sliding_window"] == cfg["sliding_window"]
        assert kv["gpt-oss.attention.sliding_window_pattern"] == [t == "sliding_attention" for t in cfg["layer_types"]]
        assert kv["gpt-oss.rope.scaling.type"] == "yarn"
    # (the gguf-py on PyPI predates hy_v3: HunYuan-MoE's tensors are its, GLM-4.5's its choice bias and MTP layer's)
    arch_enum = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == a), None) or \
        {"hy_v3": gguf.MODEL_ARCH.HUNYUAN_MOE, "granite_swa": gguf.MODEL_ARCH.GRANITE}[a]
    name_map = gguf.get_tensor_name_map(arch_enum, kv[f"{a}.block_count"])
    src = _iebin_bytes(model)
    heads = {} if mamba2 else {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}
    seen = set()
    fused = {"attn_qkv": ("q_proj", "k_proj", "v_proj"), "ffn_up": ("gate_proj", "up_proj")} if a == "phi3" else \
        {"ffn_up": ("gate_proj", "up_proj")} if a == "glm4" else {}
    # Qwen3.5's MTP block beside the model, under the names Qwen3NextModel's converter gives it (layer trunk + I)
    mtp_names = {"mtp.fc.weight": "eh_proj.weight", "mtp.pre_fc_norm_embedding.weight": "enorm.weight",
                 "mtp.pre_fc_norm_hidden.weight": "hnorm.weight", "mtp.norm.weight": "shared_head.norm.weight"}
    for hf_as_stored, (t, raw) in src.items():
        m = re.fullmatch(r"mtp\.layers\.(\d+)\.(.+)", hf_as_stored)
        hf = (f"model.layers.{trunk + int(m.group(1))}.{m.group(2)}" if m else
              f"model.layers.{trunk}.{mtp_names[hf_as_stored]}" if hf_as_stored in mtp_names else hf_as_stored)
        if nemotron or mamba2:  # (the Hub's names, which gguf-py maps: backbone.*)
            hf = "backbone." + hf.removeprefix("model.") if hf.startswith("model.") else hf
        if mla and hf.endswith("kv_b_proj.weight"):  # attn_k_b: each head's key rows transposed; attn_v_b its values
            i = int(hf.split(".")[2])
            h, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
            kv_b = raw.view(np.uint32 if t["dtype"] == "f32" else np.uint16).reshape(h, nope + v, cfg["kv_lora_rank"])
            for g_name, want in (("attn_k_b", kv_b[:, :nope].transpose(0, 2, 1)), ("attn_v_b", kv_b[:, nope:])):
                g = tensors[f"blk.{i}.{g_name}.weight"]
                seen.add(g.name)
                assert g.tensor_type.name == t["dtype"].upper()
                assert list(reversed([int(d) for d in g.shape])) == list(want.shape)
                assert np.array_equal(np.asarray(g.data).reshape(-1).view(kv_b.dtype), want.reshape(-1)), g.name
            continue
        # (gguf-py maps GLM-4.5's e_score_correction_bias as e_score_correction + a bias)
        bias = hf.endswith((".bias", ".e_score_correction_bias"))
        base = hf.removesuffix(".weight").removesuffix(".bias").removesuffix("_bias")
        if hf.endswith(("linear_attn.dt_bias", "mamba.dt_bias", "mixer.dt_bias")):  # (Qwen3NextModel, Mamba2Model: dt_proj.bias)
            base, bias = hf.removesuffix("_bias") + "_proj", True
        if hf.endswith("feed_forward.expert_bias") or a == "afmoe" and hf.endswith("mlp.expert_bias"):
            base, bias = hf, True  # (LFM2MoeModel and AfmoeModel rename it expert_bias.bias)
        if a == "hy_v3" and hf.endswith((".mlp.expert_bias", ".final_layernorm.weight")):  # (HYV3Model: the choice
            # bias without a suffix; the MTP layer's final norm renamed shared_head.norm before the name map)
            base = hf.removesuffix(".weight").replace(".final_layernorm", ".shared_head.norm")
        # (routed experts: below; shared ones one to one, but Granite 4's shared MLP: below)
        expected_name = name_map.get_name(base) \
            if ".experts." not in hf and ".block_sparse_moe.input_linear." not in hf and not (
                ".shared_mlp." in hf and a in ("granitehybrid", "granitemoe")) else None
        if expected_name is None and (mla or a in ("qwen35", "qwen35moe", "qwen3next", "hy_v3")):  # (the gguf-py on PyPI predates deepseek2's and
            # qwen35's MTP tensors: GLM-4.5's names)
            expected_name = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GLM4_MOE, kv[f"{a}.block_count"]).get_name(base)
        if expected_name is None and a == "granite_swa":  # (the gguf-py on PyPI predates it: gpt-oss's sinks)
            expected_name = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, kv[f"{a}.block_count"]).get_name(base)
        if any(hf.split(".")[-2] in parts for parts in fused.values()):
            continue  # phi3's fused matrices: below
        if a == "qwen3next" and hf.endswith(("in_proj_b.weight", "in_proj_a.weight")):
            continue  # in ssm_ba: below
        falcon_norm = a == "falcon-h1" and hf.endswith("pre_ff_layernorm.weight")  # (llama.cpp's ffn_norm, no
        if falcon_norm:  # suffix: the gguf-py on PyPI predates its name)
            expected_name = f"blk.{hf.split('.')[2]}.ffn_norm"
        if expected_name is None:
            continue
        gname = expected_name + ("" if falcon_norm else ".bias" if bias else ".weight")
        if hf.endswith("self_attn.sinks"):
            gname = expected_name + ".weight"
        if hf.endswith(("linear_attn.A_log", "mamba.A_log", "mamba.D", "mixer.A_log", "mixer.D")) or \
                a == "hy_v3" and hf.endswith("mlp.expert_bias"):  # (gguf-py names them without a suffix)
            gname = expected_name
        g = tensors[gname]
        seen.add(gname)
        conv = hf.endswith(("linear_attn.conv1d.weight", "conv.conv.weight", "mamba.conv1d.weight",
                            "mixer.conv1d.weight"))  # [ch, taps]
        shape = [t["shape"][0], t["shape"][2]] if conv else t["shape"]
        if hf.endswith(("mamba.A_log", "mamba.D", "mamba.norm.weight", "mixer.A_log", "mixer.D", "mixer.norm.weight")) \
                and not mamba1:  # (Mamba 1's A_log [channels, state] and D as they are)
            # (Mamba2Model: [heads, 1], [groups, n])
            rows = cfg["n_groups" if nemotron or mamba2 else "mamba_n_groups"] if hf.endswith("norm.weight") else shape[0]
            shape = [rows, shape[0] // rows]
        assert [int(d) for d in reversed(g.shape)] == shape, gname
        data = np.asarray(g.data).reshape(-1).view(np.uint8)
        gemma = a in ("gemma", "gemma2", "gemma3")
        # their norms multiply by 1 + w (Qwen3.5's gated DeltaNet norm excepted; Nemotron's LayerNorm1P)
        shifted = gemma or a in ("qwen35", "qwen35moe", "qwen3next", "nemotron")
        a_log = mamba1 and ".ssm_a" in gname  # (Mamba 1's [channels, state], F32 as the others' vectors)
        if (len(t["shape"]) == 1 or ".ffn_gate_inp." in gname or ".ffn_gate_inp_shexp." in gname or conv or a_log) \
                and (t["dtype"] != "f32" or shifted or ".ssm_a" in gname):
            assert g.tensor_type.name == "F32"  # llama.cpp keeps them F32 (routers, the shared expert's gate)
            data = data.view(np.float32)
            want = _as_f32(t, raw)
            if shifted and hf.endswith("norm.weight") and not hf.endswith("linear_attn.norm.weight"):
                want = want + np.float32(1)  # convert_hf_to_gguf.py's GemmaModel, ..., Qwen3NextModel, NemotronModel: 1 + w
            if ".ssm_a" in gname:  # Qwen3NextModel: -exp(A_log), float32 correctly rounded (torch's)
                want = (-np.exp(want.astype(np.float64))).astype(np.float32)
        else:
            assert g.tensor_type.name == t["dtype"].upper(), gname
            want = raw
            if a == "falcon-h1":  # (its matrices times the muP multipliers, as its converter stores them)
                want = _falcon_h1_bf16(cfg, hf, t, raw)
        proj = hf.split(".")[-2]
        # (convert_hf_to_gguf's LlamaModel and its kin)
        if (a in ("llama", "smollm3", "granite", "granitehybrid", "granitemoe", "granite_swa", "mistral3", "arcee",
                  "olmo") or nemotron) and proj in heads:
            rows = t["shape"][0]
            want = llama_permute(want.reshape(rows, -1), heads[proj]).reshape(-1)
        assert np.array_equal(data, want), gname
    # phi3: q, k, v rows one after another in attn_qkv, gate and up in ffn_up (convert_hf_to_gguf keeps
    # Phi-3's own qkv_proj and gate_up_proj), LongRoPE's factors as F32 tensors
    for i in range(trunk):
        for g_name, parts in fused.items():
            g = tensors[f"blk.{i}.{g_name}.weight"]
            seen.add(g.name)
            want = [src[f"model.layers.{i}.{'mlp' if g_name == 'ffn_up' else 'self_attn'}.{p}.weight"] for p in parts]
            assert g.tensor_type.name == want[0][0]["dtype"].upper()
            assert np.asarray(g.data).reshape(-1).view(np.uint8).tobytes() == b"".join(w[1].tobytes() for w in want)
    # Granite's shared MLP: gate, up and output_linear as ffn_*_shexp beside experts, else the dense MLP's
    shared = a in ("granitehybrid", "granitemoe") and cfg.get("shared_intermediate_size")
    for i in range(trunk) if shared else ():
        for k, hf in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "output_linear")):
            g = tensors[f"blk.{i}.ffn_{k}{'_shexp' if cfg['num_local_experts'] else ''}.weight"]
            seen.add(g.name)
            t, raw = src[f"model.layers.{i}.shared_mlp.{hf}.weight"]
            assert g.tensor_type.name == t["dtype"].upper() and np.asarray(g.data).reshape(-1).view(np.uint8).tobytes() \
                == raw.tobytes(), g.name
    # qwen3next: ssm_ba as Hugging Face's in_proj_ba, per key head its value heads' b rows, then their a rows
    for i, kind in enumerate(cfg.get("layer_types", []) if a == "qwen3next" else []):
        if kind != "linear_attention":
            continue
        g = tensors[f"blk.{i}.ssm_ba.weight"]
        seen.add(g.name)
        b, a_ = (src[f"model.layers.{i}.linear_attn.in_proj_{k}.weight"] for k in "ba")
        kh = cfg["linear_num_key_heads"]
        want = np.concatenate([x[1].reshape(kh, -1) for x in (b, a_)], axis=1)
        assert g.tensor_type.name == b[0]["dtype"].upper()
        assert np.asarray(g.data).reshape(-1).view(np.uint8).tobytes() == want.tobytes()
    if a == "phi3":
        rp = cfg["rope_parameters"]
        for k in ("long", "short"):
            g = tensors[f"rope_factors_{k}.weight"]
            seen.add(g.name)
            assert np.array_equal(np.asarray(g.data), np.asarray(rp[f"{k}_factor"], np.float32))
        assert kv["phi3.rope.dimension_count"] == int(cfg["hidden_size"] // cfg["num_attention_heads"] * rp["partial_rotary_factor"]) == 8
        assert kv["phi3.rope.scaling.original_context_length"] == cfg["original_max_position_embeddings"]
        f = cfg["max_position_embeddings"] / cfg["original_max_position_embeddings"]
        assert kv["phi3.rope.scaling.attn_factor"] == pytest.approx(np.sqrt(1 + np.log(f) / np.log(32)), rel=1e-7)
    # experts: stacks of the per-expert matrices (Mixtral, Qwen3-MoE) or gpt-oss's pair split by row parity (Llama
    # 4's by halves)
    for i in range(kv[f"{a}.block_count"]):
        for k in ("gate", "up", "down"):
            g = tensors.get(f"blk.{i}.ffn_{k}_exps.weight")
            if g is None:
                continue
            seen.add(g.name)
            data = np.asarray(g.data).reshape(-1).view(np.uint8)
            if a == "gpt-oss":
                want = _paired_expert(src, i, k, bias=False)
            elif a == "llama4":
                want = _paired_expert(src, i, k, bias=False, module="feed_forward", halves=True)
            elif a in ("granitehybrid", "granitemoe", "mistral4"):  # (the gate/up stack's halves, down as it is)
                t, raw = src[f"model.layers.{i}.mlp.experts.{'down' if k == 'down' else 'gate_up'}_proj"] \
                    if a == "mistral4" else \
                    src[f"model.layers.{i}.block_sparse_moe.{'output' if k == 'down' else 'input'}_linear.weight"]
                x = raw.reshape(t["shape"][0], t["shape"][1], -1)
                want = x if k == "down" else x[:, :x.shape[1] // 2] if k == "gate" else x[:, x.shape[1] // 2:]
            elif a == "granite_swa":  # (GraniteMoeSWA's down stack as it is; its gate_up one below)
                want = src[f"model.layers.{i}.block_sparse_moe.experts.down_proj"][1]
            else:
                pat = {"llama": {"gate": "block_sparse_moe.experts.{e}.w1", "up": "block_sparse_moe.experts.{e}.w3",
                                 "down": "block_sparse_moe.experts.{e}.w2"},
                       "qwen3moe": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "olmoe": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "qwen2moe": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "glm4moe": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "deepseek2": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "ernie4_5-moe": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "qwen35moe": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "qwen3next": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "hunyuan-moe": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "hy_v3": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "afmoe": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "dots1": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "exaone-moe": {k2: f"mlp.experts.{{e}}.{k2}_proj" for k2 in ("gate", "up", "down")},
                       "minimax-m2": {"gate": "block_sparse_moe.experts.{e}.w1", "up": "block_sparse_moe.experts.{e}.w3",
                                      "down": "block_sparse_moe.experts.{e}.w2"},
                       "lfm2moe": {"gate": "feed_forward.experts.{e}.w1", "up": "feed_forward.experts.{e}.w3",
                                   "down": "feed_forward.experts.{e}.w2"},
                       "nemotron_h_moe": {k2: f"mixer.experts.{{e}}.{k2}_proj" for k2 in ("up", "down")}}[a][k]
                beside = i >= trunk and a in ("qwen35moe", "qwen3next")  # (their MTP layers are kept beside the model)
                layer = f"mtp.layers.{i - trunk}." if beside else f"model.layers.{i}."
                want = np.concatenate([src[f"{layer}{pat.format(e=e)}.weight"][1] for e in range(int(g.shape[-1]))])
            assert np.array_equal(data, np.ascontiguousarray(want).reshape(-1)), g.name
        if a == "granite_swa" and f"blk.{i}.ffn_gate_up_exps.weight" in tensors:  # (GraniteMoeSWA, as its converter
            # writes it: the gate_up stack as it is, the router widened to F32, the shared MLP's gate and up rows fused)
            pre = f"model.layers.{i}."
            moe = {"ffn_gate_up_exps": [src[pre + "block_sparse_moe.experts.gate_up_proj"][1]],
                   "ffn_down_shexp": [src[pre + "shared_mlp.output_linear.weight"][1]],
                   "ffn_up_shexp": [src[pre + f"shared_mlp.{p}_proj.weight"][1] for p in ("gate", "up")]}
            for name, parts in moe.items():
                g = tensors[f"blk.{i}.{name}.weight"]
                seen.add(g.name)
                assert np.asarray(g.data).reshape(-1).view(np.uint8).tobytes() == b"".join(p.tobytes() for p in parts)
            g = tensors[f"blk.{i}.ffn_gate_inp.weight"]
            seen.add(g.name)
            t, raw = src[pre + "block_sparse_moe.router.weight"]
            assert g.tensor_type.name == "F32" and np.array_equal(np.asarray(g.data).reshape(-1), _as_f32(t, raw))
    # gpt-oss's expert biases: the gate/up stack's elements split by parity, down's as they are (widened to F32)
    for i in range(trunk):
        for k in ("gate", "up", "down"):
            g = tensors.get(f"blk.{i}.ffn_{k}_exps.bias")
            if g is None:
                continue
            seen.add(g.name)
            want = _paired_expert(src, i, k, bias=True)
            assert g.tensor_type.name == "F32" and np.array_equal(np.asarray(g.data).reshape(want.shape), want)
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rp.get("rope_type") == "llama3":  # convert_hf_to_gguf's per-frequency divisors, restated
        hd, theta = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"], rp["rope_theta"]
        old, lo, hi, factor = (rp["original_max_position_embeddings"], rp["low_freq_factor"], rp["high_freq_factor"],
                               rp["factor"])
        want = []
        for f in 1.0 / (np.float32(theta) ** (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd))):
            wl = 2 * np.pi / float(f)
            sm = (old / wl - lo) / (hi - lo) if hi > lo else 0.0  # (equal factors, Llama 4 Scout's: no ramp)
            want.append(1 if wl < old / hi else factor if wl > old / lo else 1 / ((1 - sm) / factor + sm))
        g = tensors["rope_freqs.weight"]
        seen.add(g.name)
        assert g.tensor_type.name == "F32"
        np.testing.assert_allclose(np.asarray(g.data), np.asarray(want, np.float32), rtol=2e-7)
        assert 1 < np.asarray(g.data).max() and kv[f"{a}.rope.scaling.original_context_length"] == old
    if a == "apertus":  # each layer's xIELU parameters as keys, one float32 per layer, raw as the checkpoint's
        for k in ("alpha_p", "alpha_n", "beta", "eps"):
            want = [decode_f32(src[f"model.layers.{i}.mlp.act_fn.{k}"][1].tobytes(),
                               src[f"model.layers.{i}.mlp.act_fn.{k}"][0]["dtype"])[0] for i in range(trunk)]
            assert kv[f"xielu.{k}"] == [float(v) for v in want] and len(set(want)) == trunk, k
    assert seen == set(tensors)  # every tensor of the file checked above


@pytest.mark.parametrize("name", sorted(ARCH_OF))
def test_export_import_is_the_same_model(tmp_path, models, name):
    """Export, import: the same tensors (matrices byte for byte, vectors the
    same floats widened to f32), bit-identical logits; export again: the same
    tensor bytes and the same key-values llama.cpp reads."""
    from iekit.runtime.decoder import Decoder

    model = models[name]
    assert _export(model, tmp_path / "a.gguf").returncode == 0
    res = _import(tmp_path / "a.gguf", tmp_path / "back")
    assert res.returncode == 0, res.stderr
    src, back = _iebin_bytes(model), _iebin_bytes(tmp_path / "back")
    assert set(src) == set(back)
    falcon = ARCH_OF[name] == "falcon-h1"  # (its matrices come back times the muP multipliers, its config's 1)
    cfg = json.loads((model / "config.json").read_text())
    for n, (t, raw) in src.items():
        t2, raw2 = back[n]
        assert t2["shape"] == t["shape"], n
        if falcon and t["dtype"] == "bf16" and len(t["shape"]) == 2:
            raw = _falcon_h1_bf16(cfg, n, t, raw)
        if n.endswith(DECAY_RATES):  # (stored as llama.cpp's rate: A_log back as a float32 of the same rate)
            assert np.array_equal(decay_rate(_as_f32(t, raw)), decay_rate(_as_f32(t2, raw2))), n
        elif t2["dtype"] == t["dtype"]:
            assert np.array_equal(raw, raw2), n
        else:
            assert t2["dtype"] == "f32" and np.array_equal(_as_f32(t, raw), raw2.view(np.float32)), n
    if falcon:  # (the same model to bfloat16's rounding of the products: 0.0093 measured)
        assert max_rel(Decoder(tmp_path / "back", ctx=16).logits(IDS), Decoder(model, ctx=16).logits(IDS)) < 1.2e-2
    else:
        assert np.array_equal(Decoder(model, ctx=16).logits(IDS), Decoder(tmp_path / "back", ctx=16).logits(IDS))
    assert run_tool("ieconv", "validate", "--deep", tmp_path / "back").returncode == 0
    assert _export(tmp_path / "back", tmp_path / "b.gguf").returncode == 0
    _assert_same_gguf(tmp_path / "a.gguf", tmp_path / "b.gguf")


def _assert_same_gguf(a: Path, b: Path, ignore: tuple[str, ...] = PROVENANCE) -> None:
    ka = {k: v for k, v in _reader_kv(a).items() if not k.startswith(ignore)}
    kb = {k: v for k, v in _reader_kv(b).items() if not k.startswith(ignore)}
    assert ka == kb
    ta, tb = _reader_tensors(a), _reader_tensors(b)
    assert list(ta) == list(tb)
    for n, t in ta.items():
        u = tb[n]
        assert (t.tensor_type, list(t.shape)) == (u.tensor_type, list(u.shape)), n
        assert np.array_equal(np.asarray(t.data).reshape(-1).view(np.uint8), np.asarray(u.data).reshape(-1).view(np.uint8)), n


def test_llama3_divisors_import_without_their_original_context(tmp_path, models):
    """llama.cpp's converter writes Llama-3 scaling as rope_freqs.weight only:
    the importer finds factor, low/high_freq_factor from the divisors (with
    the original context defaulted to 8192, an equivalent scale) and runs the
    same model; divisors that are not Llama-3's ramp are one line."""
    from iekit.runtime.decoder import Decoder

    import gguf

    a = tmp_path / "a.gguf"
    assert _export(models["tiny-llama3"], a).returncode == 0
    key = b"llama.rope.scaling.original_context_length"
    raw = bytearray(a.read_bytes())
    assert raw.count(key) == 1
    raw[raw.index(key):raw.index(key) + len(key)] = b"general.x".ljust(len(key), b"x")  # as convert_hf_to_gguf writes
    a.write_bytes(bytes(raw))
    assert _import(a, tmp_path / "back").returncode == 0
    cfg = json.loads((tmp_path / "back/config.json").read_text())
    rs = cfg["rope_scaling"]
    assert (rs["rope_type"], rs["factor"], rs["original_max_position_embeddings"]) == ("llama3", 8.0, 8192)
    assert rs["high_freq_factor"] / rs["low_freq_factor"] == pytest.approx(4.0, rel=1e-5)
    np.testing.assert_allclose(Decoder(tmp_path / "back", ctx=16).logits(IDS),
                               Decoder(models["tiny-llama3"], ctx=16).logits(IDS), rtol=0, atol=1e-4)
    t = next(t for t in gguf.GGUFReader(str(a)).tensors if t.name == "rope_freqs.weight")
    div = np.asarray(t.data).copy()
    div[len(div) // 2] *= 1.5  # off the ramp
    raw[t.data_offset:t.data_offset + div.nbytes] = div.astype("<f4").tobytes()
    a.write_bytes(bytes(raw))
    assert_one_line_error(_import(a, tmp_path / "bad"), "rope_freqs.weight", "Llama-3")
    assert not (tmp_path / "bad").exists()


def test_sentencepiece_vocabulary_round_trips(tmp_path):
    """A SentencePiece vocabulary as llama.cpp stores it (``llama``: pieces,
    scores, types), imported (a byte-fallback BPE tokenizer.json) and
    exported again: ``llama`` with the same pieces, types, scores and space
    prefix, and a tokenizer that still gives sentencepiece's own ids once
    imported again; a tokenizer.json without the file's scores gets scores
    made from its merges, in the same order."""
    import gguf
    from test_gguf_import import _strings, sentencepiece_gguf
    from tokenizers import Tokenizer

    sp, src = sentencepiece_gguf(tmp_path)
    assert _import(src, tmp_path / "m").returncode == 0
    res = _export(tmp_path / "m", tmp_path / "b.gguf")
    assert res.returncode == 0, res.stderr
    a, b = _reader_kv(src), _reader_kv(tmp_path / "b.gguf")
    assert b["tokenizer.ggml.model"] == "llama" and "tokenizer.ggml.merges" not in b
    for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id",
              "tokenizer.ggml.eos_token_id"):
        assert b[k] == a[k], k
    assert b.get("tokenizer.ggml.unknown_token_id", 0) == a.get("tokenizer.ggml.unknown_token_id", 0)
    assert b["tokenizer.ggml.add_space_prefix"] is True and b["tokenizer.ggml.add_bos_token"] is True
    # the file's own scores come back (kept in tokenizer_config.json, since the BPE merges cannot hold them)
    assert b["tokenizer.ggml.scores"] == a["tokenizer.ggml.scores"]
    # without them (a tokenizer.json from elsewhere) the scores are made from the merges: the same order
    from iekit.convert.gguf_tokenizer import gguf_tokenizer_fields

    made = gguf_tokenizer_fields((tmp_path / "m/tokenizer.json").read_bytes(), {}, {}, tmp_path / "tokenizer.json")
    sa, sb, types = a["tokenizer.ggml.scores"], made["tokenizer.ggml.scores"], a["tokenizer.ggml.token_type"]
    assert made["tokenizer.ggml.tokens"] == a["tokenizer.ggml.tokens"] and sb != sa
    normal = [i for i, t in enumerate(types) if t == 1 and len(sp.id_to_piece(i)) > 1]
    assert sorted(normal, key=lambda i: (-sa[i], i)) == sorted(normal, key=lambda i: (-sb[i], i))
    assert _import(tmp_path / "b.gguf", tmp_path / "m2").returncode == 0
    ours = Tokenizer.from_file(str(tmp_path / "m2/tokenizer.json"))
    texts = [t for t in _strings(2000, seed=4) if "<" not in t]
    assert [e.ids for e in ours.encode_batch(texts)] == [[1] + sp.encode(t) for t in texts]
    assert gguf.GGUFReader(str(tmp_path / "b.gguf")).fields["tokenizer.ggml.scores"].types[-1] == \
        gguf.GGUFValueType.FLOAT32




@needs_smollm2
def test_smollm2_gguf_round_trip_keeps_every_byte(tmp_path):
    """The real SmolLM2-135M-Instruct Q4_1 GGUF: import (blocks kept), export:
    every one of its 272 tensors has the same type, shape and bytes, and every
    key-value llama.cpp reads to run it (hyperparameters, tokenizer, chat
    template) is the same."""
    src = SMOLLM2_GGUF
    assert _import(src, tmp_path / "m").returncode == 0
    res = _export(tmp_path / "m", tmp_path / "back.gguf")
    assert res.returncode == 0, res.stderr
    assert "272 copied byte for byte" in res.stderr
    ka, kb = _reader_kv(src), _reader_kv(tmp_path / "back.gguf")
    # the source says these at their defaults, or only what llama.cpp does not read to run it
    skip = PROVENANCE + ("tokenizer.ggml.add_space_prefix", "tokenizer.ggml.unknown_token_id")
    assert kb["tokenizer.ggml.add_eos_token"] is False  # llama.cpp's default, which the source leaves unsaid
    assert {k: v for k, v in ka.items() if not k.startswith(skip)} == \
           {k: v for k, v in kb.items() if not k.startswith(skip) and k not in
            ("llama.attention.key_length", "llama.attention.value_length", "tokenizer.ggml.add_eos_token")}
    assert kb["llama.attention.key_length"] == ka["llama.embedding_length"] // ka["llama.attention.head_count"]
    ta, tb = _reader_tensors(src), _reader_tensors(tmp_path / "back.gguf")
    assert sorted(ta) == sorted(tb) and len(ta) == 272
    for n, t in ta.items():
        assert t.tensor_type == tb[n].tensor_type and list(t.shape) == list(tb[n].shape)
        assert np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(tb[n].data).view(np.uint8)), n


@pytest.mark.parametrize("group,affine", [(32, False), (64, False), (128, True), ("row", True)])
def test_int4w_repacks_losslessly(tmp_path, group, affine):
    """int4w with f16 scales becomes Q4_0 (symmetric) / Q4_1 (affine) whose
    values, dequantized by gguf.quants (the reference), are exactly int4w's."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    q4 = tmp_path / "q4.json"
    args = ["--scheme", "int4w", "--group-size", str(group)] + (["--affine"] if affine else [])
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-llama", "-o", q4, *args).returncode == 0
    model = _convert(GOLDEN_HF / "tiny-llama", tmp_path / "m", "--q4-map", str(q4))
    res = _export(model, tmp_path / "m.gguf")
    assert res.returncode == 0, res.stderr
    assert "int4w repacked losslessly" in res.stderr
    tensors = _reader_tensors(tmp_path / "m.gguf")
    n = 0
    for name, (t, raw) in _iebin_bytes(model).items():
        if t["dtype"] != "int4w":
            continue
        p = SCHEMES["int4w"].params_from(t["quant"], t["shape"][1])
        ours = SCHEMES["int4w"].dequantize(raw, *t["shape"], p)
        g = tensors[f"blk.{name.split('.')[2]}.{_short(name)}.weight"]
        want_type = "Q4_1" if affine else "Q4_0"
        assert g.tensor_type.name == want_type
        theirs = dequantize(np.asarray(g.data), GGMLQuantizationType[want_type]).reshape(t["shape"])
        if "q_proj" in name or "k_proj" in name:  # rows move, values do not change
            heads = 4 if "q_proj" in name else 2
            ours = llama_permute(ours, heads)
        assert np.array_equal(ours, theirs), name
        n += 1
    assert n > 0


def _short(hf: str) -> str:
    from iekit.convert.gguf_names import LAYER_NAMES

    proj = ".".join(hf.split(".")[3:5])
    return next(g for g, h in LAYER_NAMES.items() if h == proj)


def test_int4w_with_f32_scales_is_refused_or_requantized(tmp_path):
    q4 = tmp_path / "q4.json"
    assert run_tool("ieconv", "q4-manifest", "--hf-dir", GOLDEN_HF / "tiny-llama", "-o", q4,
                    "--scale-dtype", "f32").returncode == 0
    model = _convert(GOLDEN_HF / "tiny-llama", tmp_path / "m", "--q4-map", str(q4))
    res = _export(model, tmp_path / "m.gguf")
    assert_one_line_error(res, "int4w with f32 scales", "--scale-dtype f16", "--requantize q4_0")
    assert not (tmp_path / "m.gguf").exists() and not list(tmp_path.glob(".m.gguf*"))
    assert_one_line_error(_export(model, tmp_path / "m.gguf", "--requantize", "q4_k"), "--requantize q4_k", "256")
    res = _export(model, tmp_path / "m.gguf", "--requantize", "q8_0")
    assert res.returncode == 0, res.stderr
    assert "requantized blk.0.ffn_down.weight to q8_0: added error SQNR" in res.stderr
    assert {t.tensor_type.name for n, t in _reader_tensors(tmp_path / "m.gguf").items() if "ffn_down" in n} == {"Q8_0"}


def test_what_llamacpp_cannot_express_is_refused(tmp_path):
    out = tmp_path / "x.gguf"
    res = _export(GOLDEN_IEBIN / "tiny-mistral", out)
    assert_one_line_error(res, "config.sliding_window", "--allow-full-attention")
    res = _export(GOLDEN_IEBIN / "tiny-qwen3-moe", out)
    assert_one_line_error(res, "config.mlp_only_layers")
    swa = edited_artifact(GOLDEN_IEBIN / "tiny-qwen3", tmp_path / "qwen3-swa", lambda meta: reconfigure(
        meta, sliding_window=4, layer_types=["sliding_attention", "full_attention"]))
    res = _export(swa, out)  # (llama.cpp's qwen3 attends to every position: the window would be dropped)
    assert_one_line_error(res, "config.sliding_window", "llama.cpp's qwen3", "--allow-full-attention")
    res = _export(GOLDEN_IEBIN / "tiny-gpt-oss", out)
    assert_one_line_error(res, "config.swiglu_limit", "7.0")
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["qwen3-swa"]


def test_mistral_with_full_attention_matches_within_its_window(tmp_path):
    from iekit.runtime.decoder import Decoder

    res = _export(GOLDEN_IEBIN / "tiny-mistral", tmp_path / "m.gguf", "--allow-full-attention")
    assert res.returncode == 0 and "warning: sliding_window 4 is dropped" in res.stderr
    assert _import(tmp_path / "m.gguf", tmp_path / "back").returncode == 0
    ids = IDS[:4]  # the window: every position sees all of them either way
    assert np.array_equal(Decoder(GOLDEN_IEBIN / "tiny-mistral", ctx=8).logits(ids),
                          Decoder(tmp_path / "back", ctx=8).logits(ids))


def test_outputs_are_never_replaced_unasked(tmp_path):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"mine")
    assert_one_line_error(_export(GOLDEN_IEBIN / "tiny-llama", out), "exists", "--overwrite")
    assert out.read_bytes() == b"mine"
    assert _export(GOLDEN_IEBIN / "tiny-llama", out, "--overwrite").returncode == 0
    assert out.read_bytes()[:4] == b"GGUF"
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    assert_one_line_error(_export(GOLDEN_IEBIN / "tiny-llama", fifo, "--overwrite"), "not a regular file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.gguf", "m.gguf"]


@pytest.mark.parametrize("name", ["tiny-mixtral", "tiny-gpt-oss"])
def test_a_split_export_is_the_export_in_gguf_splits_files(tmp_path, models, name):
    """--split-max-tensors N: files named and keyed as llama.cpp's gguf-split
    writes them (gguf's own reader: the first holds every key-value of the
    unsplit export, the others only split.*; each split.no / split.count /
    split.tensors.count), holding the unsplit export's tensors in its order,
    byte for byte, at most N a file; imported from the first file, the same
    artifact as the unsplit export's."""
    whole = tmp_path / "whole.gguf"
    assert _export(models[name], whole).returncode == 0
    res = _export(models[name], tmp_path / "s.gguf", "--split-max-tensors", "7")
    assert res.returncode == 0, res.stderr
    ref_kv, ref_t = _reader_kv(whole), list(_reader_tensors(whole).values())
    files = sorted(tmp_path.glob("s-*-of-*.gguf"))
    n = -(-len(ref_t) // 7)
    assert [p.name for p in files] == [f"s-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    assert "(the first of" in res.stderr and str(files[0]) in res.stderr
    got = []
    for i, p in enumerate(files):
        kv, tensors = _reader_kv(p), list(_reader_tensors(p).values())
        split = {"split.no": i, "split.count": n, "split.tensors.count": len(ref_t)}
        assert kv == ({**ref_kv, **split} if i == 0 else {"general.architecture": ref_kv["general.architecture"],
                                                            **split}), p.name
        assert 1 <= len(tensors) <= 7
        got += tensors
    assert [(t.name, t.tensor_type, list(t.shape)) for t in got] == [(t.name, t.tensor_type, list(t.shape))
                                                                       for t in ref_t]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(got, ref_t))
    for label, src in (("whole", whole), ("split", files[0])):
        assert _import(src, tmp_path / label).returncode == 0
    assert (tmp_path / "whole" / "model.ie.bin").read_bytes() == (tmp_path / "split" / "model.ie.bin").read_bytes()


def test_split_max_size_and_what_a_split_will_not_replace(tmp_path):
    """--split-max-size 20K: no file holds more tensor bytes than that unless it
    holds one tensor; a limit the model stays under writes one file under its own
    name, unsplit; a file of the split already there is refused, and nothing is
    written, until --overwrite; a size that is not one is a usage error."""
    src = GOLDEN_IEBIN / "tiny-llama"
    assert _export(src, tmp_path / "m.gguf", "--split-max-size", "20K").returncode == 0
    files = sorted(tmp_path.glob("m-*-of-*.gguf"))
    assert len(files) > 3
    for p in files:
        sizes = [int(t.n_bytes) for t in _reader_tensors(p).values()]
        assert sum(sizes) <= 20_000 or len(sizes) == 1, (p.name, sizes)
    assert _export(src, tmp_path / "one.gguf", "--split-max-tensors", "1000").returncode == 0
    assert "split.count" not in _reader_kv(tmp_path / "one.gguf")
    assert not list(tmp_path.glob("one-*"))
    (tmp_path / "t").mkdir()
    taken = tmp_path / "t" / "m-00002-of-00003.gguf"
    taken.write_bytes(b"mine")
    assert_one_line_error(_export(src, tmp_path / "t" / "m.gguf", "--split-max-tensors", "8"), str(taken), "--overwrite")
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [taken.name] and taken.read_bytes() == b"mine"
    assert _export(src, tmp_path / "t" / "m.gguf", "--split-max-tensors", "8", "--overwrite").returncode == 0
    assert taken.read_bytes()[:4] == b"GGUF" and len(list((tmp_path / "t").iterdir())) == 3
    for bad in ("0", "12X", "-5M", "G"):
        res = _export(src, tmp_path / "x.gguf", "--split-max-size", bad)
        assert res.returncode == 2 and "--split-max-size" in res.stderr, (bad, res.stderr)


def test_more_files_than_gguf_split_can_name_is_refused(tmp_path, monkeypatch):
    """Five digits name at most 99999 files (llama.cpp's gguf-split); a split past that is one line, nothing
    written (here with the limit lowered to 2, the tiny model in 3 files)."""
    from iekit.convert import iebin_to_gguf
    from iekit.formats.errors import IEError

    monkeypatch.setattr(iebin_to_gguf, "MAX_SHARDS", 2)
    with pytest.raises(IEError, match="3 files; gguf-split's names count to 2"):
        iebin_to_gguf.export_gguf(GOLDEN_IEBIN / "tiny-llama", tmp_path / "m.gguf", split_max_tensors=8)
    assert not list(tmp_path.iterdir())
