"""Calibration and held-out English text that every machine with Python has:
the Python documentation's topics (``pydoc_data.topics``), first half for
calibration (imatrix, kl-probes, gptq), second half held out for scoring.
Shared by ``make demo``, the README's quick start and ``make bench-quality``
so that all three calibrate and score on the same split.

    python benchmarks/sample_texts.py DIR   # writes DIR/calib.txt and DIR/held.txt
"""

from __future__ import annotations

import sys
from pathlib import Path


def calib_and_held() -> tuple[str, str]:
    import pydoc_data.topics as topics

    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    half = len(text) // 2
    return text[:half], text[half:]


def write_texts(out: Path) -> None:
    """DIR/calib.txt and DIR/held.txt (DIR made if missing)."""
    out.mkdir(parents=True, exist_ok=True)
    calib, held = calib_and_held()
    (out / "calib.txt").write_text(calib, encoding="utf-8")
    (out / "held.txt").write_text(held, encoding="utf-8")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    write_texts(Path(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
