"""Builds jax_pathways and its C++ extensions from csrc/.

* jax_pathways._core: dispatcher, worker executor, transport (no deps).
* jax_pathways._frontend: the controller's gRPC server (links grpc++; only
  the controller process loads it). Needs libgrpc++-dev and pkg-config:
  scripts/install_system_deps.sh installs them.
"""
import glob
import os
import shlex
import subprocess

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

# Compile csrc/ on every core (the CI machine has two).
ParallelCompile("JAX_PATHWAYS_BUILD_JOBS", default=0).install()

_CXX_FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"]
_LINK_FLAGS = ["-pthread"]

# JAX_PATHWAYS_SANITIZE=address|thread builds both extensions under that
# sanitizer (BUILD.md, "Sanitizers", says how to load and run them).
_SANITIZE = os.environ.get("JAX_PATHWAYS_SANITIZE", "")
if _SANITIZE:
  if _SANITIZE not in ("address", "thread"):
    raise SystemExit(f"jax_pathways: JAX_PATHWAYS_SANITIZE={_SANITIZE!r}; "
                     f"expected 'address' or 'thread' (or unset)")
  # -g1: line tables only (reports still name file:line), a fifth less
  # compile time than -g.
  _SANITIZER_FLAGS = [f"-fsanitize={_SANITIZE}", "-fno-omit-frame-pointer",
                      "-g1"]
  # One unit per extension (_as_one): GCC's rule that a type of
  # the main file may use its anonymous namespace would not see the files.
  _CXX_FLAGS = _CXX_FLAGS + ["-Wno-subobject-linkage"]
  # -O0: builds in half the time of -O1 (the suite builds both modes on two
  # cores) and the sanitizers see every access.
  _CXX_FLAGS = ["-O0"] + _CXX_FLAGS[1:] + _SANITIZER_FLAGS
  _LINK_FLAGS += _SANITIZER_FLAGS


def _sources(*patterns: str) -> list[str]:
  out = []
  for pattern in patterns:
    out += glob.glob(os.path.join("csrc", pattern), recursive=True)
  out = sorted(s for s in set(out) if not s.endswith("_test.cc"))
  return _as_one(out) if _SANITIZE else out


def _as_one(sources: list[str]) -> list[str]:
  """A sanitizer build's sources as one unit per extension: at -O0 the
  headers (the standard library's, pybind11's, grpc++'s) are most of each
  file's compile time, and the suite builds both modes. The unit is
  generated under build/ and rewritten (or touched) when a file it
  includes is newer, so incremental builds see their changes."""
  module = next(s for s in sources if s.endswith("module.cc"))
  unit = os.path.join("build", f"unity-{_SANITIZE}",
                      os.path.basename(module).replace(".cc", "_unit.cc"))
  text = "".join(f'#include "{os.path.relpath(s, "csrc")}"\n' for s in sources)
  os.makedirs(os.path.dirname(unit), exist_ok=True)
  stale = (not os.path.exists(unit) or open(unit).read() != text or
           max(os.path.getmtime(s) for s in sources) > os.path.getmtime(unit))
  if stale:
    with open(unit, "w") as f:
      f.write(text)
  return [unit]


def _pkg_config(package: str) -> tuple[list[str], list[str]]:
  try:
    cflags = subprocess.check_output(["pkg-config", "--cflags", package],
                                     text=True)
    libs = subprocess.check_output(["pkg-config", "--libs", package], text=True)
  except (OSError, subprocess.CalledProcessError):
    raise SystemExit(
        f"jax_pathways: building the controller's gRPC frontend needs "
        f"{package} (C++) and pkg-config. Install them with "
        f"scripts/install_system_deps.sh (Debian/Ubuntu: apt-get install "
        f"libgrpc++-dev pkg-config), then build again.") from None
  return shlex.split(cflags), shlex.split(libs)


