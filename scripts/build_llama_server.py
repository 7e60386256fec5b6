#!/usr/bin/env python
"""Build llama.cpp's C++ server (`llama-server`) from the llama.cpp that fincheck's pinned
llama-cpp-python source archive carries, into fincheck's cache, and print its path:

  python scripts/build_llama_server.py            # about 6 minutes on 2 cores; then instant
  "$(python scripts/build_llama_server.py)" -m exports/detector-f16/FILE.gguf -c 2048 -np 1 \\
      -fa off -cram 0 --port 8080

Any llama-server of your own serves a `fincheck export --gguf` file as well; this one is the
llama.cpp the converter came from. Needs cmake and a C++17 compiler.
"""

from __future__ import annotations

import argparse
import os
import sys

from tqdm import tqdm

from fincheck.errors import FincheckError
from fincheck.serve.llama_server_build import build_llama_server, built_llama_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="compile jobs (default: every core)"
    )
    args = parser.parse_args(argv)
    binary = built_llama_server()
    if binary is None:
        with tqdm(total=100, unit="%", desc="building llama-server", file=sys.stderr) as bar:
            try:
                binary = build_llama_server(args.jobs, lambda p: bar.update(p - bar.n))
            except FincheckError as e:
                bar.close()
                print(f"error: {e}", file=sys.stderr)
                return 1
    print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
