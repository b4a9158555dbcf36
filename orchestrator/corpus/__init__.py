"""The products of an output folder: what a run leaves for people, not for the next stage.

From the artifacts the stages keep, the parent writes each input's files (``outputs``: SRT, VTT, TXT,
TSV, JSON, RTTM, TextGrid, EAF, DOCX, HTML, Audacity labels; ``captions``: the subtitle rules and
cues; ``page``: ``transcript.html`` and ``OUT/index.html``), shows who speaks (``labels``: corpus label,
enrolled name or the input's label, overlaps), keeps the folder's corpus speakers (``speakers``:
``OUT/speakers.json``, placed, named, merged and split without a model), writes them again on demand
(``export``) and enrolls voice profiles (``enroll``). The run's machinery (planning, the stage runner,
retries, the journal, the lock) lives in ``orchestrator.run``; of it, this package uses only the lock,
the plan's ids, the journal and, for ``enroll``, the hub and the stage runner.
"""
