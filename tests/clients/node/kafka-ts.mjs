// kafka-ts 1.5.0 doing the census test script: create topic, produce 5, consume 5 in a fresh
// group, fetch metadata, close. Usage: node kafka-ts.mjs --bootstrap H:P --topic T --group G
// [--ca PEM [--cert PEM --key PEM]] [--sasl-mechanism M --sasl-user U --sasl-password P] [--hold]
// (see common.mjs). Held, the consumer keeps running (fetching and heartbeating).
// kafka-ts has no heartbeat-interval option: it heartbeats every sessionTimeoutMs / 10 (600 ms here).
import kafkaTs from 'kafka-ts'
import { CONSUME_DEADLINE_MS, MESSAGES, SESSION_TIMEOUT_MS, payloads, runClient, sleep } from './common.mjs'

const { API, API_ERROR, createKafkaClient, getApiName, saslPlain, saslScramSha512, setLogger } = kafkaTs
const SASL = { PLAIN: saslPlain, 'SCRAM-SHA-512': saslScramSha512 }

// The default logger writes JSON lines to stdout; keep stdout for the report, warnings to stderr.
const toStderr = level => (message, metadata) =>
  process.stderr.write(`kafka-ts ${level}: ${message} ${metadata === undefined ? '' : safeJson(metadata)}\n`)
function safeJson (v) {
  try { return JSON.stringify(v, (_, x) => typeof x === 'bigint' ? x.toString() : x instanceof Error ? String(x) : x) } catch { return String(v) }
}
setLogger({ debug: () => {}, info: () => {}, warn: toStderr('warn'), error: toStderr('error') })

await runClient('kafka-ts', 'kafka-ts', async (args, report, closing) => {
  const kafka = createKafkaClient({
    clientId: 'census-kafka-ts',
    bootstrapServers: [{ host: args.host, port: args.port }],
    requestTimeout: 10000,
    connectTimeout: 5000,
    ...(args.tls ? { ssl: args.tls } : {}), // Node's tls.connect options (common.mjs)
    ...(args.sasl ? { sasl: SASL[args.sasl.mechanism]({ username: args.sasl.username, password: args.sasl.password }) } : {})
  })

  const cluster = kafka.createCluster()
  await cluster.connect()
  try {
    const { controllerId } = await cluster.sendRequest(API.METADATA, {
      allowTopicAutoCreation: false,
      includeTopicAuthorizedOperations: false,
      topics: []
    })
    const created = await cluster.sendRequestToNode(controllerId)(API.CREATE_TOPICS, {
      validateOnly: false,
      timeoutMs: 10000,
      topics: [{ name: args.topic, numPartitions: 1, replicationFactor: 1, assignments: [], configs: [] }]
    })
    report.topic_created = created.topics.every(t => t.errorCode === 0 || t.errorCode === 36 /* TOPIC_ALREADY_EXISTS */)
  } finally {
    await cluster.disconnect()
  }

  const producer = kafka.createProducer({ allowTopicAutoCreation: false })
  try {
    await sendOnceTopicIsKnown(producer, payloads('kafka-ts').map(m => ({ topic: args.topic, key: Buffer.from(m.key), value: Buffer.from(m.value) })))
    report.produced = MESSAGES
  } finally {
    await closing(() => producer.close())
  }

  let got = 0
  const consumer = await kafka.startConsumer({
    topics: [args.topic],
    groupId: args.group,
    sessionTimeoutMs: SESSION_TIMEOUT_MS,
    rebalanceTimeoutMs: 10000,
    maxWaitMs: 500,
    fromBeginning: true,
    onBatch: messages => { got += messages.length }
  })
  try {
    const deadline = Date.now() + CONSUME_DEADLINE_MS
    while (got < MESSAGES && Date.now() < deadline) await sleep(100)
    report.consumed = got
  } finally {
    await closing(() => consumer.close()) // commits the processed offsets, leaves the group
  }

  const cluster2 = kafka.createCluster()
  await cluster2.connect()
  try {
    const md = await cluster2.sendRequest(API.METADATA, {
      allowTopicAutoCreation: false,
      includeTopicAuthorizedOperations: false,
      topics: [{ id: null, name: args.topic }]
    })
    report.metadata = { brokers: md.brokers.length, partitions: md.topics[0].partitions.length }
  } finally {
    await cluster2.disconnect()
  }
})

// Apache Kafka (KRaft) may not know a topic it has just created for a moment (seen with six clients
// creating topics at once), and kafka-ts's producer does not retry a Metadata answer of
// UNKNOWN_TOPIC_OR_PARTITION or LEADER_NOT_AVAILABLE (it has enqueued nothing then): send again,
// for at most 10 s.
async function sendOnceTopicIsKnown (producer, messages) {
  const retriable = [API_ERROR.UNKNOWN_TOPIC_OR_PARTITION, API_ERROR.LEADER_NOT_AVAILABLE]
  const deadline = Date.now() + 10_000
  for (;;) {
    try {
      return await producer.send(messages)
    } catch (err) {
      if (err?.apiName !== getApiName(API.METADATA) || !retriable.includes(err?.errorCode) || Date.now() > deadline) throw err
    }
    await sleep(100)
  }
}
