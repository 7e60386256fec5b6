"""`fincheck publish`: the model card, the dry-run folder, and pushes to a fake hub on loopback."""

from __future__ import annotations

import gzip
import json
import logging
import re
from pathlib import Path

import pytest
import yaml
from fake_hub import FakeHub, FakeRepo
from serve_tiny_run import build_tiny_run

from fincheck.commands.cli import main
from fincheck.errors import FincheckError
from fincheck.serve.card import metrics_from_results, render_card
from fincheck.serve.publish import PublishOptions, is_main_process, publish

SENTINEL = "hf_SENTINELtoken0123456789abcdefSECRET"
# The shape `fincheck score` writes (fincheck.eval.score): figures per task, CIs, counts.
RESULTS = {
    "run": {"split": "test", "bootstrap_resamples": 1000},
    "tasks": {
        "final": {
            "precision": 0.5,
            "recall": 0.25,
            "f1": 0.3333,
            "binary_bacc": 0.6,
            "n": 12,
            "true_positives": 3,
            "binary_confusion": {"labels": ["c", "i"], "counts": [[1, 2], [3, 4]]},
            "ci95": {"f1": [0.2, 0.4], "precision": None},
            "judge_errors": 0,
        },
        "qasem": {
            "cliff": {
                "bacc": 0.61,
                "auc": 0.66,
                "n": 40,
                "n_supported": 20,
                "ci95": {"bacc": [0.5, 0.7]},
            },
            "factscore": {"bacc": 0.7, "auc": None, "n": 40},
            "overall": {"bacc": 0.65, "auc": 0.7, "n": 80},
        },
        "fhsumbench": {
            "precision": 0.41,
            "recall": 0.43,
            "f": 0.42,
            "accuracy": 0.5,
            "fh_acc": 0.2,
            "nfh_acc": 0.3,
            "noh_acc": 0.9,
            "n": 30,
            "n_parse_failed": 2,
            "parse_failure_rate": 0.07,
            "confusion": {"labels": ["a"], "counts": [[1]]},
            "ci95": {"f": [0.3, 0.5]},
        },
    },
    "counts": {"final": {"n_gold": 12}},
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_run(tmp_path_factory.mktemp("publish"))


@pytest.fixture
def results_file(tmp_path: Path, run_dir: Path) -> Path:
    """RESULTS as `fincheck score` writes them for the adapter of `run_dir` (its sha256)."""
    from fincheck.io.runs import adapter_sha256

    path = tmp_path / "results.json"
    results = {**RESULTS, "run": {**RESULTS["run"], "adapter_sha256": adapter_sha256(run_dir)}}
    path.write_text(json.dumps(results))
    return path


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", SENTINEL)
    monkeypatch.setattr("fincheck.serve.publish._sleep", lambda seconds: None)
    with FakeHub(token=SENTINEL) as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        yield fake


@pytest.fixture
def hub_downloads(hub: FakeHub, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """huggingface_hub's downloads pointed at the fake hub, through fincheck's bounded client;
    the hub cache folder."""
    import huggingface_hub.constants

    from fincheck.io import bounded_http

    cache = tmp_path / "hub-cache"
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.endpoint)
    monkeypatch.setattr(  # both read from HF_ENDPOINT once, when huggingface_hub is imported
        huggingface_hub.constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}",
    )
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    bounded_http.bound_hub_replies()
    return cache


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_metrics_flatten_results_json_exactly():
    rows = {(r.task, r.subset, r.metric): (r.value, r.ci95) for r in metrics_from_results(RESULTS)}
    assert rows == {
        ("final", None, "f1"): (0.3333, (0.2, 0.4)),
        ("final", None, "precision"): (0.5, None),
        ("final", None, "recall"): (0.25, None),
        ("final", None, "binary_bacc"): (0.6, None),
        ("qasem", "cliff", "bacc"): (0.61, (0.5, 0.7)),
        ("qasem", "cliff", "auc"): (0.66, None),
        ("qasem", "factscore", "bacc"): (0.7, None),  # auc null (undefined) is left out
        ("qasem", "overall", "bacc"): (0.65, None),
        ("qasem", "overall", "auc"): (0.7, None),
        ("fhsumbench", None, "f"): (0.42, (0.3, 0.5)),
        ("fhsumbench", None, "precision"): (0.41, None),
        ("fhsumbench", None, "recall"): (0.43, None),
        ("fhsumbench", None, "accuracy"): (0.5, None),
        ("fhsumbench", None, "fh_acc"): (0.2, None),
        ("fhsumbench", None, "nfh_acc"): (0.3, None),
        ("fhsumbench", None, "noh_acc"): (0.9, None),
    }


def test_card_metadata_is_yaml_and_model_index_matches_results(run_dir: Path):
    from huggingface_hub import ModelCard

    from fincheck.io.runs import load_run

    card = render_card(load_run(run_dir), "me/tiny-detector", RESULTS)
    meta = _front_matter(card)
    assert meta["library_name"] == "peft"
    assert meta["license"] == "apache-2.0"
    assert "base_model" not in meta  # a random-init local base has no hub id
    assert {"fincheck", "hallucination-detection", "final", "qasem", "fhsumbench"} <= set(
        meta["tags"]
    )
    # The hub's own parser reads the model-index back to the numbers in results.json.
    parsed = ModelCard(card).data.eval_results
    got = {(e.dataset_type, e.dataset_config, e.metric_type): e.metric_value for e in parsed}
    assert got[("final", None, "f1")] == 0.3333
    assert got[("qasem_consistency", "cliff", "auc")] == 0.66
    assert got[("fhsumbench", None, "f")] == 0.42
    assert len(got) == len(metrics_from_results(RESULTS))
    assert all(e.dataset_split == "test" for e in parsed)
    # Training facts and anchors appear in the prose.
    assert "sha256:" + "ab" * 32 in card
    recorded = json.loads((run_dir / "fincheck_run.json").read_text())["base_fingerprint"]
    assert "Base fingerprint: `" + recorded[:16] in card
    for task, digest in load_run(run_dir).prompt_hashes.items():
        assert f"`{task}`: `{digest}`" in card
    assert (
        "| qasem | cliff | bacc | 0.610 [0.500, 0.700] | 40 | GPT-4o 0.757; MiniCheck-770M 0.704"
        in card
    )
    assert "Detector.from_pretrained(" in card


