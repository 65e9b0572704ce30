"""``ieconv``: the conversion command line (click + rich)."""

from __future__ import annotations

import json
import math
import os
import sys
from contextlib import ExitStack
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from iekit.cli.support import (FiniteFloat, human_bytes, run_cli, split_max_size_option, stdout_console,
                               threads_option)
from iekit.formats import (checksums, expert_stacks, fingerprints, gptq, hf_checkpoint, iebin, kl_probes,
                           weight_types)
from iekit.formats.atomic import check_new_file, write_file_atomic
from iekit.formats.casting import decode_f32
from iekit.formats.errors import IEError
from iekit.formats.fileio import read_small
from iekit.formats.gguf_file import is_gguf_file, open_gguf
from iekit.formats.jsonio import dumps_canonical, loads_strict
from iekit.formats.paths import real_path
from iekit.formats.policy_measurements import Measurements
from iekit.formats.quant import QuantError
from iekit.formats.workers import one_blas_thread
from iekit.formats.q4_manifest import (EMBED_NAMES, HEAD_NAMES, KEEP, bytes_per_token, default_manifest, is_tied,
                                       load_manifest, manifest_from, plan, step_reads)

from iekit.formats.bsr import is_bsr_path

from . import bpw_policy
from .bsr_cli import block_sparse_cmd, inspect_bsr, validate_bsr
from .dedup_cli import COMMANDS as DEDUP_COMMANDS
from .dedup_cli import inspect_dedup_index, is_dedup_index_path, validate_dedup_index
from .gptq_cli import MEMORY_BUDGET, calibration, calibration_options, gptq_cmd
from .hf_hub import from_hub
from .conversion_output import convert_progress, err, report_conversion
from .artifact_out import CAST_TARGETS, natural_key
from .hf_to_iebin import convert, load_importance
from .gguf_to_hf import convert_gguf_to_hf
from .gguf_to_iebin import build_config as build_gguf_config
from .gguf_to_iebin import GGUFRows, convert_gguf, open_model
from .gguf_to_iebin import tensor_shapes as gguf_tensor_shapes
from .gguf_names import joint_types
from .iebin_legacy import is_schema2, upgrade_legacy
from .iebin_to_gguf import REQUANTIZE_TARGETS, export_gguf
from .imatrix_cli import imatrix_cmd, inspect_imatrix, is_imatrix_path, validate_imatrix
from .kl_probes_cli import kl_probes_cmd
from .quantize_cli import quantize_cmd
from .rotate_cli import rotate_cmd
from .text_model import extract_text_model

QUANTIZED = weight_types.manifest_schemes()

out = stdout_console()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="iekit", prog_name="ieconv")
def cli() -> None:
    """Convert Hugging Face checkpoints into iekit artifacts and check them.

    \b
    Typical use:
      ieconv hf-to-iebin --hf-dir path/to/hf_model --out-dir out/
      ieconv validate --deep out/
      ieconv inspect out/

    Errors are one line on stderr with a non-zero exit (1 bad input, 2 bad
    usage); set IE_DEBUG=1 to see a traceback for internal errors.
    """


# The converters' --imatrix (hf-to-iebin, gguf-to-iebin), and what both require of it and --force.
IMATRIX_OPTION = click.option(
    "--imatrix", type=click.Path(path_type=Path, dir_okay=False),
    help="Importance matrix (`ieconv imatrix`, or llama.cpp's imatrix .gguf / legacy .dat): every quantized matrix's scale/min "
         "search minimises its error weighted by it (default: the manifest's \"imatrix\"). q4_0/q4_1/q4_k "
         "without one stay byte-identical to llama.cpp.")


# The digest every writer of model.ie.json records (formats/checksums.py).
CHECKSUM_OPTION = click.option(
    "--checksum", type=click.Choice(checksums.NAMES), default=checksums.DEFAULT, show_default=True,
    help="Digest recorded for every payload, source and auxiliary file: xxh3_128 (xxhash, ~25 GB/s) catches "
         "corruption as surely as sha256 at a fraction of the time; sha256 if you want to compare with sha256sum "
         "or need a cryptographic hash. Readers accept both.")


# The converters' --allow-nonfinite (hf-to-iebin, gguf-to-iebin, gguf-to-hf): validate --deep takes the same flag.
ALLOW_NONFINITE_OPTION = click.option(
    "--allow-nonfinite", is_flag=True,
    help="Keep float tensors that hold NaN or ±inf (without it they are refused, naming the tensor and element: "
         "such a weight turns every logit into NaN). An IEBIN artifact then validates only with `validate --deep "
         "--allow-nonfinite`. A non-finite quantization scale is always refused.")


# A multimodal GGUF (Ollama's gemma3, mistral3, llama4 blobs keep the vision tower beside the language model):
# gguf-to-iebin, gguf-to-hf and q4-manifest --gguf read its language model alone only when asked.
TEXT_ONLY_OPTION = click.option(
    "--text-only", is_flag=True,
    help="A multimodal file (Ollama's blobs of Gemma 3, Mistral Small 3.x, Llama 4 hold the vision tower, "
         "projector or audio encoder beside the language model, where llama.cpp keeps them in a separate mmproj "
         "file): import the language model alone, which is all the tools run; the artifact records what was "
         "left out. Without it such a file is refused.")


def check_q4_map_flags(q4_map, force: bool, imatrix) -> None:
    if (force or imatrix) and not q4_map:
        raise click.UsageError(f"{'--force' if force else '--imatrix'} only applies with --q4-map")


@cli.command("hf-to-iebin")
@click.option("--hf-dir", type=click.Path(path_type=Path), help="Local HF model directory (config.json + safetensors).")
@click.option("--repo-id", help="HF hub repo id, resolved through the local HF cache first (offline when cached).")
@click.option("--revision", help="Branch, tag or commit for --repo-id (default: main).")
@click.option("--out-dir", required=True, type=click.Path(path_type=Path), help="Output directory for model.ie.json + model.ie.bin.")
@click.option("--dtype", type=click.Choice(CAST_TARGETS), help="Cast floating tensors to this dtype (bf16: round to nearest even, like torch). Default: keep bytes exactly.")
@click.option("--q4-map", type=click.Path(path_type=Path, dir_okay=False),
              help=f"q4_manifest.json selecting tensors to quantize ({', '.join(QUANTIZED)}); see `ieconv q4-manifest`.")
@click.option("--force", is_flag=True, help="With --q4-map: also quantize embeddings/norms the manifest selects.")
@IMATRIX_OPTION
@CHECKSUM_OPTION
@ALLOW_NONFINITE_OPTION
@click.option("--overwrite", is_flag=True,
              help="Replace the artifact in --out-dir as a whole: its files are replaced, and files of a previous "
                   "artifact this one does not write (model.ie.*, config/tokenizer files, dedup links) are removed "
                   "and listed. Other files are never touched. Without it, any such file already there is an error.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def hf_to_iebin_cmd(hf_dir, repo_id, revision, out_dir, dtype, q4_map, force, imatrix, checksum, allow_nonfinite,
                    overwrite, quiet):
    """Convert an HF safetensors checkpoint to IEBIN schema2.

    Reads model.safetensors or sharded model-XXXXX-of-YYYYY.safetensors with
    model.safetensors.index.json, streams tensor by tensor (memory stays
    bounded whatever the model size), and writes atomically. Without --dtype
    every tensor keeps its HF name and exact bytes, except gpt-oss's MXFP4
    pairs (config quant_method "mxfp4"): each P_blocks + P_scales becomes
    one mxfp4 tensor P [experts, rows, cols], repacked, not dequantized
    (convert/hf_mxfp4.py); an FP8 checkpoint's weights (quant_method "fp8":
    e4m3 codes and their block or matrix scales) are read dequantized and
    written in the checkpoint's dtype (bf16) unless --dtype says, or
    quantized per --q4-map, and its config loses the quantization_config
    (formats/hf_fp8.py); an NVFP4 checkpoint's (Model Optimizer's
    quant_method "modelopt", quant_algo "NVFP4", or llm-compressor's
    nvfp4-pack-quantized: e2m1 codes, e4m3 scales per 16, a float32 scale
    per matrix) become nvfp4 tensors, repacked, not
    dequantized, and its config loses the quantization_config too
    (formats/hf_nvfp4.py). config.json,
    generation_config.json and tokenizer files are copied alongside (each
    must be a regular file inside the checkpoint). A float tensor holding
    NaN or ±inf is refused, naming its shard and element (--allow-nonfinite
    keeps it). Nothing already in --out-dir is replaced without --overwrite.
    """
    if (hf_dir is None) == (repo_id is None):
        raise click.UsageError("give exactly one of --hf-dir or --repo-id")
    if revision and not repo_id:
        raise click.UsageError("--revision only applies to --repo-id")
    check_q4_map_flags(q4_map, force, imatrix)
    manifest = load_manifest(q4_map) if q4_map else None
    src = hf_checkpoint.from_dir(hf_dir) if hf_dir is not None else from_hub(repo_id, revision)
    with convert_progress(quiet) as prog:
        res = convert(src, out_dir, dtype=dtype, overwrite=overwrite, progress=prog, manifest=manifest, force=force,
                      imatrix=imatrix, checksum=checksum, allow_nonfinite=allow_nonfinite)
    report_conversion(res)
    mbps = res.bytes_in / 1e6 / res.seconds if res.seconds > 0 else float("inf")
    err.print(f"converted {res.tensors} tensors ({human_bytes(res.bytes_in)} in, {human_bytes(res.bytes_out)} "
              f"model.ie.bin{f', {res.cast_tensors} cast to {dtype}' if dtype else ''}"
              f"{f', {res.quantized_tensors} quantized' if manifest else ''}"
              f"{f' ({res.weighted_tensors} importance-weighted)' if res.weighted_tensors else ''}"
              f"{f', {res.kept_blocks} MXFP4 kept as mxfp4' if res.kept_blocks else ''}"
              f"{f', {res.fp8_tensors} FP8 dequantized' if res.fp8_tensors else ''}) in {res.seconds:.2f} s "
              f"({mbps:.0f} MB/s) -> {res.out_dir}", markup=False)


