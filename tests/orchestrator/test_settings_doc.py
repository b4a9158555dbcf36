"""docs/settings.md is generated from the settings: it must be current, and it must not depend on the machine."""

from __future__ import annotations

from orchestrator import settings_doc
from orchestrator.settings import GROUPS, Settings


def test_the_committed_page_is_current():
    # When this fails: python -m orchestrator.settings_doc
    assert settings_doc.PAGE.read_text(encoding="utf-8") == settings_doc.render()


def test_check_exits_1_when_the_page_is_stale(tmp_path):
    page = tmp_path / "settings.md"
    page.write_text("# Settings\n")
    assert settings_doc.main(["--check", "--output", str(page)]) == 1
    assert settings_doc.main(["--output", str(page)]) == 0
    assert settings_doc.main(["--check", "--output", str(page)]) == 0


def test_every_field_is_documented_once_with_its_comment():
    page = settings_doc.render()
    for group in GROUPS:
        assert f"## {group.TITLE}\n" in page
        comments = settings_doc.field_comments(group)
        assert set(comments) == set(group.model_fields), f"{group.__name__}: a field without a #: comment"
        assert all(comments.values()), f"{group.__name__}: a field without a #: comment"
    for name in Settings.model_fields:
        assert page.count(f"| `{name}` |") == 1


def test_the_page_does_not_depend_on_the_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    page = settings_doc.render()
    assert str(tmp_path) not in page and page == settings_doc.PAGE.read_text(encoding="utf-8")