def test_card_uses_hub_base_id_when_the_base_is_on_the_hub(run_dir: Path):
    from fincheck.io.runs import load_run

    run = load_run(run_dir)
    run.local_base = None
    run.metadata = {**run.metadata, "base_model": "Qwen/Qwen2.5-0.5B-Instruct"}
    run.adapter_config = {
        **run.adapter_config,
        "base_model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct",
    }
    run.adapter_config["r"] = 12
    card = render_card(run, "me/x")
    meta = _front_matter(card)
    assert meta["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert "model-index" not in meta
    # vLLM serves it as a LoRA module on that base; its --max-lora-rank takes 8, 16, 32, ...
    assert (
        "vllm serve Qwen/Qwen2.5-0.5B-Instruct --enable-lora --lora-modules detector=me/x "
        "--max-lora-rank 16 " in card
    )
    # a random-init base is not on the hub: no vLLM command is offered for it
    assert "vllm serve" not in render_card(load_run(run_dir), "me/x")


def test_dry_run_writes_the_exact_repo_folder(
    run_dir: Path, results_file: Path, tmp_path: Path, capsys
):
    out = tmp_path / "repo"
    code = main(
        [
            "publish",
            "--checkpoint",
            str(run_dir),
            "--repo-id",
            "me/tiny",
            "--results",
            str(results_file),
            "--dry-run",
            str(out),
        ]
    )
    assert code == 0
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert {
        "README.md",
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "recipe.yaml",
        "data_manifest.json",
        "results.json",
        "fincheck_run.json",
        "base/config.json",
        "base/model.safetensors",
    } <= set(files)
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)
    # The printed list is the folder's list.
    printed = [line.strip() for line in capsys.readouterr().out.splitlines()[1:]]
    assert printed == files
    # The shipped adapter points at the shipped base, not at a path on this machine.
    assert (
        json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "base"
    )
    assert json.loads((out / "fincheck_run.json").read_text())["base_model"] == "base"
    assert json.loads((out / "results.json").read_text()) == json.loads(results_file.read_text())


def test_dry_run_refuses_a_non_empty_folder(run_dir: Path, tmp_path: Path):
    (tmp_path / "x.txt").write_text("keep me")
    with pytest.raises(FincheckError, match="not empty"):
        publish(PublishOptions(run_dir, "me/tiny", dry_run=tmp_path))


