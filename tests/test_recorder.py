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
        recorder.uninstall()
    logs, _ = recorder.snapshot()
    assert [(r["message"], r["exception"]) for r in logs] == [
        ("chunk failed", "KeyError"), ("chunk failed again", "KeyError"), ("no exception", "")]
    observation = recorder.observation("prefill", [])
    assert observation["log_records_dropped"] == 2


def _observe_late_threads(starter_module: str):
    """A recorder watching the threads a fake manager (code of ``starter_module``) starts after
    it was built: one loop alive, one that returned on its own, one its starter joined."""
    import threading
    import types

    recorder = RoleRecorder().install()
    stop = threading.Event()
    try:
        since = recorder.mark()
        fake = types.ModuleType(starter_module)
        exec("def start(t):\n    t.start()\n", fake.__dict__)  # noqa: S102 - the starter's module is what counts
        loop = threading.Thread(target=stop.wait, name="worker-loop", daemon=True)
        quits = threading.Thread(target=lambda: None, name="worker-that-quits", daemon=True)
        helper = threading.Thread(target=lambda: None, name="helper-joined", daemon=True)
        for t in (loop, quits, helper):
            fake.start(t)
        helper.join(5)
        for _ in range(100):
            if not quits.is_alive():
                break
            stop.wait(0.01)
        return recorder.observation("decode", [], since=since)["loops"]
    finally:
        stop.set()
        recorder.uninstall()


def test_threads_a_manager_starts_late_are_watched_and_one_that_stops_is_seen():
    """R-LIVE-2 (issue 36, 1h): a thread started after the manager was built (a transfer
    executor's worker, a heartbeat checker started at the first room) is watched like the
    constructor's; one that returned is seen stopped (planted), a helper its starter
    joined to the end is not a loop, and threads the harness starts are not watched."""
    loops = _observe_late_threads("sglang.srt.disaggregation.fake_conn")
    assert loops == {"worker-loop#late0": True, "worker-that-quits#late1": False}
    assert _observe_late_threads("harness.drive.fake") == {}
