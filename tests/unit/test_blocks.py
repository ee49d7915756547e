"""Glossary: the KV-block count of a request, DyntraLB's load unit."""

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dyntra_lb.blocks import block_counts, num_blocks


@pytest.mark.parametrize(
    "num_tokens, block_size, expected",
    [
        (0, 8, 0),
        (1, 8, 1),
        (8, 8, 1),
        (9, 8, 2),
        (17, 8, 3),
        (5, 8, 1),
        (128, 128, 1),
        (129, 128, 2),
        (7, 1, 7),
    ],
)
def test_num_blocks(num_tokens, block_size, expected):
    assert num_blocks(num_tokens, block_size) == expected


@given(st.integers(min_value=0, max_value=10**7), st.integers(min_value=1, max_value=4096))
def test_num_blocks_is_ceiling(num_tokens, block_size):
    n = num_blocks(num_tokens, block_size)
    assert (n - 1) * block_size < num_tokens <= n * block_size or (n == 0 and num_tokens == 0)


@pytest.mark.parametrize("block_size", [0, -16, True, False, 16.0, "16", None])
def test_invalid_block_size(block_size):
    with pytest.raises(RuntimeError) as info:
        num_blocks(10, block_size)
    assert str(info.value) == f"Invalid DyntraLB block size: {block_size}"


def test_invalid_block_size_text():
    with pytest.raises(RuntimeError) as info:
        block_counts([SimpleNamespace(num_tokens=3)], 0)
    assert str(info.value) == "Invalid DyntraLB block size: 0"


def test_block_counts_use_num_tokens():
    # 12 prompt + 5 generated tokens = 17 tokens -> 3 blocks of 8
    request = SimpleNamespace(num_tokens=17, num_prompt_tokens=12)
    assert block_counts([request], 8) == [3]
    assert block_counts([request], 16) == [2]


def test_block_counts_match_num_blocks_in_order():
    requests = [SimpleNamespace(num_tokens=n) for n in (1, 16, 17, 33, 0)]
    assert block_counts(requests, 16) == [num_blocks(r.num_tokens, 16) for r in requests]
    assert block_counts(requests, 16) == [1, 1, 2, 3, 0]
    assert block_counts(iter(requests), 16) == [1, 1, 2, 3, 0]  # any iterable, once


@given(st.lists(st.integers(min_value=0, max_value=10**6), max_size=20),
       st.integers(min_value=1, max_value=4096))
def test_block_counts_are_num_blocks_of_each_request(tokens, block_size):
    requests = [SimpleNamespace(num_tokens=n) for n in tokens]
    assert block_counts(requests, block_size) == [num_blocks(n, block_size) for n in tokens]


@pytest.mark.parametrize("bad", [0, -1, 16.0, True])
def test_block_counts_check_the_block_size_even_with_no_requests(bad):
    with pytest.raises(RuntimeError, match=f"Invalid DyntraLB block size: {bad}"):
        block_counts([], bad)
