"""pytest plugin: run JAX's tests through jax_pathways.

pytest imports `-p` plugins before it collects (imports) any test module, so
the embedded cluster is up and 'proxy' is JAX's only backend before JAX's
test utilities first ask for devices.
"""
import jax_pathways

jax_pathways.initialize(islands=2, devices_per_island=4)
