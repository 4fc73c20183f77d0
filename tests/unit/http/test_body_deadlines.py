"""BodyDeadlines: one ticking task cuts body reads past their deadline, and only those."""

from __future__ import annotations

import asyncio

import pytest

from app.http.deadlines import BodyDeadlineExceeded, BodyDeadlines


async def _arrives(after: float, body: bytes = b"{}") -> bytes:
    await asyncio.sleep(after)
    return body


def test_a_body_that_arrives_is_returned_and_nothing_stays_watched() -> None:
    async def main() -> tuple[bytes, int, bool]:
        deadlines = BodyDeadlines(0.2)
        body = await deadlines.read(_arrives(0.0, b"body"))
        await asyncio.sleep(0.12)  # past one tick: the ticker sees nothing to watch and stops
        return body, len(deadlines._watched), deadlines._ticker is None

    assert asyncio.run(main()) == (b"body", 0, True)


def test_a_stalled_read_is_cut_after_its_deadline_and_the_task_goes_on() -> None:
    async def main() -> tuple[float, int, str]:
        loop = asyncio.get_running_loop()
        deadlines = BodyDeadlines(0.2)
        began = loop.time()
        with pytest.raises(BodyDeadlineExceeded):
            await deadlines.read(_arrives(30.0))
        took = loop.time() - began
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0.01)  # the task is not left cancelled: it can await again (e.g. send the 408)
        return took, task.cancelling(), "went on"

    took, cancelling, went_on = asyncio.run(main())
    assert 0.2 <= took < 0.2 + 0.05 + 0.2  # deadline + one tick (0.05 s) + scheduling slack
    assert (cancelling, went_on) == (0, "went on")


def test_only_the_stalled_read_of_many_is_cut() -> None:
    async def one(deadlines: BodyDeadlines, after: float) -> str:
        try:
            return (await deadlines.read(_arrives(after))).decode()
        except BodyDeadlineExceeded:
            return "408"

    async def main() -> list[str]:
        deadlines = BodyDeadlines(0.2)
        return await asyncio.gather(*(one(deadlines, after) for after in (0.0, 0.05, 5.0, 0.1, 0.0)))

    assert asyncio.run(main()) == ["{}", "{}", "408", "{}", "{}"]


def test_someone_elses_cancellation_is_not_turned_into_a_408() -> None:
    async def main() -> None:
        deadlines = BodyDeadlines(5.0)
        reader = asyncio.create_task(deadlines.read(_arrives(30.0)))
        await asyncio.sleep(0.05)
        reader.cancel()  # e.g. the server shutting down
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert deadlines._watched == {}

    asyncio.run(main())
