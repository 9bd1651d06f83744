"""The role recorder keeps every caught exception, at any level, and says when it drops records."""

import logging

from harness.role.recorder import RoleRecorder


def test_exceptions_are_kept_at_any_level_and_the_cap_is_counted():
    recorder = RoleRecorder(logger_prefixes=("sglang.test",), limit=3).install()
    logger = logging.getLogger("sglang.test.worker")
    logger.setLevel(logging.DEBUG)
    try:
        logger.info("plain info")  # below WARNING and no exception: not kept
        try:
            raise KeyError("room 5")
        except KeyError:
            logger.info("chunk failed", exc_info=True)  # caught and logged below WARNING: kept
            logger.warning("chunk failed again", exc_info=True)
        logger.warning("no exception")
        logger.warning("one too many")
        logger.error("and another")
    finally:
        logger.setLevel(logging.NOTSET)
        for handler in list(logging.getLogger().handlers):
            if type(handler).__qualname__.endswith("_Handler"):
                logging.getLogger().removeHandler(handler)
    logs, _ = recorder.snapshot()
    assert [(r["message"], r["exception"]) for r in logs] == [
        ("chunk failed", "KeyError"), ("chunk failed again", "KeyError"), ("no exception", "")]
    observation = recorder.observation("prefill", [])
    assert observation["log_records_dropped"] == 2
