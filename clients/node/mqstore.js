'use strict';
/**
 * A Node.js client of the mqstore gateway (mqstore.v1.MessagingService), built from the .proto files
 * alone: they are loaded at run time by @grpc/proto-loader, nothing is generated. The packed client
 * (`npm pack`) carries its own copy under proto/ (scripts/bundle-protos.js); a checkout of the
 * repository loads the repository's proto/.
 *
 *   const { connect } = require('mqstore-node-client');   // or require('./mqstore') in this folder
 *   const mq = connect('127.0.0.1:9876', process.env.MQSTORE_TOKEN);
 *   const sent = await mq.send({ message: { topic: 'demo', body: Buffer.from('hi'), properties: { KEYS: 'k1' } } });
 *   const pulled = await mq.pull({ topic: 'demo', queue_id: sent.queue_id, queue_offset: sent.queue_offset });
 *   mq.close();
 *
 * Field names are the .proto's (snake_case, keepCase). int64 fields come back as decimal strings
 * (longs: String) and may be given as strings or numbers; enums come back as their names; bytes are
 * Buffers; every field is present in answers (defaults: true). Errors are grpc-js errors with `code`
 * (a grpc.status number, e.g. 3 = INVALID_ARGUMENT) and `details` (the gateway's message).
 */
const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

/**
 * The include root of the .proto files: the package's bundled copy when it has one (an installed
 * package), else the repository's proto/ two folders up (a checkout). The bundled copy comes first:
 * an installed package two folders below a project's own proto/ must not load that one.
 */
function protoDir() {
  const bundled = path.join(__dirname, 'proto');
  if (fs.existsSync(path.join(bundled, 'mqstore', 'v1', 'gateway.proto'))) {
    return bundled;
  }
  return path.resolve(__dirname, '..', '..', 'proto');
}

const PROTO_DIR = protoDir();
const GATEWAY_PROTO = path.join(PROTO_DIR, 'mqstore', 'v1', 'gateway.proto');
const LOADER_OPTIONS = Object.freeze({
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_DIR],
});
const DEFAULT_ADDRESS = '127.0.0.1:9876';
const DEFAULT_DEADLINE_MS = 10000;
// Pulled messages may be large (the gateway allows pulls of up to 32 MiB).
const CHANNEL_OPTIONS = Object.freeze({ 'grpc.max_receive_message_length': 64 * 1024 * 1024 + 4096 });

// The unary RPCs of MessagingService, by the name this client gives them.
const UNARY_METHODS = Object.freeze({
  send: 'Send',
  sendBatch: 'SendBatch',
  pull: 'Pull',
  getMessage: 'GetMessage',
  queryByKey: 'QueryByKey',
  searchOffset: 'SearchOffset',
  getQueueOffsets: 'GetQueueOffsets',
  commitOffset: 'CommitOffset',
  queryOffset: 'QueryOffset',
  createTopic: 'CreateTopic',
  updateTopic: 'UpdateTopic',
  listTopics: 'ListTopics',
  getRoute: 'GetRoute',
  getClusterStatus: 'GetClusterStatus',
  deleteTopic: 'DeleteTopic',
  consumerSendBack: 'ConsumerSendBack',
  endTransaction: 'EndTransaction',
  heartbeat: 'Heartbeat',
  unregisterConsumer: 'UnregisterConsumer',
  describeGroups: 'DescribeGroups',
});

let cachedPackage = null;

/** The loaded mqstore.v1 package (grpc-js service constructors and message types). */
function loadPackage() {
  if (cachedPackage === null) {
    const definition = protoLoader.loadSync(GATEWAY_PROTO, LOADER_OPTIONS);
    cachedPackage = grpc.loadPackageDefinition(definition).mqstore.v1;
  }
  return cachedPackage;
}

/** Metadata carrying "authorization: Bearer <token>", or empty metadata without a token. */
function authMetadata(token) {
  const metadata = new grpc.Metadata();
  if (token) {
    metadata.set('authorization', `Bearer ${token}`);
  }
  return metadata;
}

