"""Running stage children beyond this machine (Ray)."""
