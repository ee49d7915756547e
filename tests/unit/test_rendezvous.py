"""emu.cluster.rendezvous: which MASTER_ADDR values are loopback, and when rank 0 warns
under torchrun (the warning as a user sees it: tests/cli/test_security.py)."""

from __future__ import annotations

import logging

import pytest

from emu.cluster.rendezvous import is_loopback, warn_if_master_addr_exposed


@pytest.mark.parametrize("host,expected", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("localhost", True),
    ("192.0.2.2", False), ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
    ("no-such-host.invalid", False)])
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


@pytest.mark.parametrize("env,rank,warns", [
    ({"MASTER_ADDR": "10.1.2.3", "LOCAL_WORLD_SIZE": "2"}, 0, True),
    ({"MASTER_ADDR": "10.1.2.3", "LOCAL_WORLD_SIZE": "2"}, 1, False),  # rank 0 says it
    ({"MASTER_ADDR": "10.1.2.3", "LOCAL_WORLD_SIZE": "1"}, 0, False),  # two nodes
    ({"MASTER_ADDR": "10.1.2.3"}, 0, False),  # how many nodes: unknown
    ({"MASTER_ADDR": "127.0.0.1", "LOCAL_WORLD_SIZE": "2"}, 0, False),
    ({"MASTER_ADDR": "localhost", "LOCAL_WORLD_SIZE": "2"}, 0, False)])
def test_rank_0_warns_when_a_single_node_run_has_a_network_master_addr(
        monkeypatch, caplog, env, rank, warns):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="emu.cluster.rendezvous"):
        warn_if_master_addr_exposed(rank, world_size=2)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == warns
    if warns:
        assert messages[0].startswith("warning: MASTER_ADDR=10.1.2.3 is not a loopback "
                                      "address, but all 2 ranks of this run are on this "
                                      "machine")
