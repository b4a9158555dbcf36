"""Child processes: the executor interface, spawning, stopping and following stage children, pid files."""
