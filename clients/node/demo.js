#!/usr/bin/env node
'use strict';
/**
 * mqstore from Node.js: a demo round trip and one command per RPC, printing JSON lines on stdout.
 *
 *   node demo.js [demo] [--count N] [--topic T] [--key-prefix P]   send N, pull them back, get one by
 *                                                                  uniq_key, query one by key
 *   node demo.js send  --topic T [--body TEXT | --body-base64 B64] [--keys K] [--tags T]
 *                      [--property NAME=VALUE ...] [--born-timestamp MS] [--queue-id Q] [--sharding-key S]
 *   node demo.js pull  --topic T [--queue-id Q] [--offset O] [--max N] [--long-poll-ms MS] [--subscription S]
 *   node demo.js get   --msg-id ID [--topic T] [--wait-ms MS]     ID: a uniq_key or an offset_msg_id
 *   node demo.js query --topic T --key K [--max N] [--wait-ms MS]
 *   node demo.js route --topic T
 *
 * Every command takes --address HOST:PORT (default $MQSTORE_GATEWAY or 127.0.0.1:9876), --token TOKEN
 * (default $MQSTORE_TOKEN; sent as "authorization: Bearer TOKEN") and --deadline-ms MS; TLS with
 * --tls-ca PEM (default $MQSTORE_TLS_CA), --tls-cert PEM and --tls-key PEM (mutual TLS; default
 * $MQSTORE_TLS_CERT, $MQSTORE_TLS_KEY), or MQSTORE_TLS=1 for a certificate the system's CAs sign.
 * Each answer is one line {"event": <command>, "response": <answer>}: fields keep their .proto names,
 * int64 values are decimal strings, enums are names, bytes are base64 (as in proto3's JSON mapping).
 * A failed call prints {"event": "error", "rpc", "code", "status", "details"} and exits with 1.
 */
const { parseArgs } = require('node:util');
const { connect, statusName, grpc, DEFAULT_ADDRESS, UNARY_METHODS } = require('./mqstore');

const COMMANDS = ['demo', 'send', 'pull', 'get', 'query', 'route'];
const OPTIONS = {
  address: { type: 'string', default: process.env.MQSTORE_GATEWAY || DEFAULT_ADDRESS },
  token: { type: 'string', default: process.env.MQSTORE_TOKEN || '' },
  'deadline-ms': { type: 'string', default: '10000' },
  'tls-ca': { type: 'string', default: process.env.MQSTORE_TLS_CA || '' },
  'tls-cert': { type: 'string', default: process.env.MQSTORE_TLS_CERT || '' },
  'tls-key': { type: 'string', default: process.env.MQSTORE_TLS_KEY || '' },
  topic: { type: 'string' },
  count: { type: 'string', default: '3' },
  'key-prefix': { type: 'string' },
  body: { type: 'string' },
  'body-base64': { type: 'string' },
  keys: { type: 'string' },
  tags: { type: 'string' },
  property: { type: 'string', multiple: true, default: [] },
  'born-timestamp': { type: 'string' },
  'queue-id': { type: 'string' },
  'sharding-key': { type: 'string', default: '' },
  offset: { type: 'string', default: '0' },
  max: { type: 'string', default: '0' },
  'long-poll-ms': { type: 'string', default: '0' },
  subscription: { type: 'string', default: '' },
  'msg-id': { type: 'string', default: '' },
  key: { type: 'string', default: '' },
  'wait-ms': { type: 'string', default: '0' },
  help: { type: 'boolean', short: 'h', default: false },
};

class RpcFailure extends Error {
  constructor(method, err) {
    const rpc = UNARY_METHODS[method] || method;
    super(`${rpc} failed: ${err.message}`);
    this.rpc = rpc;
    this.err = err;
  }
}

/** A value made JSON-safe: Buffers as base64, everything else as is. */
function toJson(value) {
  if (Buffer.isBuffer(value) || value instanceof Uint8Array) {
    return Buffer.from(value).toString('base64');
  }
  if (Array.isArray(value)) {
    return value.map(toJson);
  }
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, toJson(v)]));
  }
  return value;
}

function emit(event, fields) {
  process.stdout.write(`${JSON.stringify({ event, ...toJson(fields) })}\n`);
}

