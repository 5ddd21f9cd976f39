// The official Node.js producer's TransactionChecker against mqstore's gateway: two halves are sent and
// left open; mqstore's check reaches the checker as RecoverOrphanedTransactionCommand, which commits the
// one whose body is "commit me" and rolls back the other. Prints one JSON line:
// RESULT {"sent": {body: messageId}, "checked": [{id, body}]}.
'use strict';
const { Producer } = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

async function main() {
  const [endpoints, topic, waitMs] = process.argv.slice(2);
  const checked = [];
  const producer = new Producer({
    endpoints, topic: [topic],
    checker: {
      check: async (message) => {
        const body = message.body.toString();
        checked.push({ id: message.messageId, body });
        return body === 'commit me' ? TransactionResolution.COMMIT : TransactionResolution.ROLLBACK;
      },
    },
  });
  await producer.startup();
  const sent = {};
  for (const body of ['commit me', 'roll me back']) {
    const transaction = producer.beginTransaction();
    const receipt = await producer.send({ topic, tag: 'NodeTx', body: Buffer.from(body) }, transaction);
    sent[body] = receipt.messageId;  // never ended: left to the check
  }
  const deadline = Date.now() + Number(waitMs);
  while (checked.length < 2 && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await new Promise((resolve) => setTimeout(resolve, 500));  // the EndTransaction calls complete
  await producer.shutdown();
  console.log('RESULT ' + JSON.stringify({ sent, checked }));
}

main().then(() => process.exit(0), (err) => { console.error(err); process.exit(1); });
