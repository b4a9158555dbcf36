"""What every section of the device run shares: where it writes, which device, how long it may take."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
#: the ignored folder the kit is prepared in (wheels, weights, bundles); travels only where ``carry`` names it
KIT = ROOT / ".kit"


@dataclass
class Context:
    """One device run: each section gets it and returns a dict of measured figures (JSON-able)."""

    out: Path
    device: str = "cuda"
    #: small sizes everywhere (the CPU rehearsal): the same code paths, minutes instead of hours
    quick: bool = False
    #: where carried or built weights are (``KIT / "weights"``)
    weights: Path = KIT / "weights"
    #: a scratch folder for this run's inputs and outputs
    work: Path = field(default_factory=lambda: Path("/tmp/device-run"))
    started: float = field(default_factory=time.monotonic)
    #: seconds the whole run may take; sections check :meth:`left` and cut their sizes
    budget_s: float = 420.0

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def write(self, name: str, data: dict) -> Path:
        """Write ``data`` as ``$OUT/<name>.json`` now, so a later section's crash loses nothing."""
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"{name}.json"
        path.write_text(json.dumps(data, indent=2, default=str))
        return path
