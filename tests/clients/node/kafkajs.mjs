// kafkajs 2.2.4 doing the census test script: create topic, produce 5, consume 5 in a fresh
// group, fetch metadata, close. Usage: node kafkajs.mjs --bootstrap H:P --topic T --group G
// [--ca PEM [--cert PEM --key PEM]] (TLS) [--sasl-mechanism M --sasl-user U --sasl-password P]
// [--hold] (see common.mjs). Held, the consumer keeps running (fetching and heartbeating).
import kafkajs from 'kafkajs'
import { CONSUME_DEADLINE_MS, HEARTBEAT_MS, MESSAGES, SESSION_TIMEOUT_MS, payloads, runClient, sleep } from './common.mjs'

const { Kafka, logLevel } = kafkajs

await runClient('kafkajs', 'kafkajs', async (args, report, closing) => {
  const kafka = new Kafka({
    clientId: 'census-kafkajs',
    brokers: [args.bootstrap],
    ...(args.tls ? { ssl: args.tls } : {}),
    ...(args.sasl ? { sasl: { ...args.sasl, mechanism: args.sasl.mechanism.toLowerCase() } } : {}), // 'plain', 'scram-sha-512'
    logLevel: logLevel.NOTHING,
    connectionTimeout: 5000,
    requestTimeout: 10000,
    retry: { retries: 3 }
  })

  const admin = kafka.admin()
  await admin.connect()
  try {
    try {
      await admin.createTopics({ topics: [{ topic: args.topic, numPartitions: 1, replicationFactor: 1 }], waitForLeaders: true, timeout: 10000 })
    } catch (err) {
      // Apache Kafka (KRaft) can answer the leader wait's Metadata with UNKNOWN_TOPIC_OR_PARTITION
      // for a moment after creating the topic (seen with six clients creating topics at once), and
      // kafkajs retries only LEADER_NOT_AVAILABLE there: wait for the topic's leader ourselves.
      if (err?.type !== 'UNKNOWN_TOPIC_OR_PARTITION') throw err
      await waitForLeader(admin, args.topic)
    }
    report.topic_created = true
  } finally {
    await admin.disconnect()
  }

  const producer = kafka.producer({ allowAutoTopicCreation: false })
  await producer.connect()
  try {
    await producer.send({ topic: args.topic, acks: -1, messages: payloads('kafkajs') })
    report.produced = MESSAGES
  } finally {
    await closing(() => producer.disconnect())
  }

  const consumer = kafka.consumer({
    groupId: args.group,
    sessionTimeout: SESSION_TIMEOUT_MS,
    heartbeatInterval: HEARTBEAT_MS,
    rebalanceTimeout: 10000,
    maxWaitTimeInMs: 500
  })
  await consumer.connect()
  try {
    let got = 0
    await consumer.subscribe({ topics: [args.topic], fromBeginning: true })
    await consumer.run({ eachMessage: async () => { got++ } })
    const deadline = Date.now() + CONSUME_DEADLINE_MS
    while (got < MESSAGES && Date.now() < deadline) await sleep(100)
    report.consumed = got
    await closing(() => consumer.stop()) // commits the resolved offsets
  } finally {
    await closing(() => consumer.disconnect())
  }

  const admin2 = kafka.admin()
  await admin2.connect()
  try {
    const md = await admin2.fetchTopicMetadata({ topics: [args.topic] })
    report.metadata = { partitions: md.topics[0].partitions.length }
  } finally {
    await admin2.disconnect()
  }
})

// Poll the topic's metadata (at most 10 s) until its one partition has a leader.
async function waitForLeader (admin, topic) {
  const deadline = Date.now() + 10_000
  for (;;) {
    try {
      const md = await admin.fetchTopicMetadata({ topics: [topic] })
      if (md.topics[0]?.partitions.every(p => p.leader >= 0)) return
    } catch (err) {
      if (err?.type !== 'UNKNOWN_TOPIC_OR_PARTITION' && err?.type !== 'LEADER_NOT_AVAILABLE') throw err
      if (Date.now() > deadline) throw err
    }
    if (Date.now() > deadline) throw new Error(`topic ${topic} has no leader after 10 s`)
    await sleep(100)
  }
}
