"""``python -m orchestrator.cli`` (what ``bin/pipeline`` runs): the ``pipeline`` command line."""

from orchestrator.cli import main

if __name__ == "__main__":  # importing it (every parent module is imported by a test) runs nothing
    main()