def test_dry_run_into_a_dangling_link_names_the_link_and_writes_nothing(run_dir, tmp_path):
    """The link's target is never made; the error names the link, not a staging folder that
    is gone by the time the user reads it."""
    (tmp_path / "repo").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FincheckError, match=rf"^{tmp_path / 'repo'}: not empty \(or not a folder"):
        publish(PublishOptions(run_dir, "me/tiny", dry_run=tmp_path / "repo"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def test_publish_to_fake_hub_then_republish_changes_nothing(
    run_dir: Path, results_file: Path, hub: FakeHub
):
    first = publish(
        PublishOptions(run_dir, "me/tiny", results=results_file, private=True), base_delay=0.01
    )
    assert first is not None and first.changed
    stored = hub.files("me/tiny")
    assert set(stored) == set(first.files)
    assert (
        stored["adapter_model.safetensors"] == (run_dir / "adapter_model.safetensors").read_bytes()
    )
    assert hub.repos["me/tiny"].private
    second = publish(PublishOptions(run_dir, "me/tiny", results=results_file), base_delay=0.01)
    assert second is not None and not second.changed
    assert hub.repos["me/tiny"].commits == 1  # no empty commit


def test_republish_removes_what_it_no_longer_ships_but_keeps_user_files(
    run_dir: Path, results_file: Path, hub: FakeHub
):
    publish(PublishOptions(run_dir, "me/tiny", results=results_file), base_delay=0.01)
    hub.files("me/tiny")["notes.md"] = b"added by hand on the hub"
    result = publish(PublishOptions(run_dir, "me/tiny"), base_delay=0.01)  # now without results
    assert result is not None and result.changed
    stored = hub.files("me/tiny")
    assert "results.json" not in stored  # would contradict the new card
    assert "model-index" not in stored["README.md"].decode()
    assert stored["notes.md"] == b"added by hand on the hub"
    assert hub.repos["me/tiny"].commits == 2


def test_publish_to_a_branch(run_dir: Path, hub: FakeHub):
    result = publish(PublishOptions(run_dir, "me/tiny", revision="v1"), base_delay=0.01)
    assert result is not None and result.revision == "v1"
    assert "README.md" in hub.files("me/tiny", "v1")
    assert hub.files("me/tiny", "main") == {}


def test_transient_5xx_is_retried(run_dir: Path, hub: FakeHub, caplog):
    hub.fail_next("commit", 503)
    hub.fail_next("create", 502)
    with caplog.at_level(logging.WARNING):
        result = publish(PublishOptions(run_dir, "me/tiny"), base_delay=0.01)
    assert result is not None and result.changed
    assert hub.repos["me/tiny"].commits == 1
    assert "HTTP 503, retrying" in caplog.text


def test_persistent_5xx_gives_up_with_a_message(run_dir: Path, hub: FakeHub):
    hub.fail_next("commit", 500, 500, 500)
    with pytest.raises(FincheckError, match="upload failed: HTTP 500"):
        publish(PublishOptions(run_dir, "me/tiny"), attempts=3, base_delay=0.01)


@pytest.mark.parametrize("silent", ["create", "commit"])
def test_a_hub_that_never_answers_is_given_up_on_at_the_deadline(
    silent, run_dir: Path, hub: FakeHub, capsys
):
    """A hub that accepts the connection and never answers (reading the repo or taking the
    upload): each hub call, its retries included, ends within --hub-timeout, as one line."""
    import time

    hub.silent.add(silent)
    start = time.monotonic()
    code = main(
        ["publish", "--checkpoint", str(run_dir), "--repo-id", "me/tiny", "--hub-timeout", "1.5"]
    )
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    what = {"create": "create repo", "commit": "upload"}[silent]
    assert f"{what}: no answer from the hub within 1.5 s" in err[0] and "--hub-timeout" in err[0]


def test_a_hub_that_drips_its_status_line_is_given_up_on_in_one_line(
    run_dir: Path, hub: FakeHub, capsys, monkeypatch
):
    """A status line sent a byte at a time never trips a read timeout: every hub call (this
    route as a model's download, whichever library asks) waits for a reply's head at most
    `MAX_REPLY_SECONDS` (1 s here) after its request is sent, then stops in one line."""
    import time

    from fincheck.io import bounded_http

    monkeypatch.setattr(bounded_http, "MAX_REPLY_SECONDS", 1.0)
    hub.dripped.add("info")
    start = time.monotonic()
    code = main(["publish", "--checkpoint", str(run_dir), "--repo-id", "me/tiny"])
    assert time.monotonic() - start < 8  # the drip alone: 18 bytes of a line, 1,000 times over
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("fincheck publish: error: the model hub's reply to GET http://")
    assert "/api/models/me/tiny: no status line and headers within 1 s" in err[0]
    hub.dripped.clear()  # a hub that answers in time: the same publish goes through
    assert main(["publish", "--checkpoint", str(run_dir), "--repo-id", "me/tiny"]) == 0


@pytest.mark.parametrize(
    "body, headers, said",
    [
        (gzip.compress(b" " * 512 * 2**20), {"Content-Encoding": "gzip"}, "inflates to more than"),
        (b"[" + b"0," * 10 * 2**20 + b"0]", {}, "a reply of more than 16,777,216 bytes"),
    ],
    ids=["gzip-bomb", "20-MiB-json"],
)
@pytest.mark.parametrize("route", ["direct", "redirected"])
def test_a_hub_reply_too_large_is_one_line_and_costs_bounded_memory(
    run_dir: Path, hub: FakeHub, capsys, body, headers, said, route
):
    """The hub's API replies are read as an LLM endpoint's are (every command, whichever
    route: huggingface_hub's shared client is made bounded): a repo-info reply inflating to 512
    MiB, or a 20 MiB one, is not read, and `fincheck publish` says so in one line."""
    import tracemalloc

    if route == "redirected":  # an API reply redirected out of /api/ keeps the API's cap
        hub.moved.add("info")
        hub.raw["moved"] = (body, headers)
    else:
        hub.raw["info"] = (body, headers)
    tracemalloc.start()
    code = main(["publish", "--checkpoint", str(run_dir), "--repo-id", "me/tiny"])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("fincheck publish: error: the model hub's reply to GET http://")
    assert said in err[0] and "/api/models/me/tiny" in err[0]  # (after /moved when redirected)
    assert peak < 200 * 2**20  # the cap and its copies, never the half gigabyte
    assert [r.path for r in hub.requests].count("/api/models/me/tiny") == 1  # not retried


ADAPTER_CONFIG_BYTES = json.dumps({"peft_type": "LORA", "r": 8}).encode()


@pytest.mark.parametrize("redirected", [False, True], ids=["resolve", "redirected-to-cdn"])
@pytest.mark.parametrize(
    "body, headers, said",
    [
        (gzip.compress(ADAPTER_CONFIG_BYTES), {"Content-Encoding": "gzip"}, None),
        (gzip.compress(b" " * 512 * 2**20), {"Content-Encoding": "gzip"}, "inflates to more than"),
        (b" " * 3 * 2**20, {}, "a reply of more than 1,048,576 bytes"),
    ],
    ids=["gzip-file", "gzip-bomb", "3-MiB-file"],
)
def test_a_file_the_hub_sends_is_capped_as_sent_and_as_inflated(
    hub: FakeHub, hub_downloads: Path, monkeypatch, body, headers, said, redirected
):
    """A file's content (`/resolve/`, streamed to disk by huggingface_hub) has a cap of its own
    (the hub's 50 GB for a plain download, lowered here to 1 MiB), as sent and as inflated: a
    hub adapter's config that inflates to 512 MiB, or one of 3 MiB, stops at the cap in one line
    and leaves at most the cap on disk; a file sent gzipped within the cap arrives whole."""
    from fincheck.io import bounded_http
    from fincheck.models.loading import local_adapter_dir

    cache = hub_downloads
    monkeypatch.setattr(bounded_http, "MAX_HUB_FILE_BYTES", 2**20)
    hub.repos["me/adapter"] = FakeRepo(private=False)
    hub.repos["me/adapter"].branches["main"]["adapter_config.json"] = ADAPTER_CONFIG_BYTES
    hub.redirect_files = redirected  # a large file comes from the hub's CDN, not /resolve/
    hub.raw["cdn" if redirected else "resolve"] = (body, headers)
    if said is None:
        folder = local_adapter_dir("me/adapter")
        assert (folder / "adapter_config.json").read_bytes() == ADAPTER_CONFIG_BYTES
        return
    with pytest.raises(FincheckError) as caught:
        local_adapter_dir("me/adapter")
    message = str(caught.value)
    assert "\n" not in message and said in message, message
    assert re.search(r"/me/adapter/(?:resolve/)?\w+/adapter_config\.json", message)
    assert "a hub file is capped at 1,048,576 bytes" in message
    on_disk = sum(path.stat().st_size for path in cache.rglob("*") if path.is_file())
    assert on_disk <= 2**20


def test_a_file_stored_on_xet_comes_through_the_bounded_client(
    hub: FakeHub, hub_downloads: Path, monkeypatch
):
    """A file whose metadata names a Xet hash (the hub's Xet storage) is fetched over the plain
    download route, not by hf_xet's own client: it arrives whole, and past the file cap it
    stops in the same one line as any hub file."""
    from fincheck.io import bounded_http
    from fincheck.models.loading import local_adapter_dir

    hub.xet = True
    hub.repos["me/adapter"] = FakeRepo(private=False)
    hub.repos["me/adapter"].branches["main"]["adapter_config.json"] = ADAPTER_CONFIG_BYTES
    folder = local_adapter_dir("me/adapter")
    assert (folder / "adapter_config.json").read_bytes() == ADAPTER_CONFIG_BYTES
    assert [r.path for r in hub.requests if "xet" in r.path] == []  # no Xet token asked for

    monkeypatch.setattr(bounded_http, "MAX_HUB_FILE_BYTES", 2**20)
    hub.repos["me/big"] = FakeRepo(private=False)
    hub.repos["me/big"].branches["main"]["adapter_config.json"] = ADAPTER_CONFIG_BYTES
    hub.raw["resolve"] = (b" " * 3 * 2**20, {})
    with pytest.raises(FincheckError, match="a hub file is capped at 1,048,576 bytes"):
        local_adapter_dir("me/big")


def test_an_error_reply_to_a_file_request_is_capped_as_an_api_reply(
    hub: FakeHub, hub_downloads: Path, monkeypatch
):
    """An error's body is read into memory to say what failed: a 403 of 20 MiB to a file's
    GET keeps the 16 MiB cap, whatever the file cap."""
    from fincheck.io import bounded_http
    from fincheck.models.loading import local_adapter_dir

    monkeypatch.setattr(bounded_http, "MAX_HUB_FILE_BYTES", 64 * 2**20)
    hub.repos["me/adapter"] = FakeRepo(private=False)
    hub.repos["me/adapter"].branches["main"]["adapter_config.json"] = ADAPTER_CONFIG_BYTES
    hub.raw["resolve"] = (b" " * 20 * 2**20, {":status": "403"})
    with pytest.raises(FincheckError, match="a reply of more than 16,777,216 bytes"):
        local_adapter_dir("me/adapter")


def test_a_large_file_from_the_hub_s_cdn_is_not_capped_as_an_api_reply(
    hub: FakeHub, hub_downloads: Path
):
    """Only the hub's API replies (`/api/`) are read into memory and capped at 16 MiB: a file
    of 20 MiB redirected from `/resolve/` to the CDN's own path arrives whole."""
    from fincheck.models.loading import local_adapter_dir

    weights = b"\0" * 20 * 2**20
    hub.repos["me/adapter"] = FakeRepo(private=False)
    hub.repos["me/adapter"].branches["main"].update(
        {"adapter_config.json": ADAPTER_CONFIG_BYTES, "adapter_model.safetensors": weights}
    )
    hub.redirect_files = True
    folder = local_adapter_dir("me/adapter")
    assert (folder / "adapter_model.safetensors").stat().st_size == len(weights)


def test_bad_token_is_a_clear_401_message(run_dir: Path, hub: FakeHub, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    code = main(["publish", "--checkpoint", str(run_dir), "--repo-id", "me/tiny"])
    err = capsys.readouterr().err
    assert code == 1
    assert "401 Unauthorized" in err and "HF_TOKEN" in err
    assert hub.repos == {}


def test_forbidden_is_a_clear_403_message(run_dir: Path, hub: FakeHub):
    hub.fail_next("create", 403)
    hub.fail_next("info", 403)
    with pytest.raises(FincheckError, match="403 Forbidden"):
        publish(PublishOptions(run_dir, "other-org/tiny"), base_delay=0.01)


def test_no_token_says_how_to_log_in(run_dir: Path, monkeypatch, tmp_path: Path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no saved login
    import huggingface_hub.constants

    monkeypatch.setattr(
        huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token")
    )
    with pytest.raises(FincheckError, match="HF_TOKEN"):
        publish(PublishOptions(run_dir, "me/tiny"))


def test_only_rank_zero_publishes(run_dir: Path, hub: FakeHub, monkeypatch):
    assert is_main_process({}) and is_main_process({"RANK": "0", "LOCAL_RANK": "0"})
    assert not is_main_process({"RANK": "1"}) and not is_main_process({"LOCAL_RANK": "3"})
    assert not is_main_process({"RANK": "2", "LOCAL_RANK": "0"})  # node 2's local rank 0
    monkeypatch.setenv("RANK", "1")
    assert publish(PublishOptions(run_dir, "me/tiny")) is None
    assert hub.requests == []


def test_token_never_leaks(
    run_dir: Path, results_file: Path, hub: FakeHub, tmp_path: Path, capsys, caplog, monkeypatch
):
    """The sentinel token reaches the hub only as an Authorization header: never in printed
    output, logs, the dry-run folder or any uploaded file -- also on the failure paths."""
    import huggingface_hub.constants

    out = tmp_path / "dry"
    # Loudest logging there is: huggingface_hub at DEBUG with HF_DEBUG (it logs curl commands).
    monkeypatch.setattr(huggingface_hub.constants, "HF_DEBUG", True)
    caplog.set_level(logging.DEBUG, logger="huggingface_hub")
    with caplog.at_level(logging.DEBUG):
        assert (
            main(
                [
                    "publish",
                    "--checkpoint",
                    str(run_dir),
                    "--repo-id",
                    "me/tiny",
                    "--results",
                    str(results_file),
                    "--dry-run",
                    str(out),
                ]
            )
            == 0
        )
        assert (
            main(
                [
                    "publish",
                    "--checkpoint",
                    str(run_dir),
                    "--repo-id",
                    "me/tiny",
                    "--results",
                    str(results_file),
                ]
            )
            == 0
        )
        hub.fail_next("commit", 503, 500, 500, 500, 500)
        assert main(["publish", "--checkpoint", str(run_dir), "--repo-id", "me/other"]) == 1
        hub.fail_next("create", 403)
        hub.fail_next("info", 403)
        assert main(["publish", "--checkpoint", str(run_dir), "--repo-id", "me/forbidden"]) == 1
    captured = capsys.readouterr()
    assert SENTINEL not in captured.out + captured.err
    assert SENTINEL not in caplog.text
    assert "Send: curl" in caplog.text  # the debug log really ran, with the token hidden
    for path in out.rglob("*"):
        if path.is_file():
            assert SENTINEL.encode() not in path.read_bytes(), path
    for content in hub.files("me/tiny").values():
        assert SENTINEL.encode() not in content
    # It was sent, as a header only: the test would be vacuous otherwise.
    assert any(r.headers.get("authorization") == f"Bearer {SENTINEL}" for r in hub.requests)
    assert not any(SENTINEL.encode() in r.body for r in hub.requests)


def test_card_rejected_by_the_hub_is_a_clear_error(run_dir: Path, hub: FakeHub):
    hub.fail_next("validate", 400)
    with pytest.raises(FincheckError, match=r"upload: Invalid metadata in README\.md"):
        publish(PublishOptions(run_dir, "me/tiny"), base_delay=0.01)
    assert hub.repos["me/tiny"].commits == 0


def test_results_of_another_adapter_or_of_no_adapter_are_refused(run_dir, results_file, tmp_path):
    results = json.loads(results_file.read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**results, "run": {**results["run"], "adapter_sha256": "0" * 64}}))
    with pytest.raises(FincheckError, match="computed with another adapter"):
        publish(PublishOptions(run_dir, "me/tiny", results=other, dry_run=tmp_path / "a"))
    other.write_text(json.dumps(RESULTS))  # no adapter recorded: a base model's results
    with pytest.raises(FincheckError, match="does not record which adapter"):
        publish(PublishOptions(run_dir, "me/tiny", results=other, dry_run=tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    shapes = {"tasks": ["final"], "run": 5, "counts.final": {"final": "x"}}
    shapes |= {"run.adapter_sha256": {**results["run"], "adapter_sha256": 12345}}
    final = results["tasks"]["final"]
    for bad in ({"ci95": {"f1": ["a", 1]}}, {"f1": 10**400}):  # a figure the card reads
        other.write_text(json.dumps({**results, "tasks": {"final": {**final, **bad}}}))
        with pytest.raises(FincheckError, match=r"other\.json: a figure of another shape"):
            publish(PublishOptions(run_dir, "me/tiny", results=other, dry_run=tmp_path / "c"))
    for where, value in shapes.items():
        edited = {where.split(".")[0]: value}
        other.write_text(json.dumps({**results, **edited}))  # of another shape: one line
        with pytest.raises(FincheckError, match=rf"other\.json: {where} is "):
            publish(PublishOptions(run_dir, "me/tiny", results=other, dry_run=tmp_path / "c"))


def test_a_dry_run_refuses_the_user_s_token_as_the_upload_would(
    run_dir, results_file, tmp_path, monkeypatch
):
    """The token a user holds (of any shape) inside a file of the upload: the dry run, which
    reads no token to upload with, refuses it as the upload would, and writes nothing; its
    results are strict JSON (an undefined figure is null, not NaN)."""
    monkeypatch.setenv("HF_TOKEN", "plainTOKvalue98765")  # no token shape: found by its value
    results = json.loads(results_file.read_text())
    holding = tmp_path / "holding.json"
    holding.write_text(json.dumps({**results, "note": "plainTOKvalue98765"}))
    with pytest.raises(FincheckError, match=r"results\.json of the upload holds a secret"):
        publish(PublishOptions(run_dir, "me/tiny", results=holding, dry_run=tmp_path / "a"))
    assert not (tmp_path / "a").exists()
    task = next(iter(results["tasks"]))
    undefined = {**results["tasks"][task], "undefined_figure": float("nan")}
    holding.write_text(json.dumps({**results, "tasks": {**results["tasks"], task: undefined}}))
    publish(PublishOptions(run_dir, "me/tiny", results=holding, dry_run=tmp_path / "b"))
    strict = {"parse_constant": lambda constant: pytest.fail(f"{constant} is no JSON")}
    written = json.loads((tmp_path / "b" / "results.json").read_text(), **strict)
    assert written["tasks"][task]["undefined_figure"] is None


@pytest.mark.parametrize("repo_id", ["me/x y", "me", "a/b/c", "me/x..y", "-me/x"])
def test_an_invalid_repo_id_is_refused_before_anything_is_built(run_dir, tmp_path, repo_id):
    with pytest.raises(FincheckError, match="not a valid hub repo id"):
        publish(PublishOptions(run_dir, repo_id, dry_run=tmp_path / "repo"))
    assert not (tmp_path / "repo").exists()


def _trained_with_base_as_it_is(run: Path) -> None:
    """The run's record names its base/ as it is now (as if trained with the files planted in
    it): what publish then ships of it is what is tested."""
    from fincheck.io.checksums import folder_sha256

    record = json.loads((run / "fincheck_run.json").read_text())
    record["base_fingerprint"] = folder_sha256(run / "base")
    (run / "fincheck_run.json").write_text(json.dumps(record))


def test_symlinks_out_of_the_run_are_never_uploaded(run_dir, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    secret = tmp_path / "secret.txt"
    secret.write_text("hf_SECRET")
    (run / "tokenizer_config.json").unlink()
    (run / "tokenizer_config.json").symlink_to(secret)
    with pytest.raises(FincheckError, match="symlink or not a regular file"):
        publish(PublishOptions(run, "me/tiny", dry_run=tmp_path / "repo"))
    # refused half-way (the weights were already copied): nothing is left behind
    assert not (tmp_path / "repo").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".repo.")]
    (run / "tokenizer_config.json").unlink()
    shutil.copy2(run_dir / "tokenizer_config.json", run / "tokenizer_config.json")
    (run / "base" / "notes.txt").symlink_to(secret)  # inside the shipped base: skipped
    _trained_with_base_as_it_is(run)
    publish(PublishOptions(run, "me/tiny", dry_run=tmp_path / "repo2"))
    uploaded = [p for p in (tmp_path / "repo2").rglob("*") if p.is_file()]
    assert all("hf_SECRET" not in p.read_text(errors="ignore") for p in uploaded)
    assert not (tmp_path / "repo2" / "base" / "notes.txt").exists()


def test_a_sample_is_labelled_with_its_n_and_kept_out_of_the_model_index(run_dir):
    from huggingface_hub import ModelCard

    from fincheck.io.runs import load_run

    sample = {**RESULTS, "counts": {"final": {"n_gold": 1075, "n_scored": 12}}}
    card = render_card(load_run(run_dir), "me/tiny", sample)
    assert "| final | all | f1 | 0.333 [0.200, 0.400] | 12 of 1,075 (sample) |" in card
    assert "final: computed on a sample of the evaluation split" in card
    parsed = ModelCard(card).data.eval_results
    assert parsed and all(e.dataset_type != "final" for e in parsed)


def test_figures_at_a_dev_threshold_are_named_so_on_the_card_and_in_the_model_index(run_dir):
    """FINAL scored with `--threshold final=T` (lists below T held back): every figure the
    threshold changes is named with it, the flag AUC (threshold-free) is not, and the card says
    what the threshold does; without one, nothing is named."""
    from huggingface_hub import ModelCard

    from fincheck.io.runs import load_run

    final = {**RESULTS["tasks"]["final"], "threshold": 0.7043, "flag_auc": 0.66}
    results = {**RESULTS, "tasks": {**RESULTS["tasks"], "final": final}}
    card = render_card(load_run(run_dir), "me/tiny", results)
    assert "| final | all | f1 at the dev threshold 0.7043 | 0.333 [0.200, 0.400] |" in card
    assert "| final | all | flag\\_auc | 0.660 |" in card
    assert "is below T is held back" in card
    names = {e.metric_type: e.metric_name for e in ModelCard(card).data.eval_results}
    assert names["binary_bacc"] == "binary_bacc at the dev threshold 0.7043"
    assert names["flag_auc"] == "flag_auc"
    plain = render_card(load_run(run_dir), "me/tiny", RESULTS)
    assert "at the dev threshold" not in plain and "is below T is held back" not in plain


def test_the_card_names_the_tasks_of_the_training_mixture_not_of_the_prepared_folder(run_dir):
    """The prepared folder held all three tasks (its manifest hashes every prompt); the run
    trained on QASem and FHSumBench only. The card's tags, task list, prompt hashes and data
    origins say what the adapter trained on: no `final` tag, no DeFacto."""
    from fincheck.io.runs import load_run

    run = load_run(run_dir)
    assert set(run.prompt_hashes) == {"final", "qasem", "fhsumbench"}  # the manifest's
    run.metadata = {**run.metadata, "tasks": ["qasem", "fhsumbench"]}  # what train records
    card = render_card(run, "me/tiny", RESULTS)
    tags = set(_front_matter(card)["tags"])
    assert {"qasem", "fhsumbench"} <= tags and "final" not in tags
    assert "Tasks this adapter was trained on: `qasem`, `fhsumbench`." in card
    assert "`final`: `" not in card and "DeFacto" not in card.split("## Results")[0]
    # a run written before train recorded its tasks: the tasks that had training pairs
    run.metadata = {k: v for k, v in run.metadata.items() if k != "tasks"}
    run.metadata["data"] = {"train_examples": {"qasem": 976, "fhsumbench": 493, "final": 0}}
    assert load_run(run_dir).tasks == ["final", "qasem", "fhsumbench"]  # no record: the hashes
    assert run.tasks == ["qasem", "fhsumbench"]


def test_the_cards_anchors_state_how_their_setting_differs(run_dir):
    """Beside the papers' rows the card says, per task, what differs: the items, the training
    regime, and the same-size rows it shows."""
    from fincheck.io.runs import load_run

    card = render_card(load_run(run_dir), "me/tiny", RESULTS)
    results = card.split("## Results")[1]
    assert "The anchors are the papers' own runs, in their settings, not this card's:" in results
    assert "Qwen2.5-0.5B vanilla 0.222" in results  # the same-size FHSumBench row
    assert "fine-tuned on 40% of the source documents" in results
    assert "- FINAL: FINAL's rows are prompted LLMs (no training)" in results


def test_the_card_names_no_local_path_and_no_github_repo_as_a_dataset(run_dir, tmp_path):
    from fincheck.io.runs import load_run

    run = load_run(run_dir)
    run.recipe = {**run.recipe, "output_dir": "/home/me/runs/x", "dataset_dir": "/data/prepared"}
    card = render_card(run, "me/tiny", RESULTS)
    meta = _front_matter(card)
    assert "datasets" not in meta
    assert "/home/me" not in card and "/data/prepared" not in card
    assert str(tmp_path.parent) not in card and str(run_dir) not in card
    assert "SPEC" not in card


def test_a_checkpoint_folder_publishes_the_runs_base_and_no_local_path(run_dir, tmp_path):
    """`--checkpoint run/checkpoint-20`: the random-init base lives in run/base, one level up."""
    import shutil

    from fincheck.train.checkpoints import COMPLETE_MARKER

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    checkpoint = run / "checkpoint-20"
    checkpoint.mkdir()
    for name in (
        "adapter_model.safetensors",
        "adapter_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "recipe.yaml",
    ):
        shutil.copy2(run / name, checkpoint / name)
    metadata = json.loads((run / "fincheck_run.json").read_text())
    (checkpoint / COMPLETE_MARKER).write_text(json.dumps({**metadata, "step": 20}))
    out = tmp_path / "repo"
    publish(PublishOptions(checkpoint, "me/tiny", dry_run=out))
    assert (out / "base" / "config.json").is_file() and (
        out / "base" / "model.safetensors"
    ).is_file()
    assert (
        json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "base"
    )
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".md", ".yaml"):
            assert str(tmp_path) not in path.read_text(), path
    assert "shipped with the adapter (folder `base/`)" in (out / "README.md").read_text()


@pytest.mark.slow  # 9 s: runs the snippet in a subprocess
def test_the_cards_snippet_reproduces_detect_without_fincheck(run_dir, tmp_path, capsys):
    """The card's transformers + PEFT snippet, run in a process that cannot import fincheck,
    on the published folder (its prompts/ shipped), writes fincheck detect's FINAL answer."""
    import re
    import subprocess
    import sys

    from fincheck.commands.cli import main
    from fincheck.serve.publish import PublishOptions, publish

    repo = tmp_path / "repo"
    publish(PublishOptions(run_dir, "me/tiny", dry_run=repo))
    assert sorted(p.name for p in (repo / "prompts").iterdir()) == [
        "fhsumbench.txt",
        "final.txt",
        "qasem.txt",
    ]
    card = (repo / "README.md").read_text()
    snippet = re.search(r"Without fincheck.*?```python\n(.*?)```", card, flags=re.S).group(1)
    snippet = snippet.replace('repo = "me/tiny"', f'repo = "{repo}"').replace(
        "max_new_tokens=384", "max_new_tokens=24"
    )
    (repo / "article.txt").write_text("The bridge opened in 2020 and cost 4 million euros.")
    (repo / "summary.txt").write_text("The bridge opened in 2021.")
    (tmp_path / "snippet.py").write_text(snippet)
    blocked = "import sys; sys.modules['fincheck'] = None; exec(open(sys.argv[1]).read())"
    plain = subprocess.run(
        [sys.executable, "-c", blocked, str(tmp_path / "snippet.py")],
        cwd=repo, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr[-2000:]

    assert main(["detect", "--adapter", str(repo), "--model", str(repo / "base"), "--device",
                 "cpu", "--max-new-tokens", "24", "--text", str(repo / "article.txt"),
                 "--summary", str(repo / "summary.txt")]) == 0  # fmt: skip
    detected = json.loads(capsys.readouterr().out)
    assert detected["raw"]["final"] and plain.stdout.strip() == detected["raw"]["final"]


def test_a_shipped_base_uploads_only_a_models_files(run_dir, tmp_path, caplog):
    """base/ is copied by allow-list: config, safetensors weights, tokenizer; a `.env`, a key,
    a hard link to a file elsewhere on the machine are left out and named."""
    import logging
    import os
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    base = run / "base"
    (base / ".env").write_text("HF_TOKEN=hf_secret")
    (base / ".ssh").mkdir()
    (base / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    outside = tmp_path / "outside.json"
    outside.write_text('{"secret": 1}')
    (base / "generation_config.json").unlink(missing_ok=True)
    os.link(outside, base / "generation_config.json")  # an allowed name, but a hard link
    _trained_with_base_as_it_is(run)
    out = tmp_path / "repo"
    with caplog.at_level(logging.WARNING):
        publish(PublishOptions(run, "me/tiny", dry_run=out))
    shipped = sorted(p.name for p in (out / "base").iterdir())
    assert ".env" not in shipped and ".ssh" not in shipped
    assert "generation_config.json" not in shipped and "model.safetensors" in shipped
    assert ".env" in caplog.text and "generation_config.json" in caplog.text
    for path in out.rglob("*"):
        if path.is_file():
            assert b"hf_secret" not in path.read_bytes() and b"PRIVATE KEY" not in path.read_bytes()


def test_an_adapter_that_is_not_safetensors_is_refused(run_dir, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "adapter_model.safetensors").write_bytes(b"\x80\x04\x95 a pickle, renamed")
    with pytest.raises(FincheckError, match="is not a safetensors file"):
        publish(PublishOptions(run, "me/tiny", dry_run=tmp_path / "repo"))
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_a_hard_linked_file_of_the_run_is_refused(run_dir, tmp_path):
    """A tokenizer file that is a hard link shares its bytes with a file elsewhere on this
    machine (a key, a saved token): refused, named, nothing left behind. base/ leaves such a
    file out; the run's own files are refused, since the adapter cannot go without them."""
    import os
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    secret = tmp_path / "token.json"
    secret.write_text('{"token": "hf_SECRET"}')
    (run / "tokenizer_config.json").unlink()
    os.link(secret, run / "tokenizer_config.json")
    with pytest.raises(FincheckError, match=r"tokenizer_config\.json is a hard link") as error:
        publish(PublishOptions(run, "me/tiny", dry_run=tmp_path / "repo"))
    assert "hf_SECRET" not in str(error.value)
    assert not (tmp_path / "repo").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".repo.")]


@pytest.mark.parametrize(
    "header",
    [
        b"[1]",
        b'"weights"',
        b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": "ab"}}',
        b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, null]}}',
        b'{"w": [0, 4]}',
    ],
)
def test_an_adapter_whose_header_is_json_of_another_shape_is_one_line(header, run_dir, tmp_path):
    """A header that is JSON but not a safetensors header (a list, a string, offsets that are
    no numbers) is the same one line as a renamed pickle, not a traceback."""
    import shutil
    import struct

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    data = struct.pack("<Q", len(header)) + header + b"\0" * 16
    (run / "adapter_model.safetensors").write_bytes(data)
    with pytest.raises(FincheckError, match="is not a safetensors file"):
        publish(PublishOptions(run, "me/tiny", dry_run=tmp_path / "repo"))


