"""Deploying a cluster on an engine that places and restarts its processes.

k8s.py: the Kubernetes manifests that `jax-pathways k8s` prints.
ray.py: the controller and workers as Ray actors (`jax_pathways.ray`). Hosts
without an engine start `jax-pathways controller` and one `jax-pathways
worker` per host by hand (docs/deploy.md).
"""
