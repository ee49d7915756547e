"""Which vllm-ascend and which vLLM a run uses, checked before any rank starts.

The launching process resolves the tree once per run (``--vllm-ascend PATH``, else the
``DYNTRA_VLLM_ASCEND`` environment variable, else an importable ``vllm_ascend``) and
checks everything that can be checked without importing vLLM (which costs seconds):
the path is a vllm-ascend source tree, the tree has DyntraLB, vLLM is installed, and
``torch_npu`` is not installed without CANN. Each failure is one ``TreeError`` line. The
ranks (or their fork server) then import the tree from its root with ``import_tree``.

A vLLM other than the release the tree pins is tried (docs/upstream-findings.md lists
the releases the shared tree runs on): where the tree's code does not fit that vLLM, the
rank's failure is one ``TreeError`` line naming both releases (``VersionDrift``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import types
from dataclasses import dataclass

ENV_VAR = "DYNTRA_VLLM_ASCEND"
# The vLLM release this emulation is written against (vllm-ascend pins it in
# .github/vllm-release-tag.commit; a tree without that file is taken to pin this one).
SUPPORTED_VLLM = "0.27.1"
# Files that exist from the commit DyntraLB landed in (ffa55704fb, PR #12292) on.
DYNTRA_LB_FILES = ("vllm_ascend/core/dyntra_lb_scheduler.py",
                   "vllm_ascend/patch/platform/patch_dyntra_lb_core.py")
# Packages whose __init__ imports NPU-only patches; registered bare (see import_tree).
_BARE_PACKAGES = ("vllm_ascend.patch", "vllm_ascend.patch.platform")


class TreeError(ValueError):
    """The vllm-ascend tree or the vLLM install cannot run the emulation."""


@dataclass(frozen=True)
class Tree:
    """A checked vllm-ascend tree: ``root`` holds the ``vllm_ascend`` package (None: the
    installed package is used), ``commit`` its git commit when it is a checkout."""

    root: pathlib.Path | None
    commit: str | None
    vllm_version: str
    vllm_pinned: str = SUPPORTED_VLLM

    def describe(self) -> dict:
        """What metrics.json and summary.md record about the implementation."""
        return {"vllm_ascend": str(self.root) if self.root is not None else "installed",
                "vllm_ascend_commit": self.commit,
                "vllm_ascend_sha256": self.sha256,
                "vllm_version": self.vllm_version,
                "vllm_pinned": self.vllm_pinned}

    @property
    def on_pinned_vllm(self) -> bool:
        """Whether the installed vLLM is the release the tree pins."""
        return self.vllm_version.split("+")[0] == self.vllm_pinned

    def drift_error(self, exc: BaseException) -> TreeError:
        """The one line of a tree whose code failed on a vLLM it does not pin."""
        return TreeError(f"this vllm-ascend pins vLLM {self.vllm_pinned} and does not run "
                         f"on the installed vLLM {self.vllm_version}: "
                         f"{type(exc).__name__}: {exc}")

    @functools.cached_property
    def sha256(self) -> str:
        """The package's ``content_hash``, computed the first time it is asked for."""
        return content_hash(self.package)

    @property
    def package(self) -> pathlib.Path:
        """The ``vllm_ascend`` package directory the ranks import."""
        if self.root is not None:
            return self.root / "vllm_ascend"
        return pathlib.Path(importlib.util.find_spec("vllm_ascend").origin).parent