def test_a_run_whose_recorded_recipe_holds_a_secret_is_not_published(run_dir, tmp_path):
    """A run trained before training refused secrets (or a recipe.yaml edited by hand) holds
    `model_init_kwargs: {token: hf_...}`: publishing would put it in recipe.yaml and the card."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe["model_init_kwargs"] = {"token": SENTINEL}
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(FincheckError, match=r"model_init_kwargs\.token holds a secret") as error:
        publish(PublishOptions(run, "me/tiny", dry_run=tmp_path / "repo"))
    assert SENTINEL not in str(error.value)
    assert not (tmp_path / "repo").exists()


def test_card_values_are_data_never_markup_or_code(run_dir: Path):
    """Whatever a run folder or a flag holds reaches the card checked against its grammar (a hub
    id) or escaped for where it lands: a fenced block it cannot close, a code span, prose."""
    from fincheck.io.runs import load_run
    from fincheck.serve.card import published_base

    injected = "Qwen/Qwen2.5-0.5B\nimport os; os.system('touch /tmp/x')\n#"
    with pytest.raises(FincheckError, match=r"--base-model-id .* is not a valid hub repo id"):
        published_base(load_run(run_dir), injected)
    run = load_run(run_dir)
    run.local_base = None
    run.metadata = {**run.metadata, "base_model_id": injected}  # a tampered run record
    with pytest.raises(FincheckError, match="is not a valid hub repo id"):
        render_card(run, "me/x")

    run = load_run(run_dir)
    fence_break = "x\n```\n</details><script>alert(1)</script>\n```"
    run.recipe = {**run.recipe, "run_name": fence_break}
    run.adapter_config = {**run.adapter_config, "target_modules": ["q_proj", "<img src=x onerror=alert(1)>"]}  # fmt: skip
    run.metadata = {**run.metadata, "base_origin": "<b>mine</b> [link](http://x)"}
    card = render_card(run, "me/x")
    fence = "````"  # one longer than the value's own backtick runs
    block = card[card.index(f"{fence}yaml\n") : card.index(f"{fence}\n\n</details>")]
    assert "<script>" in block and card.count("<script>") == 1  # only inside the block
    assert "`<img src=x onerror=alert(1)>`" in card and "<img" not in card.replace("`<img", "")
    assert "&lt;b&gt;mine&lt;/b&gt; \\[link\\]\\(http://x\\)" in card
    # a task name from the run's record, and the names of a results row, land as prose: no
    # HTML, no link, no table cell broken, wherever the template puts them
    run = load_run(run_dir)
    evil = "<img src=x onerror=alert(1)>|[x](javascript:alert(1))"
    run.metadata = {**run.metadata, "tasks": ["qasem", evil]}
    results = {"tasks": {"qasem": {"overall": {"auc": 0.7, "n": 4}}}}
    card = render_card(run, "me/x", results)
    outside_code = re.sub(r"`[^`]*`", "", card)
    assert "<img" not in outside_code and "](javascript" not in outside_code
    assert "&lt;img src=x onerror=alert\\(1\\)&gt;\\|\\[x\\]" in card


def test_a_token_anywhere_in_an_uploaded_file_is_refused_unechoed(run_dir: Path, tmp_path):
    """The upload boundary reads every file that would go up, not two records: a token inside
    adapter_config.json (a value a user pasted), in any shape, stops the publish."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    config = json.loads((copy / "adapter_config.json").read_text())
    config["revision"] = "main-ghp_abcdefghijklmnopqrstuvwxyz0123456789"
    (copy / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(
        FincheckError, match=r"adapter_config\.json of the upload holds a secret"
    ) as e:
        publish(PublishOptions(copy, "me/tiny", dry_run=tmp_path / "dry"))
    assert "ghp_" not in str(e.value)


def test_a_token_is_found_after_decoding_json_escapes_and_in_safetensors_metadata(
    run_dir: Path, tmp_path
):
    """Uploads are scanned as a reader decodes them: a token spelled with JSON escapes, and one
    in the weights file's header metadata, stop the publish as a plain one does."""
    import shutil

    from safetensors.torch import load_file, save_file

    token = "hf_" + "a" * 30
    escaped = "".join(f"\\u{ord(c):04x}" for c in token)  # \u0068\u0066\u005f...
    copy = tmp_path / "escaped"
    shutil.copytree(run_dir, copy)
    text = (copy / "adapter_config.json").read_text().rstrip().rstrip("}")
    (copy / "adapter_config.json").write_text(text + f', "note": "{escaped}"}}')
    assert token not in (copy / "adapter_config.json").read_text()
    with pytest.raises(FincheckError, match=r"adapter_config\.json of the upload holds a secret"):
        publish(PublishOptions(copy, "me/tiny", dry_run=tmp_path / "dry1"))
    copy = tmp_path / "metadata"
    shutil.copytree(run_dir, copy)
    weights = copy / "adapter_model.safetensors"
    save_file(load_file(weights), weights, metadata={"format": "pt", "note": token})
    with pytest.raises(FincheckError, match=r"adapter_model\.safetensors of the upload holds"):
        publish(PublishOptions(copy, "me/tiny", dry_run=tmp_path / "dry2"))
    # ... in a JSON file the one reader refuses (nested 65 deep, a lone surrogate beside it)
    from fincheck.serve.publish import check_upload_holds_no_secret

    for name, text in [
        ("deep.json", "[" * 65 + f'"{escaped}"' + "]" * 65),
        ("lone.json", f'{{"a": "\\ud800", "b": "{escaped}"}}'),
    ]:
        (tmp_path / name).write_text(text)
        with pytest.raises(FincheckError, match=f"{name} of the upload holds a secret"):
            check_upload_holds_no_secret(tmp_path, [tmp_path / name])


def test_secrets_are_redacted_in_whatever_fincheck_writes_or_prints(tmp_path, capsys):
    from fincheck.eval.predictions import _write_json
    from fincheck.io.secrets import has_secret, public_url, redact

    url = "http://user:p4ss@127.0.0.1:9/v1?api_key=k3y&model=x"
    # an endpoint URL is recorded without its userinfo and without any query value: a key may
    # sit under any name there (x-api-key, subscription-key, ...)
    assert public_url(url) == "http://<redacted>@127.0.0.1:9/v1?api_key=<redacted>&model=<redacted>"
    assert (
        redact("?x-api-key=v4lue&access_key=v5lue") == "?x-api-key=<redacted>&access_key=<redacted>"
    )
    assert redact("run exp-hf_abcdefghijklmnopqrstuvwx done") == "run exp-<redacted> done"
    assert not has_secret("mask-qwen2-5-0-5b-cpu-long-run-name and sha 0123456789abcdef")
    _write_json(tmp_path / "eval_config.json", {"base_url": url, "model": "me/x:hf_abcdefghijklmnopqrstuvwx"})  # fmt: skip
    written = (tmp_path / "eval_config.json").read_text()
    assert "p4ss" not in written and "k3y" not in written and "hf_abc" not in written
    # an error line names the URL without its credentials
    assert main(["compare", url, str(tmp_path), "--bootstrap", "1"]) == 1
    err = capsys.readouterr().err
    assert "127.0.0.1" in err and "p4ss" not in err and "k3y" not in err


def test_a_url_s_credentials_are_held_in_every_form_they_travel_in(monkeypatch):
    """An endpoint that echoes what it was sent prints nothing of the credentials: the password
    as written and percent-decoded (one holding an "@" too), the Basic header an HTTP client
    makes of the userinfo, a key in the fragment or percent-encoded in the query; an API key
    too short to be held by value (a placeholder such as "EMPTY" would redact ordinary words)
    is redacted as an echoed header's value, and prose about bearer bonds is left alone."""
    import base64
    import sys

    from fincheck.io import secrets

    monkeypatch.setattr(secrets, "_HELD", set())
    monkeypatch.setattr(sys, "argv", ["fincheck"])
    url = "http://alice:p%40ss@w0rdSECRET@127.0.0.1:9/v1#api_key=FRAGSECRET12345"
    secrets.hold_url_secrets(url)
    basic = base64.b64encode(b"alice:p@ss@w0rdSECRET").decode()
    echoed = secrets.redact(
        f"header Basic {basic}; decoded alice:p@ss@w0rdSECRET; as written p%40ss@w0rdSECRET; "
        f"in a log line {url}; fragment FRAGSECRET12345"
    )
    assert "w0rdSECRET" not in echoed and basic not in echoed and "FRAG" not in echoed, echoed
    assert secrets.public_url(url) == "http://<redacted>@127.0.0.1:9/v1"
    secrets.hold_url_secrets("http://127.0.0.1:9/v1?api_key=abc%2Fdefghi")
    assert secrets.redact("key abc/defghi") == "key <redacted>"
    # a value as a server reads it ("+" a space) and as a client sends it again (its escapes
    # in either case); a key given bare, without a name, is a value too, and is not recorded
    bare = "http://127.0.0.1:9/v1?access=ab+cdefgh9&k=abc*defgh1&Zq8Xv2Lm9Pw4Rt6"
    secrets.hold_url_secrets(bare)
    for echoed in (
        "'ab cdefgh9'",
        "abc%2Adefgh1",
        "abc%2adefgh1",
        "ab%20cdefgh9",
        "Zq8Xv2Lm9Pw4Rt6",
    ):
        assert secrets.redact(echoed).strip("'") == "<redacted>", echoed
    assert secrets.public_url(bare) == (
        "http://127.0.0.1:9/v1?access=<redacted>&k=<redacted>&<redacted>"
    )
    # a path segment's parameters (";api_key=…"), and a key held with white space around it
    params = "http://127.0.0.1:9/v1;api_key=Zq8Xv2Lm9Pw4/chat"
    secrets.hold_url_secrets(params)
    assert secrets.public_url(params) == "http://127.0.0.1:9/v1;<redacted>/chat"
    assert secrets.redact("echo Zq8Xv2Lm9Pw4 and ;token=abcdefgh9") == (
        "echo <redacted> and ;token=<redacted>"
    )
    secrets.hold_secret(" spaced-key-778899\n")
    assert secrets.redact("got spaced-key-778899.") == "got <redacted>."
    secrets.hold_secret("Zq9x7")
    said = 'got authorization: bearer Zq9x7, {"Proxy-Authorization": "Zq9x7"}; a Zq9x7 word'
    expected = (
        'got authorization: bearer <redacted>, {"Proxy-Authorization": "<redacted>"}; a Zq9x7 word'
    )
    assert secrets.redact(said) == expected
    assert secrets.redact("Authorization: Zq9x7\nnext") == "Authorization: <redacted>\nnext"
    # the scheme inside a quoted value is kept and its credentials go; a quoted key's bare
    # number is JSON's (Qwen2.5's tokenizer.json has the word in its vocabulary) and stays
    assert (
        secrets.redact("{'Authorization': 'Bearer x1'}") == "{'Authorization': 'Bearer <redacted>'}"
    )
    assert secrets.redact("curl -H 'Authorization: k3y'") == "curl -H 'Authorization: <redacted>'"
    assert secrets.redact('{"Authorization": "18124"}') == '{"Authorization": "<redacted>"}'
    vocab = '{"vocab": {\n  "Authorization": 18124,\n  "x": 1}, "Authorization":7}'
    assert secrets.redact(vocab) == vocab
    for prose in (
        "The fund holds Bearer bonds and Basic materials stocks.",
        "Share repurchase authorization: $500 million remains.",
    ):
        assert secrets.redact(prose) == prose
    secrets.hold_url_secrets("http://127.0.0.1:9/v1?key=ab;cdefghijkl")  # ";" is in the value
    assert secrets.redact("sent ab;cdefghijkl") == "sent <redacted>"


def test_a_held_secret_leaves_the_process_s_command_line(monkeypatch):
    """Libraries record the command line (wandb stores sys.argv with each run): once a run holds
    a URL's credentials, its own argv no longer carries them, so wandb's record cannot."""
    import sys

    import wandb

    from fincheck.io import secrets

    monkeypatch.setattr(secrets, "_HELD", set())
    url = "http://user:pw-1234567@127.0.0.1:9/v1?subscription-key=QUERY-SECRET-77"
    monkeypatch.setattr(sys, "argv", ["fincheck", "eval", "--base-url", url, "--tasks", "qasem"])
    secrets.hold_url_secrets(url)
    recorded = " ".join(wandb.Settings()._args)
    assert "pw-1234567" not in recorded and "QUERY-SECRET-77" not in recorded
    assert sys.argv[-2:] == ["--tasks", "qasem"]
