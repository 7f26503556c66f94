// bbc/sqs-consumer side of scripts/bench-worker: drains QUEUE_URL through the same latency proxy
// (SQS_ENDPOINT) and the same HTTP handler (HANDLER_URL) as qc-worker, until the bench kills it.
// MODE: batch1 (batchSize 1, handleMessage), batch10 (batchSize 10, handleMessage),
// handleMessageBatch (batchSize 10, the batch handler calls the handler for each message at once) or
// bulk (batchSize 10, handleMessageBatch making one call with all its messages, as a JSON array).
// CONSUMERS Consumer instances run in this one process, so C = CONSUMERS x batch size.
// HEARTBEAT_INTERVAL and VISIBILITY_TIMEOUT (seconds), if set, turn on sqs-consumer's heartbeat.
import { Consumer } from 'sqs-consumer';
import { SQSClient } from '@aws-sdk/client-sqs';

const { QUEUE_URL, SQS_ENDPOINT, HANDLER_URL, MODE, CONSUMERS } = process.env;
const sqs = new SQSClient({ endpoint: SQS_ENDPOINT, region: process.env.AWS_REGION || 'us-east-1' });

async function call(message) {
  const res = await fetch(HANDLER_URL, { method: 'POST', body: message.Body });
  await res.arrayBuffer();
  if (!res.ok) throw new Error(`handler answered ${res.status}`);
  return message;
}

const options = {
  queueUrl: QUEUE_URL,
  sqs,
  waitTimeSeconds: 20,
  batchSize: MODE === 'batch1' ? 1 : 10,
};
// The heartbeat bench: sqs-consumer's own heartbeat, in whole seconds.
if (process.env.HEARTBEAT_INTERVAL) {
  options.heartbeatInterval = Number(process.env.HEARTBEAT_INTERVAL);
  options.visibilityTimeout = Number(process.env.VISIBILITY_TIMEOUT);
}
async function callBulk(messages) {
  const res = await fetch(HANDLER_URL, {
    method: 'POST',
    headers: { 'content-type': 'application/cloudevents-batch+json' },
    body: JSON.stringify(messages.map((m) => m.Body)),
  });
  await res.arrayBuffer();
  if (!res.ok) throw new Error(`handler answered ${res.status}`);
  return messages;
}

if (MODE === 'bulk') {
  options.handleMessageBatch = callBulk;
} else if (MODE === 'handleMessageBatch') {
  options.handleMessageBatch = async (messages) => {
    await Promise.all(messages.map(call));
    return messages;
  };
} else {
  options.handleMessage = call;
}

for (let i = 0; i < Number(CONSUMERS || 1); i++) {
  const consumer = Consumer.create(options);
  consumer.on('error', (e) => console.error('error', e.message));
  consumer.on('processing_error', (e) => console.error('processing_error', e.message));
  consumer.start();
}
process.on('SIGTERM', () => process.exit(0));
