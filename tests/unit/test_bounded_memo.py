"""app.models.cluster.BoundedMemo: the oldest entry goes first, a key put again keeps its place, and the memo never
holds more than its size, however many keys come and go."""

from __future__ import annotations

from app.models.cluster import BoundedMemo


def test_the_oldest_key_goes_first_and_a_key_put_again_keeps_its_place() -> None:
    memo = BoundedMemo[str, int](3)
    for i, key in enumerate("abc"):
        memo.put(key, i)
    memo.put("a", 10)  # already there: replaced, still the oldest, nothing evicted
    assert len(memo) == 3 and memo.get("a") == 10
    memo.put("d", 3)
    assert memo.get("a") is None
    assert [memo.get(k) for k in "bcd"] == [1, 2, 3]


def test_a_stream_of_new_keys_keeps_the_last_size_of_them() -> None:
    memo = BoundedMemo[int, int](64)
    for i in range(10_000):
        memo.put(i, i)
    assert len(memo) == 64
    assert [memo.get(i) for i in range(10_000 - 64, 10_000)] == list(range(10_000 - 64, 10_000))
    assert memo.get(10_000 - 65) is None
