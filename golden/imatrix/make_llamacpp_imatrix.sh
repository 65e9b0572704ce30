#!/bin/sh
# llama.cpp's own importance matrices (GGUF and legacy .dat) for the golden tiny
# GGUF, the references tests/test_imatrix.py reads. Needs llama-imatrix built
# from llama-cpp-python 0.3.36's vendored llama.cpp (`ninja llama-imatrix` in its
# build directory); run from the repository root:
#   sh golden/imatrix/make_llamacpp_imatrix.sh path/to/llama-imatrix
# One thread, so the sums are added in one order; the relative text path keeps
# the dataset name in the files free of this machine's directories.
set -e
bin=$(realpath "$1")
cd golden/text
for f in gguf dat; do
  "$bin" -m ../gguf/tiny-llama.mixed.gguf -f eval-sample.txt -o "../imatrix/tiny-llama.llamacpp.$f" \
    --output-format $f -c 64 --chunks 6 -t 1 --no-ppl
done
# The Mixtral toy's per-expert entries (ffn_*_exps: in the GGUF a row and a count per expert,
# in the .dat the experts' rows one after another),
# from its GGUF export (ieconv iebin-to-gguf, the repository's .venv).
tmp=$(mktemp -d)
../../.venv/bin/ieconv iebin-to-gguf -q --model-dir ../iebin/tiny-mixtral --out "$tmp/tiny-mixtral.gguf"
for f in gguf dat; do
  "$bin" -m "$tmp/tiny-mixtral.gguf" -f eval-sample.txt -o "../imatrix/tiny-mixtral.llamacpp.$f" \
    --output-format $f -c 64 --chunks 6 -t 1 --no-ppl
done
rm -rf "$tmp"
