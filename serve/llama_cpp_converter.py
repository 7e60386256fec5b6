"""llama.cpp's own GGUF converter (`convert_hf_to_gguf.py` with its `conversion/` package and
`gguf-py/`), taken from the source archive of llama-cpp-python on the package index: the one
release that also serves the files (`llama_cpp.server`), pinned by URL and sha256, downloaded
once into the cache and unpacked there. Nothing of it is part of fincheck.

`convert` runs it as its own process on a transformers folder; `quantize` calls the C library
llama-cpp-python built (`llama_model_quantize`, what `llama-quantize` runs).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.io.cache import cache_root
from fincheck.io.safe_files import new_folder
from fincheck.io.sources import Source, resolve_source

RELEASE = "0.3.36"  # the llama-cpp-python release `make install` builds: converter and server agree
SOURCE = Source(
    name=f"llama_cpp_python-{RELEASE}.tar.gz",
    url="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae"
    f"45ca773a59fe7cf3/llama_cpp_python-{RELEASE}.tar.gz",
    sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    license="MIT",
)
# What the converter needs of the archive's 76 MB (1.6 MB unpacked).
MEMBERS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")
VENDORED = f"llama_cpp_python-{RELEASE}/vendor/llama.cpp/"

# The types the converter writes itself, and those llama.cpp quantizes to from its f32 output
# (llama_ftype values of llama.h).
FULL_TYPES = ("f16", "bf16", "f32")
QUANTIZED_TYPES = {"q8_0": 7, "q6_k": 18, "q5_k_m": 17, "q4_k_m": 15, "q4_0": 2}
GGUF_TYPES = (*FULL_TYPES, *QUANTIZED_TYPES)


def gguf_name(adapter_name: str, kind: str) -> str:
    """An exported file's name: the adapter's and the type's (`qwen-three-tasks-f16.gguf`)."""
    return f"{adapter_name}-{kind}.gguf"


def converter_dir() -> Path:
    """The unpacked converter in the cache, unpacked from the verified archive on first use."""
    tools = cache_root() / "tools"
    final = tools / f"llama.cpp-converter-{RELEASE}"
    if (final / "convert_hf_to_gguf.py").is_file():
        return final
    archive = resolve_source(SOURCE, data_dir=None, cache_dir=tools)
    try:
        with new_folder(final, "unpacking") as staging, tarfile.open(archive) as tar:
            wanted = [
                m
                for m in tar.getmembers()
                if m.name.startswith(VENDORED)
                and m.name[len(VENDORED) :].startswith(MEMBERS)
                and (m.isfile() or m.isdir())
            ]
            for member in wanted:
                member.name = member.name[len(VENDORED) :]
            tar.extractall(staging, members=wanted, filter="data")
    except FincheckError:
        if not (final / "convert_hf_to_gguf.py").is_file():  # not another process's unpacking
            raise
    return final


def convert(model_dir: Path, outfile: Path, outtype: str) -> None:
    """`convert_hf_to_gguf.py model_dir --outfile outfile --outtype outtype`; a base it cannot
    convert (an architecture or a tokenizer llama.cpp does not know) is one line with its reason."""
    script = converter_dir() / "convert_hf_to_gguf.py"
    command = [
        sys.executable,
        str(script),
        str(model_dir),
        "--outfile",
        str(outfile),
        "--outtype",
        outtype,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        reason = _reason(result.stderr)
        if reason.startswith("ModuleNotFoundError"):  # this Python lacks one of its imports
            raise FincheckError(
                f"llama.cpp's converter ({RELEASE}) needs a package this Python lacks ({reason}):"
                " pip install 'fincheck[llama-cpp]' (or `make install-llama-cpp`), then rerun"
            )
        raise FincheckError(f"llama.cpp's converter ({RELEASE}) cannot convert this base: {reason}")


def _reason(stderr: str) -> str:
    """The converter's own last word: its error line, not its traceback."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"(\w+(Error|Exception)|ERROR)\b", line)]
    text = (errors or lines or ["no message"])[-1]
    return text if len(text) <= 300 else text[:297] + "..."


def quantize(source: Path, outfile: Path, kind: str) -> None:
    """`source` (a full-precision GGUF) quantized to `kind` by llama.cpp's own quantizer."""
    try:
        import llama_cpp
    except ImportError:
        raise FincheckError(
            f"a quantized export ({kind}) needs llama-cpp-python: pip install "
            f"'llama-cpp-python=={RELEASE}' (it builds llama.cpp, about 5-20 minutes on 2 cores)"
        ) from None
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANTIZED_TYPES[kind]
    params.nthread = os.cpu_count() or 1
    failed = llama_cpp.llama_model_quantize(str(source).encode(), str(outfile).encode(), params)
    if failed:
        raise FincheckError(f"llama.cpp could not quantize {source.name} to {kind} (code {failed})")
