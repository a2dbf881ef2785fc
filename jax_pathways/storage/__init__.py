"""Storage: the data plane's bytes at rest.

The controller reads what a client asks to save or restore (requests.py);
each island's worker writes and reads only the shards it holds, with
tensorstore, in orbax's layout (zarr_arrays.py), under the storage root its
owner gave it (paths.py). No byte of a saved array crosses the client or
the controller.
"""
