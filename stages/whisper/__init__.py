"""The Whisper engine behind the ``asr`` and ``alignment`` stages: which Whisper a setting names
(``models``), which runtime runs it (``runtime``: CTranslate2 or torch, the ``auto`` choice, the compute
type), the prompt and vocabulary within the decoder's budget (``prompt``), how an input's speech becomes
decode windows (``windows``: join groups and the inputs a window holds; ``joining``: which short windows
share one Whisper window and how their words are split back; ``speech``: which pieces and decodes count as
speech, and the repetition guard's measures), language identification (``language``), word timing by
cross-attention (``align``), Whisper on torch through transformers (``torch_model``) and the
CTranslate2-to-transformers conversion (``convert``: ``python -m stages.whisper.convert``).
"""
