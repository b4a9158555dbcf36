"""Long-lived children that serve the HTTP API rather than a run: no work items and no artifacts, a task at a
time on a pipe (``embeddings``: the API's embedding worker, which loads its model through the embeddings
stage's own loader). Started by ``orchestrator/process/worker.py``.
"""
