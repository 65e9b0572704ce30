"""Error compensation of a mixture of experts, on real weights: what each
expert's own routed covariances bring to ``ieconv gptq``.

No mixture of experts is on PyPI, so one is made from SmolLM2-135M (the
rotated checkpoint of quality_bench.py, whose weights are off Q4_1's grid):
each layer's MLP channels are cut into --experts experts (contiguous blocks
of gate/up rows and down columns, a Mixtral checkpoint), each token routed
to --top-k of them by a router whose row for an expert is the sum of that
expert's gate rows (tokens go where their gate pre-activations are largest),
and each expert's down projection scaled by --down-scale. That is a new
model, not SmolLM2: its own float artifact is the reference every KL is
taken against (its KL against the dense model is printed too, to say how
far it moved).

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


def upcycle(src: Path, dst: Path, experts: int, top_k: int, down_scale: float) -> None:
    """The Mixtral checkpoint of the module docstring, from a Llama one."""
    from safetensors.numpy import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    w = {k: v for f in sorted(src.glob("*.safetensors")) for k, v in load_file(f).items()}
    inter = cfg["intermediate_size"]
    if inter % experts:
        raise SystemExit(f"--experts {experts} does not divide intermediate_size {inter}")
    per = inter // experts
    out = {}
    for k, v in w.items():
        pre, _, rest = k.partition(".mlp.")
        if not rest:
            out[k] = v
            continue
        if rest != "gate_proj.weight":
            continue  # up and down go with gate
        gate, up, down = v, w[pre + ".mlp.up_proj.weight"], w[pre + ".mlp.down_proj.weight"]
        moe = pre + ".block_sparse_moe."
        router = []
        for e in range(experts):
            rows = slice(e * per, (e + 1) * per)
            out[moe + f"experts.{e}.w1.weight"] = gate[rows]
            out[moe + f"experts.{e}.w3.weight"] = up[rows]
            out[moe + f"experts.{e}.w2.weight"] = down[:, rows] * np.float32(down_scale)
            router.append(gate[rows].sum(axis=0))
        out[moe + "gate.weight"] = np.stack(router)
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}, str(dst / "model.safetensors"))
    cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=per,
               num_local_experts=experts, num_experts_per_tok=top_k, sliding_window=None, output_router_logits=False,
               router_aux_loss_coef=0.0, router_jitter_noise=0.0)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, dst / f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("out/moe-gptq"), help="Models and text are kept here.")
    ap.add_argument("--hf-dir", type=Path, help="A float Llama-family checkpoint (default: SmolLM2-135M, rotated).")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--down-scale", type=float, default=2.0, help="Each expert's down projection times this.")
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
    tag = f"e{a.experts}-k{a.top_k}-s{a.down_scale:g}"
    moe_hf, ref, im = w / f"moe-{tag}", w / f"moe-{tag}-f32", w / f"moe-{tag}.imatrix.npz"
    if not (moe_hf / "config.json").exists():
        upcycle(hf, moe_hf, a.experts, a.top_k, a.down_scale)
    if not (ref / "model.ie.json").exists():
        run(BIN / "ieconv", "hf-to-iebin", "-q", "--hf-dir", moe_hf, "--out-dir", ref)
    if not im.exists():
        run(BIN / "ieconv", "imatrix", "-q", "--model-dir", ref, "--text-file", calib, "-o", im,
            "--chunks", a.calib_chunks)
    moved = eval_json(ref, dense, held, a.chunks, a.threads)
    print(f"{a.experts} experts, top {a.top_k}, down x{a.down_scale:g}, from {hf.name}: against the dense model "
          f"KL {moved['kld_mean']:.3f}, PPL {moved['ppl']:.2f} (the dense model's {moved['ppl_ref']:.2f})")
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