@cli.command("gguf-to-iebin")
@click.option("--gguf", "gguf_path", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="The llama.cpp GGUF file (any of the architectures listed below; a split model's first part).")
@click.option("--out-dir", required=True, type=click.Path(path_type=Path), help="Output directory for model.ie.json + model.ie.bin.")
@click.option("--dtype", type=click.Choice(CAST_TARGETS),
              help="Float dtype for tensors that are dequantized (default f32), and to cast F32/F16/BF16 tensors to "
                   "(default: keep them).")
@click.option("--dequantize", is_flag=True,
              help="Keep no quantized block: every tensor becomes a float of --dtype (the file's float reference, "
                   "for `ierun eval --ref-dir`).")
@click.option("--q4-map", type=click.Path(path_type=Path, dir_okay=False),
              help="q4_manifest.json: the tensors it selects are quantized again, from their dequantized values "
                   "(see `ieconv q4-manifest --gguf`).")
@click.option("--force", is_flag=True, help="With --q4-map: also quantize embeddings/norms the manifest selects.")
@IMATRIX_OPTION
@CHECKSUM_OPTION
@ALLOW_NONFINITE_OPTION
@TEXT_ONLY_OPTION
@click.option("--overwrite", is_flag=True, help="Replace the artifact in --out-dir as a whole (as hf-to-iebin --overwrite).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def gguf_to_iebin_cmd(gguf_path, out_dir, dtype, dequantize, q4_map, force, imatrix, checksum, allow_nonfinite,
                      text_only, overwrite, quiet):
    """Import a llama.cpp GGUF model as IEBIN schema2, keeping its quantized blocks.

    \b
    - tensors get their Hugging Face names (blk.N.attn_q.weight ->
      model.layers.N.self_attn.q_proj.weight) and llama.cpp's q/k row
      interleaving is undone: the artifact is what hf-to-iebin makes of
      the original checkpoint;
    - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS,
      IQ2_XS, IQ2_S, IQ1_S, IQ1_M, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, MXFP4,
      NVFP4, Q1_0 blocks are copied byte for byte (their scales checked finite;
      an NVFP4 weight's .scale and .input_scale tensors go with it); other
      quantized types (TQ1_0, TQ2_0, ...) are dequantized with gguf.quants
      to --dtype;
    - architectures llama (Llama, Mistral, Mixtral), qwen2, qwen3, qwen3moe,
      gpt-oss, gemma (Gemma 1, CodeGemma), gemma2 and gemma3 (norms stored
      as 1 + w taken back to Gemma's w),
      and phi3 (Phi-3, Phi-3.5, Phi-4, Phi-4-mini: its fused q/k/v and
      gate/up split, partial RoPE, LongRoPE's rope_factors_long/_short),
      smollm3 (every 4th layer without RoPE), arcee (AFM-4.5B: its MLP
      up and down alone), stablelm (StableLM 2 1.6B, StableLM 3B, Stable
      Code 3B: LayerNorms with biases), starcoder2 (biases everywhere, its
      MLP without a gate), nemotron (Nemotron-Mini, Minitron: LayerNorm1P
      stored as 1 + w), phi2 (Phi-2, Phi-1.5: a parallel layer, the head's
      bias), granite (its multipliers), granite_swa (Granite SWASH:
      sinks, sliding layers by its pattern, rope_pattern's layers without
      RoPE; with experts GraniteMoeSWA),
      olmo (OLMo 1: no norm tensors, attention.clamp_kqv as clip_qkv),
      olmo2 (the blocks' output norms alone; with a window, OLMo 3),
      mistral3 (Ministral 3, Devstral Small 2, Mistral Small 3.x), exaone4,
      olmoe, qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B: a shared expert beside
      the routed ones), glm4moe (GLM-4.5, 4.5-Air, 4.6; its multi-token
      prediction layer carried, unread), minimax-m2 (MiniMax-M2, M2.1),
      deepseek2 (DeepSeek-V3, R1, V3.1, Kimi K2 with sigmoid gating;
      GLM-4.7-Flash where the file keeps its MTP layer; DeepSeek-V2 with
      softmax: latent attention, attn_k_b and attn_v_b joined into
      kv_b_proj), mistral4 (Mistral Small 4: the same attention,
      ffn_gate_up_exps read as the experts' gate_up_proj; no
      attention.temperature_scale, as llama.cpp's converter writes none:
      run without the temperature, as llama.cpp runs it), llama4 (Llama 4 Scout, Maverick: each expert's
      ffn_gate_exps and ffn_up_exps joined into gate_up_proj's halves),
      ernie4_5 and ernie4_5-moe (ERNIE 4.5), qwen35 and qwen35moe (Qwen3.5:
      its gated DeltaNet's value heads kept in llama.cpp's order, ssm_a back
      as A_log, its MTP block beside the model as mtp.*), qwen3next
      (Qwen3-Next, Qwen3-Coder-Next: as qwen35moe, its value heads in
      Hugging Face's order, ssm_ba and an older file's ssm_in read as
      the projections they fuse), seed_oss, apertus (Apertus 8B, 70B:
      each layer's xIELU parameters made tensors again from the
      xielu.* keys), afmoe (Arcee's Trinity: route_norm and mup_enabled
      true, as llama.cpp runs it), dots1 (dots.llm1: sigmoid gating
      required, as llama.cpp's graph has no default), Solar Open (a
      glm4moe file without feed_forward_length), Youtu-LLM (a deepseek2
      file without experts), jais2 (Jais 2), exaone-moe (K-EXAONE: its
      MTP layers back beside the model as mtp.*), glm4, cohere2 and
      command-r,
      hunyuan-dense and hunyuan-moe (Hunyuan 0.5B-7B, Hunyuan-MT,
      Hunyuan-A13B: the NTK-alpha base read back as the Hub's alpha),
      hy_v3 (Hy3: its dense layers where a block has no router, its MTP
      layers carried unread under the Hub's names),
      exaone (EXAONE 3.5, as the Llama it is), qwen2vl (Qwen2-VL's and
      Qwen2.5-VL's language model, as the Qwen2 it is), qwen3vl and qwen3vlmoe
      (Qwen3-VL's language model, as the Qwen3 or Qwen3-MoE it is: text
      turns its MRoPE as one RoPE), lfm2 and lfm2moe (LFM2, LFM2.5,
      LFM2-8B-A1B: its short convolutions by attention.head_count_kv's
      zeros), granitehybrid (Granite 4.0 H: its Mamba2 layers likewise,
      ssm_a back as A_log, ffn_gate_exps and ffn_up_exps joined into
      input_linear's halves; RoPE where rope.scaling.finetuned is true),
      granitemoe (Granite 3.x MoE: the same experts; GraniteMoeShared
      where expert_shared_feed_forward_length is positive), nemotron_h
      and nemotron_h_moe (Nemotron-H, Nemotron Nano 2, Nemotron 3 Nano:
      its blocks by head_count_kv and feed_forward_length, one per block),
      mamba2 (Mamba-Codestral: Mamba2 in every layer, no attention),
      falcon-h1 (Falcon-H1: Mamba2 beside attention in every layer; the
      muP multipliers the converter multiplied into the matrices are 1),
      mamba (Mamba 1; Falcon Mamba where ssm.dt_b_c_rms is true);
      files the converter wrote with --fuse-qkv or
      --fuse-gate-up-exps read as the separate tensors;
    - config.json is rebuilt from the GGUF metadata and tokenizer.json from
      its vocabulary (byte-level BPE under any split llama.cpp names for
      these models, gpt-4o, tekken, deepseek-* and llama-bpe among them;
      SentencePiece BPE), tokenizing as llama.cpp does; a GGUF is known by
      its magic, so an Ollama blob (sha256-...) is taken as it is, and
      where Ollama's converter lays a model out otherwise (gpt-oss as
      gptoss, gemma3's RoPE keys, mistral3's YaRN keys) it is read as
      llama.cpp's file of it; a multimodal blob's vision (v.*), projector
      (mm.*) and audio (a.*) tensors are refused unless --text-only.

    \b
    Typical use:
      ieconv gguf-to-iebin --gguf m.gguf --out-dir m/               # blocks kept
      ieconv gguf-to-iebin --gguf m.gguf --out-dir m-f32/ --dequantize
      ieconv q4-manifest --gguf m.gguf -o q4.json
      ieconv gguf-to-iebin --gguf m.gguf --out-dir m-int4w/ --q4-map q4.json

    Anything it cannot carry over faithfully (another architecture, RoPE
    scaling, tokenizer kind or tensor type) is refused with one line and
    nothing is written. Streams and writes atomically, like hf-to-iebin.
    """
    check_q4_map_flags(q4_map, force, imatrix)
    manifest = load_manifest(q4_map) if q4_map else None
    with convert_progress(quiet) as prog:
        res = convert_gguf(gguf_path, out_dir, dtype=dtype, overwrite=overwrite, progress=prog,
                           dequantize_all=dequantize, manifest=manifest, force=force, imatrix=imatrix,
                           checksum=checksum, allow_nonfinite=allow_nonfinite, text_only=text_only)
    report_conversion(res)
    mbps = res.bytes_in / 1e6 / res.seconds if res.seconds > 0 else float("inf")
    parts = [f"{res.kept_blocks} with their blocks kept"] if res.kept_blocks else []
    parts += [f"{res.cast_tensors} dequantized or cast to floats"] if res.cast_tensors else []
    parts += [f"{res.quantized_tensors} quantized per {q4_map}"] if manifest else []
    parts += [f"{res.weighted_tensors} of them importance-weighted"] if res.weighted_tensors else []
    parts += [res.read_as] if res.read_as else []
    err.print(f"imported {res.tensors} tensors ({'; '.join(parts) or 'all kept as they are'}; "
              f"{human_bytes(res.bytes_out)} model.ie.bin) in {res.seconds:.2f} s ({mbps:.0f} MB/s) -> {res.out_dir}",
              markup=False)


