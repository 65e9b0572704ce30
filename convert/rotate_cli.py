"""``ieconv rotate``: the command line of convert/rotate.py."""

from __future__ import annotations

from pathlib import Path

import click

from iekit.cli.support import human_bytes
from iekit.formats import hf_checkpoint

from .conversion_output import convert_progress, err
from .rotate import OUT_DTYPES, rotate


@click.command("rotate")
@click.option("--hf-dir", required=True, type=click.Path(path_type=Path),
              help="HF checkpoint to rotate (config.json + safetensors).")
@click.option("--out-dir", required=True, type=click.Path(path_type=Path),
              help="Where the rotated checkpoint is written (model.safetensors, config.json, tokenizer files).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the random orthogonal matrix: the same seed gives the same bytes.")
@click.option("--dtype", type=click.Choice(OUT_DTYPES), default="f32", show_default=True,
              help="Dtype of the rotated tensors. A rotated weight is a sum over the whole stream, so a bf16 source's "
                   "values are no longer bf16: f32 keeps the model's function exactly (to float rounding), bf16 "
                   "halves the size for an error of bf16's own order.")
@click.option("--overwrite", is_flag=True, help="Replace the files of a previous rotation in --out-dir.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def rotate_cmd(hf_dir, out_dir, seed, dtype, overwrite, quiet):
    """Rotate the residual stream of a checkpoint without changing what it computes.

    \b
    Folds every RMSNorm weight into the matrices that read its output, then
    multiplies the residual stream by a random orthogonal matrix Q: embedding
    E Q, the matrices that read the stream W Q, those that write it Qᵀ W. The
    logits stay the same (to float rounding) while no channel of the stream
    stands out any more (incoherence processing, as in QuIP# and QuaRot).
    Whether that helps depends on the recipe. On SmolLM2, widened to 768
    (docs/quality.md, "Rotating the residual stream"): with codes from
    ieconv gptq it gave 0.44x the KL at 3.5 bits and 0.62x at 4.0; with
    an importance matrix and nearest rounding it gave 1.04-1.71x more KL
    (the imatrix leans on the very channels rotation spreads out). So use
    it before the gptq pipeline, and score both on your model (ierun
    eval). The head is untied (its own copy: counted in every
    bits-per-weight figure). Nothing changes at run time.

    Architectures: llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, smollm3,
    granite, phi3 (its fused matrices written fused again), ministral3,
    seed_oss, olmoe, qwen2_moe, deepseek_v3 and deepseek_v2 (latent
    attention; DeepSeek-V3's MTP layer is refused), ernie4_5 and
    ernie4_5_moe (its MTP tensors are refused: drop them first),
    hunyuan_v1_dense, hunyuan_v1_moe and hy_v3 (Hy3's MTP layer is
    refused), apertus (its norms under its own names; xIELU's parameters
    kept), dots1 (dots.llm1), solar_open (Solar Open), youtu (Youtu-LLM),
    granite_swa (Granite SWASH: its sinks kept).
    A tensor no rule covers is refused, never copied unrotated.

    \b
    Typical use:
      ieconv rotate --hf-dir M --out-dir M-rot
      ieconv hf-to-iebin --hf-dir M-rot --out-dir ref
      ieconv hf-to-iebin --hf-dir M --out-dir orig
      ierun eval --model-dir ref --ref-dir orig --text-file t.txt  (KL ~ 0: the same function)
      ieconv imatrix -m ref ... ; ieconv q4-manifest --hf-dir M-rot ... ; ieconv gptq --hf-dir M-rot ...
    """
    src = hf_checkpoint.from_dir(hf_dir)
    with convert_progress(quiet) as prog:
        res = rotate(src, out_dir, seed=seed, dtype=dtype, overwrite=overwrite, progress=prog)
    err.print(f"rotated {res.tensors} tensors with a random orthogonal {src.config['hidden_size']} x "
              f"{src.config['hidden_size']} matrix (seed {seed}): {human_bytes(res.bytes_in)} in, "
              f"{human_bytes(res.bytes_out)} {dtype} out, the untied head {human_bytes(res.head_bytes)} of it, in "
              f"{res.seconds:.1f} s -> {res.out_dir}", markup=False)
    if res.removed:
        err.print(f"removed the previous checkpoint's {', '.join(res.removed)} from {res.out_dir} "
                  "(not part of the new one)", markup=False)
