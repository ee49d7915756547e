"""Device selection: cpu / npu / auto, and the error an NPU run gives when torch_npu or its
runtime is missing. torch_npu is never installed here: the import is replaced."""

import logging
import subprocess
import sys

import psutil
import pytest

from emu.cluster import device
from emu.cluster.device import DeviceError, bind_rank_device, select_device
from emu.cluster.launcher import launch
from emu.cluster.rank_process import join_from_env
from emu.run import run_cluster
from emu.spec import RunSpec, SpecError
from emu.workload import TraceRequest


class FakeNpu:
    """Stands in for `torch.npu` after a successful `import torch_npu`."""

    def __init__(self, available=True, count=8):
        self.available = available
        self.count = count
        self.set_device_calls = []

    def is_available(self):
        return self.available

    def device_count(self):
        return self.count

    def set_device(self, index):
        self.set_device_calls.append(index)


def use_npu(monkeypatch, npu):
    monkeypatch.setattr(device, "_import_torch_npu", lambda: npu)


def fail_import(monkeypatch, exc):
    def importer():
        raise exc

    monkeypatch.setattr(device, "_import_torch_npu", importer)


def not_installed():
    return ModuleNotFoundError("No module named 'torch_npu'", name="torch_npu")


# --- this machine, no stand-in: torch_npu is not installed -------------------------------


def test_this_machine_auto_picks_cpu_and_npu_is_refused():
    assert select_device("auto", local_ranks=2) == "cpu"
    with pytest.raises(DeviceError, match="torch_npu is not installed"):
        select_device("npu", local_ranks=2)


def test_probing_a_machine_without_torch_npu_does_not_import_torch():
    # A fresh interpreter: the CLI checks the device before anything imports torch, so
    # that a refused input or a process-transport launcher answers without torch's import.
    code = ("import sys; from emu.cluster.device import probe_npu; "
            "print(probe_npu().problem); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0].startswith("torch_npu is not installed")
    assert out[1] == "False"


def test_an_npu_run_fails_before_any_rank_starts(tmp_path):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    spec = RunSpec(trace=[TraceRequest("a", 0.0, 10, 2)], dp_size=2, out_dir=tmp_path,
                   device="npu")
    with pytest.raises(SpecError, match="RunSpec.device='npu': device 'npu' requested but "
                                        "torch_npu is not installed"):
        run_cluster(spec)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert not (tmp_path / "run.json").exists()


def test_launch_takes_a_chosen_device_kind():
    with pytest.raises(ValueError, match="device must be one of cpu, npu .select_device "
                                         "resolves 'auto'.; got 'auto'"):
        launch(print, None, dp_size=2, device="auto")


# --- selection ----------------------------------------------------------------------------


def test_cpu_never_probes_for_torch_npu(monkeypatch):
    fail_import(monkeypatch, AssertionError("cpu must not import torch_npu"))
    assert select_device("cpu", local_ranks=4) == "cpu"


@pytest.mark.parametrize("bad", ["gpu", "NPU", "", None, "cuda"])
def test_unknown_device_choice_is_refused(bad):
    with pytest.raises(ValueError, match="device must be one of auto, cpu, npu"):
        select_device(bad, local_ranks=2)


def test_auto_picks_npu_when_torch_npu_reports_devices(monkeypatch):
    use_npu(monkeypatch, FakeNpu(count=4))
    assert select_device("auto", local_ranks=4) == "npu"
    assert select_device("npu", local_ranks=4) == "npu"


def test_auto_falls_back_to_cpu_when_torch_npu_is_missing(monkeypatch, caplog):
    fail_import(monkeypatch, not_installed())
    with caplog.at_level(logging.WARNING):
        assert select_device("auto", local_ranks=2) == "cpu"
    assert caplog.records == []  # the normal case on a CPU machine: nothing to warn about


def test_auto_warns_when_torch_npu_is_installed_but_unusable(monkeypatch, caplog):
    use_npu(monkeypatch, FakeNpu(available=False))
    with caplog.at_level(logging.WARNING, logger="emu.cluster.device"):
        assert select_device("auto", local_ranks=2) == "cpu"
    assert "reports no available NPU" in caplog.text


def test_npu_without_torch_npu_names_the_missing_package(monkeypatch):
    fail_import(monkeypatch, not_installed())
    with pytest.raises(DeviceError) as info:
        select_device("npu", local_ranks=2)
    assert str(info.value).startswith("device 'npu' requested but torch_npu is not installed")
    assert "CANN" in str(info.value)


def test_npu_with_broken_runtime_names_the_import_failure(monkeypatch):
    fail_import(monkeypatch, OSError("libascendcl.so: cannot open shared object file"))
    with pytest.raises(DeviceError) as info:
        select_device("npu", local_ranks=2)
    message = str(info.value)
    assert "torch_npu is installed but failed to import" in message
    assert "OSError: libascendcl.so" in message
    assert "set_env.sh" in message


def test_npu_with_a_missing_dependency_of_torch_npu_names_it(monkeypatch):
    fail_import(monkeypatch, ModuleNotFoundError("No module named 'decorator'",
                                                 name="decorator"))
    with pytest.raises(DeviceError, match="a module it needs is missing: No module named "
                                          "'decorator'"):
        select_device("npu", local_ranks=2)


def test_npu_without_devices_names_the_runtime(monkeypatch):
    use_npu(monkeypatch, FakeNpu(available=False))
    with pytest.raises(DeviceError, match="reports no available NPU.*npu-smi"):
        select_device("npu", local_ranks=2)


@pytest.mark.parametrize("requested", ["npu", "auto"])
def test_too_few_npus_for_the_ranks_is_refused(monkeypatch, requested):
    use_npu(monkeypatch, FakeNpu(count=2))
    with pytest.raises(DeviceError, match="reports 2 NPU\\(s\\) and 4 rank\\(s\\)"):
        select_device(requested, local_ranks=4)


# --- inside a rank ------------------------------------------------------------------------


def test_cpu_rank_binds_to_cpu_and_gloo(monkeypatch):
    fail_import(monkeypatch, AssertionError("cpu must not import torch_npu"))
    assert bind_rank_device("cpu", 3) == ("cpu", "gloo")


def test_npu_rank_pins_its_local_device_and_uses_hccl(monkeypatch):
    npu = FakeNpu()
    use_npu(monkeypatch, npu)
    assert bind_rank_device("npu", 3) == ("npu:3", "hccl")
    assert npu.set_device_calls == [3]


# --- torchrun mode: the environment it needs -----------------------------------------------


@pytest.mark.parametrize("missing", ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"])
def test_join_from_env_names_a_missing_variable(monkeypatch, missing):
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(missing)
    with pytest.raises(RuntimeError, match=f"needs the {missing} environment variable"):
        join_from_env(print, None, device="cpu")


def test_join_from_env_refuses_a_non_integer_rank(monkeypatch):
    for name, value in {"RANK": "zero", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match="RANK must be an int; got 'zero'"):
        join_from_env(print, None, device="cpu")
