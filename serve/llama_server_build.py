"""llama.cpp's own C++ server (`llama-server`), built from the llama.cpp that the pinned
llama-cpp-python source archive carries (the archive the converter comes from), into the cache.

Why a second server: llama-cpp-python's server returns logprobs only for a model loaded with
`logits_all`, so it computes the output layer (151,936 words for Qwen2.5) at every prompt
position and keeps a context-sized logits buffer. `llama-server` computes the last position's
only. Users with a llama.cpp of their own (a package manager's, a release binary) need none of
this: any `llama-server` serves a `fincheck export --gguf` file.

The build is cmake's, with the compiler the machine has: the server alone, static, for this
CPU (`GGML_NATIVE`), no web UI and no TLS (nothing to download). About 6 minutes on 2 cores.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from fincheck.errors import FincheckError
from fincheck.io.cache import cache_root
from fincheck.io.safe_files import copy_file, new_folder
from fincheck.io.sources import resolve_source
from fincheck.serve.llama_cpp_converter import RELEASE, SOURCE, VENDORED

BINARY = "llama-server"
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one file: the binary moves into the cache alone
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # the prebuilt UI is a download
    "-DLLAMA_OPENSSL=OFF",
)


def llama_server_dir() -> Path:
    return cache_root() / "tools" / f"llama-server-{RELEASE}"


def built_llama_server() -> Path | None:
    """The cached binary, if a build finished; None otherwise."""
    binary = llama_server_dir() / BINARY
    return binary if binary.is_file() else None


def build_llama_server(jobs: int, progress=None) -> Path:
    """The cached `llama-server`, built first if absent. `progress(percent)` follows cmake's
    own "[ NN%]" lines. The build happens in a scratch folder that is removed afterwards; only
    the binary and llama.cpp's licence are kept, and only once the build succeeded."""
    binary = built_llama_server()
    if binary is not None:
        return binary
    for program in ("cmake", "c++"):
        if shutil.which(program) is None:
            raise FincheckError(
                f"building llama-server needs {program} on PATH (and a C++17 compiler); or use "
                "a llama-server of your own (a package manager's, a llama.cpp release)"
            )
    archive = resolve_source(SOURCE, data_dir=None, cache_dir=cache_root() / "tools")
    final = llama_server_dir()
    try:
        with (
            tempfile.TemporaryDirectory(prefix="llama-server-build-") as scratch,
            new_folder(final, "build") as staging,
        ):
            into = Path(scratch) / "src"
            with tarfile.open(archive) as tar:  # llama.cpp's source tree (vendor/llama.cpp/)
                wanted = [m for m in tar.getmembers() if m.name.startswith(VENDORED)]
                tar.extractall(into, members=wanted, filter="data")
            source = into / VENDORED
            build = Path(scratch) / "build"
            _run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_OPTIONS], None)
            _run(["cmake", "--build", str(build), "--target", BINARY, "-j", str(jobs)], progress)
            copy_file(build / "bin" / BINARY, staging / BINARY, "llama-server")
            (staging / BINARY).chmod(0o755)
            copy_file(source / "LICENSE", staging / "LICENSE", "llama-server")
    except FincheckError:
        if built_llama_server() is None:  # not another process's build, finished first
            raise
    return final / BINARY


def _run(command: list[str], progress) -> None:
    """`command`, following cmake's "[ NN%]" lines; a failure is one line with its last error
    (the output's last 200 lines are kept for it)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: collections.deque[str] = collections.deque(maxlen=200)
    for line in process.stdout:
        tail.append(line.rstrip())
        percent = re.match(r"\[\s*(\d+)%\]", line)
        if percent and progress is not None:
            progress(int(percent.group(1)))
    code = process.wait()
    if code != 0:
        errors = [line for line in tail if "error" in line.lower()] or list(tail) or ["no output"]
        raise FincheckError(
            f"building llama-server failed ({command[0]} {command[1]}, exit {code}): "
            f"{errors[-1].strip()[:300]}"
        )
