"""The run's performance log and ``pipeline report``."""
