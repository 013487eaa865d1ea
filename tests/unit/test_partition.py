"""The one split rule: counts differ by at most one, larger first, and add up."""

from hypothesis import given, strategies as st

from horovod.common.partition import block_size, even_counts, offsets


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_even_counts_add_up_and_differ_by_at_most_one(total: int, parts: int) -> None:
    counts = even_counts(total, parts)
    assert sum(counts) == total and len(counts) == parts
    assert max(counts) - min(counts) <= 1
    assert counts == sorted(counts, reverse=True)
    assert [block_size(total, parts, i) for i in range(parts)] == counts


def test_uneven_split_gives_the_extra_rows_to_the_first_members() -> None:
    assert even_counts(7, 3) == [3, 2, 2]
    assert offsets([3, 2, 2]) == [0, 3, 5]
    assert offsets([]) == []
