"""Bad input stops with `file:line: field: problem` (or is skipped and counted)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fincheck.commands.cli import main
from fincheck.data.raw_records import iter_records
from fincheck.data_prep.prepare import PrepareConfig, RecordStream, run_prepare
from fincheck.errors import FincheckError
from fincheck.io.sources import resolve_source
from fincheck.tasks import get_task, qasem
from fincheck.tasks.fhsumbench.convert import convert_fhsumbench

GOOD = {
    "id": "x1",
    "text": "The mine is in Peru.",
    "summary": "A gold mine.",
    "inconsistencies": ["Gold is not stated."],
}


def write_final_file(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def prepare_final(tmp_path: Path, data_dir: Path, final: Path, skip: bool = False) -> dict:
    config = PrepareConfig(tasks=["final"], final_file=str(final), skip_invalid=skip)
    return run_prepare(config, data_dir, tmp_path / "out", progress=False, log=lambda _: None)


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"id": "x2", "text": "Some text", "summ', ":3: <json>: not valid JSON"),  # truncated line
        (
            json.dumps({**GOOD, "id": "x2", "inconsistencies": "Gold"}),
            ":3: inconsistencies: expected a list",
        ),
        (json.dumps({"id": "x2", "summary": "s", "inconsistencies": []}), ":3: text: missing"),
        (json.dumps({**GOOD, "text": 42, "id": "x2"}), ":3: text: expected a non-empty string"),
        (json.dumps(GOOD), ":3: id: duplicate record 'x1' (first at line 1)"),
    ],
    ids=["truncated-line", "wrong-type", "missing-field", "wrong-type-text", "duplicate-id"],
)
def test_bad_final_record_names_file_line_field(tmp_path, data_dir, bad_line, expected):
    final = write_final_file(
        tmp_path / "final.jsonl", [json.dumps(GOOD), json.dumps({**GOOD, "id": "x3"}), bad_line]
    )
    with pytest.raises(FincheckError) as info:
        prepare_final(tmp_path, data_dir, final)
    assert f"{final}{expected}" in str(info.value)
    assert "--skip-invalid" in str(info.value)
    # the same file with --skip-invalid: two good items written, one skipped and counted
    manifest = prepare_final(tmp_path, data_dir, final, skip=True)
    assert manifest["skipped_invalid"] == {"final_file": 1}
    assert manifest["counts"]["final"]["test"]["pairs"] == 2


def test_final_items_are_named_by_the_ids_their_pairs_get(tmp_path, data_dir):
    """Items without an id are each their own (named by their line), never "duplicates of
    None" that --skip-invalid would drop; an id given as 1 and as "1" names one pair twice."""
    no_id = {k: v for k, v in GOOD.items() if k != "id"}
    final = write_final_file(tmp_path / "final.jsonl", [json.dumps(no_id)] * 3)
    assert prepare_final(tmp_path, data_dir, final)["counts"]["final"]["test"]["pairs"] == 3
    final = write_final_file(
        tmp_path / "final.jsonl", [json.dumps({**GOOD, "id": 1}), json.dumps({**GOOD, "id": "1"})]
    )
    with pytest.raises(FincheckError, match=r":2: id: duplicate record '1' \(first at line 1\)"):
        prepare_final(tmp_path, data_dir, final)


def test_a_final_file_not_in_utf8_names_its_line_and_one_with_a_bom_is_read(tmp_path, data_dir):
    """A byte that is no UTF-8 (Latin-1 text, a raw surrogate) names the file and the line, as
    JSONL or as a JSON array; a byte-order mark an editor put at the start is not a record's."""
    lines = [json.dumps(GOOD).encode(), json.dumps({**GOOD, "id": "x2"}).encode()]
    for bad in (b'{"id": "x3", "text": "caf\xe9"}', b'{"id": "x3", "text": "\xed\xa0\x80"}'):
        final = tmp_path / "final.jsonl"
        final.write_bytes(b"\n".join([*lines, bad]) + b"\n")
        with pytest.raises(FincheckError, match=rf"{final}:3: <encoding>: not UTF-8 text"):
            prepare_final(tmp_path, data_dir, final)
        array = tmp_path / "final.json"
        array.write_bytes(b"[\n" + b",\n".join([*lines, bad]) + b"\n]")
        with pytest.raises(FincheckError, match=rf"{array}:4: not UTF-8 text"):
            prepare_final(tmp_path, data_dir, array)
    for name, body in (
        ("bom.jsonl", b"\n".join(lines)),
        ("bom-blank.jsonl", b"\r\n" + b"\n".join(lines)),  # a blank first line after the mark
        ("bom.json", b"[" + b",".join(lines) + b"]"),
    ):
        final = tmp_path / name
        final.write_bytes(b"\xef\xbb\xbf" + body + b"\n")
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        manifest = prepare_final(tmp_path, data_dir, final)
        assert manifest["counts"]["final"]["test"]["pairs"] == 2