/**
 * A client of the gateway at `address` ("host:port"). With a `token`, every call carries it as
 * "authorization: Bearer <token>" metadata. `options.deadlineMs` is the default deadline of a call
 * (a call may pass its own as `{ deadlineMs }`). `options.tls` turns TLS on: `{ ca, cert, key }`, each a
 * PEM file path or Buffer (`ca` omitted: the system's CAs; `cert` + `key`: this client's certificate for a
 * gateway that requires one, i.e. mutual TLS); `tls: true` = TLS with the system's CAs. `options.credentials`
 * (grpc-js ChannelCredentials) replaces both. Each method returns a Promise of the answer; `close()` closes
 * the channel.
 */
function connect(address = DEFAULT_ADDRESS, token = undefined, options = {}) {
  const { MessagingService } = loadPackage();
  const credentials = options.credentials || tlsCredentials(options.tls);
  const raw = new MessagingService(address, credentials, { ...CHANNEL_OPTIONS, ...(options.channelOptions || {}) });
  const defaultDeadlineMs = options.deadlineMs || DEFAULT_DEADLINE_MS;

  const call = (method, request, callOptions = {}) => new Promise((resolve, reject) => {
    const deadlineMs = callOptions.deadlineMs || defaultDeadlineMs;
    raw[method](request, authMetadata(token), { deadline: Date.now() + deadlineMs }, (err, response) => {
      if (err) {
        reject(err);
      } else {
        resolve(response);
      }
    });
  });

  const duplex = (method, callOptions) => raw[method](authMetadata(token), callOptions.deadlineMs
    ? { deadline: Date.now() + callOptions.deadlineMs } : {});
  const client = {
    raw,
    address,
    close: () => raw.close(),
    /** SendStream: a duplex call; write SendRequests, read SendResults in order. */
    sendStream: (callOptions = {}) => raw.SendStream(authMetadata(token), {
      deadline: Date.now() + (callOptions.deadlineMs || defaultDeadlineMs),
    }),
    /** SendBatchStream: a duplex call; write SendBatchRequests, read SendBatchResponses in order. */
    sendBatchStream: (callOptions = {}) => raw.SendBatchStream(authMetadata(token), {
      deadline: Date.now() + (callOptions.deadlineMs || defaultDeadlineMs),
    }),
    /**
     * TransactionChecks: a duplex call a transactional producer keeps open (no deadline unless
     * `callOptions.deadlineMs`): write `{ producer_group }` first, then read TransactionChecks and answer
     * each with `{ answer: { producer_group, transaction_id, offset_msg_id, resolution } }`.
     */
    transactionChecks: (callOptions = {}) => duplex('TransactionChecks', callOptions),
  };
  for (const [name, method] of Object.entries(UNARY_METHODS)) {
    client[name] = (request = {}, callOptions = {}) => call(method, request, callOptions);
  }
  return client;
}

/** A PEM file path or Buffer as a Buffer (undefined stays undefined). */
function pem(value) {
  if (value === undefined || value === null || value === '') return undefined;
  return Buffer.isBuffer(value) ? value : fs.readFileSync(value);
}

/**
 * Channel credentials for `tls` (see connect): plaintext when it is falsy. grpc-js takes the key and
 * certificate chain together or not at all, so one without the other is refused here with a clear message.
 */
function tlsCredentials(tls) {
  if (!tls) return grpc.credentials.createInsecure();
  const { ca, cert, key } = tls === true ? {} : tls;
  if (!cert !== !key) {
    throw new Error('TLS: a client certificate needs its key and a key its certificate: give both or neither');
  }
  return grpc.credentials.createSsl(pem(ca) || null, pem(key) || null, pem(cert) || null);
}

/** The name of a grpc status code, e.g. 3 -> "INVALID_ARGUMENT". */
function statusName(code) {
  return Object.keys(grpc.status).find((name) => grpc.status[name] === code) || String(code);
}

module.exports = {
  connect,
  tlsCredentials,
  loadPackage,
  authMetadata,
  statusName,
  grpc,
  UNARY_METHODS,
  PROTO_DIR,
  GATEWAY_PROTO,
  LOADER_OPTIONS,
  DEFAULT_ADDRESS,
};
