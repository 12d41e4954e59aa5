"""A report tab that closes while its page is being updated is not an error: the report server
(`keynes report --serve`, and the one `keynes serve` starts) logs nothing for it."""

from __future__ import annotations

import asyncio
import gc
import logging

from tornado.websocket import WebSocketClosedError

from reports.server import serve_reports
from tests.support.waiting import free_port


async def _update_of_a_closed_tab() -> None:
    """What tornado's write of a page update to a closed tab's socket ends with."""
    raise WebSocketClosedError()


def test_a_page_update_sent_to_a_closed_tab_logs_no_traceback(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    server = serve_reports([tmp_path / "keynes.duckdb"], port=free_port(), threaded=True)
    try:
        # Panel drops a closed page's pending writes unawaited: asyncio logs each failed one, with
        # its traceback ("Task exception was never retrieved"), when the task is collected.
        loop = asyncio.new_event_loop()
        write = loop.create_task(_update_of_a_closed_tab())
        loop.run_until_complete(asyncio.sleep(0.05))
        loop.close()
        assert write.done()  # failed, and nobody asked for its exception
        del write
        gc.collect()
    finally:
        server.stop()
    assert [r.getMessage() for r in caplog.records] == []
