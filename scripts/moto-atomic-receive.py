"""moto_server with each SQS receive atomic, for every test (scripts/lib.sh moto_instance, and the node
scenarios of tests/node.rs).

moto checks a message's visibility and marks it received in two steps, without a lock: two receives
running at once in its server's threads can both take the same message (the second with the receive count
one higher, so it looks like a redelivery). The node scenarios count every handling of every message and
must tell the product's double handling from that. Here a lock makes a receive's scan of the queue, and
deletes and visibility changes, one at a time; a long poll lets go of it while it waits for messages, so
receives still wait side by side as on SQS. Everything else is moto as installed.

Usage: python moto-atomic-receive.py [moto_server arguments]
"""

import sys
import threading

from moto.server import main
from moto.sqs import models

_lock = threading.RLock()
_held = threading.local()


def _locked(method):
    def run(*args, **kwargs):
        with _lock:
            _held.depth = getattr(_held, "depth", 0) + 1
            try:
                return method(*args, **kwargs)
            finally:
                _held.depth -= 1

    return run


def _wait_unlocked(wait):
    def run(self, timeout):
        if getattr(_held, "depth", 0) != 1:
            return wait(self, timeout)
        _lock.release()
        try:
            return wait(self, timeout)
        finally:
            _lock.acquire()

    return run


for name in (
    "receive_message",
    "delete_message",
    "delete_message_batch",
    "change_message_visibility",
    "change_message_visibility_batch",
):
    setattr(models.SQSBackend, name, _locked(getattr(models.SQSBackend, name)))
models.Queue.wait_for_messages = _wait_unlocked(models.Queue.wait_for_messages)

if __name__ == "__main__":
    sys.exit(main())
