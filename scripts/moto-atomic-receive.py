"""moto_server with each SQS receive atomic, for every test (scripts/lib.sh moto_instance, and the node
scenarios of tests/node.rs).

moto checks a message's visibility and marks it received in two steps, without a lock: two receives
running at once in its server's threads can both take the same message (the second with the receive count
one higher, so it looks like a redelivery). The node scenarios count every handling of every message and
must tell the product's double handling from that. Here a lock makes a receive's scan of the queue, and
deletes and visibility changes, one at a time; a long poll lets go of it while it waits for messages, so
receives still wait side by side as on SQS. moto's retention check per message handed out reads the one
attribute it needs instead of computing them all (below). Everything else is moto as installed.

Usage: python moto-atomic-receive.py [moto_server arguments]
"""

import sys
import threading

from moto.server import main
from moto.core.utils import unix_time
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


def _retained(self, queue_name, message):
    retention = int(self.get_queue(queue_name).message_retention_period)
    return retention + message.sent_timestamp / 1000 > unix_time()


# moto checks each message it hands out against the queue's retention period by computing every
# attribute of the queue, three of them scans of all its messages: a receive of 10 from a queue of
# 2,000 took 2.7 s on an idle machine, past the worker's bound (wait + 10 s) under CI's load, and the
# receives it gave up on still ran later, burning receive counts until SQS's redrive dead-lettered
# messages no handler had seen. The same check reading the one attribute it needs.
# (Read first, so a moto that renamed it fails here instead of losing the fix silently.)
assert callable(models.SQSBackend.is_message_valid_based_on_retention_period)
models.SQSBackend.is_message_valid_based_on_retention_period = _retained

if __name__ == "__main__":
    sys.exit(main())
