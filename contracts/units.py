"""Memory units, defined once for the parent and the children.

NVML and torch count in bytes; this project reports MiB (and GiB / the seeds'
"GB", both 1024**3 bytes).
"""

from __future__ import annotations

#: bytes in a MiB / a GiB
MIB = 1024**2
GIB = 1024**3
#: MiB in a GiB
GIB_MIB = 1024.0


def gib(mib: float | None, unit: str = " GiB", digits: int = 2) -> str:
    """MiB as GiB text: ``gib(1536) == "1.50 GiB"``; ``unit="GB"`` gives the seeds' log format ("1.50GB")."""
    return f"{(mib or 0.0) / GIB_MIB:.{digits}f}{unit}"
