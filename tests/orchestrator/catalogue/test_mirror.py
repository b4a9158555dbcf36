"""The catalogue copied beside outputs at a URL (moto's S3 server on 127.0.0.1, through s3fs), and searched
from a copy made elsewhere: only what is new travels, and what the upkeep removed is removed there too."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from orchestrator.catalogue import upkeep
from orchestrator.catalogue.mirror import cache_dir, pull, push
from orchestrator.catalogue.search import search
from orchestrator.catalogue.store import READ_CONSISTENCY, Catalogue
from tests.orchestrator.catalogue.test_store import rows

URL = "s3://media/out"


def files(root) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def remote(fs) -> set[str]:
    fs.invalidate_cache()
    prefix = "media/out/.catalogue/"
    return {name[len(prefix) :] for name in fs.find("media/out/.catalogue")}


def found(out, query: str) -> list[str]:
    return [hit.input for hit in search(out, query, None, mode="words").hits]


def test_a_catalogue_beside_its_outputs_is_searched_from_a_copy_elsewhere(s3, tmp_path, monkeypatch):
    fs, _ = s3
    out = tmp_path / "staging"
    catalogue = Catalogue(out)
    catalogue.put([rows("a/x", ["the harbour in Kirkenes", "funding for the school"]), rows("b/y", ["bees"])])
    local = files(out / ".catalogue")
    # the first copy carries every file; a second one, nothing
    assert push(out, URL) == len(local) and remote(fs) == local
    assert push(out, URL) == 0
    # another machine copies it into its cache and searches the copy
    elsewhere = pull(URL, cache_dir(URL, tmp_path / "cache"))
    assert files(elsewhere / ".catalogue") == local
    assert found(elsewhere, "Kirkenes") == ["a/x"]

    # a later chunk: only its new files travel, the tables' manifests last
    catalogue.put([rows("c/z", ["Kirkenes again, by boat"])])
    new = files(out / ".catalogue") - local
    assert push(out, URL) == len(new) < len(files(out / ".catalogue"))
    # the upkeep compacts and deletes old versions: those files go from the URL too
    monkeypatch.setattr(upkeep, "KEEP_VERSIONS", timedelta(0))
    catalogue.maintain()
    push(out, URL)
    assert remote(fs) == files(out / ".catalogue")
    # and from the copy, at its next search; the copy finds the new input
    pull(URL, elsewhere)
    assert files(elsewhere / ".catalogue") == files(out / ".catalogue")
    time.sleep(READ_CONSISTENCY.total_seconds() + 0.2)  # a search kept open sees new commits within this
    assert sorted(found(elsewhere, "Kirkenes")) == ["a/x", "c/z"]


def test_a_url_without_a_catalogue_leaves_no_copy(s3, tmp_path):
    into = tmp_path / "cache"
    (into / ".catalogue" / "stale").mkdir(parents=True)
    assert not (pull(URL, into) / ".catalogue").exists()
    with pytest.raises(Exception, match="catalogue"):
        search(into, "anything", None, mode="words")
