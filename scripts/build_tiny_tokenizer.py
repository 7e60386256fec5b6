"""Rebuild the tiny test model's tokenizer: train/assets/tiny_tokenizer.json.

The byte-level BPE is trained on train/assets/tiny_corpus.txt (project-written text); run this
after editing the corpus or the vocabulary size, then commit the JSON.

    python scripts/build_tiny_tokenizer.py [--out train/assets/tiny_tokenizer.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fincheck.train.tiny_model import TOKENIZER_FILE, train_tiny_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=TOKENIZER_FILE, help="where to write the tokenizer JSON"
    )
    args = parser.parse_args()
    tokenizer = train_tiny_tokenizer()
    tokenizer.save(str(args.out), pretty=False)
    print(f"wrote {args.out}: {tokenizer.get_vocab_size()} tokens, {args.out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
