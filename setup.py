"""Builds jax_pathways and its C++ extensions from csrc/.

* jax_pathways._core: dispatcher, worker executor, transport, fast path.
* jax_pathways._server: the controller's gRPC server (links grpc++; only
  the controller process loads it).
Both link libprotobuf: the IFRT-proxy messages C++ reads are classes protoc
generates here from the schema jaxlib embeds. Needs libgrpc++-dev,
libprotobuf-dev, protobuf-compiler and pkg-config:
scripts/install_system_deps.sh installs them.
"""
import glob
import importlib.util
import os
import shlex
import shutil
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


_PROTO_DIR = os.path.join("build", "ifrt_protos")
# The host-buffer messages are the gRPC server's, the rest the fast path's;
# each is compiled into one extension only (both register their messages
# with the one libprotobuf of a process).
_SERVER_PROTO = "xla/python/ifrt_proxy/common/grpc_ifrt_service.proto"


def _ifrt_protos() -> dict[str, str]:
  """The IFRT-proxy messages C++ reads, as C++: protoc generates them from
  the schema jaxlib embeds (the part jax_pathways/wire/descriptors.py names)
  into build/ifrt_protos/, again only when that schema changed. Returns
  each .proto's generated source by file name."""
  spec = importlib.util.spec_from_file_location(
      "_jax_pathways_descriptors",
      os.path.join(HERE, "jax_pathways", "wire", "descriptors.py"))
  descriptors = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(descriptors)
  with open(descriptors.library_path(), "rb") as f:
    schema = descriptors.subset(descriptors.extract(f.read()),
                                descriptors.CXX_MESSAGES)
  sources = {f.name: os.path.join(_PROTO_DIR, f.name.replace(".proto", ".pb.cc"))
             for f in schema.file}
  blob = schema.SerializeToString()
  kept = os.path.join(_PROTO_DIR, "schema.pb")
  if (os.path.exists(kept) and open(kept, "rb").read() == blob and
      all(map(os.path.exists, sources.values()))):
    return sources
  # Generated aside, then moved in file by file: a build running beside
  # this one (the sanitizer modes) reads either version whole.
  tmp = f"{_PROTO_DIR}.{os.getpid()}"
  os.makedirs(tmp, exist_ok=True)
  with open(os.path.join(tmp, "schema.pb"), "wb") as f:
    f.write(blob)
  try:
    subprocess.check_call(["protoc", f"--descriptor_set_in={tmp}/schema.pb",
                           f"--cpp_out={tmp}", *sources])
  except OSError:
    raise SystemExit(
        "jax_pathways: building csrc/ needs protoc (protobuf-compiler) and "
        "libprotobuf-dev. Install them with scripts/install_system_deps.sh, "
        "then build again.") from None
  for name in sorted(glob.glob(f"{tmp}/**/*.*", recursive=True),
                     key=lambda n: n.endswith("schema.pb")):  # it last
    dest = os.path.join(_PROTO_DIR, os.path.relpath(name, tmp))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.replace(name, dest)
  shutil.rmtree(tmp)
  return sources


class _BuildExt(build_ext):
  """build_ext that first generates the IFRT-proxy messages' C++ (only a
  build needs jaxlib and protoc; metadata does not)."""

  def run(self) -> None:
    protos = _ifrt_protos()
    headers = glob.glob(os.path.join(_PROTO_DIR, "**", "*.pb.h"),
                        recursive=True)
    for ext in self.extensions:
      if ext.name == "jax_pathways._server":
        ext.sources.append(protos[_SERVER_PROTO])
      else:
        ext.sources += [src for name, src in protos.items()
                        if name != _SERVER_PROTO]
      ext.depends += headers
    super().run()


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
        f"jax_pathways: building csrc/ needs {package} (C++) and "
        f"pkg-config. Install them with scripts/install_system_deps.sh "
        f"(Debian/Ubuntu: apt-get install libgrpc++-dev libprotobuf-dev "
        f"protobuf-compiler pkg-config), then build again.") from None
  return shlex.split(cflags), shlex.split(libs)


_grpc_cflags, _grpc_libs = _pkg_config("grpc++")
_protobuf_cflags, _protobuf_libs = _pkg_config("protobuf")
# A changed header rebuilds the extension (an in-place build compares times).
_HEADERS = sorted(glob.glob(os.path.join("csrc", "**", "*.h"), recursive=True))

core = Pybind11Extension(
    "jax_pathways._core",
    _sources("common/*.cc", "transport/*.cc", "controller/dispatcher/*.cc",
             "worker/*.cc", "controller/fast_path/*.cc", "python/module.cc",
             "python/status_bindings.cc", "python/op_bindings.cc",
             "python/dispatcher_bindings.cc", "python/executor_bindings.cc",
             "python/fast_path_bindings.cc"),
    include_dirs=["csrc", _PROTO_DIR],
    depends=list(_HEADERS),
    cxx_std=17,
    extra_compile_args=_CXX_FLAGS + _protobuf_cflags,
    extra_link_args=_LINK_FLAGS + _protobuf_libs,
)

frontend = Pybind11Extension(
    "jax_pathways._server",
    _sources("common/bytes.cc", "controller/server/*.cc",
             "python/server_module.cc",
             "python/server_bindings.cc", "python/status_bindings.cc"),
    include_dirs=["csrc", _PROTO_DIR],
    depends=list(_HEADERS),
    cxx_std=17,
    extra_compile_args=_CXX_FLAGS + _grpc_cflags + _protobuf_cflags,
    extra_link_args=_LINK_FLAGS + _grpc_libs + _protobuf_libs,
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
    package_data={"jax_pathways": ["_core.pyi", "_server.pyi", "py.typed"]},
    ext_modules=[core, frontend],
    cmdclass={"build_ext": _BuildExt},
    install_requires=[
        "jax==0.10.2",
        "jaxlib==0.10.2",
        # Below 0.7: 0.7.0 registers its NumPy loops in ~0.55 s of CPU at
        # import (against numpy 2.4), which every process that imports jax
        # pays (controller, each worker, each client): 0.6 imports in 0.04 s.
        "ml_dtypes>=0.5,<0.7",
        "numpy",
        "absl-py",
        "grpcio",
        "protobuf",
        "pyyaml",
        # Workers write and read saved arrays with it (storage/), in the
        # layout orbax writes with it.
        "tensorstore",
        # colocated_python pickles functions with it (client) and its
        # colocated processes unpickle them (colocated/).
        "cloudpickle",
    ],
    extras_require={
        # grain: examples/island_input.py's pipeline on the islands.
        "examples": ["optax", "grain"],
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
        "test": ["optax", "grain", "pytest", "pytest-timeout", "pytest-xdist",
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
