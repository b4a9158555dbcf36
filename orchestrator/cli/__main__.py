"""``python -m orchestrator.cli`` (what ``bin/pipeline`` runs): the ``pipeline`` command line."""

from orchestrator.cli import main

main()
