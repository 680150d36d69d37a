// Shared by the Node.js test clients: argument parsing, payloads, the one-line JSON report.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { parseArgs } from 'node:util'

export const MESSAGES = 5
export const CONSUME_DEADLINE_MS = 30_000
export const SESSION_TIMEOUT_MS = 6_000
export const HEARTBEAT_MS = 1_000

export function parseCli () {
  const { values } = parseArgs({
    options: {
      bootstrap: { type: 'string' },
      topic: { type: 'string' },
      group: { type: 'string' },
      ca: { type: 'string' },
      cert: { type: 'string' },
      key: { type: 'string' }
    }
  })
  const usage = `usage: node ${process.argv[1]} --bootstrap H:P --topic T --group G [--ca PEM [--cert PEM --key PEM]]\n`
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
  const [host, port] = splitHostPort(values.bootstrap)
  return { ...values, host, port, tls: tlsOptions(values) }
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

// Run `body(report)`; print the report as one JSON line; exit 0 only if 5 produced and 5 consumed.
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
  const t0 = performance.now()
  let ok = false
  // Hard stop in case a library keeps the event loop alive after close().
  const watchdog = setTimeout(() => {
    report.error = (report.error ?? '') + ' watchdog: script took longer than 90 s'
    finish(false)
  }, 90_000)
  watchdog.unref()
  function finish (success) {
    report.ok = success
    report.seconds = Math.round(performance.now() - t0) / 1000
    const sorted = Object.fromEntries(Object.entries(report).sort(([a], [b]) => a < b ? -1 : 1))
    process.stdout.write(JSON.stringify(sorted) + '\n', () => process.exit(success ? 0 : 1))
  }
  try {
    await body(args, report)
    ok = report.produced === MESSAGES && report.consumed === MESSAGES
    if (!ok) report.error = `expected ${MESSAGES} produced and consumed`
  } catch (err) {
    report.error = `${err?.name ?? 'Error'}: ${err?.message ?? err}`
    process.stderr.write(`${err?.stack ?? err}\n`)
    if (err?.errors) process.stderr.write(`${JSON.stringify(err.errors, null, 1)}\n`)
  }
  finish(ok)
}
