"""Peak RSS and speed of `ieconv hf-to-iebin` on a synthetic checkpoint.

Converting must not need RAM for the whole model, nor take much longer than
copying it: this builds a sharded checkpoint of --size-mb (default 512 MB,
f32, written by the safetensors library), converts it with the installed
`ieconv` as a child process, and prints one JSON line per run with the
child's peak RSS (ru_maxrss from wait4) next to the model size, and its wall
time next to `cp -r` of the same checkpoint timed just before it (the same
warm page cache): `over_cp_r` is the ratio. The converter fsyncs what it
writes (an artifact is durable once the command returns) and cp does not,
so `cp -r` followed by `sync` of the copies is timed too (`over_cp_r_sync`:
the like-for-like ratio). ``inside_seconds`` is the converter's own figure
(from its summary line: the conversion without interpreter start-up and
imports, ~0.2 s here), ``over_cp_r_sync_inside`` its ratio. Four runs: bytes
kept with the default digest (xxh3_128), kept with ``--checksum sha256``,
cast to bf16, and quantized (``--q4-map``, every tensor int4w g64 symmetric,
the usual policy's scheme), whose ``m_elements_per_s`` is the conversion's
own throughput (inside_seconds) on every CPU the process may use. The
checkpoint is generated in a separate process: Linux carries a process's
pre-exec peak RSS across exec, so a child forked from a process that held
the data would inherit it.

    python benchmarks/convert_rss.py [--size-mb 512] [--keep]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import child_rss  # benchmarks/, beside this script

TENSOR_MB = 32


def write_checkpoint(d: Path, size_mb: int) -> int:
    import numpy as np
    import safetensors

    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["Synthetic"], "hidden_size": 4096}))
    n = max(2, size_mb // TENSOR_MB)
    rows = TENSOR_MB * 1024 * 1024 // 4 // 4096
    rng = np.random.default_rng(0)
    names = [f"model.layers.{i}.mlp.weight" for i in range(n)]
    weight_map, total = {}, 0
    for s, part in enumerate((names[: n // 2], names[n // 2:])):
        fname = f"model-{s + 1:05d}-of-00002.safetensors"
        arrays = {k: rng.standard_normal((rows, 4096), dtype=np.float32) for k in part}
        specs = {k: safetensors.TensorSpec(dtype="float32", shape=list(a.shape), data_ptr=a.ctypes.data,
                                           data_len=a.nbytes) for k, a in arrays.items()}
        safetensors.serialize_file(specs, str(d / fname))
        total += sum(a.nbytes for a in arrays.values())
        weight_map.update({k: fname for k in part})
        del arrays, specs
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:
        print(write_checkpoint(args.generate, args.size_mb))
        return
    ieconv = Path(sys.executable).with_name("ieconv")
    tmp = Path(tempfile.mkdtemp(prefix="iekit-rss-"))
    try:
        gen = subprocess.run([sys.executable, __file__, "--generate", str(tmp / "hf"), "--size-mb", str(args.size_mb)],
                             check=True, capture_output=True, text=True)
        model_bytes = int(gen.stdout)
        q4_map = tmp / "int4w.q4_manifest.json"
        q4_map.write_text(json.dumps({"version": 1, "default": {"scheme": "int4w", "group_size": 64, "symmetric": True,
                                                                "scale_dtype": "f16"}, "rules": [], "tensors": {}}))
        # The default digest, then what --checksum sha256 (every earlier artifact's) costs, a cast, quantization.
        runs = (("keep", "xxh3_128", []), ("keep", "sha256", []), ("bf16", "xxh3_128", ["--dtype", "bf16"]),
                ("int4w", "xxh3_128", ["--q4-map", str(q4_map)]))
        for label, checksum, extra in runs:
            subprocess.run(["sync"], check=True)  # both timings start with no dirty pages being written back
            t0 = time.perf_counter()
            subprocess.run(["cp", "-r", str(tmp / "hf"), str(tmp / "copy")], check=True)
            cp_secs = time.perf_counter() - t0
            subprocess.run(["sync", *map(str, (tmp / "copy").iterdir())], check=True)
            cp_sync_secs = time.perf_counter() - t0
            shutil.rmtree(tmp / "copy")
            subprocess.run(["sync"], check=True)
            out = tmp / f"out-{label}-{checksum}"
            cmd = [str(ieconv), "hf-to-iebin", "-q", "--hf-dir", str(tmp / "hf"), "--out-dir", str(out),
                   "--checksum", checksum, *extra]
            log = tmp / "stderr.txt"
            secs, peak_mb = child_rss.run(cmd, log)
            inside = float(re.search(r" in ([0-9.]+) s ", log.read_text())[1])
            quant = {"m_elements_per_s": round(model_bytes / 4 / 1e6 / inside, 1)} if label == "int4w" else {}
            print(json.dumps({"bench": "convert_rss", "dtype": label, "checksum": checksum, "model_mb": round(model_bytes / 1e6, 1),
                              "peak_rss_mb": round(peak_mb, 1),
                              "rss_over_model": round(peak_mb * 2**20 / model_bytes, 3),
                              "seconds": round(secs, 2), "mb_per_s": round(model_bytes / 1e6 / secs, 1),
                              "cp_r_seconds": round(cp_secs, 2), "over_cp_r": round(secs / cp_secs, 2),
                              "cp_r_sync_seconds": round(cp_sync_secs, 2),
                              "over_cp_r_sync": round(secs / cp_sync_secs, 2),
                              "inside_seconds": inside, "over_cp_r_sync_inside": round(inside / cp_sync_secs, 2),
                              **quant}))
            shutil.rmtree(out)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
