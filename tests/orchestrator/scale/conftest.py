"""Token authentication for every Ray cluster these tests start, as on a real cluster.

Ray reads these variables when it is first imported, so they are set here, before any test module of
this package imports it; they reach the head nodes, the raylets and the drivers the tests start through
the environment (not ``~/.ray/auth_token``, which other Ray runs on the machine may have written).
"""

from __future__ import annotations

import os
import secrets

os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
