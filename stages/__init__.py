"""Model stages. Each module runs inside a spawned child process only.

One module per stage at this level (``audio``, ``asr``, ``diarization``, ``enrollment``, ``alignment``,
``embeddings``, ``voice_profile``); each exposes ``STAGE``, an instance of
:class:`stages.runtime.base.Stage`, whose ``run(request) -> StageResult`` is the one
entry signature. The engines live in rooms beside them: ``stages.runtime`` (what every child shares:
the shared loop, the child entry, memory, weights), ``stages.whisper`` (the Whisper engine the ``asr``
and ``alignment`` stages run), ``stages.voices`` (the speaker encoders) and ``stages.workers`` (the HTTP
API's long-lived children, which are not stages). Heavy libraries (torch,
whisperx, sentence-transformers, av) are imported inside ``Stage.import_libraries`` / ``load``, never at
module import time, and nothing here imports ``orchestrator``.
"""
