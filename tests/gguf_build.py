"""GGUF files for the import tests, written the way llama.cpp's converter
writes them, with the ``gguf`` package's own writer (the independent side).

``gguf_from_hf`` turns a golden Hugging Face checkpoint into a GGUF file as
``convert_hf_to_gguf.py`` would: llama.cpp names, q/k rows interleaved for
Llama-family RoPE (its ``LlamaModel.permute``, restated here from its
definition, not from iekit's inverse), the hyperparameters as ``{arch}.*``
key-values and the byte-level BPE vocabulary as ``tokenizer.ggml.*``;
selected tensors quantized with ``gguf.quants.quantize``.

``raw_gguf`` writes any header at all, valid or not, for the hostile-input
tests: the format as the GGUF spec describes it, with struct.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

LLAMA_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    stem, _, suffix = hf.rpartition(".")
    if stem in top:
        return f"{top[stem]}.{suffix}"
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf)
    return f"blk.{m.group(1)}.{LLAMA_NAMES[m.group(2)]}.{m.group(3)}"


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf ``LlamaModel.permute``: each head's
    rows (2, d/2) -> (d/2, 2)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def hf_tensors(hf_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint as float32 (bf16 widened exactly: numpy has no bfloat16)."""
    out = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        raw = f.read_bytes()
        n = struct.unpack_from("<Q", raw)[0]
        header = json.loads(raw[8:8 + n])
        for name, t in header.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            data = raw[8 + n + a:8 + n + b]
            if t["dtype"] == "BF16":
                w = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                w = np.frombuffer(data, {"F32": np.float32, "F16": np.float16}[t["dtype"]]).astype(np.float32)
            out[name] = w.reshape(t["shape"])
    return out


def tokenizer_fields(tok_json: dict) -> dict:
    """What convert_hf_to_gguf's ``get_vocab_base`` stores for a byte-level BPE tokenizer."""
    vocab = tok_json["model"]["vocab"]
    added = {t["id"]: t for t in tok_json["added_tokens"]}
    size = max(max(vocab.values()), max(added, default=-1)) + 1
    rev = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(size):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(3 if added[i]["special"] else 4)
        else:
            tokens.append(rev.get(i, f"[PAD{i}]"))
            types.append(1 if i in rev else 5)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    return {"tokens": tokens, "types": types, "merges": merges}


