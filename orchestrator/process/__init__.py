"""Child processes: the executor interface, spawning, stopping and following stage children, pid files, and
the ``pipeline gpu`` view of the GPUs and the stage children holding them."""
