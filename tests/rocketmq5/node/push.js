// The official Node.js PushConsumer (rocketmq-client-nodejs) against mqstore's gateway: its listener
// consumes every message, fails the one whose body is FAIL_BODY (so it is retried, then dead-lettered),
// and records each delivery. Prints one JSON line: RESULT {"seen": [{id, body, attempt, at}]}.
'use strict';
const { PushConsumer, ConsumeResult } = require('rocketmq-client-nodejs');

async function main() {
  const [endpoints, topic, group, failBody, waitMs, lingerMs] = process.argv.slice(2);
  const seen = [];
  const consumer = new PushConsumer({
    consumerGroup: group, endpoints, subscriptions: new Map([[topic, '*']]),
    messageListener: {
      consume: async (message) => {
        const body = message.body.toString();
        seen.push({ id: message.messageId, body, attempt: message.deliveryAttempt, at: Date.now() / 1000 });
        return body === failBody ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  await new Promise((resolve) => setTimeout(resolve, Number(waitMs)));
  await consumer.shutdown();
  console.log('RESULT ' + JSON.stringify({ seen }));
}

main().then(() => process.exit(0), (err) => { console.error(err); process.exit(1); });
