"""The corpus catalogue of a real run: every chunk's segments appended with their vectors, searched by words,
meaning and both through ``bin/pipeline search``, repaired after a kill, rebuilt from the artifacts alone,
and never comparing a query with vectors of another model. Real ``bin/pipeline`` runs, the embedded models."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import MEDIA, PIPELINE, ROOT, process_args

pytestmark = pytest.mark.slow

#: input id -> its source (the ids start with the folder given, ``corpus``)
INPUTS = {
    "corpus/interviews/2023/host_guest": MEDIA / "speakers" / "host_guest.mp4",
    "corpus/interviews/2024/host_stranger": MEDIA / "speakers" / "host_stranger.mp4",
    "corpus/talks/speech": MEDIA / "speech.mp4",
    "corpus/names/contract": MEDIA / "names" / "contract.ogg",
}


def pipeline(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run([*PIPELINE, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def search(out: Path, query: str, *options: str) -> dict:
    return json.loads(pipeline("search", str(out), query, "--json", *options).stdout)


def rows(out: Path) -> dict[tuple[str, int], tuple]:
    """Every segment row of the catalogue: (input, segment) -> (text, start, speaker, model, vector)."""
    from orchestrator.catalogue.store import Catalogue

    catalogue = Catalogue(out)
    found = {}
    for name in catalogue.segment_tables():
        for row in catalogue.db.open_table(name).to_arrow().to_pylist():
            found[(row["input"], row["segment"])] = (
                row["text"],
                round(row["start"], 3),
                row["speaker"],
                row["model"],
                tuple(np.round(row["vector"], 6)),
            )
    return found


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A finished output folder of four inputs in folders, chunks of two, speakers on."""
    inputs = tmp_path_factory.mktemp("in") / "corpus"
    for item_id, source in INPUTS.items():
        target = inputs.parent / f"{item_id}{source.suffix}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    out = tmp_path_factory.mktemp("out") / "out"
    done = subprocess.run(
        process_args(inputs, out, "--chunk-size", "2"), cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (out / "inputs-for-tests").write_text(str(inputs))
    return out


def copy(corpus: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(corpus, out, symlinks=True)
    return out


def test_each_chunk_indexed_every_segment_with_its_vector_and_model(corpus):
    found = rows(corpus)
    for item_id in INPUTS:
        lines = [json.loads(line) for line in (corpus / item_id / "segments.jsonl").read_text().splitlines()]
        embeddings = json.loads((corpus / item_id / "embeddings.json").read_text())
        vectors = np.load(corpus / item_id / "embeddings.npy")
        mine = {seg: row for (inp, seg), row in found.items() if inp == item_id}
        assert sorted(mine) == [line["id"] for line in lines], item_id
        for line in lines:  # what the files show: the text, its start, the speaker's label
            text, start, speaker, model, vector = mine[line["id"]]
            assert (text, start, speaker) == (line["text"].strip(), round(line["start"], 3), line["speaker"])
            assert model == embeddings["model"]
            np.testing.assert_allclose(vector, vectors[line["id"]], atol=1e-5)
    # the run report says what the writer did beside the run: every input, two chunks of two
    written = json.loads((corpus / "run-report.json").read_text())["catalogue"]
    assert (written["chunks"], written["indexed"], written["failed"]) == (2, len(INPUTS), 0)
    assert written["seconds"] > 0


def test_words_find_a_rare_name_marked_with_a_link_to_its_moment(corpus):
    result = search(corpus, "Ingrid", "--mode", "words")
    top = result["hits"][0]
    assert (
        top["input"] == "corpus/names/contract" and "[Ingrid]" in top["marked"] or "zczepanski" in top["text"]
    )
    page, _, moment = top["link"].partition("#t=")
    assert (corpus / page).is_file() and abs(float(moment) - top["start"]) < 0.01
    stella = search(corpus, "Stella", "--mode", "words", "-k", "3")["hits"]
    assert stella[0]["input"] == "corpus/talks/speech" and "[Stella]" in stella[0]["marked"]


def test_meaning_and_hybrid_find_a_paraphrase_by_the_runs_own_model(corpus):
    embeddings = json.loads((corpus / "corpus/talks/speech" / "embeddings.json").read_text())
    meaning = search(corpus, "an animal leaping over a sleepy dog", "--mode", "meaning", "-k", "3")
    assert meaning["model"] == embeddings["model"] and meaning["unsearched"] == 0
    assert meaning["hits"][0]["input"] == "corpus/talks/speech", meaning["hits"]
    hybrid = search(corpus, "who signed the agreement", "-k", "3")
    assert hybrid["mode"] == "hybrid" and hybrid["hits"][0]["input"] == "corpus/names/contract", hybrid[
        "hits"
    ]


def test_filters_by_folder_input_speaker_and_language(corpus):
    words = "old roads straw garlic store contract"  # one word or more of each input

    def inputs(*options):
        return [
            hit["input"] for hit in search(corpus, words, "--mode", "words", "-k", "50", *options)["hits"]
        ]

    assert set(inputs()) == set(INPUTS)
    assert inputs("--under", "corpus/interviews") and all(
        i.startswith("corpus/interviews/") for i in inputs("--under", "corpus/interviews")
    )
    assert set(inputs("--under", "corpus/interviews/2023/")) == {"corpus/interviews/2023/host_guest"}
    assert set(inputs("--input", "corpus/talks/speech")) == {"corpus/talks/speech"}
    assert inputs("--under", "corpus/interview") == []  # a folder, not a prefix of a name
    speakers = search(corpus, words, "--mode", "words", "-k", "50", "--speaker", "S0002")["hits"]
    assert speakers and all("S0002" in (h["speaker"], h["corpus_speaker"]) for h in speakers)
    assert inputs("--language", "de") == [] and inputs("--language", "en")


def test_pipeline_index_repairs_what_a_kill_left_and_rebuild_makes_the_same_rows(corpus, tmp_path):
    from orchestrator.catalogue.store import Catalogue

    out = copy(corpus, tmp_path)
    reference = rows(out)
    # an input whose rows a kill left out (its catalogue row never written)
    Catalogue(out).drop(["corpus/talks/speech"])
    assert not any(inp == "corpus/talks/speech" for inp, _ in rows(out))
    done = pipeline("index", str(out))
    assert "1 indexed, 3 unchanged" in done.stderr
    assert rows(out) == reference
    # killed at any moment of a rebuild: the next `index` makes it whole again
    for wait_s in (1.0, 3.0):
        proc = subprocess.Popen([*PIPELINE, "index", str(out), "--rebuild"], cwd=ROOT)
        time.sleep(wait_s)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        pipeline("index", str(out))
        assert rows(out) == reference
    pipeline("index", str(out), "--rebuild")
    assert rows(out) == reference


def test_a_rerun_puts_back_an_input_missing_from_the_catalogue(corpus, tmp_path):
    from orchestrator.catalogue.store import Catalogue

    out = copy(corpus, tmp_path)
    reference = rows(out)
    Catalogue(out).drop(["corpus/interviews/2024/host_stranger"])
    inputs = Path((out / "inputs-for-tests").read_text())
    done = subprocess.run(
        process_args(inputs, out, "--chunk-size", "2"), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert rows(out) == reference
    assert json.loads((out / "run-report.json").read_text())["catalogue"]["indexed"] == 1


def test_vectors_of_another_model_are_counted_and_never_compared(corpus, tmp_path):
    out = copy(corpus, tmp_path)
    path = out / "corpus/names/contract" / "embeddings.json"
    artifact = json.loads(path.read_text())
    artifact["model"] = "another-model@0000"
    path.write_text(json.dumps(artifact))
    pipeline("index", str(out), "--rebuild")
    result = search(out, "who signed the agreement", "--mode", "meaning", "-k", "20")
    assert result["unsearched"] == 1 and result["indexed"] == 4
    assert result["hits"] and all(hit["input"] != "corpus/names/contract" for hit in result["hits"])
    # words still find it: its text is the same in any vector space
    assert search(out, "Ingrid", "--mode", "words")["hits"][0]["input"] == "corpus/names/contract"


@pytest.fixture(scope="module")
def server(corpus, tmp_path_factory):
    from orchestrator import Settings
    from orchestrator.api.server import start_in_thread

    running = start_in_thread(
        Settings(
            server_dir=tmp_path_factory.mktemp("server"),
            port=0,
            search_roots=[corpus],
            embedding_profile="embedded",
        )
    )
    yield running
    running.stop()


def test_the_api_and_its_client_search_the_servers_output_folders(server, corpus):
    from orchestrator.api.client import Client

    with Client(server.url) as api:
        answer = api.search("an animal leaping over a sleepy dog", k=3)
        words = api.search("Ingrid", mode="words", under="corpus/names")
        nothing = api.search("Ingrid", mode="words", under="corpus/talks")
    assert answer.mode == "hybrid" and answer.indexed == 4 and answer.unsearched == 0
    assert answer.hits[0].input == "corpus/talks/speech", answer.hits
    assert answer.model == json.loads((corpus / "corpus/talks/speech/embeddings.json").read_text())["model"]
    assert [hit.input for hit in words.hits] == ["corpus/names/contract"] and nothing.hits == []
    page = httpx.get(server.url + words.hits[0].url.split("#")[0])
    assert page.status_code == 200 and "Ingrid" in page.text  # the transcript page, served


def test_the_search_page_finds_a_moment_and_opens_its_transcript_there(server):
    from tests.orchestrator.corpus.test_page import CHROMIUM

    if CHROMIUM is None:
        pytest.fail("chromium is missing: bin/test installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--mute-audio"])
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.url + "/")
        page.fill("#q", "Ingrid")
        page.select_option("#mode", "words")
        page.click("button[type=submit]")
        page.wait_for_selector(".hit", timeout=120_000)
        assert page.locator(".hit mark").first.inner_text() == "Ingrid"
        assert "1 results (words)" in page.locator("#status").inner_text()
        page.locator(".hit a").first.click()
        page.wait_for_load_state()
        assert "/outputs/0/corpus/names/contract/transcript.html#t=" in page.url
        page.wait_for_selector(".w.now")
        assert errors == []
        browser.close()


def test_naming_a_speaker_relabels_its_rows_and_the_name_filters(corpus, tmp_path):
    out = copy(corpus, tmp_path)
    words = "old roads straw garlic store contract"
    guest = search(out, words, "--mode", "words", "-k", "50", "--input", "corpus/interviews/2023/host_guest")
    voices = {hit["corpus_speaker"] for hit in guest["hits"]}
    other = sorted(voices - {"S0001"})[0]
    done = pipeline(
        "speakers", "name", str(out), other, "Ada Lovelace", "--profiles", str(tmp_path / "profiles")
    )
    assert "relabelled" in done.stderr
    named = search(out, words, "--mode", "words", "-k", "50", "--speaker", "Ada Lovelace")["hits"]
    assert named and {hit["speaker"] for hit in named} == {"Ada Lovelace"}
    assert {hit["corpus_speaker"] for hit in named} == {other}
    assert search(out, words, "--mode", "words", "-k", "50", "--speaker", other)[
        "hits"
    ]  # the id still filters
