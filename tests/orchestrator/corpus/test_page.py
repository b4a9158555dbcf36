"""The transcript page in a real headless Chromium (Debian's, driven by Playwright): it loads with no console
error, a click on a word moves the audio to that word's start, and a screenshot is taken."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from contracts import save_model
from orchestrator import layout
from orchestrator.corpus.captions import CaptionRules
from orchestrator.corpus.export import load_sources, write_index
from orchestrator.corpus.outputs import write_formats
from orchestrator.planning.inputs import save_ids
from tests.conftest import MEDIA
from tests.orchestrator.corpus.test_export import transcript

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def page_dir(tmp_path_factory) -> Path:
    """An input folder with its transcript, the audio stage's compressed copy of speech.wav, and the page."""
    from stages.audio import STAGE, decode, write_listen_copy

    STAGE.import_libraries()
    out = tmp_path_factory.mktemp("page") / "out"
    directory = out / "talk"
    directory.mkdir(parents=True)
    samples, _ = decode(MEDIA / "speech.wav")
    write_listen_copy(directory / layout.LISTEN, samples)
    save_model(transcript(), directory / "transcript.json")
    src = load_sources(
        directory, "talk", CaptionRules(), ["embeddings: asked for 'speed', used all-MiniLM-L6-v2"]
    )
    assert src.audio == layout.LISTEN  # the copy beside the page, not the source: the folder can move
    write_formats(directory, src, ["html"])
    save_ids(out, {str(MEDIA / "speech.wav"): "talk"})
    write_index(out)
    return directory


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: bin/test installs Debian's chromium package")
        pytest.skip("no chromium (apt-get install chromium; bin/test does it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--mute-audio", "--autoplay-policy=no-user-gesture-required"],
        )
        yield browser
        browser.close()


def test_the_page_loads_clean_and_a_click_plays_from_the_word(page_dir, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1000, "height": 700})
    messages = []
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
    page.goto((page_dir / "transcript.html").as_uri())
    page.wait_for_function("document.getElementById('audio').readyState >= 1", timeout=10_000)
    assert (
        page.evaluate("document.getElementById('audio').duration") > 9
    )  # the Opus copy of speech.wav, ~10 s
    word = transcript().segments[1].words[3]
    page.locator(f'.w[data-s="{word.start:.3f}"]').click()
    position = page.evaluate("document.getElementById('audio').currentTime")
    assert abs(position - word.start) < 0.05, position
    # speakers coloured and named, the doubtful word marked, the run's notes on top
    names = page.locator(".who").evaluate_all(
        "els => els.map(e => [e.firstChild.textContent, getComputedStyle(e).color])"
    )
    assert [n for n, _ in names] == ["Host", "Guest", "Host"]
    assert names[0][1] == names[2][1] != names[1][1]
    assert page.locator(".w.low").count() == 2  # the doubtful word, and the legend's example
    assert "Damaged source" in page.locator(".notes").inner_text()
    page.screenshot(path=str(tmp_path / "transcript.png"))
    assert (tmp_path / "transcript.png").stat().st_size > 10_000
    assert [m for m in messages if m.startswith(("error", "pageerror", "warning"))] == []


def test_the_index_links_to_the_page(page_dir, browser):
    page = browser.new_page()
    messages = []
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
    page.goto((page_dir.parent / layout.INDEX).as_uri())
    page.get_by_role("link", name="talk", exact=True).click()
    page.wait_for_load_state()
    assert page.url.endswith("/talk/transcript.html") and page.title() == "talk"
    assert [m for m in messages if m.startswith("error")] == []


def test_a_link_to_a_moment_marks_its_word_and_moves_the_audio_there(page_dir, browser):
    """A search result links to ``transcript.html#t=<start>``: the page marks the word said then, scrolls to
    it and moves the audio there (without playing); a new moment in the same page does the same."""
    word = transcript().segments[1].words[3]
    page = browser.new_page()
    messages = []
    page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
    # (a hit's moment is its segment's start to the hundredth: a little before its first word's start)
    page.goto((page_dir / "transcript.html").as_uri() + f"#t={word.start - 0.005:.3f}")
    page.wait_for_function("document.getElementById('audio').readyState >= 1", timeout=10_000)
    assert page.locator(".w.now").get_attribute("data-s") == f"{word.start:.3f}"
    assert abs(page.evaluate("document.getElementById('audio').currentTime") - word.start) < 0.05
    other = transcript().segments[0].words[0]
    page.evaluate(f"location.hash = '#t={other.start}'")
    page.wait_for_function(f"document.querySelector('.w.now').dataset.s === '{other.start:.3f}'")
    assert page.locator(".w.now").count() == 1 and messages == []
