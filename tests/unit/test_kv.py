"""Unit tests of emu.impl.kit.kv: block pool, KV cache manager, remote-KV connector."""

import math

import pytest

from emu.impl.kit.kv import BlockPool, KVCacheManager
from emu.impl.kit.request import Request
from emu.rank.remote_kv import RemoteKVConnector


def make_manager(num_blocks=10, block_size=4):
    return KVCacheManager(BlockPool(num_blocks), block_size)


def test_pool_rejects_empty_capacity():
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        BlockPool(0)


def test_get_computed_blocks_never_hits():
    manager = make_manager()
    assert manager.get_computed_blocks(Request("a", 9, 1)) == ((), 0)


def test_allocate_slots_grows_by_ceil_of_tokens():
    manager = make_manager(num_blocks=10, block_size=4)
    request = Request("a", 9, 5)
    new = manager.allocate_slots(request, 9)
    assert len(new) == 3
    assert manager.num_blocks_of(request) == 3
    request.num_computed_tokens = 9
    assert list(manager.allocate_slots(request, 1)) == []  # token 10 fits in block 3
    request.num_computed_tokens = 12
    assert len(manager.allocate_slots(request, 1)) == 1  # token 13 needs block 4
    assert manager.num_blocks_of(request) == 4
    assert manager.pool.num_used_blocks == 4
    assert manager.pool.get_num_free_blocks() == 6  # 4 of the 10 blocks in use
    assert manager.holders() == {"a"}


def test_allocate_slots_counts_external_and_local_computed_tokens():
    manager = make_manager(num_blocks=10, block_size=4)
    request = Request("a", 10, 5)
    new = manager.allocate_slots(request, 0, num_new_computed_tokens=2,
                                 num_external_computed_tokens=8, delay_cache_blocks=True)
    assert len(new) == 3
    assert manager.get_blocks("a") == list(new)


def test_allocate_slots_fails_without_taking_blocks():
    manager = make_manager(num_blocks=3, block_size=4)
    first, second = Request("a", 8, 1), Request("b", 8, 1)
    assert manager.allocate_slots(first, 8) is not None
    assert manager.allocate_slots(second, 8) is None
    assert manager.num_blocks_of(second) == 0
    assert manager.pool.get_num_free_blocks() == 1
    assert manager.holders() == {"a"}  # the failed allocation made b no holder
    manager.free(first)
    assert manager.pool.get_num_free_blocks() == 3
    assert manager.holders() == set()
    assert manager.allocate_slots(second, 8) is not None


def test_full_sequence_must_fit_checks_whole_sequence():
    manager = make_manager(num_blocks=2, block_size=4)
    request = Request("a", 12, 1)
    assert manager.allocate_slots(request, 4, full_sequence_must_fit=True) is None
    assert len(manager.allocate_slots(request, 4)) == 1


def test_block_ids_are_unique_across_requests():
    manager = make_manager(num_blocks=8, block_size=2)
    requests = [Request(f"r{i}", 4, 1) for i in range(4)]
    for request in requests:
        manager.allocate_slots(request, 4)
    ids = [b for r in requests for b in manager.get_blocks(r.request_id)]
    assert sorted(ids) == list(range(8))
    assert manager.num_held_blocks == manager.pool.num_used_blocks == 8
    assert manager.holders() == {"r0", "r1", "r2", "r3"}


def test_connector_offers_full_prompt_once():
    connector = RemoteKVConnector(0.01, 0.001)
    request = Request("a", 100, 5)
    assert connector.get_num_new_matched_tokens(request, 0) == (100, True)
    assert connector.get_num_new_matched_tokens(request, 30) == (70, True)
    connector.update_state_after_alloc(request, [0, 1], 100)
    # the remote prompt is claimed: a later lookup (after a preemption) loads nothing
    assert connector.get_num_new_matched_tokens(request, 0) == (0, False)


def test_connector_nothing_to_load_when_local_covers_prompt():
    connector = RemoteKVConnector(0.01, 0.001)
    assert connector.get_num_new_matched_tokens(Request("a", 8, 1), 8) == (0, False)


def test_connector_transfer_latency_fixed_plus_per_block():
    connector = RemoteKVConnector(latency_fixed_s=0.5, latency_per_block_s=0.25)
    connector.set_virtual_time(10.0)
    connector.update_state_after_alloc(Request("a", 8, 1), [0, 1, 2, 3], 8)  # done 11.5
    connector.update_state_after_alloc(Request("b", 8, 1), [4], 8)  # done 10.75
    assert connector.finished_recving(10.7) == set()
    assert connector.finished_recving(10.75) == {"b"}
    assert connector.finished_recving(11.49) == set()
    assert connector.finished_recving(12.0) == {"a"}
    assert connector.finished_recving(100.0) == set()  # reported once


def test_connector_zero_external_starts_no_transfer():
    connector = RemoteKVConnector(0.0, 0.0)
    request = Request("a", 8, 1)
    connector.update_state_after_alloc(request, [0], 0)
    assert connector.finished_recving(1.0) == set()
    assert connector.get_num_new_matched_tokens(request, 0) == (8, True)


def test_connector_not_ready_for_n_queries():
    connector = RemoteKVConnector(0.0, 0.0)
    request = Request("a", 8, 1)
    connector.set_not_ready("a", queries=2)
    assert connector.get_num_new_matched_tokens(request, 0) == (None, False)
    assert connector.get_num_new_matched_tokens(request, 0) == (None, False)
    assert connector.get_num_new_matched_tokens(request, 0) == (8, True)
    assert connector.get_num_new_matched_tokens(Request("b", 4, 1), 0) == (4, True)


def test_connector_not_ready_until_virtual_time():
    connector = RemoteKVConnector(0.0, 0.0)
    request = Request("a", 8, 1)
    connector.set_not_ready("a", until_s=2.0)
    connector.set_virtual_time(1.999)
    assert connector.get_num_new_matched_tokens(request, 0) == (None, False)
    connector.set_virtual_time(2.0)
    assert connector.get_num_new_matched_tokens(request, 0) == (8, True)


def test_connector_completion_override_never_completes():
    connector = RemoteKVConnector(0.0, 0.0)
    connector.set_completion_time("a", math.inf)
    connector.set_completion_time("b", 3.0)
    connector.update_state_after_alloc(Request("a", 8, 1), [0], 8)
    connector.update_state_after_alloc(Request("b", 8, 1), [1], 8)
    connector.update_state_after_alloc(Request("c", 8, 1), [2], 8)
    assert connector.finished_recving(0.0) == {"c"}
    assert connector.finished_recving(2.9) == set()
    assert connector.finished_recving(1e12) == {"b"}


def test_connector_request_finished_forgets_state():
    connector = RemoteKVConnector(0.0, 0.0)
    request = Request("a", 8, 1)
    connector.update_state_after_alloc(request, [0], 8)
    connector.set_not_ready("a", queries=5)
    connector.request_finished(request)
    assert connector.get_num_new_matched_tokens(request, 0) == (8, True)
