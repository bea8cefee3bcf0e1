"""Run llama.cpp's convert_hf_to_gguf.py on the tiny model, declaring its pre-tokenizer as "gpt-2".

The converter identifies a BPE pre-tokenizer by hashing how a fixed text tokenizes, and rejects any tokenizer
it has not seen (ours is trained locally, so its hash is new). Our tokenizer splits with GPT-2's regex
(ByteLevel with use_regex=True), which is exactly llama.cpp's "gpt-2" pre-tokenizer, so we tell it that.

Usage: python convert_gguf.py --converter DIR MODEL_DIR [converter args...]
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--converter":
        raise SystemExit(__doc__)
    conv_dir = Path(argv[1]).resolve()
    script = conv_dir / "convert_hf_to_gguf.py"
    sys.path.insert(0, str(conv_dir / "gguf-py"))
    sys.path.insert(0, str(conv_dir))

    from conversion import base

    def gpt2_pre(self: object, tokenizer: object) -> str:
        return "gpt-2"

    base.TextModel.get_vocab_base_pre = gpt2_pre
    sys.argv = [str(script), *argv[2:]]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
