"""Everything the parent knows about GPUs, through NVML only (no CUDA context): readings, the
before/after guard around each child, batch and model sizing, the ``pipeline gpu`` view."""
