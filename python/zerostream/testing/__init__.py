"""Test support shipped with zerostream: the simulated asynchronous device (sim_device.py)."""
