"""This host's clusters: each lists itself privately, a dead one's entry
is dropped by the next reader."""
import json
import os
import stat
import subprocess
import sys

from jax_pathways.cluster import host_registry


def test_entries_are_private_and_outlive_nothing(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
  path = host_registry.add("controller", "127.0.0.1:8470", "secret", "/logs")
  assert stat.S_IMODE(os.stat(host_registry.folder()).st_mode) == 0o700
  assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
  [entry] = host_registry.live()
  assert (entry["kind"], entry["address"], entry["token"], entry["pid"],
          entry["log_dir"]) == ("controller", "grpc://127.0.0.1:8470",
                                "secret", os.getpid(), "/logs")
  # A process killed before it could remove its entry.
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  dead = os.path.join(host_registry.folder(), "controller-dead.json")
  with open(dead, "w") as f:
    json.dump({"kind": "controller", "address": "grpc://x:1", "token": None,
               "pid": int(gone.stdout), "log_dir": None}, f)
  assert [e["pid"] for e in host_registry.live()] == [os.getpid()]
  assert not os.path.exists(dead)
  host_registry.remove(path)
  assert host_registry.live() == []


def test_a_folder_others_may_enter_is_not_used(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
  os.makedirs(host_registry.folder(), mode=0o755)
  os.chmod(host_registry.folder(), 0o755)
  assert host_registry.add("controller", "127.0.0.1:1", "secret") is None
  assert os.listdir(host_registry.folder()) == []
