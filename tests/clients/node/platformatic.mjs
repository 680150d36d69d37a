// @platformatic/kafka 1.35 doing the census test script: create topic, produce 5, consume 5 in
// a fresh group, fetch metadata, close. Usage: node platformatic.mjs --bootstrap H:P --topic T --group G
// [--ca PEM [--cert PEM --key PEM]] [--sasl-mechanism M --sasl-user U --sasl-password P] [--hold]
// (see common.mjs). Held, the consumer stays in its group with no stream open: its heartbeats are
// the consumer's own timer.
import { Admin, Consumer, ProduceAcks, Producer, stringDeserializers, stringSerializers } from '@platformatic/kafka'
import { CONSUME_DEADLINE_MS, HEARTBEAT_MS, MESSAGES, SESSION_TIMEOUT_MS, payloads, runClient } from './common.mjs'

await runClient('platformatic', '@platformatic/kafka', async (args, report, closing) => {
  const base = {
    bootstrapBrokers: [args.bootstrap],
    connectTimeout: 5000,
    timeout: 10000,
    retries: 3,
    ...(args.tls ? { tls: args.tls } : {}), // Node's tls.connect options (common.mjs)
    ...(args.sasl ? { sasl: args.sasl } : {}) // its mechanism names are ours: 'PLAIN', 'SCRAM-SHA-512'
  }

  const admin = new Admin({ ...base, clientId: 'census-platformatic-admin' })
  try {
    await admin.createTopics({ topics: [args.topic], partitions: 1, replicas: 1 })
    report.topic_created = true
  } finally {
    await admin.close()
  }

  const producer = new Producer({ ...base, clientId: 'census-platformatic-producer', serializers: stringSerializers })
  try {
    await producer.send({ messages: payloads('platformatic').map(m => ({ topic: args.topic, ...m })), acks: ProduceAcks.ALL })
    report.produced = MESSAGES
  } finally {
    await closing(() => producer.close())
  }

  const consumer = new Consumer({
    ...base,
    clientId: 'census-platformatic-consumer',
    groupId: args.group,
    sessionTimeout: SESSION_TIMEOUT_MS,
    heartbeatInterval: HEARTBEAT_MS,
    rebalanceTimeout: 10000,
    maxWaitTime: 500,
    deserializers: stringDeserializers
  })
  try {
    const stream = await consumer.consume({
      topics: [args.topic],
      mode: 'committed',
      fallbackMode: 'earliest',
      autocommit: false
    })
    let got = 0
    const timer = setTimeout(() => stream.close().catch(() => {}), CONSUME_DEADLINE_MS)
    for await (const message of stream) {
      got++
      if (got >= MESSAGES) {
        await message.commit()
        break
      }
    }
    clearTimeout(timer)
    report.consumed = got
    await stream.close()
    const md = await consumer.metadata({ topics: [args.topic] })
    report.metadata = { brokers: md.brokers.size, partitions: md.topics.get(args.topic)?.partitionsCount }
  } finally {
    await closing(() => consumer.close(true))
  }
})
