"""What every stage child shares: the shared loop and the ``Stage`` base classes (``base``), the child's
entry point (``child``: ``python -m stages.runtime.child``, the orchestrator's ``CHILD_ENTRY``), memory
checkpoints, out-of-memory recognition and the heap policy (``memory``), the pinned weight files and
hub model names (``weights``: ``python -m stages.runtime.weights``), the libraries' known noise
(``noise``). No stage lives here, and nothing here imports a stage or an engine.
"""
