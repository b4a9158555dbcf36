"""Join groups: which inputs may share a Whisper window, fixed once per output folder (no I/O beyond its file).

The ASR stage joins the short speech of several inputs into one 30 s window
(stages/whisper/joining.py), and what Whisper hears beside an input can change what it
hears in it. So an input's partners are not whoever happens to be decoded at the
same time (that changes with the chunk size, a crash and resume, one more file):
the run forms **join groups** before anything runs, and the stage joins only the
speech of one group's inputs, always all of them:

* inputs the output folder's ``.join-groups.json`` already places keep their group;
* the others, in the run's planned order, form new groups of :data:`GROUP_SIZE`
  consecutive inputs (of the chunk size where that is smaller), recorded in that
  file before the first stage runs;
* chunks are made of whole groups (:func:`whole_group_chunks`);
* every ASR work item names its group's members and their audio, so a group of
  which only some inputs are left to do (a resumed run, a respawned child) is
  decoded whole again: the others' speech sits in the same place, only the inputs
  asked for are written.

An input's transcript then depends on its group only, and the group on the order
in which the output folder first saw its inputs. O(inputs) per run: one dict.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from contracts import WorkItem
from contracts.io import atomic_write_text
from orchestrator import layout
from orchestrator.planning.vocabulary import TermStore

if TYPE_CHECKING:
    from orchestrator.planning.state import InputState

log = logging.getLogger(__name__)

#: inputs per join group (consecutive in the planned order): five clips of 3-5 s fill one 30 s window with
#: their 2 s gaps, and 5 divides the usual chunk sizes (50, 25, 15, 10)
GROUP_SIZE = 5
#: work item input keys the ASR stage reads: the group's name, and its members as JSON [[id, audio path], ...]
GROUP_KEY = "join_group"
MEMBERS_KEY = "join_members"


def load_groups(out: Path) -> dict[str, str]:
    """The output folder's groups: input id -> group name (empty when there is none or it is unreadable)."""
    try:
        stored = json.loads(layout.path(out, layout.JOIN_GROUPS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    groups = stored.get("groups") if isinstance(stored, dict) else None
    if not isinstance(groups, dict):
        return {}
    return {str(k): str(v) for k, v in groups.items()}


def assign_groups(ids: Sequence[str], known: dict[str, str], size: int = GROUP_SIZE) -> dict[str, str]:
    """Each of ``ids`` (the planned order) -> its group: the ``known`` one, else a new group of up to ``size``
    of the new inputs, consecutive in that order. Group names are never reused (``g<n>``, n past the highest
    known)."""
    numbers = [int(name[1:]) for name in known.values() if name[:1] == "g" and name[1:].isdigit()]
    next_number = max(numbers, default=0) + 1
    out: dict[str, str] = {}
    fresh = [i for i in ids if i not in known]
    for first in range(0, len(fresh), max(1, size)):
        name = f"g{next_number}"
        next_number += 1
        for item_id in fresh[first : first + max(1, size)]:
            out[item_id] = name
    return {i: known.get(i) or out[i] for i in ids}


def plan_groups(out: Path, ids: Sequence[str], size: int = GROUP_SIZE, dry: bool = False) -> dict[str, str]:
    """The run's inputs' groups (new ones of up to ``size``), the new ones recorded in the output folder (unless
    ``dry``)."""
    known = load_groups(out)
    groups = assign_groups(ids, known, size)
    if not dry and any(i not in known for i in ids):
        atomic_write_text(
            layout.path(out, layout.JOIN_GROUPS),
            json.dumps({"groups": known | groups}, ensure_ascii=True, sort_keys=True),
        )
    return groups


def whole_group_chunks(items: Sequence, group_of, size: int) -> list[list]:
    """``items`` in chunks of about ``size``, each made of whole groups (``group_of(item)``), the groups in the
    order of their first item: a chunk closes before a group that would take it past ``size`` (a group larger
    than ``size`` is a chunk of its own)."""
    members: dict[str, list] = {}
    for item in items:
        members.setdefault(group_of(item), []).append(item)
    chunks: list[list] = []
    chunk: list = []
    for group in members.values():
        if chunk and len(chunk) + len(group) > size:
            chunks.append(chunk)
            chunk = []
        chunk.extend(group)
    if chunk:
        chunks.append(chunk)
    return chunks


def with_groups(
    items: Sequence[WorkItem],
    todo: Sequence[InputState],
    chunk: Sequence[InputState],
    terms: TermStore | None = None,
) -> list:
    """The ASR work ``items`` (of ``todo``) with their join group and its members in ``chunk`` (all of them,
    also those with nothing left to do: the stage decodes the group whole and writes only the items); the
    members' vocabulary files by reference to ``terms`` (None: with their terms)."""
    members: dict[str, list[InputState]] = {}
    for inp in chunk:
        if inp.group is not None:
            members.setdefault(inp.group, []).append(inp)
    listed = {
        group: json.dumps(
            [
                [
                    m.id,
                    str(m.plan.artifact("audio")),
                    [
                        f.model_dump(mode="json", exclude_defaults=True)
                        for f in (terms.references(m.plan.vocabulary) if terms else m.plan.vocabulary)
                    ],
                ]
                for m in group_members
            ]
        )
        for group, group_members in members.items()
    }
    return [
        item
        if inp.group is None or inp.group not in listed
        else item.model_copy(
            update={"inputs": item.inputs | {GROUP_KEY: inp.group, MEMBERS_KEY: listed[inp.group]}}
        )
        for item, inp in zip(items, todo)
    ]
