"""Performance-log lines: one event model per kind, told apart by ``event``; lines written before the kinds
were separate models read back, and are written again, byte for byte."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts.perf import (
    CheckpointEvent,
    GpuCheckEvent,
    MemoryCheckpoint,
    StageEndEvent,
    StageStartEvent,
    append_event,
    perf_event,
    read_events,
)

#: one line of each kind the parent and the children write, as the single PerfEvent model wrote them
LINES = [
    '{"t":1.5,"event":"stage_start","stage":"asr","attempt":1,"device":"cuda","batch_size":16,"items":2}',
    '{"t":2.0,"event":"checkpoint","stage":"asr","attempt":1,"pid":42,"point":"model loaded","kind":"gpu",'
    '"allocated_mb":1024.0,"reserved_mb":2048.0,"free_mb":20000.0,"total_mb":24576.0}',
    '{"t":2.5,"event":"checkpoint","stage":"asr","attempt":1,"pid":42,"point":"before exit","kind":"cpu",'
    '"rss_mb":900.0,"peak_rss_mb":950.5}',
    '{"t":3.0,"event":"gpu_sample","stage":"asr","attempt":1,"pid":42,"gpu_index":0,"device_used_mib":3000.0,'
    '"device_total_mib":24576.0,"process_mib":2100.0}',
    '{"t":3.5,"event":"gpu_check","stage":"asr","attempt":1,"pid":42,"gpu_index":0,"device_used_mib":500.0,'
    '"baseline_used_mib":480.0,"process_mib":0.0}',
    '{"t":4.0,"event":"stage_end","stage":"asr","attempt":1,"pid":42,"record":{"stage":"asr","attempt":1,'
    '"batch_size":16,"items":2,"outcome":"oom","wall_s":1.25},"gpu_index":0}',
    '{"t":4.5,"event":"retry","stage":"asr","attempt":2,"batch_size":8,"items":2,"previous_outcome":"oom",'
    '"previous_batch_size":16}',
]


def test_earlier_lines_read_back_as_their_kind_and_are_written_the_same(tmp_path):
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join(LINES) + "\n")
    events = read_events(old)
    assert [e.event for e in events] == [
        "stage_start",
        "checkpoint",
        "checkpoint",
        "gpu_sample",
        "gpu_check",
        "stage_end",
        "retry",
    ]
    assert isinstance(events[0], StageStartEvent) and isinstance(events[5], StageEndEvent)
    assert events[5].record.outcome == "oom" and isinstance(events[4], GpuCheckEvent)
    again = tmp_path / "again.jsonl"
    for event in events:
        append_event(again, event)
    assert again.read_text() == old.read_text()


def test_a_checkpoint_event_carries_the_checkpoint_fields():
    checkpoint = MemoryCheckpoint(
        point="model loaded", t=2.0, kind="gpu", allocated_mb=512.0, total_mb=1024.0
    )
    event = CheckpointEvent.of_checkpoint(checkpoint, "asr", 1, 42)
    assert (event.event, event.stage, event.pid, event.allocated_pct) == ("checkpoint", "asr", 42, 50.0)
    assert MemoryCheckpoint.model_validate(
        event.model_dump(exclude={"event", "stage", "attempt", "pid"})
    ) == (checkpoint)


@pytest.mark.parametrize(
    "fields",
    [
        {"t": 1.0, "event": "lunch"},
        {"t": 1.0, "event": "stage_start", "leak": "x"},  # a field of another kind
        {"t": 1.0, "event": "checkpoint", "point": "p"},  # a checkpoint without its kind
    ],
)
def test_unknown_kinds_and_fields_of_other_kinds_are_refused(fields):
    with pytest.raises(ValidationError):
        perf_event(**fields)


def test_a_torn_or_unknown_line_is_skipped(tmp_path):
    log = tmp_path / "perf.jsonl"
    log.write_text(LINES[0] + '\n{"t":2.0,"event":"lunch"}\n' + LINES[1][:40])
    assert [e.event for e in read_events(log)] == ["stage_start"]
