#!/usr/bin/env python3
"""An HTTP handler for qc-worker, standard library only.

qc-worker POSTs each SQS message in CloudEvents binary mode: the body is the message body byte for
byte, the metadata is in ce-* and x-sqs-* headers. The answer decides the message's fate:
  2xx            done: the worker deletes the message
  400 or 422     poison: it can never succeed (the worker applies --on-poison)
  429            try again later (this message), after Retry-After seconds if given
  503 + Retry-After  my dependency is down: the worker pauses receiving for that long and keeps
                 the message in hand, retrying it then (its receive count does not grow)
  anything else  try again later, with the worker's backoff; 5xx that pile up pause it too

This one handles order events such as {"orderId": "o-1", "amount": 12}. A body that is not JSON or
has no orderId is poison. {"flaky": true} fails its first delivery with 429 and Retry-After: 1, as a
handler briefly rate-limited by an API for that order would. Each decision is printed as one JSON line on stdout.

Run: python3 http_handler.py --port 8080   (the QueueConsumer's handler.http.port)
"""

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OUTPUT_LOCK = threading.Lock()


class MessageHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps the worker's connections open between messages; every answer then needs a length.
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        if self.path != "/messages":
            return self.answer(404)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        message_id = self.headers.get("ce-id", "")
        receive_count = int(self.headers.get("ce-sqsreceivecount", "1"))
        try:
            order = json.loads(body)
            order_id = order["orderId"]
        except (ValueError, KeyError, TypeError):
            self.record(message_id, receive_count, "poison", None)
            # 422: retrying cannot fix this body; with --on-poison leave it goes to the DLQ.
            return self.answer(422)
        if order.get("flaky") and receive_count == 1:
            self.record(message_id, receive_count, "retry", order_id)
            # The message becomes visible again after 1 s instead of the worker's backoff. (A 503 with
            # Retry-After would say the whole dependency is down: the worker would pause instead.)
            return self.answer(429, {"Retry-After": "1"})
        # Real work goes here. It must be idempotent: SQS delivers at least once.
        self.record(message_id, receive_count, "done", order_id)
        return self.answer(204)

    def do_GET(self):
        # A readiness probe for the handler container itself.
        return self.answer(200 if self.path == "/healthz" else 404)

    def answer(self, status, headers=None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def record(self, message_id, receive_count, result, order_id):
        line = {
            "id": message_id,
            "receiveCount": receive_count,
            "source": self.headers.get("ce-source", ""),
            "type": self.headers.get("ce-type", ""),
            "contentType": self.headers.get("Content-Type", ""),
            "orderId": order_id,
            "result": result,
        }
        # One write per line under a lock: the server runs a thread per connection.
        with OUTPUT_LOCK:
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()

    def log_message(self, format, *args):
        # One line per decision above is enough; silence the per-request access log.
        pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), MessageHandler)
    print(json.dumps({"listening": f"http://{args.host}:{args.port}/messages"}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
