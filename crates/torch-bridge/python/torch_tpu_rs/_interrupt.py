"""Ctrl-C while torch works on tpu tensors: KeyboardInterrupt where Python
can take it, not an abort.

torch calls the ``tpu`` device guard's Python methods from C++ functions
that must not throw (stream lookups while autograd records a node), and
pybind11's method lookup checks for pending signals there: the default
handler's KeyboardInterrupt raised inside aborts the process
("terminate called without an active exception"). So, while Python's
default handler would be in force, SIGINT raises KeyboardInterrupt only
where the interpreter is between calls (a function's start or a loop's
jump back). Caught anywhere else, it is raised by the next tpu op's entry
into the bridge (where torch propagates errors), or, if no op comes, when
the signal, sent to the main thread again every 10 ms (waking a blocking
call), lands between calls, or anywhere once 0.5 s has passed.
"""

import dis
import signal
import threading
import time

from . import _C

# Where the interpreter itself checks for signals, with no C call under way.
_BETWEEN_CALLS = {
    dis.opmap[name]
    for name in ("RESUME", "JUMP_BACKWARD", "JUMP_ABSOLUTE")
    if name in dis.opmap
}
_RETRY_SECONDS = 0.01
_PATIENCE_SECONDS = 0.5
_deadline = None
_retry = None


def _between_calls(frame):
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] in _BETWEEN_CALLS


def _send_again():
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def _wake():
    global _retry
    _retry = None
    _send_again()


def _on_sigint(signum, frame):
    global _deadline, _retry
    if _deadline is not None and not _C.interrupt_requested():
        # Sent again after an op already raised it.
        _deadline = None
        return
    now = time.monotonic()
    if frame is None or _between_calls(frame) or (_deadline is not None and now >= _deadline):
        _deadline = None
        _C.withdraw_interrupt()
        raise KeyboardInterrupt
    if _deadline is None:
        _deadline = now + _PATIENCE_SECONDS
        _C.request_interrupt()
    # Sent again shortly (waking a blocking call that took this one); the
    # interpreter takes it at its next check.
    if _retry is None:
        _retry = threading.Timer(_RETRY_SECONDS, _wake)
        _retry.daemon = True
        _retry.start()


def install():
    """Takes SIGINT over from Python's default handler (a handler the
    program installed itself is left alone)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