async function rpc(mq, name, request, deadlineMs) {
  try {
    return await mq[name](request, { deadlineMs });
  } catch (err) {
    throw new RpcFailure(name, err);
  }
}

const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

/** Calls `attempt` until it returns a value other than undefined, retrying until `waitMs` have passed. */
async function retrying(waitMs, attempt) {
  const deadline = Date.now() + waitMs;
  for (;;) {
    const result = await attempt(Date.now() >= deadline);
    if (result !== undefined) {
      return result;
    }
    await sleep(50);
  }
}

function int(options, name) {
  const text = options[name];
  if (text === undefined || !/^-?\d+$/.test(text)) {
    throw new Error(`--${name} must be an integer, got ${JSON.stringify(text)}`);
  }
  return Number(text);
}

function required(options, name) {
  if (options[name] === undefined) {
    throw new Error(`--${name} is required`);
  }
  return options[name];
}

function messageOf(options) {
  const properties = {};
  for (const pair of options.property) {
    const at = pair.indexOf('=');
    if (at <= 0) {
      throw new Error(`--property must be NAME=VALUE, got ${JSON.stringify(pair)}`);
    }
    properties[pair.slice(0, at)] = pair.slice(at + 1);
  }
  if (options.keys !== undefined) properties.KEYS = options.keys;
  if (options.tags !== undefined) properties.TAGS = options.tags;
  const body = options['body-base64'] !== undefined
    ? Buffer.from(options['body-base64'], 'base64') : Buffer.from(options.body || '', 'utf8');
  const message = { topic: required(options, 'topic'), body, properties };
  if (options['born-timestamp'] !== undefined) {
    // An int64 goes over as a decimal string: exact beyond 2^53.
    message.born_timestamp = options['born-timestamp'];
  }
  return message;
}

async function send(mq, options, deadlineMs) {
  const request = { message: messageOf(options), sharding_key: options['sharding-key'] };
  if (options['queue-id'] !== undefined) request.queue_id = int(options, 'queue-id');
  emit('send', { response: await rpc(mq, 'send', request, deadlineMs) });
}

async function pull(mq, options, deadlineMs) {
  const longPollMs = int(options, 'long-poll-ms');
  const request = {
    topic: required(options, 'topic'),
    queue_id: options['queue-id'] === undefined ? 0 : int(options, 'queue-id'),
    queue_offset: options.offset,
    max_messages: int(options, 'max'),
    subscription: options.subscription,
    long_poll_ms: longPollMs,
  };
  emit('pull', { response: await rpc(mq, 'pull', request, deadlineMs + longPollMs) });
}

async function get(mq, options, deadlineMs) {
  const request = { msg_id: options['msg-id'], topic: options.topic || '' };
  const response = await retrying(int(options, 'wait-ms'), async (last) => {
    try {
      return await mq.getMessage(request, { deadlineMs });
    } catch (err) {
      if (err.code === grpc.status.NOT_FOUND && !last) return undefined;
      throw new RpcFailure('getMessage', err);
    }
  });
  emit('get', { response });
}

async function query(mq, options, deadlineMs) {
  const request = { topic: required(options, 'topic'), key: options.key, max_num: int(options, 'max') };
  const response = await retrying(int(options, 'wait-ms'), async (last) => {
    const answer = await rpc(mq, 'queryByKey', request, deadlineMs);
    return answer.messages.length > 0 || last ? answer : undefined;
  });
  emit('query', { response });
}

async function route(mq, options, deadlineMs) {
  emit('route', { response: await rpc(mq, 'getRoute', { topic: required(options, 'topic') }, deadlineMs) });
}

