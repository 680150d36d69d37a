// Shared by the Node.js test clients: argument parsing, payloads, the one-line JSON report, and
// --hold: after the script the client stays connected (producer and consumer open, the consumer
// in its group) and prints {"holding": true, ...}; once its standard input reaches EOF it closes
// everything and prints its usual report (harness/peers.py holding_client).
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { parseArgs } from 'node:util'

export const MESSAGES = 5
export const CONSUME_DEADLINE_MS = 30_000
export const SESSION_TIMEOUT_MS = 6_000
export const HEARTBEAT_MS = 1_000
export const SASL_MECHANISMS = ['PLAIN', 'SCRAM-SHA-512']
const SCRIPT_WATCHDOG_MS = 90_000
const CLOSE_WATCHDOG_MS = 30_000

export function parseCli () {
  const { values } = parseArgs({
    options: {
      bootstrap: { type: 'string' },
      topic: { type: 'string' },
      group: { type: 'string' },
      ca: { type: 'string' },
      cert: { type: 'string' },
      key: { type: 'string' },
      'sasl-mechanism': { type: 'string' },
      'sasl-user': { type: 'string' },
      'sasl-password': { type: 'string' },
      hold: { type: 'boolean', default: false }
    }
  })
  const usage = `usage: node ${process.argv[1]} --bootstrap H:P --topic T --group G [--ca PEM [--cert PEM --key PEM]]` +
    ` [--sasl-mechanism ${SASL_MECHANISMS.join('|')} --sasl-user U --sasl-password P] [--hold]\n`
  for (const k of ['bootstrap', 'topic', 'group']) {
    if (!values[k]) {
      process.stderr.write(usage)
      process.exit(2)
    }
  }
  if ((values.cert || values.key) && !(values.ca && values.cert && values.key)) {
    process.stderr.write(`--cert and --key go together, and need --ca\n${usage}`)
    process.exit(2)
  }
  const sasl = saslOptions(values, usage)
  const [host, port] = splitHostPort(values.bootstrap)
  return { ...values, host, port, tls: tlsOptions(values), sasl }
}

// --sasl-*: { mechanism (PLAIN or SCRAM-SHA-512), username, password }, or undefined. Each
// client maps it to its own option.
function saslOptions (values, usage) {
  const { 'sasl-mechanism': mechanism, 'sasl-user': username, 'sasl-password': password } = values
  if (!mechanism && !username && !password) return undefined
  if (!(mechanism && username && password)) {
    process.stderr.write(`--sasl-mechanism, --sasl-user and --sasl-password go together\n${usage}`)
    process.exit(2)
  }
  if (!SASL_MECHANISMS.includes(mechanism)) {
    process.stderr.write(`--sasl-mechanism ${mechanism}: one of ${SASL_MECHANISMS.join(', ')}\n${usage}`)
    process.exit(2)
  }
  return { mechanism, username, password }
}

// --ca: speak TLS, trusting only these CAs (Node checks the broker's host name by default);
// --cert/--key: present a client certificate. Node's tls.connect options, or undefined.
function tlsOptions ({ ca, cert, key }) {
  if (!ca) return undefined
  const options = { ca: [readFileSync(ca, 'utf8')] }
  if (cert) {
    options.cert = readFileSync(cert, 'utf8')
    options.key = readFileSync(key, 'utf8')
  }
  return options
}

function splitHostPort (hp) {
  const i = hp.lastIndexOf(':')
  return [hp.slice(0, i), Number(hp.slice(i + 1))]
}

export function packageVersion (name) {
  const require = createRequire(import.meta.url)
  // Read package.json from node_modules directly: some packages do not export it.
  const path = require.resolve.paths(name)
    .map(dir => `${dir}/${name}/package.json`)
    .find(p => { try { readFileSync(p); return true } catch { return false } })
  return JSON.parse(readFileSync(path, 'utf8')).version
}

export function payloads (client) {
  return Array.from({ length: MESSAGES }, (_, i) => ({ key: `k${i}`, value: `census ${client} message ${i}` }))
}

export const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

// One JSON line, keys sorted (as the Python clients print it).
function jsonLine (obj) {
  return JSON.stringify(Object.fromEntries(Object.entries(obj).sort(([a], [b]) => a < b ? -1 : 1))) + '\n'
}

// Resolves when standard input reaches EOF (or fails: the harness is gone either way).
function stdinEnded () {
  return new Promise(resolve => {
    for (const event of ['end', 'close', 'error']) process.stdin.once(event, resolve)
    process.stdin.resume() // what it carries before EOF is read and ignored
  })
}

// Run `body(args, report, closing)`; print the report as one JSON line; exit 0 only if 5 produced
// and 5 consumed. `closing(fn)` closes a producer or consumer: at once without --hold, after the
// hold (in the order given) with it. A script that fell short does not hold.
export async function runClient (client, pkg, body) {
  const args = parseCli()
  const report = {
    client,
    client_package_version: packageVersion(pkg),
    topic: args.topic,
    group: args.group,
    produced: 0,
    consumed: 0
  }
  if (args.sasl) report.sasl_mechanism = args.sasl.mechanism // never the password
  const t0 = performance.now()
  let ok = false
  // Hard stop in case a library keeps the event loop alive after close(). Disarmed while holding.
  let watchdog = arm(SCRIPT_WATCHDOG_MS, 'script')
  function arm (ms, what) {
    const timer = setTimeout(() => {
      report.error = (report.error ?? '') + ` watchdog: ${what} took longer than ${ms / 1000} s`
      finish(false)
    }, ms)
    timer.unref()
    return timer
  }
  const deferred = []
  const closing = async fn => { if (args.hold) deferred.push(fn); else await fn() }
  function finish (success) {
    report.ok = success
    report.seconds = Math.round(performance.now() - t0) / 1000
    process.stdout.write(jsonLine(report), () => process.exit(success ? 0 : 1))
  }
  try {
    await body(args, report, closing)
    ok = report.produced === MESSAGES && report.consumed === MESSAGES
    if (!ok) report.error = `expected ${MESSAGES} produced and consumed`
    if (args.hold && ok) {
      clearTimeout(watchdog)
      report.held = true
      process.stdout.write(jsonLine({ holding: true, pid: process.pid, ...report })) // synchronous for a pipe on Linux
      const held = performance.now()
      await stdinEnded()
      report.held_seconds = Math.round(performance.now() - held) / 1000
      watchdog = arm(CLOSE_WATCHDOG_MS, 'closing after the hold')
    }
    for (const fn of deferred.splice(0)) await fn()
  } catch (err) {
    ok = false
    report.error = `${err?.name ?? 'Error'}: ${err?.message ?? err}`
    process.stderr.write(`${err?.stack ?? err}\n`)
    if (err?.errors) process.stderr.write(`${JSON.stringify(err.errors, null, 1)}\n`)
  }
  finish(ok)
}