def content_hash(package: pathlib.Path) -> str:
    """SHA-256 over every file of the ``vllm_ascend`` package (its path inside the package
    and its bytes, in path order; Python's bytecode caches left out): which code ran,
    also for a tree that is no git checkout or has uncommitted changes. Two trees with
    the same hash run the same vllm-ascend."""
    digest = hashlib.sha256()
    files = sorted(p for p in package.rglob("*") if p.is_file()
                   and "__pycache__" not in p.parts and p.suffix != ".pyc")
    for path in files:
        data = path.read_bytes()
        digest.update(f"{path.relative_to(package).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def resolve(path: str | os.PathLike | None) -> Tree:
    """Check the tree named by ``path`` (or the environment variable, or the installed
    package) and the vLLM install; raise TreeError naming what is wrong."""
    _check_torch_npu()
    if path is None:
        path = os.environ.get(ENV_VAR) or None
    if path is None:
        spec = importlib.util.find_spec("vllm_ascend")
        if spec is None or spec.origin is None:
            raise TreeError(
                "no vllm-ascend tree given and no vllm_ascend package installed: pass "
                f"--vllm-ascend PATH or set {ENV_VAR}")
        root = pathlib.Path(spec.origin).parent.parent
        _check_dyntra_lb(root, "the installed vllm_ascend")
        return Tree(None, None, _check_vllm(root), pinned_vllm(root))
    root = _tree_root(pathlib.Path(path))
    _check_dyntra_lb(root, str(path))
    return Tree(root.resolve(), _git_commit(root), _check_vllm(root), pinned_vllm(root))


def _tree_root(path: pathlib.Path) -> pathlib.Path:
    if not path.exists():
        raise TreeError(f"vllm-ascend tree {path}: no such directory")
    if (path / "vllm_ascend" / "__init__.py").is_file():
        return path
    if path.name == "vllm_ascend" and (path / "__init__.py").is_file():
        return path.parent
    raise TreeError(f"{path} is not a vllm-ascend source tree (no "
                    f"{path / 'vllm_ascend' / '__init__.py'})")


def _check_dyntra_lb(root: pathlib.Path, name: str) -> None:
    missing = [f for f in DYNTRA_LB_FILES if not (root / f).is_file()]
    if missing:
        raise TreeError(f"{name}: this vllm-ascend has no DyntraLB (missing {missing[0]}; "
                        "DyntraLB landed in commit ffa55704fb, PR #12292)")


def pinned_vllm(root: pathlib.Path) -> str:
    """The vLLM release the tree pins."""
    tag_file = root / ".github" / "vllm-release-tag.commit"
    if tag_file.is_file():
        return tag_file.read_text().strip().removeprefix("v")
    return SUPPORTED_VLLM


def installed_vllm() -> str | None:
    """vLLM's version without importing it (the import costs seconds)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = pathlib.Path(next(iter(spec.submodule_search_locations))) / "_version.py"
    try:
        match = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)",
                          version_file.read_text())
    except OSError:
        return None
    return match.group(1) if match else None


def _check_vllm(root: pathlib.Path) -> str:
    pinned = pinned_vllm(root)
    version = installed_vllm()
    if version is None:
        raise TreeError(
            f"vLLM {pinned} is not installed (on a CPU machine: see "
            "docs/vllm-ascend.md, its environment)")
    return version


def _check_torch_npu() -> None:
    """With torch_npu installed but CANN not set up, even ``import torch`` fails inside
    the ranks; say so once, here."""
    if importlib.util.find_spec("torch_npu") is None:
        return
    if not any(os.environ.get(v) for v in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")):
        raise TreeError("torch_npu is installed but CANN is not set up (no ASCEND_HOME_PATH "
                        "or ASCEND_TOOLKIT_HOME): source CANN's set_env.sh, or use an "
                        "environment without torch_npu")


def _git_commit(root: pathlib.Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def import_tree(root: pathlib.Path | None) -> types.ModuleType:
    """In a rank: import vllm-ascend's DyntraLB engine-core module from the tree at
    ``root`` (``Tree.root``; None: the installed package).

    ``vllm_ascend/patch/__init__.py`` and ``vllm_ascend/patch/platform/__init__.py``
    import every platform patch, several of which need torch_npu. Production imports
    them all on an NPU; here the two packages are registered as bare modules (their
    ``__path__`` set, their ``__init__`` not run), so that only the DyntraLB core patch
    and what it imports itself (the balance-scheduling patch, vllm-ascend's config and
    the DyntraLB scheduler) run, in the same order as in production.
    """
    if root is not None:
        sys.path.insert(0, str(root))
    import vllm_ascend

    base = pathlib.Path(vllm_ascend.__file__).parent
    for name in _BARE_PACKAGES:
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(base.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = module
    import vllm_ascend.patch.platform.patch_dyntra_lb_core as core

    return core
