"""The HTTP API (``pipeline serve``): server, embedding workers, jobs, metrics and the client."""
