"""How the ``asr`` stage's inputs become decode windows beyond what ``joining`` decides: the work item
inputs that name an input's join group and its members (the orchestrator's ``orchestrator.planning.groups``),
and words timed in a window's time moved back into their input's time.
"""

from __future__ import annotations

import logging

from contracts import WorkItem
from contracts.artifacts import VocabularyFile

log = logging.getLogger(__name__)

#: work item inputs naming the item's join group and its members as JSON [[id, audio.json], ...] in the group's
#: order (the orchestrator's ``orchestrator.planning.groups.GROUP_KEY`` / ``MEMBERS_KEY``)
GROUP_INPUT = "join_group"
MEMBERS_INPUT = "join_members"


def in_input_time(words: list, start: float) -> list:
    """Words timed in a window's time, moved to the input's time (the window starts ``start`` s into it)."""
    return [
        w.model_copy(update={"start": round(start + w.start, 3), "end": round(start + w.end, 3)})
        for w in words
    ]


def group_members(item: WorkItem) -> list[tuple[str, str, list[VocabularyFile]]]:
    """``item``'s join group: its members' ids, audio artifacts and vocabulary files, in the group's order
    (none named: []). A member's vocabulary decides which windows it shares, as when it is asked for."""
    import json

    try:
        return [
            (
                str(entry[0]),
                str(entry[1]),
                [VocabularyFile.model_validate(f) for f in (entry[2] if len(entry) > 2 else [])],
            )
            for entry in json.loads(item.inputs.get(MEMBERS_INPUT) or "[]")
        ]
    except (ValueError, TypeError, IndexError):
        log.warning("asr: %s: unreadable join group members; decoded without its group", item.id)
        return []
