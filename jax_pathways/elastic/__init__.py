"""Elastic training: a loop that loses islands and loses no committed step.

    from jax_pathways import elastic
    result = elastic.run(setup, state, steps=1000, commit_every=10)

See loop.py for what `setup` returns and what happens on a loss.
"""
from jax_pathways.elastic.loop import Event
from jax_pathways.elastic.loop import IslandsLost
from jax_pathways.elastic.loop import Plan
from jax_pathways.elastic.loop import Result
from jax_pathways.elastic.loop import is_loss
from jax_pathways.elastic.loop import run

__all__ = ["Event", "IslandsLost", "Plan", "Result", "is_loss", "run"]
