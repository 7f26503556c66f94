#!/usr/bin/env python3
"""An exec handler for qc-worker, standard library only.

qc-worker runs this once per SQS message: the body arrives on stdin (the exact bytes), the metadata in
QC_* environment variables (QC_MESSAGE_ID, QC_RECEIVE_COUNT, QC_QUEUE_URL, QC_ATTR_<NAME>, ...).
The exit status decides the message's fate:
  0              done: the worker deletes the message
  65 EX_DATAERR  poison: it can never succeed (the worker applies --on-poison)
  75 EX_TEMPFAIL my dependency is down: the worker pauses receiving, keeps the message in hand
                 and retries it when a probe succeeds (its receive count does not grow)
  anything else  try again later, with the worker's backoff (failures that pile up pause it too)

This one handles order events such as {"orderId": "o-1", "amount": 12}. A body that is not JSON or
has no orderId is poison. {"flaky": true} fails its first delivery (exit 1). Each decision is printed
as one JSON line on stdout, which the worker passes through to its own.

In a QueueConsumer: handler.exec.command: ["/app/exec_handler.py"]
"""

import json
import os
import sys

EX_OK = 0
EX_DATAERR = 65
EX_TEMPFAIL = 75  # not used here: say it when the database or an API the handler needs is down
RETRY = 1


def record(result, order_id):
    line = {
        "handler": "exec_handler.py",
        "id": os.environ.get("QC_MESSAGE_ID", ""),
        "receiveCount": int(os.environ.get("QC_RECEIVE_COUNT", "1")),
        "queueArn": os.environ.get("QC_QUEUE_ARN", ""),
        "orderId": order_id,
        "result": result,
    }
    # One write(2) per line: concurrent handler processes share the worker's stdout.
    os.write(sys.stdout.fileno(), (json.dumps(line) + "\n").encode())


def main():
    body = sys.stdin.buffer.read()
    try:
        order = json.loads(body)
        order_id = order["orderId"]
    except (ValueError, KeyError, TypeError):
        record("poison", None)
        return EX_DATAERR
    if order.get("flaky") and os.environ.get("QC_RECEIVE_COUNT") == "1":
        record("retry", order_id)
        return RETRY
    # Real work goes here. It must be idempotent: SQS delivers at least once.
    record("done", order_id)
    return EX_OK


if __name__ == "__main__":
    sys.exit(main())
