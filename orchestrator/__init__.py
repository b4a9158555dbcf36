"""The parent process: plans work, runs every stage in a spawned child, keeps the books.

Nothing in this package imports torch or a model library; the parent never
creates a CUDA context.
"""

from orchestrator.run.pipeline import Orchestrator
from orchestrator.settings import Settings

__all__ = ["Orchestrator", "Settings"]
