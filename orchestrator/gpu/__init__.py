"""Everything the parent knows about GPUs, through NVML only (no CUDA context): readings, the
before/after guard around each child, batch and model sizing. (The ``pipeline gpu`` view, which also
lists the stage children's pid files, is ``orchestrator.process.gpu_status``.)"""
