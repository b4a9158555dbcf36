"""The device check that travels: prepare here, rehearse here on the CPU, run there on a bare GPU machine.

See bench/device/README.md for the commands.
"""