def gguf_from_hf(hf_dir: Path, out: Path, *, quant: dict[str, str] | None = None, pre: str | None = "gpt-2",
                 arch: str | None = None, extra_kv: dict | None = None,
                 tokenizer: dict | str | None = None, spm=None, split_max_tensors: int = 0,
                 extra_tensors: dict[str, np.ndarray] | None = None) -> Path:
    """Write ``out`` from the checkpoint ``hf_dir``; ``quant`` maps a regex on
    HF names to a GGMLQuantizationType name (first match wins); ``tokenizer``
    (a tokenizer.json) replaces the checkpoint's, or is ``"none"``: no
    vocabulary, only ``{arch}.vocab_size`` (llama.cpp's "none" tokenizer, for
    a synthetic model that runs on token ids); ``spm`` (a
    SentencePieceProcessor) stores a SentencePiece vocabulary instead, as
    convert_hf_to_gguf's ``_set_vocab_sentencepiece`` does. ``split_max_tensors``:
    split into files of that many tensors, as convert_hf_to_gguf's
    ``--split-max-tensors`` does (gguf-py's writer names them
    ``STEM-00001-of-0000N.gguf``); the first file's path is returned.
    ``arch="phi3"``: a Llama checkpoint written as Phi-3 is (q, k, v rows in
    one ``attn_qkv``, gate and up rows in one ``ffn_up``, no q/k reordering).
    ``extra_tensors``: more tensors by GGUF name, as they are."""
    import gguf
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    cfg = json.loads((hf_dir / "config.json").read_text())
    model_type = cfg["model_type"]
    arch = arch or {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}[model_type]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(out), arch, split_max_tensors=split_max_tensors)
    theta = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]
    kvs = {f"{arch}.context_length": ("uint32", cfg["max_position_embeddings"]),
           f"{arch}.embedding_length": ("uint32", cfg["hidden_size"]),
           f"{arch}.block_count": ("uint32", cfg["num_hidden_layers"]),
           f"{arch}.feed_forward_length": ("uint32", cfg["intermediate_size"]),
           f"{arch}.attention.head_count": ("uint32", heads),
           f"{arch}.attention.head_count_kv": ("uint32", kv_heads),
           f"{arch}.rope.freq_base": ("float32", theta),
           f"{arch}.attention.layer_norm_rms_epsilon": ("float32", cfg["rms_norm_eps"]),
           "general.file_type": ("uint32", 0),
           "tokenizer.ggml.model": ("string", "gpt2"), "tokenizer.ggml.pre": ("string", pre),
           "tokenizer.ggml.bos_token_id": ("uint32", cfg["bos_token_id"]),
           "tokenizer.ggml.eos_token_id": ("uint32", cfg["eos_token_id"])}
    kvs.update(extra_kv or {})
    if pre is None:  # a file converted before llama.cpp named its splits
        del kvs["tokenizer.ggml.pre"]
    if tokenizer == "none":
        for k in ("tokenizer.ggml.pre", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
            del kvs[k]
        kvs["tokenizer.ggml.model"] = ("string", "none")
        kvs[f"{arch}.vocab_size"] = ("uint32", cfg["vocab_size"])
    if spm is not None:
        kvs["tokenizer.ggml.model"] = ("string", "llama")
        del kvs["tokenizer.ggml.pre"]
    for k, (typ, v) in kvs.items():
        getattr(w, f"add_{typ}")(k, v)
    if spm is not None:
        ids = range(spm.get_piece_size())
        w.add_token_list([spm.id_to_piece(i) for i in ids])
        w.add_token_scores([spm.get_score(i) for i in ids])
        w.add_token_types([2 if spm.is_unknown(i) else 3 if spm.is_control(i) else 5 if spm.is_unused(i)
                           else 6 if spm.is_byte(i) else 1 for i in ids])
    elif tokenizer != "none":
        tf = tokenizer_fields(tokenizer or json.loads((hf_dir / "tokenizer.json").read_text()))
        w.add_token_list(tf["tokens"])
        w.add_token_types(tf["types"])
        w.add_token_merges(tf["merges"])
    tensors = hf_tensors(hf_dir)
    if arch == "phi3":
        for k in [k for k in tensors if k.endswith((".q_proj.weight", ".gate_proj.weight"))]:
            if ".q_proj." in k:
                parts = [tensors.pop(k.replace("q_proj", p)) for p in ("q_proj", "k_proj", "v_proj")]
                tensors[k.replace("q_proj", "qkv_proj")] = np.concatenate(parts)
            else:
                parts = [tensors.pop(k.replace("gate_proj", p)) for p in ("gate_proj", "up_proj")]
                tensors[k.replace("gate_proj", "gate_up_proj")] = np.concatenate(parts)
    for hf, t in tensors.items():
        name = gguf_name(hf)
        if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
            t = llama_permute(t, heads if ".attn_q." in name else kv_heads)
        qtype = next((q for pat, q in (quant or {}).items() if re.search(pat, hf)), None)
        if qtype is None or t.ndim != 2:
            w.add_tensor(name, np.ascontiguousarray(t))
        elif qtype == "F16":
            w.add_tensor(name, t.astype(np.float16))
        elif qtype in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XXS", "IQ2_XS",
                       "IQ2_S", "IQ1_S", "IQ1_M"):
            # gguf-py cannot quantize these; ours are llama.cpp's bytes (tests/test_kquant.py, test_iq4.py;
            # the IQ2/IQ3 codebooks: our own searches, in llama.cpp's layouts, which gguf-py reads: tests/test_iq3s.py)
            from iekit.formats.quant import SCHEMES, QuantParams

            s = qtype.lower()
            raw = SCHEMES[s].quantize(np.ascontiguousarray(t, np.float32), QuantParams(s))
            w.add_tensor(name, raw.reshape(t.shape[0], -1), raw_dtype=GGMLQuantizationType[qtype])
        else:
            q = GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(np.ascontiguousarray(t), q), raw_dtype=q)
    for name, t in (extra_tensors or {}).items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return w.format_shard_names(out)[0]


