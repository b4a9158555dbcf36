"""One run: planning, stage-major chunks, the stage runner, the one retry policy, journal and outputs."""