def test_empty_file_is_an_error(tmp_path, data_dir):
    final = write_final_file(tmp_path / "final.jsonl", [])
    with pytest.raises(FincheckError, match=r"final.jsonl: the file is empty"):
        prepare_final(tmp_path, data_dir, final)


def test_final_file_aliases_and_json_array(tmp_path, data_dir):
    records = [
        {"id": "a", "document": "Doc.", "summary": "S.", "errors": []},
        {
            "id": "b",
            "article": "Doc two.",
            "summary": "S2.",
            "descriptions": {"B": "second", "A": "first"},
        },
    ]
    final = tmp_path / "final.json"
    final.write_text(json.dumps(records, indent=2))
    prepare_final(tmp_path, data_dir, final)
    lines = (tmp_path / "out" / "final" / "test.jsonl").read_text().splitlines()
    targets = [json.loads(line)["messages"][-1]["content"] for line in lines]
    assert targets == ["None", "A. first\nB. second"]


def test_json_array_errors_carry_the_element_line(tmp_path):
    records = [
        {"source": "d", "summary": "s", "label": "no_hallu", "id": 1, "hallu_span": ""},
        {"source": "d", "summary": "s", "label": "maybe", "id": 2, "hallu_span": ""},
    ]
    path = tmp_path / "fh.json"
    path.write_text(json.dumps(records, indent=4))
    stream = RecordStream(skip_invalid=False)
    with pytest.raises(FincheckError, match=r"fh.json:9: label: 'maybe' not in"):
        list(
            stream.convert(
                "fh",
                iter_records(path),
                lambda r: r["id"],
                lambda raw: convert_fhsumbench(raw, "test", get_task("fhsumbench").prompt()),
            )
        )
    truncated = tmp_path / "cut.json"
    truncated.write_text(json.dumps(records, indent=4)[:-30])
    with pytest.raises(FincheckError, match=r"cut.json:\d+: <json>: not valid JSON"):
        list(iter_records(truncated))


def test_checksum_mismatch_missing_file_and_missing_dir(tmp_path, data_dir):
    source = qasem.TEST
    local = tmp_path / "data"
    (local / "qasem").mkdir(parents=True)
    shutil.copy(data_dir / "qasem" / "test.jsonl", local / "qasem" / "test.jsonl")
    assert resolve_source(source, local) == local / "qasem" / "test.jsonl"
    with (local / "qasem" / "test.jsonl").open("a") as f:
        f.write("\n")
    with pytest.raises(
        FincheckError, match=r"test.jsonl: sha256 mismatch for qasem/test.jsonl .* replace it"
    ):
        resolve_source(source, local)
    with pytest.raises(FincheckError, match=r"missing file: .*qasem/dev.jsonl"):
        resolve_source(qasem.DEV, local)
    with pytest.raises(FincheckError, match=r"data directory not found: .*nowhere.*--data-dir"):
        resolve_source(source, tmp_path / "nowhere")


def test_download_path_verifies_and_caches(tmp_path, data_dir, monkeypatch):
    """The real download path, served from a local file URL instead of the network."""
    import dataclasses

    from fincheck.io import sources

    source = dataclasses.replace(qasem.TEST, url=(data_dir / "qasem" / "test.jsonl").as_uri())
    cached = resolve_source(source, None, cache_dir=tmp_path / "cache")
    assert cached == tmp_path / "cache" / "qasem" / "test.jsonl"
    assert sources.sha256_file(cached) == source.sha256
    bad = dataclasses.replace(source, name="qasem/other.jsonl", sha256="0" * 64)
    with pytest.raises(FincheckError, match="download was corrupted"):
        resolve_source(bad, None, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "qasem" / "other.jsonl").exists()
    offline = dataclasses.replace(source, name="qasem/x.jsonl", url="http://127.0.0.1:9/none")
    with pytest.raises(FincheckError, match=r"could not download .* --data-dir"):
        resolve_source(offline, None, cache_dir=tmp_path / "cache")
    # neither failure left a partial or temporary file in the cache
    assert [p.name for p in (tmp_path / "cache" / "qasem").iterdir()] == ["test.jsonl"]