/** Sends N messages, pulls them back, gets the first by uniq_key and queries it by key; checks each. */
async function demo(mq, options, deadlineMs) {
  const topic = options.topic || 'node-demo';
  const count = int(options, 'count');
  const prefix = options['key-prefix'] || `node-${Date.now().toString(36)}`;
  const sent = [];
  for (let i = 0; i < count; i += 1) {
    const message = {
      topic,
      body: Buffer.from(`hello from node #${i} (${prefix})`, 'utf8'),
      properties: { KEYS: `${prefix}-${i}`, TAGS: 'TagNode' },
    };
    const response = await rpc(mq, 'send', { message }, deadlineMs);
    emit('send', { response });
    sent.push({ message, result: response });
  }

  // Pull every queue the gateway picked, from the first offset we wrote there, until ours are all back.
  const wanted = new Map(sent.map((s) => [s.result.uniq_key, s]));
  const pulled = new Map();
  const queues = new Map();
  for (const { result } of sent) {
    const first = queues.get(result.queue_id);
    if (first === undefined || BigInt(result.queue_offset) < BigInt(first)) queues.set(result.queue_id, result.queue_offset);
  }
  for (const [queueId, firstOffset] of queues) {
    let offset = firstOffset;
    const ours = sent.filter((s) => s.result.queue_id === queueId).length;
    let seen = 0;
    while (seen < ours) {
      const request = { topic, queue_id: queueId, queue_offset: offset, max_messages: 32, long_poll_ms: 3000 };
      const response = await rpc(mq, 'pull', request, deadlineMs + 3000);
      emit('pull', { response });
      if (response.messages.length === 0) break;
      for (const m of response.messages) {
        if (wanted.has(m.uniq_key)) {
          pulled.set(m.uniq_key, m);
          seen += 1;
        }
      }
      offset = response.next_begin_offset;
    }
  }
  const same = [...wanted].every(([id, s]) => {
    const m = pulled.get(id);
    // A pull names a message as its send did: the same uniq_key and offset_msg_id.
    return m !== undefined && Buffer.compare(m.body, s.message.body) === 0
      && m.offset_msg_id === s.result.offset_msg_id
      && m.keys === s.message.properties.KEYS && m.tags === s.message.properties.TAGS;
  });

  // The UNIQ_KEY and KEYS indexes are built by the indexer shortly after the send: wait for them.
  let byId = false;
  let byKey = false;
  if (count > 0) {
    const first = sent[0];
    await get(mq, { 'msg-id': first.result.uniq_key, topic, 'wait-ms': '5000' }, deadlineMs);
    byId = true;
    const key = first.message.properties.KEYS;
    const response = await retrying(5000, async (last) => {
      const answer = await rpc(mq, 'queryByKey', { topic, key }, deadlineMs);
      return answer.messages.some((m) => m.uniq_key === first.result.uniq_key) || last ? answer : undefined;
    });
    emit('query', { response });
    byKey = response.messages.some((m) => m.uniq_key === first.result.uniq_key);
  }
  const ok = same && byId && byKey;
  emit('summary', { ok, topic, sent: sent.length, pulled: pulled.size, found_by_id: byId, found_by_key: byKey });
  return ok;
}

async function main(argv) {
  const { values: options, positionals } = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true });
  const command = positionals[0] || 'demo';
  if (options.help || !COMMANDS.includes(command) || positionals.length > 1) {
    const usage = require('node:fs').readFileSync(__filename, 'utf8').split('\n')
      .filter((line) => line.startsWith(' *   node ') || line.startsWith(' *  '))
      .map((line) => line.slice(3)).join('\n');
    process.stderr.write(`usage:\n${usage}\n`);
    return options.help ? 0 : 2;
  }
  const deadlineMs = int(options, 'deadline-ms');
  const tlsFiles = { ca: options['tls-ca'], cert: options['tls-cert'], key: options['tls-key'] };
  const tls = Object.values(tlsFiles).some(Boolean) ? tlsFiles
    : ['1', 'true', 'yes', 'on'].includes((process.env.MQSTORE_TLS || '').toLowerCase());
  const mq = connect(options.address, options.token || undefined, { deadlineMs, tls });
  try {
    const handlers = { demo, send, pull, get, query, route };
    const ok = await handlers[command](mq, options, deadlineMs);
    return ok === false ? 1 : 0;
  } catch (failure) {
    if (!(failure instanceof RpcFailure)) throw failure;
    const { err } = failure;
    emit('error', { rpc: failure.rpc, code: err.code, status: statusName(err.code), details: err.details });
    process.stderr.write(`${failure.message}\n`);
    return 1;
  } finally {
    mq.close();
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => { process.exitCode = code; }, (err) => {
    process.stderr.write(`${err.message}\n`);
    process.exitCode = 2;
  });
}

module.exports = { main, toJson };
