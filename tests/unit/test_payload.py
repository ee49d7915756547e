"""Spec C: the all-gather wire format (pack on each rank, unpack of all ranks)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dyntra_lb.payload import block_slots, pack, payload_len, unpack


def _buffer(max_num_seqs, fill=0):
    return np.full(payload_len(max_num_seqs), fill, dtype=np.int32)


def _block(buffers):
    """The gathered buffers as the coordinator holds them: the rows of one block."""
    return np.stack(buffers)


def _unpack(buffers):
    block = _block(buffers)
    return unpack(block, block_slots(block))


def _unpack_lists(buffers):
    """unpack with the block rows as lists, for comparing."""
    requests_by_rank, has_new_long = _unpack(buffers)
    return [(blks.tolist(), split) for blks, split in requests_by_rank], has_new_long


def test_payload_len():
    assert payload_len(1) == 4
    assert payload_len(2) == 6
    assert payload_len(128) == 258


def test_spec_example():
    out = _buffer(2, fill=77)  # stale content must be overwritten
    pack(out, [5, 3], [9, 2, 7], True)
    assert out.tolist() == [5, 3, 9, 2, 2, 1]
    assert out.dtype == np.int32
    requests_by_rank, has_new_long = _unpack_lists([out])
    assert requests_by_rank == [([5, 3, 9, 2], 2)]
    assert has_new_long is True


def test_zero_padding_and_trailing_zeros_kept():
    out = _buffer(3, fill=-1)
    pack(out, [4], [6], False)
    assert out.tolist() == [4, 6, 0, 0, 0, 0, 1, 0]
    assert _unpack_lists([out]) == ([([4, 6, 0, 0, 0, 0], 1)], False)


def test_empty_snapshot():
    out = _buffer(2, fill=5)
    pack(out, [], [], False)
    assert out.tolist() == [0] * 6
    assert _unpack_lists([out]) == ([([0, 0, 0, 0], 0)], False)


def test_running_truncated_to_max_slots():
    out = _buffer(1)
    pack(out, [1, 2, 3], [4], False)
    assert out.tolist() == [1, 2, 2, 0]


def test_unpack_many_ranks_or_of_long_flags():
    bufs = [_buffer(2) for _ in range(3)]
    pack(bufs[0], [8, 4], [9], False)
    pack(bufs[1], [1], [], True)
    pack(bufs[2], [], [3, 3], False)
    requests_by_rank, has_new_long = _unpack_lists(bufs)
    assert requests_by_rank == [([8, 4, 9, 0], 2), ([1, 0, 0, 0], 1), ([3, 3, 0, 0], 0)]
    assert has_new_long is True
    for buf in bufs:
        buf[-1] = 0
    assert _unpack(bufs)[1] is False
    empty = np.zeros((0, payload_len(2)), dtype=np.int32)
    assert unpack(empty, block_slots(empty)) == ([], False)


def test_unpack_returns_views_of_the_block_and_an_int_split():
    # The compiled planner takes the int32 rows as they are (no list in between).
    out = _buffer(2)
    pack(out, [5], [6], True)
    block = _block([out])
    ((blks, split),) = unpack(block, block_slots(block))[0]
    assert blks.dtype == np.int32 and np.shares_memory(blks, block)
    assert blks.tolist() == [5, 6, 0, 0]
    assert type(split) is int


def test_pack_accepts_numpy_inputs():
    out = _buffer(2)
    pack(out, np.array([5, 3]), np.array([9, 2, 7]), np.bool_(True))
    assert out.tolist() == [5, 3, 9, 2, 2, 1]


@pytest.mark.parametrize(
    "bad", [np.zeros(6, dtype=np.int64), np.zeros((2, 3), dtype=np.int32), np.zeros(1, np.int32)]
)
def test_pack_rejects_wrong_buffer(bad):
    with pytest.raises(ValueError, match="DyntraLB payload buffer must be a 1-D int32 array"):
        pack(bad, [1], [], False)


blk = st.integers(min_value=1, max_value=2**31 - 1)


@given(
    max_num_seqs=st.integers(min_value=1, max_value=64),
    running=st.lists(blk, max_size=80),
    waiting=st.lists(blk, max_size=200),
    pending_long=st.booleans(),
    stale=st.integers(min_value=-5, max_value=5),
)
def test_round_trip_and_truncation(max_num_seqs, running, waiting, pending_long, stale):
    max_slots = 2 * max_num_seqs
    out = _buffer(max_num_seqs, fill=stale)
    pack(out, running, waiting, pending_long)
    ((blks, split),), has_new_long = _unpack_lists([out])

    run_cnt = min(len(running), max_slots)
    wait_cnt = min(len(waiting), max_slots - run_cnt)
    assert split == run_cnt
    assert len(blks) == max_slots
    assert blks[:split] == running[:run_cnt]
    assert blks[split : split + wait_cnt] == waiting[:wait_cnt]
    assert blks[split + wait_cnt :] == [0] * (max_slots - run_cnt - wait_cnt)
    assert has_new_long is pending_long
    # running never exceeds max_num_seqs in practice: then no waiting slot is lost early
    if len(running) <= max_num_seqs:
        assert wait_cnt >= min(len(waiting), max_num_seqs)
    # everything fits -> lossless
    if len(running) + len(waiting) <= max_slots:
        assert blks[:split] == running and [b for b in blks[split:] if b] == waiting


@given(
    snapshots=st.lists(
        st.tuples(st.lists(blk, max_size=8), st.lists(blk, max_size=8), st.booleans()),
        min_size=1,
        max_size=16,
    )
)
def test_round_trip_many_ranks(snapshots):
    bufs = []
    for running, waiting, long_flag in snapshots:
        buf = _buffer(8)
        pack(buf, running, waiting, long_flag)
        bufs.append(buf)
    requests_by_rank, has_new_long = _unpack_lists(bufs)
    assert has_new_long is any(flag for _, _, flag in snapshots)
    for (blks, split), (running, waiting, _) in zip(requests_by_rank, snapshots, strict=True):
        assert split == len(running)
        assert blks == running + waiting + [0] * (16 - len(running) - len(waiting))


@given(
    snapshots=st.lists(
        st.tuples(st.lists(blk, max_size=8), st.lists(blk, max_size=8), st.booleans()),
        min_size=1,
        max_size=16,
    )
)
def test_unpack_reads_the_block_again_after_each_gather(snapshots):
    """The coordinator's gathered buffers are the rows of one block whose slot views are
    made once: each unpack decodes what the latest gather wrote, as views of the block."""
    block = np.full((len(snapshots), payload_len(8)), 3, dtype=np.int32)
    slots = block_slots(block)
    for turn in range(2):
        for row, (running, waiting, long_flag) in zip(block, snapshots, strict=True):
            pack(row, running[turn:], waiting, long_flag)
        requests_by_rank, has_new_long = unpack(block, slots)
        assert has_new_long is any(flag for _, _, flag in snapshots)
        for (blks, split), (running, waiting, _) in zip(requests_by_rank, snapshots,
                                                         strict=True):
            sent = running[turn:]
            assert split == len(sent)
            assert blks.tolist() == sent + waiting + [0] * (16 - len(sent) - len(waiting))
        assert all(type(split) is int and np.shares_memory(blks, block)
                   for blks, split in requests_by_rank)
