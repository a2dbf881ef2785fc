"""What a client and its colocated processes must share."""
from jax_pathways.colocated import packages


def test_matching_or_unsaid_packages_pass():
  ours = packages.describe()
  assert "jax=" in ours and "cloudpickle=" in ours and "python=" in ours
  assert packages.mismatch(ours, ours) is None
  assert packages.mismatch(None, ours) is None


def test_a_mismatch_names_both_sides():
  why = packages.mismatch("python=3.11 jax=0.10.1 jaxlib=0.10.2",
                          "python=3.12 jax=0.10.2 jaxlib=0.10.2")
  assert "jax 0.10.1 (client) vs 0.10.2 (colocated process)" in why
  assert "python 3.11 (client) vs 3.12 (colocated process)" in why
  assert "jaxlib" not in why
