// kafkajs 2.2.4 doing the census test script: create topic, produce 5, consume 5 in a fresh
// group, fetch metadata, close. Usage: node kafkajs.mjs --bootstrap H:P --topic T --group G
// [--ca PEM [--cert PEM --key PEM]] (TLS, see common.mjs)
import kafkajs from 'kafkajs'
import { CONSUME_DEADLINE_MS, HEARTBEAT_MS, MESSAGES, SESSION_TIMEOUT_MS, payloads, runClient, sleep } from './common.mjs'

const { Kafka, logLevel } = kafkajs

await runClient('kafkajs', 'kafkajs', async (args, report) => {
  const kafka = new Kafka({
    clientId: 'census-kafkajs',
    brokers: [args.bootstrap],
    ...(args.tls ? { ssl: args.tls } : {}),
    logLevel: logLevel.NOTHING,
    connectionTimeout: 5000,
    requestTimeout: 10000,
    retry: { retries: 3 }
  })

  const admin = kafka.admin()
  await admin.connect()
  try {
    await admin.createTopics({ topics: [{ topic: args.topic, numPartitions: 1, replicationFactor: 1 }], waitForLeaders: true, timeout: 10000 })
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
    await producer.disconnect()
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
    await consumer.stop() // commits the resolved offsets
  } finally {
    await consumer.disconnect()
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
