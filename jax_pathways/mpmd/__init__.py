"""jax_pathways.mpmd: pipeline parallelism over islands, from one process.

    from jax_pathways import mpmd

    @mpmd.stage("front")
    def front(params, x): ...

    @mpmd.stage("back")
    def back(params, h, y): ...   # returns the microbatch's loss

    def train_step(params, opt_state, batch):      # batch: M microbatches
      loss, grads = mpmd.value_and_grad(microbatch_loss)(params, batch)
      ...
      return params, opt_state, loss

    step = mpmd.pipeline(train_step, mpmd.Topology.islands(),
                         stages={"front": 0, "back": 1}, schedule="1F1B",
                         microbatches=8, batch_argnums=(2,))
    params, opt_state, loss = step(params, opt_state, batch)
    print(step.schedule)

Stages are marked in ordinary JAX code (stages.py), meshes named in a
Topology (topology.py), and the step is partitioned into one program per
mesh and scheduled (pipeline.py): by jaxlib's Shardy MPMD partitioner when
present (shardy.py, running as one IFRT IR program on the controller), else
by jax_pathways' own splitter (fallback.py). `step.partitioner` says which.
"""
from jax_pathways.mpmd.pipeline import Pipeline
from jax_pathways.mpmd.pipeline import pipeline
from jax_pathways.mpmd.schedule import Schedule
from jax_pathways.mpmd.schedule import Task
from jax_pathways.mpmd.schedule import bubble_fraction
from jax_pathways.mpmd.stages import stage
from jax_pathways.mpmd.stages import value_and_grad
from jax_pathways.mpmd.meshes import Topology

__all__ = ["Pipeline", "Schedule", "Task", "Topology", "bubble_fraction",
           "pipeline", "stage", "value_and_grad"]
