// An HTTP handler for qc-worker in TypeScript on Node 20, no runtime dependencies
// (docs/handler-contract.md). Node 20 cannot run TypeScript itself (type stripping came in Node 22.6),
// so compile it first with tsc (the `typescript` and `@types/node` npm packages, build-time only):
//
//   npm install --prefix ~/.cache/tsc typescript@5.9 @types/node@20
//   NODE_PATH=~/.cache/tsc/node_modules ~/.cache/tsc/node_modules/.bin/tsc -p . --outDir dist --typeRoots ~/.cache/tsc/node_modules/@types
//   node dist/http_handler.js --port 8080
//
// Single mode (POST /messages): qc-worker POSTs each SQS message in CloudEvents binary mode: the body
// is the message body byte for byte, the metadata is in ce-* and x-sqs-* headers (percent-encoded).
// The answer decides the message's fate:
//   2xx                done: the worker deletes the message
//   400 or 422         poison: it can never succeed (the worker applies onPoison)
//   429 + Retry-After  try again later (this message), after that many seconds
//   503 + Retry-After  my dependency is down: the worker pauses receiving for that long
//   anything else      try again later, with the worker's backoff
//
// Batch mode (POST /batch, with handler.batch / --batch-max-items): one POST per batch, a JSON array
// of structured CloudEvents (content-type application/cloudevents-batch+json), each message's body
// as the event's `data`. The answer is a 200 with Lambda's ReportBatchItemFailures shape,
// {"batchItemFailures": [{"itemIdentifier": "<message id>"}]}: listed items are retried (and reach
// the DLQ by the redrive policy's maxReceiveCount if they keep failing), the others deleted. There is
// no per-item poison: a non-2xx answer applies to every item, and 400/422 retries them all.
//
// Orders such as {"orderId": "o-1", "amount": 12}; a body that is not JSON or has no orderId is
// poison (single: 422; batch: listed as failed); {"flaky": true} fails its first delivery (single:
// 429 with Retry-After: 1; batch: listed as failed). Each decision is printed as one JSON line.
import http from 'node:http';

/** One message in a batch: a structured CloudEvent (the fields this handler reads). */
interface SqsCloudEvent {
  id: string;
  source: string;
  type: string;
  datacontenttype?: string;
  /** A JSON body as JSON, other text as a string. */
  data?: unknown;
  /** A body that is not UTF-8. */
  data_base64?: string;
  sqsreceivecount: number;
  sqsgroupid?: string;
  /** The message attributes in Lambda's messageAttributes shape, as JSON text. */
  sqsmessageattributes?: string;
}

interface BatchAnswer {
  batchItemFailures: { itemIdentifier: string }[];
}

interface Order {
  orderId: string;
  flaky?: boolean;
}

type Result = 'done' | 'retry' | 'poison';

function asOrder(value: unknown): Order | null {
  if (typeof value === 'object' && value !== null && typeof (value as Order).orderId === 'string') {
    return value as Order;
  }
  return null;
}

/** What to do with one order: retrying cannot fix poison; a flaky order fails its first delivery. */
function decide(order: Order | null, receiveCount: number): Result {
  if (order === null) return 'poison';
  if (order.flaky === true && receiveCount === 1) return 'retry';
  // Real work goes here. It must be idempotent: SQS delivers at least once.
  return 'done';
}

function record(line: Record<string, unknown>): void {
  // One write per line: Node runs one thread, so lines never interleave.
  process.stdout.write(JSON.stringify({ handler: 'typescript', ...line }) + '\n');
}

/** A ce-* header value, percent-decoded (the CloudEvents HTTP binding encodes it). */
function header(req: http.IncomingMessage, name: string): string {
  const v = req.headers[name];
  const s = Array.isArray(v) ? v[0] : (v ?? '');
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

function single(req: http.IncomingMessage, body: Buffer, res: http.ServerResponse): void {
  const receiveCount = Number(header(req, 'ce-sqsreceivecount') || '1');
  let order: Order | null = null;
  try {
    order = asOrder(JSON.parse(body.toString('utf8')));
  } catch {
    order = null;
  }
  const result = decide(order, receiveCount);
  record({
    mode: 'single',
    id: header(req, 'ce-id'),
    receiveCount,
    source: header(req, 'ce-source'),
    type: header(req, 'ce-type'),
    contentType: req.headers['content-type'] ?? '',
    orderId: order?.orderId ?? null,
    result,
  });
  if (result === 'poison') {
    res.writeHead(422).end(); // the worker applies onPoison
  } else if (result === 'retry') {
    // Visible again after 1 s. (A 503 with Retry-After would say the whole dependency is down: the
    // worker would pause receiving instead.)
    res.writeHead(429, { 'Retry-After': '1' }).end();
  } else {
    res.writeHead(204).end();
  }
}

function batch(body: Buffer, res: http.ServerResponse): void {
  let events: SqsCloudEvent[];
  try {
    const parsed: unknown = JSON.parse(body.toString('utf8'));
    if (!Array.isArray(parsed)) throw new Error('not a batch');
    events = parsed as SqsCloudEvent[];
  } catch {
    res.writeHead(400).end(); // not a batch: every item is retried, none dead-lettered
    return;
  }
  const answer: BatchAnswer = { batchItemFailures: [] };
  for (const event of events) {
    const order = asOrder(event.data);
    const result = decide(order, event.sqsreceivecount);
    record({
      mode: 'batch',
      id: event.id,
      receiveCount: event.sqsreceivecount,
      source: event.source,
      type: event.type,
      contentType: event.datacontenttype ?? '',
      orderId: order?.orderId ?? null,
      result,
    });
    // No per-item poison in batch mode: listed every time, the redrive policy dead-letters it.
    if (result !== 'done') answer.batchItemFailures.push({ itemIdentifier: event.id });
  }
  const text = JSON.stringify(answer);
  res
    .writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) })
    .end(text);
}

function flag(name: string, fallback: string): string {
  const at = process.argv.indexOf(name);
  return at >= 0 && at + 1 < process.argv.length ? process.argv[at + 1] : fallback;
}

const port = Number(flag('--port', '8080'));
const host = flag('--host', '127.0.0.1');

const server = http.createServer((req, res) => {
  if (req.method === 'GET') {
    res.writeHead(req.url === '/healthz' ? 200 : 404).end();
    return;
  }
  if (req.method !== 'POST' || (req.url !== '/messages' && req.url !== '/batch')) {
    res.writeHead(404).end();
    return;
  }
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    if (req.url === '/batch') batch(body, res);
    else single(req, body, res);
  });
});

// Above the worker's 4 s idle close, so the worker, not the handler, ends idle connections.
server.keepAliveTimeout = 5000;
server.listen(port, host, () =>
  console.log(JSON.stringify({ listening: `http://${host}:${port}/messages`, batch: `http://${host}:${port}/batch` })),
);
