"""One run: planning, stage-major chunks, the stage runner, the one retry policy, journal, lock, progress.

The products of an output folder (files, captions, corpus speakers, export, enroll) live in
``orchestrator.corpus``."""
