// KafkaJS against the ledgerd Kafka gateway, as an application would use it: an admin
// creates a topic, an idempotent producer writes keyed messages, a group consumer reads
// them all and commits, then the admin lists and describes the group, fetches, sets and
// resets its offsets, and deletes the topic's first records.
//
// node scenario.js BOOTSTRAP TOPIC GROUP COUNT
// Prints one JSON line per step ({"step": ..., ...}) and exits 0; any failure prints
// {"error": ...} and exits 1. The Python test (tests/kafka/test_kafkajs.py) checks
// every value.
"use strict";

const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic, groupId, countArg] = process.argv.slice(2);
const count = Number(countArg);

function say(step, fields) {
  process.stdout.write(JSON.stringify({ step, ...fields }) + "\n");
}

async function withTimeout(what, ms, promise) {
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer in ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, expired]);
  } finally {
    clearTimeout(timer);
  }
}

async function main() {
  const kafka = new Kafka({
    clientId: "ledgerd-kafkajs-test",
    brokers: [bootstrap],
    logLevel: logLevel.NOTHING,
    retry: { retries: 5, initialRetryTime: 200 },
  });
  const admin = kafka.admin();
  await admin.connect();

  const created = await admin.createTopics({
    topics: [{ topic, numPartitions: 2, replicationFactor: 1 }],
    waitForLeaders: true,
  });
  say("create", { created, topics: (await admin.listTopics()).includes(topic) });

  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const sent = [];
  for (let i = 0; i < count; i++) {
    const [meta] = await producer.send({
      topic,
      acks: -1,
      messages: [{ key: `k${i % 4}`, value: `v${i}`, headers: { n: String(i) } }],
    });
    sent.push({ partition: meta.partition, offset: Number(meta.baseOffset), i });
  }
  await producer.disconnect();
  // The partition the admin steps work on: one holding at least two records.
  const sizes = {};
  for (const s of sent) sizes[s.partition] = (sizes[s.partition] || 0) + 1;
  const chosen = Number(Object.keys(sizes).find((p) => sizes[p] >= 2));
  say("produce", { sent, chosen });

  const consumer = kafka.consumer({ groupId, sessionTimeout: 10000, heartbeatInterval: 500 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const received = [];
  await withTimeout("consuming", 60000, new Promise((resolve, reject) => {
    consumer.run({
      autoCommit: true,
      autoCommitThreshold: 1,
      eachMessage: async ({ partition, message }) => {
        received.push({
          partition,
          offset: Number(message.offset),
          key: message.key.toString(),
          value: message.value.toString(),
          n: message.headers.n.toString(),
        });
        if (received.length === count) resolve();
      },
    }).catch(reject);
  }));
  await consumer.commitOffsets([]);  // anything still pending
  await consumer.disconnect();
  say("consume", { received });

  const groups = await admin.listGroups();
  say("list", { groups: groups.groups.map((g) => g.groupId).filter((g) => g === groupId) });
  const described = await admin.describeGroups([groupId]);
  say("describe", {
    groups: described.groups.map((g) => ({ groupId: g.groupId, state: g.state, members: g.members.length })),
  });
  const fetched = async () => (await admin.fetchOffsets({ groupId, topics: [topic] }))[0]
    .partitions.map((p) => ({ partition: p.partition, offset: Number(p.offset) }))
    .sort((a, b) => a.partition - b.partition);
  say("offsets", { partitions: await fetched() });

  await admin.setOffsets({ groupId, topic, partitions: [{ partition: chosen, offset: "1" }] });
  say("set", { partitions: await fetched() });
  await admin.resetOffsets({ groupId, topic, earliest: true });
  say("reset", { partitions: await fetched() });

  await admin.deleteTopicRecords({ topic, partitions: [{ partition: chosen, offset: "2" }] });
  const low = (await admin.fetchTopicOffsets(topic))
    .map((p) => ({ partition: p.partition, low: Number(p.low), high: Number(p.high) }))
    .sort((a, b) => a.partition - b.partition);
  say("delete-records", { partitions: low });

  await admin.deleteGroups([groupId]);
  const after = await admin.listGroups();
  say("delete-group", { groups: after.groups.map((g) => g.groupId).filter((g) => g === groupId) });
  await admin.disconnect();
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stdout.write(JSON.stringify({ error: `${err.name}: ${err.message}`, type: err.type }) + "\n");
    process.exit(1);
  },
);
