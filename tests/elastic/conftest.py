"""The elastic tests' helpers (restarting_cluster.py) import as top-level modules."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
