"""`fincheck export --gguf`: a trained adapter as one GGUF file that llama.cpp serves on a CPU.

The adapter is merged into its base in fp32 (`fincheck.serve.merge`: the LoRA update summed
before any rounding), the merged folder converted by llama.cpp's own converter
(`llama_cpp_converter`), and for a quantized type quantized by llama.cpp's own quantizer from the
f32 conversion (one rounding, not two). The folder gets the GGUF file and `fincheck_export.json`:
the source adapter by content (its weights' sha256 and its base's), the converter's release and
the file's sha256, so a served score can be traced to the adapter that made it.

Written into a new folder beside OUT and renamed into place once complete (as merge does): a
kill or a full disk leaves no half-written export.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fincheck.errors import FincheckError
from fincheck.io.checksums import folder_sha256, sha256_file
from fincheck.io.config import REQUIRED, config_field
from fincheck.io.runs import adapter_sha256, load_run
from fincheck.io.safe_files import new_folder, write_text
from fincheck.models.loading import resolve_base, resolve_model
from fincheck.serve import llama_cpp_converter as llama_cpp
from fincheck.serve.merge import MergeOptions, merge_adapter

log = logging.getLogger(__name__)

EXPORT_RECORD = "fincheck_export.json"


@dataclass
class ExportOptions:
    """`fincheck export`."""

    adapter: str = config_field(REQUIRED, "run folder or adapter folder")
    out: Path = config_field(REQUIRED, "output folder (must be new or empty)")
    gguf: bool = config_field(False, "write a GGUF file for llama.cpp (the one format so far)")
    type: Literal[llama_cpp.GGUF_TYPES] = config_field(
        "f16",
        "the GGUF tensor type: f16, bf16, f32 keep full precision; q8_0 ... q4_0 are llama.cpp's "
        "quantized types (smaller and faster on a CPU, a little less exact: see docs/serving.md)",
    )
    model: str | None = config_field(None, "base model (default: the adapter's own base)")
    trust_remote_code: bool = config_field(False, "allow the base's own code")


def export_gguf(opts: ExportOptions) -> dict[str, Any]:
    """Merge, convert (and quantize) into the new folder `out`; returns its record."""
    adapter, out, kind, base = opts.adapter, Path(opts.out), opts.type, opts.model
    if kind not in llama_cpp.GGUF_TYPES:
        raise FincheckError(f"--type {kind}: choose one of {', '.join(llama_cpp.GGUF_TYPES)}")
    run = load_run(adapter)  # one line for a folder that holds no adapter
    base_path = resolve_base(run, base)
    # named after the adapter's folder (`.` and `..` by the folder they stand for, never "")
    named = Path(os.path.abspath(adapter)).name
    with new_folder(out, "export") as staging:
        merged = staging / run.root.name  # the GGUF's general.name
        merge_adapter(MergeOptions(str(run.path), merged, base, "fp32", opts.trust_remote_code))
        name = llama_cpp.gguf_name(named, kind)
        if kind in llama_cpp.FULL_TYPES:
            llama_cpp.convert(merged, staging / name, kind)
        else:
            llama_cpp.convert(merged, staging / "f32.gguf", "f32")
            llama_cpp.quantize(staging / "f32.gguf", staging / name, kind)
            (staging / "f32.gguf").unlink()
        shutil.rmtree(merged)
        record = {
            "format": "gguf",
            "file": name,
            "type": kind,
            "file_sha256": sha256_file(staging / name),
            "adapter": str(run.path),
            "adapter_sha256": adapter_sha256(run.path),
            "base": base_path,
            "base_content": folder_sha256(resolve_model(base_path, log=lambda _: None)),
            "training_window": run.max_length,
            "converter": f"llama.cpp of llama-cpp-python {llama_cpp.RELEASE}",
            "merged_in": "fp32",
        }
        write_text(staging / EXPORT_RECORD, json.dumps(record, indent=2) + "\n")
    log.info("exported %s as %s", run.path, out / name)
    return {**record, "out": str(out)}