# -- raw writer for hostile files ---------------------------------------------

_VT = {"u8": (0, "B"), "u32": (4, "I"), "i32": (5, "i"), "f32": (6, "f"), "bool": (7, "?"), "u64": (10, "Q")}


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_bytes(key: str, typ: str, value) -> bytes:
    if typ == "str":
        return _str(key) + struct.pack("<I", 8) + _str(value)
    if typ == "strs":
        return _str(key) + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_str(v) for v in value)
    if typ == "i32s":
        return _str(key) + struct.pack("<IIQ", 9, 5, len(value)) + struct.pack(f"<{len(value)}i", *value)
    code, fmt = _VT[typ]
    return _str(key) + struct.pack("<I" + fmt, code, value)


def raw_gguf(path: Path, kvs: list[bytes], tensors: list[tuple[str, list[int], int, int]], data: bytes,
             *, magic: bytes = b"GGUF", version: int = 3, n_kv: int | None = None, n_tensors: int | None = None,
             alignment: int = 32) -> Path:
    """``tensors``: (name, ggml dims (fastest first), ggml type id, offset)."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs)
    for name, dims, typ, off in tensors:
        head += _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", typ, off)
    head += b"\0" * (-len(head) % alignment)
    path.write_bytes(head + data)
    return path


def rewrite_gguf(src: Path, dst: Path, *, drop: set[str] = frozenset(), kv: dict | None = None,
                 tensors: dict | None = None, arch: str | None = None, keys: dict[str, str] | None = None,
                 names: dict[str, str] | None = None) -> Path:
    """``src`` written again by gguf-py's writer with the key-values in
    ``drop`` and the tensors mapped to None in ``tensors`` left out,
    key-values ``kv`` added (a bool as bool, an int as uint32, a float as
    float32, a string as a string, a list as an array), and tensors
    ``tensors`` (name -> array, written as its numpy type, or (bytes, ggml
    type) for a block type's) added or replaced: one change at a time to a valid file, for the import's
    refusals. ``arch`` names another architecture; ``keys`` renames
    key-values (whole names) and ``names`` the parts of tensor names (each
    first occurrence), as another converter would have written the file."""
    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch or r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop:
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value((keys or {}).get(k, k), f.contents(), f.types[0], sub_type=sub)
    for k, v in (kv or {}).items():
        if isinstance(v, list):
            w.add_array(k, v)
            continue
        kind = {bool: gguf.GGUFValueType.BOOL, int: gguf.GGUFValueType.UINT32,
                str: gguf.GGUFValueType.STRING}.get(type(v), gguf.GGUFValueType.FLOAT32)
        w.add_key_value(k, v, kind)
    tensors = dict(tensors or {})
    for t in r.tensors:
        if t.name not in tensors:
            name = t.name
            for a, b in (names or {}).items():
                name = name.replace(a, b, 1)
            w.add_tensor(name, np.asarray(t.data), raw_dtype=t.tensor_type)  # (shape: from the data's)
        elif isinstance(tensors[t.name], tuple):  # (bytes [rows, row bytes], its ggml type): a block type's
            data, qtype = tensors.pop(t.name)
            w.add_tensor(t.name, data, raw_dtype=qtype)
        elif tensors[t.name] is not None:
            w.add_tensor(t.name, tensors.pop(t.name))
    for name, a in tensors.items():
        if a is not None:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
