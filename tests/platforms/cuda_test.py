"""Embedded clusters of accelerator islands (initialize(platform=...)).

On a host with a GPU and JAX's CUDA plugin, cuda_client.py runs programs
through one CUDA island and on its own GPU with plain JAX: the bits must
match. Without one (CI), those are skipped; the choice of each island's
GPUs and the error for a platform the host lacks are tested everywhere.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from jax_pathways.cluster import local_cluster

HERE = os.path.dirname(os.path.abspath(__file__))


def _cuda_host() -> str | None:
  """Why this host cannot run a CUDA island, or None if it can."""
  if importlib.util.find_spec("jax_plugins") is None or not any(
      importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (12, 13)):
    return "JAX's CUDA plugin is not installed (jax_pathways[cuda12])"
  if shutil.which("nvidia-smi") is None:
    return "no nvidia-smi: no NVIDIA GPU"
  listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                          text=True, timeout=30, check=False)
  if listed.returncode or "GPU" not in listed.stdout:
    return "nvidia-smi lists no GPU"
  return None


def test_each_island_sees_its_own_gpus(monkeypatch):
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  assert local_cluster.island_env("cpu", 1, 4) == {}
  assert local_cluster.island_env("cuda", 0, 2) == {
      "CUDA_VISIBLE_DEVICES": "0,1"}
  assert local_cluster.island_env("cuda", 1, 2) == {
      "CUDA_VISIBLE_DEVICES": "2,3"}
  assert local_cluster.island_env("rocm", 1, 1) == {"HIP_VISIBLE_DEVICES": "1"}
  # Only among the GPUs this process was given.
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
  assert local_cluster.island_env("cuda", 1, 2) == {
      "CUDA_VISIBLE_DEVICES": "6,7"}
  with pytest.raises(ValueError, match="too few for island 2"):
    local_cluster.island_env("cuda", 2, 2)
  assert local_cluster.island_env("tpu", 0, 4) == {}
  with pytest.raises(ValueError, match="one island"):
    local_cluster.island_env("tpu", 1, 4)
  with pytest.raises(ValueError, match="pins emulated CPU devices"):
    local_cluster.LocalCluster(1, 1, 16, device_cores=[[0]], platform="cuda")


@pytest.mark.integration
@pytest.mark.skipif(_cuda_host() is None, reason="this host has a GPU")
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_platform_the_host_lacks_fails_the_start_clearly(how):
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  if how == "environment":
    env["JAX_PATHWAYS_PLATFORM"] = "cuda"
  out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
      import jax_pathways
      from jax_pathways.cluster.local_cluster import ClusterError
      try:
        jax_pathways.initialize(islands=1, devices_per_island=1,
                                {'platform="cuda"' if how == "argument" else ""})
      except ClusterError as e:
        print("ERROR", e)
  """)], env=env, capture_output=True, text=True, timeout=120, check=False)
  assert "ERROR" in out.stdout, out.stderr[-2000:]
  assert "JAX cannot make a cuda client on this host" in out.stdout


@pytest.fixture(scope="module")
def cuda_results():
  why = _cuda_host()
  if why:
    pytest.skip(why)
  # XLA's GPU autotuner times candidate kernels at each compile, so the
  # worker's compile and this process's may pick gemm algorithms whose sums
  # round differently (seen on an H200: one float32 weight of mlp_training
  # 1 ulp apart). Without it both choose by the same rules; the flag reaches
  # the worker inside the program's compile options.
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
             XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                        " --xla_gpu_autotune_level=0").strip())
  env.pop("JAX_PLATFORMS", None)
  proc = subprocess.run([sys.executable, os.path.join(HERE, "cuda_client.py")],
                        env=env, capture_output=True, text=True, timeout=280,
                        check=False)
  lines = [json.loads(l) for l in proc.stdout.splitlines()
           if l.startswith("{")]
  assert lines, proc.stderr[-3000:]
  return lines[0], {l["program"]: l for l in lines[1:]}


@pytest.mark.integration
def test_the_island_shows_the_gpu(cuda_results):
  devices, _ = cuda_results
  # As plain JAX's: platform "gpu" (jaxlib's alias), the GPU's kind.
  assert devices["proxy"] == devices["gpu"], devices


@pytest.mark.integration
def test_the_training_example_runs_on_a_client_without_a_gpu():
  """examples/train_mlp.py unchanged, on one CUDA island, from a client
  whose JAX has no GPU backend (as on a CPU host): its eager ops lower for
  the island's platform."""
  why = _cuda_host()
  if why:
    pytest.skip(why)
  env = dict(os.environ, JAX_PATHWAYS_PLATFORM="cuda",
             JAX_PATHWAYS_ISLANDS="1", JAX_PATHWAYS_DEVICES_PER_ISLAND="1",
             XLA_PYTHON_CLIENT_PREALLOCATE="false")
  env.pop("JAX_PLATFORMS", None)
  out = subprocess.run(
      [sys.executable, os.path.join(HERE, "..", "..", "examples",
                                    "train_mlp.py")],
      env=env, capture_output=True, text=True, timeout=280, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "final loss" in out.stdout, out.stdout


@pytest.mark.integration
@pytest.mark.parametrize("program", [
    "mlp_training", "random_and_reductions", "matmuls", "convolution",
    "control_flow", "cholesky", "donation", "host_round_trip"])
def test_same_bits_as_plain_jax_on_the_gpu(cuda_results, program):
  _, results = cuda_results
  assert program in results, f"{program} did not run: {results}"
  assert results[program].get("same_bits") is True, results[program]
