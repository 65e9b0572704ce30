"""Error compensation of a mixture of experts, on real weights: what each
expert's own routed covariances bring to ``ieconv gptq``.

No mixture of experts is on PyPI, so one is made from SmolLM2-135M (the
rotated checkpoint of quality_bench.py, whose weights are off Q4_1's grid)
as sparse upcycling starts one: every layer's MLP copied into --experts
experts (a Mixtral checkpoint), each token routed to --top-k of them by a
random router. Mixtral weighs the chosen experts by a softmax over their
logits alone, so the weights sum to 1 and, the experts being equal, the
model computes what SmolLM2 does: its logits are checked against the dense
model's. Its experts' inputs are not: each sees the tokens the router sends
it, so each expert's copy is compensated under another covariance.

Then per scheme: nearest rounding weighted by the imatrix (hf-to-iebin
--q4-map), and ieconv gptq (every matrix, experts included, compensated
under its own input covariance), each scored by ``ierun eval --act f32``
on held-out text.

    python benchmarks/moe_gptq.py [--work out/moe-gptq] [--schemes q4_0,iq4_nl] [--experts 8 --top-k 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from quality_bench import BIN, eval_json, rotate, run  # noqa: E402


def upcycle(src: Path, dst: Path, experts: int, top_k: int, seed: int = 0) -> None:
    """The Mixtral checkpoint of the module docstring, from a Llama one."""
    from safetensors.numpy import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    w = {k: v for f in sorted(src.glob("*.safetensors")) for k, v in load_file(f).items()}
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in w.items():
        pre, _, rest = k.partition(".mlp.")
        if not rest:
            out[k] = v
            continue
        moe = pre + ".block_sparse_moe."
        for e in range(experts):
            out[moe + f"experts.{e}." + {"gate_proj.weight": "w1", "up_proj.weight": "w3",
                                         "down_proj.weight": "w2"}[rest] + ".weight"] = v
        if rest == "gate_proj.weight":
            out[moe + "gate.weight"] = rng.standard_normal((experts, v.shape[1])).astype(np.float32)
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}, str(dst / "model.safetensors"))
    cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=experts,
               num_experts_per_tok=top_k, sliding_window=None, output_router_logits=False,
               router_aux_loss_coef=0.0, router_jitter_noise=0.0)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, dst / f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("out/moe-gptq"), help="Models and text are kept here.")
    ap.add_argument("--hf-dir", type=Path, help="A float Llama-family checkpoint (default: SmolLM2-135M, rotated).")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--schemes", default="q4_0,iq4_nl", help="Schemes compared, comma-separated.")
    ap.add_argument("--chunks", type=int, default=8, help="512-token chunks scored.")
    ap.add_argument("--calib-chunks", type=int, default=32, help="512-token chunks of calibration (imatrix, gptq).")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    w = a.work
    w.mkdir(parents=True, exist_ok=True)
    hf = a.hf_dir
    if hf is None:
        hf = w / "smollm2-rot"
        if not (hf / "config.json").exists():
            plain = w / "smollm2-hf"
            if not (plain / "config.json").exists():
                subprocess.run([sys.executable, HERE / "smollm2_hf.py", "--out", plain], check=True,
                               stdout=subprocess.DEVNULL)
            rotate(plain, hf)
    dense = w / "dense-f32"
    if not (dense / "model.ie.json").exists():
        run(BIN / "ieconv", "hf-to-iebin", "-q", "--hf-dir", hf, "--out-dir", dense)
    from sample_texts import calib_and_held

    from iekit.runtime.decoder import Decoder

    calib_text, held_text = calib_and_held()
    calib, held = w / "calib.txt", w / "eval-ids.txt"
    calib.write_text(calib_text)
    held.write_text(" ".join(map(str, Decoder(dense).encode(held_text))))
    tag = f"e{a.experts}-k{a.top_k}"
    moe_hf, ref, im = w / f"moe-{tag}", w / f"moe-{tag}-f32", w / f"moe-{tag}.imatrix.npz"
    if not (moe_hf / "config.json").exists():
        upcycle(hf, moe_hf, a.experts, a.top_k)
    if not (ref / "model.ie.json").exists():
        run(BIN / "ieconv", "hf-to-iebin", "-q", "--hf-dir", moe_hf, "--out-dir", ref)
    if not im.exists():
        run(BIN / "ieconv", "imatrix", "-q", "--model-dir", ref, "--text-file", calib, "-o", im,
            "--chunks", a.calib_chunks)
    ids = [int(i) for i in held.read_text().split()[:64]]
    same = np.abs(Decoder(ref).logits(ids) - Decoder(dense).logits(ids)).max()
    print(f"{a.experts} experts (each SmolLM2's MLP), top {a.top_k}, from {hf.name}: logits within {same:.2g} of "
          "the dense model's")
    print(f"{'scheme':10} {'how':28} {'KL':>8} {'± se':>7} {'top-1':>6} {'PPL':>7}")
    for scheme in a.schemes.split(","):
        man = w / f"{tag}-{scheme}.json"
        run(BIN / "ieconv", "q4-manifest", "--hf-dir", moe_hf, "-o", man, "--scheme", scheme, "--imatrix", im)
        for how, args in (("nearest, imatrix", ("hf-to-iebin", "--q4-map", man)),
                          ("ieconv gptq", ("gptq", "--q4-map", man, "--ref-dir", ref, "--text-file", calib,
                                           "--chunks", a.calib_chunks))):
            out = w / f"{tag}-{scheme}-{args[0]}"
            if not (out / "model.ie.json").exists():
                run(BIN / "ieconv", *args, "-q", "--hf-dir", moe_hf, "--out-dir", out)
            r = eval_json(out, ref, held, a.chunks, a.threads)
            print(f"{scheme:10} {how:28} {r['kld_mean']:8.4f} {r['kld_se']:7.4f} {r['top1_agree']:6.3f} {r['ppl']:7.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
