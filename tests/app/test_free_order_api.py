"""The service with ``free_order="uncached_first"``: the queue the API shows
(from the columns' stamps) is the pool's queue, head inserts included."""

from __future__ import annotations

import pytest

from tests.app.conftest import Api, make_settings

pytestmark = pytest.mark.anyio


@pytest.mark.app_settings(num_blocks=11, free_order="uncached_first")
async def test_worked_example_with_hashless_blocks_first(api: Api) -> None:
    await api.admit(list(range(10)), request_id="A")  # blocks 1, 2 cached, 3 partial
    await api.admit([*range(8), 90, 91], request_id="B")  # hits 1, 2; block 4 partial
    await api.finish("A")
    assert await api.queue() == [3, 5, 6, 7, 8, 9, 10] == api.pool_queue()
    await api.finish("B")
    assert await api.queue() == [4, 3, 5, 6, 7, 8, 9, 10, 2, 1] == api.pool_queue()
    head = await api.ok("GET", "/api/blocks/4")
    assert head["queue_position"] == 0
    # below every stamp given at start-up (0..10): head inserts go negative
    assert head["queue_stamp"] < 0
    tail = await api.ok("GET", "/api/blocks/1")
    assert tail["queue_position"] == 9 and tail["queue_stamp"] > 10
    api.check()


@pytest.mark.app_settings(num_blocks=8, free_order="uncached_first")
async def test_raw_free_of_hashless_blocks_puts_them_at_the_head(api: Api) -> None:
    ids = await api.allocate(3)
    await api.cache(ids[:1], [1, 2, 3, 4])
    await api.free(ids)  # 1 hashed -> tail; 2, 3 hashless -> head, in order
    assert await api.queue() == [2, 3, 4, 5, 6, 7, 1] == api.pool_queue()
    assert await api.allocate(2) == [2, 3]
    api.check()


def test_setting_is_validated() -> None:
    assert make_settings().free_order == "append_all"
    with pytest.raises(ValueError, match="free_order"):
        make_settings(free_order="lifo")


def test_cli_flag_sets_the_free_order() -> None:
    from app.cli import parser
    from app.cli.commands import describe
    from app.cli.settings import settings_from

    s = settings_from(parser().parse_args(["serve", "--free-order", "uncached_first"]))
    assert s.free_order == "uncached_first"
    assert "free order uncached_first" in describe(s, 64)
    assert settings_from(parser().parse_args(["serve"])).free_order == "append_all"
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", "--free-order", "lifo"])
