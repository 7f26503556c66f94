#!/usr/bin/env node
// An HTTP handler for qc-worker in Node (no dependencies): the same contract as http_handler.py.
//
// qc-worker POSTs each SQS message in CloudEvents binary mode: the body is the message body byte for
// byte, the metadata is in ce-* and x-sqs-* headers. The answer decides the message's fate:
//   2xx            done: the worker deletes the message
//   400 or 422     poison: it can never succeed (the worker applies onPoison)
//   429            try again later, after Retry-After seconds if given
//   503 + Retry-After  my dependency is down: the worker pauses receiving for that long
//   anything else  try again later, with the worker's backoff
//
// Orders such as {"orderId": "o-1", "amount": 12}; a body that is not JSON or has no orderId is
// poison; {"flaky": true} fails its first delivery with 429 and Retry-After: 1.
//
// Run: node http_handler.mjs --port 8080      Try it: qc-worker invoke --body order.json --http-url http://127.0.0.1:8080/messages
import http from 'node:http';

const port = Number(process.argv[process.argv.indexOf('--port') + 1] || 8080);

const server = http.createServer((req, res) => {
  if (req.method === 'GET') {
    res.writeHead(req.url === '/healthz' ? 200 : 404).end();
    return;
  }
  if (req.method !== 'POST' || req.url !== '/messages') {
    res.writeHead(404).end();
    return;
  }
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const receiveCount = Number(req.headers['ce-sqsreceivecount'] || '1');
    const record = (result, orderId) =>
      console.log(JSON.stringify({ id: req.headers['ce-id'], receiveCount, orderId, result }));
    let order;
    try {
      order = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {
      order = null;
    }
    if (!order || typeof order.orderId !== 'string') {
      record('poison', null);
      res.writeHead(422).end();
      return;
    }
    if (order.flaky && receiveCount === 1) {
      record('retry', order.orderId);
      res.writeHead(429, { 'Retry-After': '1' }).end();
      return;
    }
    // Real work goes here. It must be idempotent: SQS delivers at least once.
    record('done', order.orderId);
    res.writeHead(204).end();
  });
});

server.keepAliveTimeout = 5000;
server.listen(port, '127.0.0.1', () =>
  console.log(JSON.stringify({ listening: `http://127.0.0.1:${port}/messages` })),
);
