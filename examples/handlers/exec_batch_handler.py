#!/usr/bin/env python3
"""An exec batch handler for qc-worker (handler.batch, --batch-max-items), standard library only.

qc-worker runs this once per batch: one structured CloudEvent per line on stdin (the SQS message id
as "id", the body as "data", the receive count as "sqsreceivecount"), QC_BATCH_SIZE and
QC_BATCH_ANSWER_FILE in the environment. The answer goes in that file, never on stdout:

  {"batchItemFailures": [{"itemIdentifier": "<message id>"}, ...]}

Listed items are retried (and reach the DLQ by the redrive policy's maxReceiveCount if they keep
failing); the rest are deleted. Write {"batchItemFailures": []} when every item succeeded: exiting 0
without the file retries every item, and so does any exit but 0. stdout is this handler's log, so it
may print anything, message bodies included (docs/handler-contract.md, "Batch mode").

This one handles order events such as {"orderId": "o-1", "amount": 12}. Batch mode has no per-item
poison: a body that is not JSON or has no orderId is listed as failed every time, so the redrive
policy moves it to the DLQ. {"flaky": true} fails its first delivery. Each decision is printed as one
JSON line on stdout.

In a QueueConsumer: handler.exec.command: ["/app/exec_batch_handler.py"], handler.batch: {maxItems: 10}
"""

import json
import os
import sys


def record(event, result, order_id):
    line = {
        "handler": "exec_batch_handler.py",
        "id": event.get("id", ""),
        "receiveCount": event.get("sqsreceivecount", 1),
        "orderId": order_id,
        "result": result,
        "body": event.get("data"),
    }
    # One write(2) per line: concurrent handler processes share the worker's stdout.
    os.write(sys.stdout.fileno(), (json.dumps(line) + "\n").encode())


def handle(event):
    """True when the item is done, False when it should be retried."""
    order = event.get("data")
    if not isinstance(order, dict) or not isinstance(order.get("orderId"), str):
        record(event, "poison", None)
        return False
    if order.get("flaky") and event.get("sqsreceivecount") == 1:
        record(event, "retry", order["orderId"])
        return False
    # Real work goes here. It must be idempotent: SQS delivers at least once.
    record(event, "done", order["orderId"])
    return True


def main():
    failed = []
    for line in sys.stdin:
        event = json.loads(line)
        if not handle(event):
            failed.append({"itemIdentifier": event["id"]})
    # The answer, written once at the end: an empty or half-written file retries every item.
    with open(os.environ["QC_BATCH_ANSWER_FILE"], "w") as f:
        json.dump({"batchItemFailures": failed}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
