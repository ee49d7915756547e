"""The command's bytecode cache (emu/bytecode.py): a start of ``dyntra-emu`` compiles a
module once, into a cache of the kit's own, even where ``PYTHONDONTWRITEBYTECODE`` is
set, and writes nothing beside the sources it imports; the fork server of the ranks,
started with ``-B`` by multiprocessing in such an environment, writes the cache too.

Each test starts a fresh interpreter with the environment a user of such a machine has
(``PYTHONDONTWRITEBYTECODE=1``, no ``PYTHONPYCACHEPREFIX``) and its own cache directory
(``XDG_CACHE_HOME``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = "import probe_pkg.probe as p, sys; print(p.__cached__); print(sys.pycache_prefix)"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    env.update(PYTHONDONTWRITEBYTECODE="1", XDG_CACHE_HOME=str(tmp_path / "cache"),
               PYTHONPATH=str(tmp_path / "tree"), **extra)
    return env


def _tree(tmp_path: Path) -> Path:
    """A source tree the kit does not own: one package with one module."""
    package = tmp_path / "tree" / "probe_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "probe.py").write_text("VALUE = 1\n")
    return package


def _start(code: str, env: dict[str, str], *flags: str) -> list[str]:
    proc = subprocess.run([sys.executable, *flags, "-c", code], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_the_command_compiles_a_module_once_into_its_own_cache(tmp_path):
    package = _tree(tmp_path)
    env = _env(tmp_path)
    # Without the command, this environment writes no bytecode anywhere.
    assert _start(PROBE, env)[1] == "None"
    assert not list((tmp_path / "cache").rglob("*.pyc"))

    cached, prefix = _start("import emu.cli.errors; " + PROBE, env)
    assert prefix == str(tmp_path / "cache" / "dyntra-emu" / "pycache")
    assert Path(cached).is_file() and Path(cached).is_relative_to(prefix)
    assert not (package / "__pycache__").exists()  # nothing beside the sources
    # The command's own modules are there too, for the next start.
    assert list(Path(prefix).rglob("emu/cli/errors.*.pyc"))

    # The next start reads it as it is: not compiled again.
    written = Path(cached).stat().st_mtime_ns
    assert _start("import emu.cli; " + PROBE, env)[0] == cached
    assert Path(cached).stat().st_mtime_ns == written


def test_a_prefix_the_user_chose_is_kept(tmp_path):
    _tree(tmp_path)
    mine = tmp_path / "mine"
    cached, prefix = _start("import emu.cli; " + PROBE,
                            _env(tmp_path, PYTHONPYCACHEPREFIX=str(mine)))
    assert prefix == str(mine)
    assert Path(cached).is_file() and Path(cached).is_relative_to(mine)


def test_the_fork_server_writes_the_cache_though_started_with_B(tmp_path):
    # multiprocessing starts the ranks' fork server with the command's interpreter
    # flags: -B where PYTHONDONTWRITEBYTECODE is set (the environment has the command's
    # cache). Its preload module comes first; what the server imports after it (here the
    # probe) is written. The cache this session already has, if any: torch is in it.
    _tree(tmp_path)
    env = _env(tmp_path, PYTHONPYCACHEPREFIX=sys.pycache_prefix or str(tmp_path / "cache"))
    cached, prefix = _start("import emu.cluster.rank_preload; " + PROBE, env, "-B")
    assert prefix == env["PYTHONPYCACHEPREFIX"]
    assert Path(cached).is_file() and Path(cached).is_relative_to(prefix)
