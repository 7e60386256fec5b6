"""Files, settings and secrets: JSON/JSONL and raw benchmark records read with their line,
checksums, pinned sources, the output-folder lock, run folders, the one options mechanism,
secret redaction. The core's lowest layers: nothing here loads a model."""
