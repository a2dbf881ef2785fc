"""Puts this folder on sys.path: its tests share socket_pairs.py."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