_grpc_cflags, _grpc_libs = _pkg_config("grpc++")
# A changed header rebuilds the extension (an in-place build compares times).
_HEADERS = sorted(glob.glob(os.path.join("csrc", "**", "*.h"), recursive=True))

core = Pybind11Extension(
    "jax_pathways._core",
    _sources("common/*.cc", "transport/*.cc", "controller/dispatcher/*.cc",
             "worker/*.cc", "controller/fast_path/*.cc", "python/module.cc",
             "python/status_bindings.cc", "python/op_bindings.cc",
             "python/dispatcher_bindings.cc", "python/executor_bindings.cc",
             "python/fast_path_bindings.cc"),
    include_dirs=["csrc"],
    depends=_HEADERS,
    cxx_std=17,
    extra_compile_args=_CXX_FLAGS,
    extra_link_args=_LINK_FLAGS,
)

frontend = Pybind11Extension(
    "jax_pathways._frontend",
    _sources("common/bytes.cc", "controller/server/*.cc",
             "python/frontend_module.cc",
             "python/frontend_bindings.cc", "python/status_bindings.cc"),
    include_dirs=["csrc"],
    depends=_HEADERS,
    cxx_std=17,
    extra_compile_args=_CXX_FLAGS + _grpc_cflags,
    extra_link_args=_LINK_FLAGS + _grpc_libs,
)

setup(
    name="jax_pathways",
    version="0.1.0",
    description=("A single-controller runtime for JAX: one Python process "
                 "drives many accelerator hosts."),
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",  # jax 0.10.2 needs 3.11
    packages=find_packages(include=["jax_pathways", "jax_pathways.*"]),
    package_data={"jax_pathways": ["_core.pyi", "_frontend.pyi", "py.typed"]},
    ext_modules=[core, frontend],
    cmdclass={"build_ext": build_ext},
    install_requires=[
        "jax==0.10.2",
        "jaxlib==0.10.2",
        "numpy",
        "absl-py",
        "grpcio",
        "protobuf",
        "pyyaml",
    ],
    extras_require={
        "examples": ["optax"],
        # Workers on accelerators (`jax-pathways worker --platform ...`):
        # JAX's own PJRT plugins, at the jax every process runs. Clients
        # lowering custom kernels for them (Pallas, jax-triton) want the
        # same extra.
        "cuda12": ["jax[cuda12]==0.10.2"],
        "cuda13": ["jax[cuda13]==0.10.2"],
        "rocm": ["jax[rocm7-local]==0.10.2"],
        "tpu": ["jax[tpu]==0.10.2"],
        # jax_pathways.ray, `jax-pathways ray`: a cluster as Ray actors.
        "ray": ["ray>=2.60.0"],
        # pybind11, setuptools: tests/sanitizers/ builds csrc/.
        # pytest-xdist: the suite runs its files on parallel workers.
        # pathwaysutils (brings orbax-checkpoint): tests/elastic/.
        # kubernetes: tests/deploy/k8s_test.py checks the manifests against
        # its models of the API. ray: tests/deploy/ray_test.py runs a
        # cluster on a local Ray cluster; psutil finds the processes there.
        # flatbuffers: jax.export's serialization (tests/conformance/
        # export_test.py), which JAX leaves optional.
        "test": ["optax", "pytest", "pytest-timeout", "pytest-xdist",
                 "pybind11>=3.0", "flatbuffers",
                 "setuptools>=64", "pathwaysutils==0.1.13",
                 "orbax-checkpoint", "kubernetes==37.0.2", "ray==2.60.0",
                 "psutil"],
    },
    entry_points={
        "console_scripts": ["jax-pathways = jax_pathways.cli:main"],
        # JAX imports this module at backend discovery; it registers the
        # 'proxy' backend (JAX's own IFRT-proxy client), nothing else.
        "jax_plugins": ["jax_pathways = jax_pathways.client.plugin"],
    },
    zip_safe=False,
)
