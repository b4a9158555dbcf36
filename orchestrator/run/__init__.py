"""One run: stage-major chunks, the stage runner, the one retry policy, finishing an input, the report,
progress, and enrolling a voice profile (one child through the same runner).

What the run will do is decided in ``orchestrator.planning``, which models run in ``orchestrator.models``,
the output folder's journal and lock are ``orchestrator.books``; the products of an output folder (files,
captions, corpus speakers, export) live in ``orchestrator.corpus``."""
