"""The products of an output folder: what a run leaves for people, not for the next stage.

From the artifacts the stages keep, the parent writes each input's files (``outputs``: SRT, VTT, TXT,
TSV, JSON, RTTM, TextGrid, EAF, DOCX, HTML, Audacity labels; ``captions``: the subtitle rules and
cues; ``page``: ``transcript.html`` and ``OUT/index.html``), shows who speaks (``labels``: corpus label,
enrolled name or the input's label, overlaps), keeps the folder's corpus speakers (``speakers``:
``OUT/speakers.json``, placed, named, merged and split without a model) and writes them again on demand
(``export``). Of the rest of the parent this package reads only the output folder's books
(``orchestrator.books``: the lock and the journal) and the plan's ids (``orchestrator.planning.inputs``);
it never imports the run (``orchestrator.run``), which calls it where an input finishes. Enrolling a voice
profile runs a stage child, so it is the run's (``orchestrator.run.enroll``).
"""
