"""Builds jax_pathways and its C++ core (jax_pathways._core, from csrc/)."""
import glob
import os

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup

# Compile csrc/ on every core (the CI machine has two).
ParallelCompile("JAX_PATHWAYS_BUILD_JOBS", default=0).install()

HERE = os.path.dirname(os.path.abspath(__file__))


def _core_sources() -> list[str]:
  sources = glob.glob(os.path.join("csrc", "**", "*.cc"), recursive=True)
  return sorted(s for s in sources if not s.endswith("_test.cc"))


core = Pybind11Extension(
    "jax_pathways._core",
    _core_sources(),
    include_dirs=["csrc"],
    cxx_std=17,
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=["-pthread"],
)

setup(
    name="jax_pathways",
    version="0.1.0",
    description=("A single-controller runtime for JAX: one Python process "
                 "drives many accelerator hosts."),
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["jax_pathways", "jax_pathways.*"]),
    package_data={"jax_pathways": ["_core.pyi", "py.typed"]},
    ext_modules=[core],
    cmdclass={"build_ext": build_ext},
    install_requires=[
        "jax==0.10.2",
        "jaxlib==0.10.2",
        "numpy",
        "absl-py",
        "grpcio",
        "protobuf",
    ],
    extras_require={
        "examples": ["optax"],
        "test": ["optax", "pytest", "pytest-timeout"],
    },
    entry_points={
        "console_scripts": ["jax-pathways = jax_pathways.cli:main"],
        # JAX imports this module at backend discovery; it registers the
        # 'proxy' backend (JAX's own IFRT-proxy client), nothing else.
        "jax_plugins": ["jax_pathways = jax_pathways.frontend.plugin"],
    },
    zip_safe=False,
)
