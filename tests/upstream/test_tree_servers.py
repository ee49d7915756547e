"""A vllm-ascend tree's fork server is a fork of one server that imported vLLM, shared by
every tree (``emu.cluster.rank_start``, ``Preload.base``): a second tree costs the import
of the tree, not of vLLM again. Each tree's ranks see their own tree; and when the
launcher is killed with SIGKILL, every server goes, taking its socket along."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import psutil
import pytest

from tests.upstream.conftest import REPO, TREE

pytestmark = pytest.mark.integration

# A launcher of its own (it is killed): the servers of two trees, one rank-like process
# from each that reports which vllm_ascend it has; then it waits to be killed.
_LAUNCHER = """
import json, multiprocessing, sys
from emu.cluster.rank_start import rank_starter
from emu.impl.vllm_ascend import VllmAscendImplementation
from emu.impl.vllm_ascend.tree import resolve

def tree_of_this_process(conn):
    conn.send(sys.modules["vllm_ascend"].__file__)

def main():
    out = {"servers": [], "trees": [], "base": None}
    for tree in sys.argv[1:]:
        preload = VllmAscendImplementation(resolve(tree), "plain").preload()
        starter = rank_starter("cpu", preload)
        ours, theirs = starter.context.Pipe(duplex=False)
        process = starter.context.Process(target=tree_of_this_process, args=(theirs,))
        with starter.starting():
            process.start()
        out["trees"].append(ours.recv())
        process.join()
        server = starter._server
        out["servers"].append([server._forkserver_pid, server._forkserver_address])
        out["base"] = rank_starter("cpu", preload.base)._server._forkserver_pid
    print(json.dumps(out), flush=True)
    sys.stdin.read()  # until killed

if __name__ == "__main__":
    main()
"""


@pytest.mark.timeout(300)
def test_tree_servers_are_forks_of_the_vllm_server_and_go_with_a_killed_launcher(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(TREE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "launcher.py").write_text(_LAUNCHER)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    launcher = subprocess.Popen([sys.executable, str(tmp_path / "launcher.py"), str(TREE),
                                 str(copy)], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        seen = json.loads(launcher.stdout.readline())
        servers = [psutil.Process(pid) for pid, _ in seen["servers"]]
        base = psutil.Process(seen["base"])
        parents = [base.ppid(), *(server.ppid() for server in servers)]
        processes = [base, *servers, *psutil.Process(launcher.pid).children(recursive=True)]
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    assert [os.path.realpath(tree) for tree in seen["trees"]] == [
        os.path.realpath(root / "vllm_ascend" / "__init__.py") for root in (TREE, copy)]
    assert parents == [launcher.pid, base.pid, base.pid]
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert alive == [], [p.cmdline()[:3] for p in alive]
    sockets = [address for _, address in seen["servers"]]
    assert [a for a in sockets if os.path.exists(a)] == []
    assert not os.path.exists(os.path.dirname(sockets[0]))  # the launcher's pymp-* dir
