"""Imported once by the fork server of one vllm-ascend tree's ranks
(``emu.cluster.rank_start``), never by a rank or the launcher: the tree whose root
``DYNTRA_EMU_PRELOAD_TREE`` names (the launching process resolved and checked it), with
its patches applied. The server is a fork of the one that imported vLLM and the rank's
engine (``VLLM_PRELOAD``), the long part of a vllm-ascend rank's start; a tree costs its
own import only. Every rank forked from the server has it all, so a vllm-ascend run
starts in about the time of one import, whatever its number of ranks.
"""

import os
import pathlib

from emu.impl.vllm_ascend import PRELOAD_TREE_VAR
from emu.impl.vllm_ascend.tree import import_tree

_root = os.environ.get(PRELOAD_TREE_VAR)
import_tree(pathlib.Path(_root) if _root else None)