def test_cli_prints_one_line_error_without_traceback(tmp_path, capsys):
    code = main(["prepare", "--data-dir", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 1
    assert (
        err.startswith("fincheck prepare: error: data directory not found")
        and "Traceback" not in err
    )


def test_unknown_recipe_key_fails_with_suggestion(tmp_path, data_dir, capsys):
    code = main(
        ["prepare", "--data-dir", str(data_dir), "--out", str(tmp_path), "--qasem_dev_fractoin=0.2"]
    )
    assert code == 1
    assert "unknown key 'qasem_dev_fractoin'" in capsys.readouterr().err
    config = tmp_path / "bad.yaml"
    config.write_text("seed: thirteen\n")
    assert main(["prepare", "--out", str(tmp_path), "--config", str(config)]) == 1
    assert "seed: expected an integer" in capsys.readouterr().err


def test_final_release_dev_items_stay_out_of_test(tmp_path, data_dir):
    records = [
        {**GOOD, "id": "d1", "split": "dev", "text": "Another document entirely."},
        {**GOOD, "id": "t1", "split": "test"},
        {**GOOD, "id": "t2"},
    ]
    final = write_final_file(tmp_path / "final.jsonl", [json.dumps(r) for r in records])
    manifest = prepare_final(tmp_path, data_dir, final)
    test_ids = [
        json.loads(x)["id"]
        for x in (tmp_path / "out" / "final" / "test.jsonl").read_text().splitlines()
    ]
    dev_ids = [
        json.loads(x)["id"]
        for x in (tmp_path / "out" / "final" / "dev.jsonl").read_text().splitlines()
    ]
    assert test_ids == ["t1", "t2"] and "d1" in dev_ids
    assert manifest["counts"]["final"]["dev"]["pairs"] == 486 + 1


def test_a_reply_body_that_drips_is_stopped_as_stalled(monkeypatch):
    """Every reply body read with bounds (an LLM endpoint's, each of the model hub's, whichever
    library asks) stops as a download does when a window brings fewer bytes than the floor: a
    hub dripping a byte at a time would otherwise hold a command for years."""
    import time

    from fincheck.io import bounded_http

    def dripped():
        while True:
            time.sleep(0.05)
            yield b"x"

    monkeypatch.setattr(bounded_http, "STALLED_WINDOW_S", 0.3)
    body = bounded_http._BoundedBody(dripped(), compressed=False, cap=2**20)
    start = time.monotonic()
    with pytest.raises(bounded_http.UnreadableReply, match=r"stalled: \d+ bytes in the last"):
        b"".join(body)
    assert time.monotonic() - start < 2
    # dripped just above the floor: a reply read into memory has a whole budget too
    monkeypatch.setattr(bounded_http, "STALLED_BYTES", 1)
    monkeypatch.setattr(bounded_http, "MAX_REPLY_SECONDS", 0.5)
    body = bounded_http._BoundedBody(dripped(), compressed=False, cap=2**20)
    with pytest.raises(bounded_http.UnreadableReply, match=r"not read whole within 0\.5 s"):
        b"".join(body)


def test_a_download_that_drips_is_stopped_as_stalled(tmp_path, monkeypatch):
    """A server that sends a few bytes at a time never trips a socket's read timeout: a window
    that brings fewer bytes than the floor stops the download (the same copy serves the data
    sources and the models' wheels), and nothing is left in the cache."""
    import contextlib
    import dataclasses
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from fincheck.io import bounded_http

    class Drip(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.endswith("headers.jsonl"):  # its status line and headers dripped
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n" * 20:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.02)
                return
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            try:
                for _ in range(200):
                    self.wfile.write(b"x" * 10)
                    self.wfile.flush()
                    time.sleep(0.05)
            except (BrokenPipeError, ConnectionResetError):
                pass

    monkeypatch.setattr(bounded_http, "STALLED_WINDOW_S", 0.5)
    monkeypatch.setattr(bounded_http, "STALLED_BYTES", 1_000)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/test.jsonl"
        source = dataclasses.replace(qasem.TEST, url=url)
        start = time.monotonic()
        with pytest.raises(FincheckError, match=r"the download stalled: .* bytes in the last"):
            resolve_source(source, None, cache_dir=tmp_path / "cache")
        assert time.monotonic() - start < 5  # the drip alone would take 10 s
        source = dataclasses.replace(qasem.TEST, url=url.replace("test.jsonl", "headers.jsonl"))
        start = time.monotonic()
        with pytest.raises(FincheckError, match=r"the download stalled: no status line"):
            resolve_source(source, None, cache_dir=tmp_path / "cache")
        assert time.monotonic() - start < 5  # the headers' drip alone takes 15 s
    finally:
        server.shutdown()
        server.server_close()
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []
