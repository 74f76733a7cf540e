"""The replication protocol as pure state machines (no I/O; time passed in).

The trio client and the deterministic simulator (tests/sim) drive the same machines.
"""
