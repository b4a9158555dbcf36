"""Model stages. Each module runs inside a spawned child process only.

One module per stage; each exposes ``STAGE``, an instance of
:class:`stages.base.Stage`, whose ``run(request) -> StageResult`` is the one
entry signature. Heavy libraries (torch, whisperx, sentence-transformers, av)
are imported inside ``Stage.import_libraries`` / ``load``, never at module
import time, and nothing here imports ``orchestrator``.
"""
