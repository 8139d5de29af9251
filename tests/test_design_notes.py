"""The design-notes page lists every NOTE in the package, each linked to the module that
holds it (docs/design-notes.md): a module that moves takes its link along."""

from __future__ import annotations

import os
import re

import pytest

from conftest import SRC_DIR


ROOT = os.path.dirname(SRC_DIR)
PAGE = open(os.path.join(ROOT, "docs", "design-notes.md")).read()
SECTIONS = {part.split("\n", 1)[0]: part for part in re.split(r"\n## ", PAGE)[1:]}


def _notes_in_the_package() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(os.path.join(SRC_DIR, "dpex")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                for note in re.findall(r"^NOTE \[ (.+?) \]$", open(path).read(), re.M):
                    found[note] = os.path.relpath(path, ROOT)
    return found


NOTES = _notes_in_the_package()


def test_every_note_has_its_section():
    assert NOTES and sorted(set(NOTES) - set(SECTIONS)) == []


@pytest.mark.parametrize("note", sorted(SECTIONS))
def test_each_section_links_the_module_that_holds_its_note(note):
    links = re.findall(r"\]\(\.\./(src/[^)#]+)\)", SECTIONS[note])
    assert links and links[0] == NOTES.get(note), (note, links, NOTES.get(note))
