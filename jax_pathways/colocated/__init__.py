"""Colocated Python: a client's `colocated_python` functions, run beside each island.

The controller reads the program (programs/colocated_program.py) and sends
one COLOCATED op per island (controller/colocated_executable.py); the
island's worker hands the call to the client's colocated process on that
island (worker/colocated_processes.py), a Python process of its own
(executor.py) that sees the client's devices as a multi-process JAX job
sees them (device_view.py): so a user's crash, leak or hang takes that
process, never the worker or other clients.
"""
