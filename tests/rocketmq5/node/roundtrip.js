// The official RocketMQ 5 Node.js client (rocketmq-client-nodejs, apache/rocketmq-clients) against
// mqstore's gateway: a producer sends, a SimpleConsumer receives and acks. Prints one JSON line.
'use strict';
const { Producer, SimpleConsumer } = require('rocketmq-client-nodejs');

async function main() {
  const [endpoints, topic, group] = process.argv.slice(2);
  const producer = new Producer({ endpoints });
  await producer.startup();
  const receipt = await producer.send({
    topic, tag: 'NodeTag', keys: ['node-key'], properties: new Map([['lang', 'node']]),
    body: Buffer.from('hello from node'),
  });
  await producer.shutdown();

  const consumer = new SimpleConsumer({ consumerGroup: group, endpoints, subscriptions: new Map([[topic, '*']]),
    awaitDuration: 2000 });
  await consumer.startup();
  const received = [];
  const deadline = Date.now() + 20000;
  while (received.length < 1 && Date.now() < deadline) {
    for (const message of await consumer.receive(16, 10000)) {
      received.push({ id: message.messageId, body: message.body.toString(), tag: message.tag,
        keys: message.keys, properties: Object.fromEntries(message.properties) });
      await consumer.ack(message);
    }
  }
  await consumer.shutdown();
  console.log('RESULT ' + JSON.stringify({ sent: receipt.messageId, received }));
}

main().then(() => process.exit(0), (err) => { console.error(err); process.exit(1); });