@cli.command("gguf-to-hf")
@click.option("--gguf", "gguf_path", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="The llama.cpp GGUF file (any architecture gguf-to-iebin imports but gpt-oss).")
@click.option("--out-dir", required=True, type=click.Path(path_type=Path),
              help="Where the checkpoint is written (model.safetensors, config.json, tokenizer files).")
@click.option("--dtype", type=click.Choice(CAST_TARGETS),
              help="Dtype of dequantized tensors (default f32, in which a block's values are exact) and of "
                   "F32/F16/BF16 tensors (default: kept).")
@ALLOW_NONFINITE_OPTION
@TEXT_ONLY_OPTION
@click.option("--overwrite", is_flag=True, help="Replace the files of a previous checkpoint in --out-dir.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def gguf_to_hf_cmd(gguf_path, out_dir, dtype, allow_nonfinite, text_only, overwrite, quiet):
    """Write a GGUF as the Hugging Face checkpoint it came from, float.

    For the tools that read an HF checkpoint's float weights (rotate,
    kl-probes, gptq, q4-manifest --ref-dir) when the model is a GGUF:
    gguf-to-iebin's import (HF tensor names, llama.cpp's q/k row
    interleaving undone, config.json and tokenizer.json rebuilt from the
    metadata) as model.safetensors, every block type dequantized with
    gguf.quants. A quantized GGUF gives its quantized values, not the
    original's: rather start from an F16/BF16/F32 file. gpt-oss is
    refused (gguf-to-iebin imports it).

    \b
    Typical use:
      ieconv gguf-to-hf --gguf m-f16.gguf --out-dir m-hf
      ieconv rotate --hf-dir m-hf --out-dir m-rot
      ieconv hf-to-iebin --hf-dir m-rot --out-dir ref ; ieconv gptq --hf-dir m-rot --ref-dir ref ...
    """
    with convert_progress(quiet) as prog:
        res = convert_gguf_to_hf(gguf_path, out_dir, dtype=dtype, overwrite=overwrite, progress=prog,
                                 allow_nonfinite=allow_nonfinite, text_only=text_only)
    mbps = res.bytes_in / 1e6 / res.seconds if res.seconds > 0 else float("inf")
    err.print(f"wrote {res.tensors} tensors ({res.cast_tensors} dequantized or cast; "
              f"{res.read_as + '; ' if res.read_as else ''}{human_bytes(res.bytes_in)} "
              f"read, {human_bytes(res.bytes_out)} model.safetensors) in {res.seconds:.2f} s ({mbps:.0f} MB/s) "
              f"-> {res.out_dir}", markup=False)
    if res.removed:
        err.print(f"removed the previous checkpoint's {', '.join(res.removed)} from {res.out_dir} "
                  "(not part of the new one)", markup=False)


@cli.command("text-model")
@click.option("--hf-dir", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="The multimodal checkpoint (Gemma3ForConditionalGeneration: Gemma 3 4B, 12B, 27B; "
                   "Mistral3ForConditionalGeneration: Mistral Small 3.1/3.2, Magistral Small, Ministral 3, "
                   "Devstral Small 2; Llama4ForConditionalGeneration: Llama 4 Scout, Maverick; "
                   "Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration: Qwen3.5; "
                   "Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration: Qwen3-VL; "
                   "Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration: Qwen2.5-VL, Qwen2-VL; "
                   "Glm4vForConditionalGeneration: GLM-4.1V, GLM-4.6V-Flash; "
                   "Glm4vMoeForConditionalGeneration: GLM-4.5V, GLM-4.6V; "
                   "Lfm2VlForConditionalGeneration: LFM2-VL).")
@click.option("--out-dir", required=True, type=click.Path(path_type=Path),
              help="Where its language model is written (model.safetensors, config.json, tokenizer files).")
@click.option("--overwrite", is_flag=True, help="Replace the files of a previous checkpoint in --out-dir.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def text_model_cmd(hf_dir, out_dir, overwrite, quiet):
    """Write a multimodal checkpoint's language model as a checkpoint of its own.

    Gemma 3 4B, 12B and 27B, Mistral Small 3.1/3.2, Ministral 3, Llama 4,
    Qwen3.5, Qwen3-VL, Qwen2.5-VL, Qwen2-VL, GLM-4.5V, GLM-4.6V and LFM2-VL are published with a vision tower
    beside the text model; a text prompt runs through the text model alone, which this
    writes as the checkpoint transformers builds from it (Gemma3ForCausalLM,
    MistralForCausalLM, Ministral3ForCausalLM, Llama4ForCausalLM,
    Qwen3_5ForCausalLM or Qwen3_5MoeForCausalLM, by text_config.model_type;
    Qwen3.5's MTP tensors kept beside it, unread; Qwen3-VL's as
    Qwen3ForCausalLM or Qwen3MoeForCausalLM, its MRoPE one RoPE for text,
    its expert stacks one matrix per expert; Qwen2.5-VL's and Qwen2-VL's as
    Qwen2ForCausalLM, from the Hub's flat config too; GLM-4V's as Glm4ForCausalLM,
    GLM-4.5V's and GLM-4.6V's as Glm4MoeForCausalLM, LFM2-VL's as
    Lfm2ForCausalLM)
    (tensors copied byte for byte under the text model's names, text_config
    with transformers' defaults filled in as config.json, the tokenizer and
    generation files as they are). The vision tower and projector are left
    out: llama.cpp's converter likewise writes them to a separate mmproj
    file. Every tool then reads the result as a checkpoint of that class.

    \b
    Typical use:
      ieconv text-model --hf-dir gemma-3-4b-it --out-dir gemma-3-4b-it-text
      ieconv hf-to-iebin --hf-dir gemma-3-4b-it-text --out-dir g4/ --q4-map q4.json
    """
    with convert_progress(quiet) as prog:
        res = extract_text_model(hf_checkpoint.from_dir(hf_dir), out_dir, overwrite=overwrite, progress=prog)
    err.print(f"wrote the text model: {res.tensors} tensors ({human_bytes(res.bytes_out)} model.safetensors) "
              f"in {res.seconds:.2f} s -> {res.out_dir}", markup=False)
    if res.removed:
        err.print(f"removed the previous checkpoint's {', '.join(res.removed)} from {res.out_dir} "
                  "(not part of the new one)", markup=False)


@cli.command("iebin-to-gguf")
@click.option("--model-dir", required=True, type=click.Path(path_type=Path),
              help="The IEBIN model directory (model.ie.json + model.ie.bin) to export.")
@click.option("--out", "out_path", required=True, type=click.Path(path_type=Path, dir_okay=False),
              help="The GGUF file to write (llama.cpp, Ollama, LM Studio read it).")
@click.option("--requantize", type=click.Choice(REQUANTIZE_TARGETS),
              help="Quantize again, to this type, the tensors whose bytes no GGUF type holds (int4w with f32 "
                   "scales, iq4_xsh); the error it adds is reported per tensor. Without it they are refused.")
@click.option("--allow-full-attention", is_flag=True,
              help="A model with sliding-window layers whose llama.cpp architecture attends to every position "
                   "(Mistral, Mixtral, Qwen3, ...): export anyway, identical for contexts up to the window.")
@split_max_size_option("")
@click.option("--split-max-tensors", type=click.IntRange(min=1), help="Split into files of at most N tensors.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file (never a non-regular one).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def iebin_to_gguf_cmd(model_dir, out_path, requantize, allow_full_attention, split_max_size, split_max_tensors,
                      overwrite, quiet):
    """Export an IEBIN model as a GGUF v3 file that llama.cpp loads and runs.

    \b
    - architectures: llama, mistral and mixtral (as llama.cpp's "llama"),
      qwen2, qwen3, qwen3moe, gpt-oss, gemma, gemma2, gemma3, phi3, smollm3,
      arcee, stablelm, starcoder2, nemotron, phi2,
      granite, granite_swa (Granite SWASH, with or without experts:
      sinks, its window's pattern and rope_pattern; one RoPE base, as
      llama.cpp turns every layer by one), olmo (OLMo 1,
      its clip_qkv as attention.clamp_kqv), olmo2,
      mistral3, exaone4, olmoe, qwen2moe, glm4moe, minimax-m2,
      deepseek2 (DeepSeek-V3, V2 and GLM-4.7-Flash: kv_b_proj split into
      attn_k_b and attn_v_b; V3's MTP layer left out as llama.cpp's
      converter leaves it, GLM-4.7-Flash's kept), mistral4 (Mistral Small
      4: gate_up_proj's halves as ffn_gate_exps and ffn_up_exps, Llama 4's
      temperature as attention.temperature_scale and _length, which
      llama.cpp's graph applies), llama4 (Llama 4:
      gate_up_proj's halves as ffn_gate_exps and ffn_up_exps; llama.cpp
      fixes its chunks and temperature, so other values are refused),
      ernie4_5 and ernie4_5-moe (ERNIE 4.5; its MTP tensors left out),
      qwen35 and qwen35moe (Qwen3.5: A_log as ssm_a = -exp(A_log); its MTP
      block after the last, nextn_predict_layers), qwen3next
      (Qwen3-Next: in_proj_b and in_proj_a joined as ssm_ba, blocked by
      key head), lfm2 and lfm2moe (LFM2, LFM2.5, LFM2-8B-A1B:
      head_count_kv one per layer, 0 where it convolves), granitehybrid
      (Granite 4.0 H: likewise, 0 where it runs Mamba2; input_linear's
      halves as ffn_gate_exps and ffn_up_exps, the shared MLP as
      ffn_*_shexp), granitemoe (Granite 3.x MoE), nemotron_h and
      nemotron_h_moe (Nemotron-H: head_count_kv and feed_forward_length
      one per block), mamba2 (Mamba-Codestral), falcon-h1 (Falcon-H1: the
      muP multipliers multiplied into the matrices, as llama.cpp's
      converter stores them), mamba (Mamba, Falcon Mamba), seed_oss, apertus (each layer's xIELU parameters
      as the xielu.* keys), afmoe (every 4th layer full, mup_enabled),
      dots1 (a key head per query head, as llama.cpp loads it), Solar
      Open (as glm4moe, experts in every layer), Youtu-LLM (as deepseek2,
      every layer dense), jais2 (every bias, as llama.cpp loads it),
      exaone-moe (its MTP layers after the last), glm4, cohere2 and
      command-r,
      hunyuan-dense and hunyuan-moe (HunYuan: the NTK-alpha base
      stretched into rope.freq_base, 256k positions, as llama.cpp's
      converter writes them), hy_v3 (Hy3, its MTP layers after the last),
      with llama.cpp's tensor names and layouts (q/k rows
      re-interleaved, experts stacked as ffn_*_exps, Gemma's norms as 1 + w,
      Phi-3's q/k/v and GLM-4's and Phi-3's gate/up joined as attn_qkv and
      ffn_up, LongRoPE's factors as rope_factors_long/_short);
    - f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k
      iq1_s iq1_m iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq4_nl iq4_xs mxfp4 nvfp4 tensors are copied byte for byte
      (nvfp4's scales as .scale and .input_scale tensors); int4w with
      f16 scales is
      repacked losslessly (symmetric as Q4_0, affine as Q4_1);
    - every hyperparameter llama.cpp reads, the tokenizer (byte-level BPE),
      the chat template, general.* and the artifact's digest go in the
      metadata.

    \b
    Typical use:
      ieconv q4-manifest --hf-dir M -o mix.json --target-bpw 4.5 --gguf-types
      ieconv hf-to-iebin --hf-dir M --out-dir q/ --q4-map mix.json
      ieconv iebin-to-gguf --model-dir q/ --out q.gguf
      llama-cli -m q.gguf -p "The capital of France is"

    What llama.cpp cannot express (another architecture, a sliding window on
    a llama, mistral3 or phi3 model, SmolLM3 layers without RoPE other than
    every 4th, an EXAONE 4 window outside 64 layers, a gpt-oss SwiGLU limit
    other than 7, a Gemma query_pre_attn_scalar it would not derive, a
    Gemma 2 without its soft-caps, an untied head on Gemma 2 or Cohere, a
    type it does not have) is refused with one line and nothing is written. Streams tensor by
    tensor from the mapped model.ie.bin; writes atomically.
    """
    with convert_progress(quiet) as prog:
        res = export_gguf(model_dir, out_path, overwrite=overwrite, requantize=requantize,
                          allow_full_attention=allow_full_attention, progress=prog, split_max_size=split_max_size,
                          split_max_tensors=split_max_tensors)
    for w in res.warnings:
        err.print(f"warning: {w}", markup=False)
    for name, e in sorted(res.requantized.items()):
        err.print(f"requantized {name} to {requantize}: added error SQNR {e.sqnr_db:.1f} dB "
                  f"(Σ(w−ŵ)² {e.sq_error:.4g} of Σw² {e.sq_norm:.4g})", markup=False)
    parts = [f"{res.copied} copied byte for byte"] + ([f"{res.repacked} int4w repacked losslessly"] if res.repacked else [])
    if res.multiplied:  # (Falcon-H1's: llama.cpp's converter multiplies its muP multipliers into the matrices)
        parts[0] = (f"{res.copied} copied, {res.multiplied} of them times the model's muP multipliers as llama.cpp "
                    "stores them")
    parts += [f"{res.widened} vectors widened to F32"] if res.widened else []
    parts += [f"{len(res.requantized)} requantized"] if res.requantized else []
    files = f" (the first of {len(res.files)} files)" if len(res.files) > 1 else ""
    err.print(f"exported {res.tensors} tensors as GGUF v3, architecture {res.arch} ({'; '.join(parts)}; "
              f"{human_bytes(res.bytes_out)}) in {res.seconds:.2f} s -> {res.out_path}{files}", markup=False)


@cli.command("q4-manifest")
@click.option("--hf-dir", type=click.Path(path_type=Path), help="HF model directory to write the policy for.")
@click.option("--gguf", "gguf_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Or a GGUF file (for gguf-to-iebin --q4-map; tensors under their HF names).")
@click.option("-o", "--out", "out_path", required=True, type=click.Path(path_type=Path, dir_okay=False), help="Output q4_manifest.json.")
@click.option("--scheme", type=click.Choice(QUANTIZED), default="int4w", show_default=True)
@click.option("--group-size", type=click.Choice(["32", "64", "128", "row"]), default="64", show_default=True, help="int4w group size (elements per scale).")
@click.option("--affine", is_flag=True, help="int4w: per-group scale and minimum instead of symmetric scale.")
@click.option("--scale-dtype", type=click.Choice(["f16", "f32"]), default="f16", show_default=True, help="int4w: scale storage.")
@click.option("--head-scheme", type=click.Choice([KEEP, *QUANTIZED]),
              help="The output head (lm_head). Default: q8_0 when the embedding is tied to the head (it is then "
                   "read in full every token), else keep.")
@click.option("--embedding-scheme", type=click.Choice([KEEP, *QUANTIZED]), default=KEEP, show_default=True,
              help="The input embedding of an untied model (one row is read per token). A tied one follows "
                   "--head-scheme.")
@click.option("--quantize-head", is_flag=True, help="Shorthand for --head-scheme SCHEME (the main scheme).")
@click.option("--imatrix", type=click.Path(path_type=Path, dir_okay=False),
              help="Record this importance matrix in the manifest (checked against the checkpoint now): "
                   "hf-to-iebin / gguf-to-iebin then weight every quantized matrix's error by it.")
@click.option("--target-bpw", type=FiniteFloat(min=1.0), default=None,
              help="Instead of one scheme: per matrix, the mix of 2.625 to 8.5-bit schemes (q2_k, q3_k, iq3_s, int4w, "
                   "q4_0, q4_1, q4_k, iq4_xs, iq4_xsh, iq4_nl, q5_k, q5_0, q5_1, q6_k, q8_0) that meets this average bits per weight over the quantized matrices, spending bits "
                   "where the (importance-weighted, with --imatrix) error measured on their rows falls most. "
                   "Reads the float weights of --hf-dir, or the dequantized weights of --gguf.")
@click.option("--gguf-types", is_flag=True,
              help="With --target-bpw: only types llama.cpp also has (q4_0 ... q8_0, k-quants, iq3_s, iq4_nl, iq4_xs; no "
                   "int4w, no iq4_xsh), so `ieconv iebin-to-gguf` exports every tensor byte for byte; matrices "
                   "llama.cpp holds as one tensor (Phi-3's gate and up) get one type.")
@click.option("--exclude-types", default="", metavar="TYPE[,TYPE...]",
              help="With --target-bpw: leave these types out of the candidates. For example iq3_s when the "
                   "file will run on llama.cpp's CPU backend and decode speed comes first: there its IQ3_S "
                   "decodes 25-35% slower than Q3_K (our runtime runs both alike; docs/quality.md).")
@click.option("--kl-probes", "probes_paths", type=click.Path(path_type=Path, dir_okay=False), multiple=True,
              help="With --target-bpw: measured KL per group of matrices (ieconv kl-probes), which turns each "
                   "matrix's predicted error into KL, so bits go where they save the most KL. Give it again for "
                   "probes measured at other bits (e.g. --base q5_1 --probe iq4_nl and --base iq4_nl --probe "
                   "iq3_s): each prices the errors in its own range.")
@click.option("--ref-dir", type=click.Path(path_type=Path),
              help="With --target-bpw and --hf-dir, for a policy `ieconv gptq` converts: the checkpoint's float "
                   "IEBIN artifact, run over the calibration text (--text-file, as gptq's) for the input "
                   "covariances; each candidate's error is then measured as gptq will quantize it, error "
                   "compensation included, not as nearest rounding leaves it.")
@click.option("--measurements", type=click.Path(path_type=Path, dir_okay=False),
              help="With --target-bpw: keep every candidate's measured error in this file (JSON), after each matrix; "
                   "a later run of the same inputs (weights, reference and calibration text, or imatrix) takes them "
                   "instead of measuring again: after a Ctrl-C it goes on where it stopped, and at another budget "
                   "or with other --kl-probes it measures nothing (with --ref-dir at 8B: seconds instead of 45 "
                   "minutes). A file of other inputs is said so and replaced.")
@calibration_options
@threads_option("Threads (with --ref-dir).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
def q4_manifest_cmd(hf_dir, gguf_path, out_path, scheme, group_size, affine, scale_dtype, head_scheme,
                    embedding_scheme, quantize_head, imatrix, target_bpw, gguf_types, exclude_types, probes_paths, ref_dir,
                    measurements, text_file, ids_file, ctx, chunks, threads, overwrite):
    """Write the usual quantization policy for a checkpoint as q4_manifest.json.

    Attention and MLP projection matrices get --scheme (one rule per layer
    pattern); norms and biases are kept; the output head and the embedding
    get --head-scheme and --embedding-scheme (exact entries). A matrix
    --scheme cannot store gets a fallback (int4w whole-row groups; q4_k:
    int4w with a scale and min per 64, its 4.5 bits per weight; iq4_xs,
    iq4_xsh, q3_k, q2_k, iq3_s, iq3_xxs, iq2_xxs, iq2_xs, iq2_s, iq1_s, iq1_m:
    iq4_nl; q5_k, q6_k: q8_0). The bytes
    a decode step reads under the policy are printed. Expert stacks
    [experts, rows, cols] take --scheme where it stacks; int4w's planes span
    one matrix, so with int4w (and q4_k's int4w fallback) they get q4_0
    (q4_1 with --affine). Edit the result freely,
    then: ieconv hf-to-iebin --hf-dir M --q4-map FILE ... (or gguf-to-iebin
    --gguf F --q4-map FILE ...).
    """
    if (hf_dir is None) == (gguf_path is None):
        raise click.UsageError("give exactly one of --hf-dir or --gguf")
    if gguf_types and target_bpw is None:
        raise click.UsageError("--gguf-types restricts --target-bpw's candidates; give --target-bpw too")
    excluded = {t.strip() for t in exclude_types.split(",") if t.strip()}
    if excluded and target_bpw is None:
        raise click.UsageError("--exclude-types restricts --target-bpw's candidates; give --target-bpw too")
    unknown = sorted(excluded - {sel["scheme"] for sel in bpw_policy.LADDER})
    if unknown:
        raise click.UsageError(f"--exclude-types: {', '.join(unknown)} is not a --target-bpw candidate (candidates: "
                               f"{', '.join(dict.fromkeys(sel['scheme'] for sel in bpw_policy.LADDER))})")
    if probes_paths and target_bpw is None:
        raise click.UsageError("--kl-probes weights --target-bpw's choices; give --target-bpw too")
    if measurements is not None and target_bpw is None:
        raise click.UsageError("--measurements keeps --target-bpw's measured errors; give --target-bpw too")
    if measurements is not None and real_path(measurements) == real_path(out_path):
        raise click.UsageError("--measurements must be another file than the manifest (-o)")
    if ref_dir is not None and (target_bpw is None or hf_dir is None):
        raise click.UsageError("--ref-dir measures --target-bpw's candidates as ieconv gptq quantizes an --hf-dir "
                               "checkpoint; give --target-bpw and --hf-dir too")
    if ref_dir is None and (text_file or ids_file):
        raise click.UsageError("--text-file/--ids-file are the calibration text --ref-dir runs over; give --ref-dir too")
    if ref_dir is not None and not (text_file or ids_file):
        raise click.UsageError("--ref-dir runs over calibration text: give --text-file or --ids-file")
    if scheme != "int4w" and (affine or scale_dtype != "f16" or group_size != "64"):
        raise click.UsageError("--group-size/--affine/--scale-dtype apply to --scheme int4w only")
    if quantize_head and head_scheme not in (None, scheme):
        raise click.UsageError(f"--quantize-head means --head-scheme {scheme}; give one of them")
    check_new_file(out_path, overwrite)
    probes = tuple(kl_probes.read(p) for p in probes_paths)
    if len({bpw_policy.selection_key(p.base) for p in probes}) < len(probes):
        raise click.UsageError("--kl-probes: two sets measured from the same --base; each set prices the errors "
                               "from its base up, so give sets of different bases (e.g. q5_1 and iq4_nl)")
    low_bits, low = min(((bpw_policy.selection_bits(p.probe), p.probe["scheme"]) for p in probes), default=(0, ""))
    hinted = target_bpw is not None and bool(probes) and target_bpw < low_bits - 0.25
    if hinted:  # a hint, not an error
        err.print(f"note: the KL probes reach down to {low} ({low_bits:g} bits per weight); --target-bpw "
                  f"{target_bpw:g} puts matrices below, {_low_probes_advice(low)}", markup=False)
    src = g = None
    if hf_dir:
        src = hf_checkpoint.from_dir(hf_dir)
        tensors, config = expert_stacks.shapes_as_written(src), src.config
    else:
        g, _read = open_model(gguf_path, text_only=True)  # (the manifest names the language model's tensors)
        tensors, config = gguf_tensor_shapes(g), build_gguf_config(g)
    tied = is_tied(tensors, config)
    head = scheme if quantize_head else head_scheme
    if tied and embedding_scheme != KEEP:  # one tensor: --embedding-scheme names the head's scheme
        if head not in (None, embedding_scheme):
            raise click.UsageError("the embedding is tied to the head: give --head-scheme only")
        head = embedding_scheme
    head = head or ("q8_0" if tied else KEEP)
    gs = group_size if group_size == "row" else int(group_size)
    rel = None
    if imatrix is not None:  # recorded relative to the manifest when it can be
        rel = os.path.relpath(real_path(imatrix), real_path(out_path).parent)
    manifest = default_manifest(tensors, scheme, gs, not affine, scale_dtype, head=head, embedding=embedding_scheme,
                                tied=tied, imatrix=rel)
    m = manifest_from(manifest, Path(out_path))
    p = plan(m, tensors)
    found, iwarn = load_importance(m.imatrix, p.quantize, {n: s for n, (_d, s) in tensors.items()})
    mix = None
    if target_bpw is not None:
        ladder = tuple(sel for sel in (bpw_policy.GGUF_LADDER if gguf_types else bpw_policy.LADDER)
                       if sel["scheme"] not in excluded)
        calib = (ref_dir, text_file, ids_file, chunks, ctx, threads) if ref_dir is not None else None
        manifest, mix = _target_bpw_manifest(src, g, manifest, p.quantize, found, target_bpw, probes, ladder, calib,
                                             measurements, m.imatrix, gguf_types)
        p = plan(manifest_from(manifest, Path(out_path)), tensors)
    write_file_atomic(out_path, dumps_canonical(manifest), replace=overwrite)
    for w in p.warnings + iwarn:
        err.print(f"warning: {w}", markup=False)
    if mix is not None:
        out.print(f"OK {out_path}: {mix['bits_per_weight']:.3f} bits per weight over {len(p.quantize)} quantized "
                  f"matrices (target {target_bpw}): " + ", ".join(f"{n} {k}" for k, n in sorted(mix["counts"].items())),
                  markup=False)
        far = sorted(n for n, sel in manifest["tensors"].items() if bpw_policy.selection_bits(sel) < low_bits - 1)
        if probes and far and not hinted:
            named = ", ".join(f"{n} {manifest['tensors'][n]['scheme']}" for n in far[:4])
            more = f" and {len(far) - 4} more" if len(far) > 4 else ""
            err.print(f"note: {len(far)} matri{'x' if len(far) == 1 else 'ces'} went over a bit below the KL "
                      f"probes' lowest type, {low} "
                      f"({low_bits:g} bits per weight), where their KL is extrapolated: {named}{more}; "
                      f"{_low_probes_advice(low)}", markup=False)
        return
    q = sum(1 for _ in p.quantize)
    out.print(f"OK {out_path}: {len(manifest['rules'])} rules, {len(manifest['tensors'])} per-tensor entries; "
              f"quantizes {q} of {len(tensors)} tensors ({scheme})", markup=False)
    fallback: dict[str, list[str]] = {}
    for name, sel in manifest["tensors"].items():
        if name in HEAD_NAMES or name in EMBED_NAMES:
            role = "tied embedding/head" if tied and name in EMBED_NAMES else "head" if name in HEAD_NAMES else "embedding"
            out.print(f"  {role} {name}: {sel['scheme']}", markup=False)
        elif sel["scheme"] != scheme:
            fallback.setdefault(sel["scheme"], []).append(name)
    for s, names in sorted(fallback.items()):
        stacks = sum(len(tensors[n][1]) == 3 for n in names)
        what = f"{len(names)} {'expert stacks' if stacks == len(names) else 'matrices'}"
        what += f" ({stacks} of them expert stacks)" if 0 < stacks < len(names) else ""
        out.print(f"  {what} {scheme} cannot store: {s} (e.g. {names[0]})", markup=False)
    read, full = (bytes_per_token(tensors, q, tied, *step_reads(config)) for q in (p.quantize, {}))
    out.print(f"  a decode step reads {human_bytes(read)} of weights ({full / read:.2f}x less than unquantized, "
              f"{human_bytes(full)}){'; the embedding is tied to the head' if tied else ''}", markup=False)


def _measured_inputs(src: hf_checkpoint.HFSource | None, g, imatrix: Path | None, calib: tuple | None,
                     parts: list[list[int]] | None) -> dict[str, object]:
    """What the candidates' errors depend on, as fingerprints
    (formats/policy_measurements.py): the weights; with --ref-dir the
    reference and the calibration ids (the covariances, whose diagonal is
    the importance, and refit_scales: measured as gptq quantizes, its scales
    refitted), else the importance matrix file."""
    weights = fingerprints.checkpoint(src) if src is not None else fingerprints.digest(fingerprints.stat_line(
        Path(g.path), whole_path=True))
    if calib is not None:
        return {"weights": weights, "ref_dir": fingerprints.artifact(calib[0]),
                "calibration": fingerprints.token_chunks(parts), "imatrix": None,
                "refit_scales": gptq.REFIT_METHOD}
    return {"weights": weights, "ref_dir": None, "calibration": None, "imatrix": fingerprints.small_file(imatrix)}


def _low_probes_advice(low: str) -> str:
    """What to measure when a policy goes below its probes: one set at 4-5 bits
    extrapolates a matrix's KL to 2-3 bits, and got layer 0's down_proj of the
    rotated SmolLM2 wrong by a fifth of the model's KL (docs/quality.md,
    "Sub-block scales refitted too")."""
    return (f"where a set measured there prices them better: ieconv kl-probes --base {low} --probe TYPE (iq3_s, "
            "q2_k), given as another --kl-probes (docs/formats/kl_probes.md)")


def _target_bpw_manifest(src: hf_checkpoint.HFSource | None, g, manifest: dict, quantize: dict, importance: dict,
                         target_bpw: float, probes: tuple[kl_probes.KLProbes, ...], ladder: tuple,
                         calib: tuple | None = None, measurements: Path | None = None,
                         manifest_imatrix: Path | None = None, for_gguf: bool = False) -> tuple[dict, dict]:
    """The manifest with one exact entry per quantized matrix, chosen by
    convert/bpw_policy.py for the budget, and the mix's summary. The
    candidates are measured on the checkpoint's float rows (``src``) or on
    the GGUF file's rows as gguf.quants dequantizes them (``g``: the float
    model the file stands for, what gguf-to-iebin --q4-map quantizes).
    ``calib``: (ref_dir, text_file, ids_file, chunks, ctx, threads), to
    measure them as ieconv gptq quantizes (input covariances from the float
    artifact ref_dir over that text). ``measurements``: the file of errors
    measured before (formats/policy_measurements.py), taken where they are
    of these inputs and added to; ``manifest_imatrix``: the importance
    matrix file the errors are weighted by without ``calib``; ``for_gguf``
    (--gguf-types): the matrices a GGUF export stores as one tensor
    (gguf_names.joint_types) get one type."""
    with ExitStack() as stack, Progress(TextColumn("{task.description:<40.40}"), BarColumn(), MofNCompleteColumn(),
                                        TextColumn("matrices"), TimeRemainingColumn(), console=err,
                                        transient=True) as bar:
        covariance, parts = None, None
        if calib is not None:  # measured as gptq quantizes: the same manifest each run (formats/workers.py)
            stack.enter_context(one_blas_thread())
        if src is not None:
            written = expert_stacks.AsWritten(src.config, hf_checkpoint.collect_tensors(src, stack))
            shapes = {n: written.shape(n) for n in quantize}
            if calib is not None:
                ref, parts, _what = calibration(shapes, calib[0], sorted(shapes, key=natural_key), *calib[1:])

            def rows_of(name: str, rows: list[int]):  # rows as written ([experts x out, in] for a stack)
                dtype = written.tensors[name][1].dtype.name
                return decode_f32(written.read_rows(name, rows), dtype).reshape(len(rows), -1)
        else:
            reader = GGUFRows(g)
            shapes = {n: reader.shape(n) for n in quantize}
            rows_of = reader.rows
        cache, kept = None, set()
        if measurements is not None:
            cache = Measurements(measurements, _measured_inputs(src, g, manifest_imatrix, calib, parts))
            if cache.note:
                err.print(f"note: {cache.note}", markup=False)
            kept = bpw_policy.measured_before(cache, shapes, ladder, probes, calib is not None)
            if kept:
                err.print(f"{measurements}: {len(kept)} of {len(shapes)} matrices measured before (of the same "
                          "inputs): taken as they are", markup=False)
        if calib is not None:
            from iekit.runtime.hessians import Hessians

            pass_task = bar.add_task("covariances", total=None)  # collected while the candidates are measured
            cov = Hessians(ref, parts, sorted(shapes, key=natural_key), MEMORY_BUDGET, kept=kept,
                           on_chunk=lambda i, n: bar.update(pass_task, description=f"covariances: chunk {i}/{n}"))
            shapes = {n: shapes[n] for n in cov.forward_order(list(shapes))}  # the order they are collected in
            covariance = cov.of
        task = bar.add_task("measuring candidates", total=len(quantize))

        def step(name: str) -> None:
            bar.update(task, description=name, advance=1)

        tied = []
        if for_gguf:  # (the architecture from the checkpoint's config, or as the GGUF import reads it)
            archs = (src.config if src is not None else build_gguf_config(g)).get("architectures") or [None]
            tied = joint_types(archs[0], shapes)
        try:
            choices = bpw_policy.choose(shapes, rows_of, importance, target_bpw, step, probes, ladder, covariance,
                                        cache, tied)
        except KeyboardInterrupt:  # (an error is one line: the next run says "measured before" instead)
            if cache is not None and cache.matrices:
                err.print(f"{len(cache.matrices)} of {len(shapes)} matrices' measured errors are kept in "
                          f"{measurements}: the same command goes on from them", markup=False)
            raise
    mix = bpw_policy.summary(choices)
    out_manifest = {k: v for k, v in manifest.items() if k not in ("rules", "tensors")}
    out_manifest.update(rules=[], tensors={c.name: c.selection for c in sorted(choices, key=lambda c: c.name)},
                        bits_per_weight=round(mix["bits_per_weight"], 4))
    return out_manifest, mix


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--deep", is_flag=True, help="Also recompute every tensor's and auxiliary file's digest (the "
              "artifact's checksum) and check the stored values: no NaN/Inf quantization scale or (without "
              "--allow-nonfinite) float weight.")
@click.option("--allow-nonfinite", is_flag=True,
              help="Accept NaN/Inf values: in a BSR file's values, and (with --deep) in an IEBIN model's float "
                   "tensors. Non-finite quantization scales are always invalid.")
def validate(path: Path, deep: bool, allow_nonfinite: bool):
    """Check an artifact against every rule of its format.

    PATH is an IEBIN model directory or its model.ie.json (a packed model's
    tensors in the dedup store included: --deep rebuilds and hashes each), a
    .bsr file (block-sparse matrix; its crc32 is always checked), a dedup
    index (*.dedup.json: blobs, regions and, with --deep, every region's
    digest), or an importance matrix (.npz, `ieconv imatrix`; or llama.cpp's
    .gguf / legacy .dat). Exit 0 and one OK line, or one line naming the file
    and field at fault and exit 1.
    """
    if is_bsr_path(path):
        return validate_bsr(path, allow_nonfinite)
    if is_gguf_model(path):
        g, read = open_model(path, text_only=True)
        build_gguf_config(g)
        files = f" in {len(g.paths)} files" if len(g.paths) > 1 else ""
        how = f" ({read.describe()})" if read.describe() else ""
        out.print(f"OK {path}: GGUF v{g.version}, {g.fields.get('general.architecture')}{how}, {len(g.tensors)} "
                  f"tensors{files}, {len(g.fields)} key-values (structure, bounds and the model's hyperparameters checked; "
                  "`ieconv gguf-to-iebin` checks every value)", markup=False)
        return
    if is_imatrix_path(path):
        return validate_imatrix(path)
    if is_dedup_index_path(path):
        return validate_dedup_index(path, deep)
    m = iebin.load_model(path, deep=deep, allow_nonfinite=allow_nonfinite)
    total = sum(t["nbytes"] for t in m.tensors)
    checked = ""
    if deep:
        checked = ", checksums verified, " + ("scales finite (non-finite floats allowed)" if allow_nonfinite
                                              else "values finite")
    out.print(f"OK {m.meta_path}: IEBIN v{m.meta['version']}, {len(m.tensors)} tensors, "
              f"{human_bytes(total)}{checked}", markup=False)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary instead of tables.")
@click.option("--allow-nonfinite", is_flag=True, help="BSR files: accept NaN/Inf values.")
@click.option("--summary", is_flag=True, help="IEBIN models: the model and the totals per dtype, without the "
              "table of every tensor (a large model has thousands).")
def inspect(path: Path, as_json: bool, allow_nonfinite: bool, summary: bool):
    """Show an artifact's contents: tensors, dtypes, shapes, bytes, totals.

    The artifact is validated first (without re-hashing; see `validate --deep`).
    A dedup index (*.dedup.json) shows its groups and what they are stored as.
    A .bsr file shows its block grid, density and bytes against dense f32; an
    importance matrix (.npz) its calibration and, per matrix, how much of the
    importance its top 1% of columns hold.
    """
    if is_bsr_path(path):
        return inspect_bsr(path, as_json, allow_nonfinite)
    if is_gguf_model(path):
        return inspect_gguf(path, as_json)
    if is_imatrix_path(path):
        return inspect_imatrix(path, as_json)
    if is_dedup_index_path(path):
        return inspect_dedup_index(path, as_json)
    m = iebin.load_model(path)
    by_dtype = iebin.dtype_totals(m.tensors)
    qcount, qbytes, qbpw = iebin.quantized_totals(by_dtype)  # bits per weight over the quantized matrices
    errors = {t["name"]: QuantError(**t[iebin.ERROR_KEY]) for t in m.tensors if iebin.ERROR_KEY in t}
    if as_json:
        click.echo(json.dumps({"path": str(m.meta_path), "model": m.meta["model"], "source": m.meta["source"],
                               "tensors": len(m.tensors), "tensors_in_store": len(m.in_store),
                               "bytes": sum(v[1] for v in by_dtype.values()),
                               "quantized_bits_per_weight": qbpw,
                               "quant_error": {n: e.record() for n, e in errors.items()},
                               "by_dtype": {k: {"tensors": v[0], "bytes": v[1],
                                                "bits_per_weight": 8 * v[1] / v[2] if v[2] else None}
                                            for k, v in sorted(by_dtype.items())}},
                              sort_keys=True))
        return
    head = Table(title=f"{m.meta_path}", show_header=False)
    for k, v in m.meta["model"].items():
        if v is not None:
            head.add_row(k, str(v))
    src = m.meta["source"]
    label = f"{src['kind']} {src['name']}" + (f"@{src['revision']}" if src["revision"] else "")
    if "gguf" in src:
        g = src["gguf"]
        label += f" (GGUF v{g['version']}, {g['architecture']}, llama.cpp file type {g['file_type'] or 'not given'})"
    head.add_row("source", label)
    if len(src["shards"]) == 1:
        head.add_row(f"source {m.checksum}", src["shards"][0][m.checksum])
    head.add_row("tokenizer files", ", ".join(m.meta["tokenizer"]["files"]) or "(none)")
    if m.in_store:
        head.add_row("dedup store", f"{len(m.in_store)} tensors ({human_bytes(sum(t['nbytes'] for t in m.in_store))}) "
                                       f"live in model.dedup.json, not in {iebin.BIN_NAME}")
    out.print(head)
    if not summary:
        _print_tensors(m, errors)
    _print_totals(m, by_dtype, qcount, qbytes, qbpw)


def _print_tensors(m: iebin.IebinModel, errors: dict[str, QuantError]) -> None:
    table = Table(title="tensors")
    for col, just in (("name", "left"), ("dtype", "left"), ("quant", "left"), ("shape", "left"),
                      ("bytes", "right"), ("offset", "right")) + ((("SQNR dB", "right"),) if errors else ()):
        table.add_column(col, justify=just)
    for t in m.tensors:
        e = errors.get(t["name"])
        table.add_row(t["name"], t["dtype"], quant_label(t.get("quant")), "×".join(map(str, t["shape"])) or "scalar",
                      human_bytes(t["nbytes"]), str(t.get("file_data_offset", f"({t.get(iebin.STORE_KEY)} store)")),
                      *((f"{e.sqnr_db:.1f}" if e else "",) if errors else ()))
    out.print(table)


def _print_totals(m: iebin.IebinModel, by_dtype: dict[str, list[int]], qcount: int, qbytes: int,
                  qbpw: float | None) -> None:
    totals = Table(title="totals")
    for col in ("dtype", "tensors", "bytes", "bits/weight"):
        totals.add_column(col, justify="left" if col == "dtype" else "right")
    for k, (n, b, e) in sorted(by_dtype.items()):
        totals.add_row(k, str(n), human_bytes(b), f"{8 * b / e:.3f}" if e else "")
    if qbpw is not None:
        totals.add_row("quantized", str(qcount), human_bytes(qbytes), f"{qbpw:.3f}")
    totals.add_row("all", str(len(m.tensors)), human_bytes(sum(v[1] for v in by_dtype.values())), "", style="bold")
    out.print(totals)


def is_gguf_model(path: Path) -> bool:
    """A GGUF file, whatever its name, that is not one of llama.cpp's
    importance matrices (general.type "imatrix")."""
    if not is_gguf_file(path):
        return False
    return open_gguf(path).fields.get("general.type") != "imatrix"


def _short_value(v) -> str:
    if isinstance(v, list):
        head = ", ".join(repr(x) if isinstance(x, str) else str(x) for x in v[:4])
        return f"[{head}{', ...' if len(v) > 4 else ''}] ({len(v)} items)"
    text = repr(v) if isinstance(v, str) else str(v)
    return text if len(text) <= 100 else text[:97] + "..."


def inspect_gguf(path: Path, as_json: bool) -> None:
    """A GGUF model's key-values and tensors, as gguf-dump lists them, with totals by type."""
    g = open_gguf(path)
    by_type: dict[str, list[int]] = {}
    for t in g.tensors:
        c = by_type.setdefault(t.ggml_type, [0, 0, 0])
        c[0] += 1
        c[1] += t.nbytes
        c[2] += math.prod(t.shape)
    if as_json:
        click.echo(json.dumps({"path": str(path), "version": g.version, "alignment": g.alignment,
                               "metadata": {k: v if not isinstance(v, list) or len(v) <= 16 else
                                            {"array_length": len(v), "first": v[:16]} for k, v in g.fields.items()},
                               "files": [str(p) for p in g.paths],
                               "tensors": [{"name": t.name, "type": t.ggml_type, "shape": t.shape, "offset": t.offset,
                                            "nbytes": t.nbytes, "file": t.shard} for t in g.tensors],
                               "by_type": {k: {"tensors": v[0], "bytes": v[1], "bits_per_weight": 8 * v[1] / v[2]}
                                           for k, v in sorted(by_type.items())}}, sort_keys=True))
        return
    kv = Table(title=f"{path}: GGUF v{g.version}, {len(g.fields)} key-values")
    kv.add_column("key")
    kv.add_column("value")
    for k, v in g.fields.items():
        kv.add_row(k, _short_value(v))
    out.print(kv)
    split = len(g.paths) > 1
    table = Table(title=f"{len(g.tensors)} tensors" + (f" in {len(g.paths)} files" if split else ""))
    cols = (("name", "left"), ("type", "left"), ("shape", "left"), ("bytes", "right"), ("offset", "right"))
    for col, just in cols + ((("file", "right"),) if split else ()):
        table.add_column(col, justify=just)
    for t in g.tensors:
        table.add_row(t.name, t.ggml_type, "×".join(map(str, t.shape)), human_bytes(t.nbytes), str(t.offset),
                      *([f"{t.shard + 1} of {len(g.paths)}"] if split else []))
    out.print(table)
    totals = Table(title="totals")
    for col in ("type", "tensors", "bytes", "bits/weight"):
        totals.add_column(col, justify="left" if col == "type" else "right")
    for k, (n, b, e) in sorted(by_type.items()):
        totals.add_row(k, str(n), human_bytes(b), f"{8 * b / e:.3f}")
    totals.add_row("all", str(len(g.tensors)), human_bytes(sum(v[1] for v in by_type.values())), "", style="bold")
    out.print(totals)


def quant_label(q: dict | None) -> str:
    if not q:
        return ""
    if q["scheme"] == "int4w":
        return f"g{q['group_size']} {'sym' if q['symmetric'] else 'affine'} {q['scale_dtype']}"
    return f"blocks of {q['block_size']}"


@cli.command("iebin-upgrade")
@click.argument("legacy_json", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("-o", "--out", "out_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Where to write schema2 metadata (default: replace LEGACY_JSON, keeping the original as "
                   "LEGACY_JSON.bak, or .bak.1, .bak.2, ... when that name is taken).")
@click.option("--no-backup", is_flag=True, help="Do not keep a backup of LEGACY_JSON when upgrading in place.")
@click.option("--overwrite", is_flag=True, help="With -o: replace an existing file.")
@CHECKSUM_OPTION
def iebin_upgrade(legacy_json: Path, out_path: Path | None, no_backup: bool, overwrite: bool, checksum: str):
    """Rewrite legacy IEBIN metadata (shard / shard_data_offset, uppercase dtypes) as schema2.

    Checksums are computed from the bytes each entry points at, and the result
    must pass `ieconv validate` before it is written (atomically). The output
    must live in the same directory as LEGACY_JSON, since file paths are
    relative to it. An existing backup is never replaced (a new .bak.N name
    is used), nor an existing -o file without --overwrite.

    A file that is already schema2 is left alone: one "nothing to do" line,
    exit 0, nothing written (use `ieconv validate` to check it).
    """
    data = read_small(legacy_json)
    legacy = loads_strict(data, legacy_json)
    if is_schema2(legacy):
        out.print(f"nothing to do: {legacy_json} is already IEBIN schema2 (nothing written; "
                  "`ieconv validate` checks it)", markup=False)
        return
    meta, notes = upgrade_legacy(legacy, legacy_json, checksum)
    target = out_path or legacy_json
    if real_path(target).parent != real_path(legacy_json).parent:
        raise IEError(f"{target}: must be in the same directory as {legacy_json} (tensor file paths are relative)")
    in_place = real_path(target) == real_path(legacy_json)
    if not in_place:
        check_new_file(target, overwrite)
    iebin.validate_meta(meta, target)
    iebin.check_backing_files(meta, target)  # ranges, overlaps: all before anything is written
    if in_place and not no_backup:
        bak = keep_backup(legacy_json, data)
        err.print(f"kept the original as {bak}", markup=False)
    write_file_atomic(target, dumps_canonical(meta), replace=in_place or overwrite)
    for n in notes:
        err.print(f"note: {n}", markup=False)
    out.print(f"OK {target}: schema2, {len(meta['tensors'])} tensors", markup=False)


MAX_BACKUPS = 100


def keep_backup(path: Path, data: bytes) -> Path:
    """Write ``data`` (the original of ``path``) as PATH.bak, or PATH.bak.1,
    .bak.2, ... : never over an existing file. A backup that already holds
    exactly these bytes is reused."""
    for i in range(MAX_BACKUPS):
        bak = path.with_name(path.name + ".bak" + (f".{i}" if i else ""))
        if bak.is_file() and not bak.is_symlink() and bak.stat().st_size == len(data) and bak.read_bytes() == data:
            return bak
        try:
            write_file_atomic(bak, data, replace=False)
            return bak
        except FileExistsError:
            continue
    raise IEError(f"{path}: {path.name}.bak to {path.name}.bak.{MAX_BACKUPS - 1} all exist; "
                  "move some away (or pass --no-backup)")


# dedup-plan, dedup-extract, dedup-link (convert/dedup_cli.py), block-sparse
# (convert/bsr_cli.py; validate and inspect hand .bsr files to it) and imatrix
# (convert/imatrix_cli.py), kl-probes, gptq, quantize (the calibrated pipeline) and rotate.
for _c in (*DEDUP_COMMANDS, block_sparse_cmd, imatrix_cmd, kl_probes_cmd, gptq_cmd, quantize_cmd, rotate_cmd):
    cli.add_command(_c)


def main() -> None:
    run_cli(cli, "ieconv")


if __name__ == "__main__":
    sys.exit(main())
