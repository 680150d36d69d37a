// The kafka-census incident page: reads /api/v1 on this origin and draws it.
// Every string from the wire goes into the page as text (textContent, DOM nodes), never as
// markup. The API token lives in this tab's sessionStorage only and travels as a header.
'use strict';

const API = '/api/v1';
const FILTERS = ['listener', 'client_software_name', 'client_software_version', 'client_id', 'principal',
  'address', 'inferred_software_name', 'identity_source', 'close_reason', 'topic', 'group'];
const CONN_PARAMS = ['state', ...FILTERS, 'order_by', 'limit'];  // the /connections query, passed as is
const ORDERABLE = new Set(['first_seen', 'last_seen', 'idle_seconds', 'client_address', 'client_port', 'client_id',
  'client_software_name', 'client_software_version', 'listener', 'bytes_from_client', 'bytes_from_broker', 'state']);
const TOKEN_KEY = 'kafka-census-token';
const REFRESH_CHOICES = [0, 2, 5, 10, 30, 60];
const DEFAULT_REFRESH = 5;

const $ = (id) => document.getElementById(id);

const view = { conn: new URLSearchParams(), target: '', refresh: DEFAULT_REFRESH, detail: null, topic: null };
let lastRefresh = DEFAULT_REFRESH;  // what "resume" goes back to
let aggregator = false;  // the answers carry peers_asked: this is the aggregator
let targets = [];  // the upgrade targets offered
let targetsKnown = false;  // read from the API's OpenAPI document (its enum)
let timer = null;
let running = false;
let again = false;

// --- DOM helpers: text only --------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = String(value);
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const dash = (v) => (v === null || v === undefined || v === '' ? '–' : String(v));
const when = (ts) => (typeof ts === 'string' ? ts.replace('T', ' ').replace(/\.\d+Z$/, 'Z') : '–');
const num = (n) => (typeof n === 'number' ? n.toLocaleString('en-US') : '–');

function td(value, cls) { return el('td', { class: cls }, dash(value)); }
// In tables: month-day and time, UTC (the whole timestamp as the cell's title).
function tdWhen(ts) {
  const cell = td(typeof ts === 'string' ? when(ts).slice(5, 19) : null, 'ts');
  if (typeof ts === 'string') cell.title = ts;
  return cell;
}

function section(id) { return $(id); }

function showError(sectionId, message) {
  const p = section(sectionId).querySelector('.error');
  p.textContent = message || '';
  p.hidden = !message;
}

// --- the URL holds the view --------------------------------------------------------------------

function readUrl() {
  const params = new URLSearchParams(location.search);
  view.conn = new URLSearchParams();
  for (const [key, value] of params) if (CONN_PARAMS.includes(key) && value !== '') view.conn.append(key, value);
  view.target = params.get('target') || '';
  view.topic = params.get('open_topic') || null;
  const refresh = Number(params.get('refresh'));
  view.refresh = params.has('refresh') && REFRESH_CHOICES.includes(refresh) ? refresh : DEFAULT_REFRESH;
  if (view.refresh > 0) lastRefresh = view.refresh;
  view.detail = null;
  if (location.hash.startsWith('#conn=')) {
    try { view.detail = decodeURIComponent(location.hash.slice(6)); } catch { view.detail = null; }
  }
}

function urlOf() {
  const params = new URLSearchParams(view.conn);
  if (view.target) params.set('target', view.target);
  if (view.topic) params.set('open_topic', view.topic);
  if (view.refresh !== DEFAULT_REFRESH) params.set('refresh', String(view.refresh));
  const query = params.toString();
  return location.pathname + (query ? '?' + query : '') + (view.detail ? '#conn=' + encodeURIComponent(view.detail) : '');
}

let drawnUrl = '';  // the URL the view was last read from or written to

function go(push) {
  const url = urlOf();
  if (url !== location.pathname + location.search + location.hash) {
    if (push) history.pushState(null, '', url); else history.replaceState(null, '', url);
  }
  drawnUrl = location.href;
  showControls();
  refresh();
}

function showControls() {
  const form = $('filters');
  for (const name of CONN_PARAMS) form.elements[name].value = view.conn.get(name) || '';
  if (view.conn.get('state') === 'all') form.elements.state.value = '';  // the option "all" sends nothing
  $('refresh').value = String(view.refresh);
  $('pause').textContent = view.refresh > 0 ? 'pause' : 'resume';
  const shown = view.conn.toString();
  $('query-shown').textContent = 'GET ' + API + '/connections' + (shown ? '?' + shown : '');
}

// --- the API -----------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

function detailText(body) {
  if (!body || body.detail === undefined) return '';
  if (typeof body.detail === 'string') return body.detail;
  if (Array.isArray(body.detail)) {  // FastAPI's 422: [{loc, msg}, ...]
    return body.detail.map((d) => `${(d.loc || []).join('.')}: ${d.msg}`).join('; ');
  }
  return JSON.stringify(body.detail);
}

const cycle = { missing: new Map(), statuses: [] };

async function api(path) {
  const headers = { Accept: 'application/json' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = 'Bearer ' + token;
  let resp;
  // A census at its --http-max-requests answers 503 with Retry-After: ask again after it (twice at most).
  for (let attempt = 0; ; attempt++) {
    try {
      resp = await fetch(path, { headers, cache: 'no-store', credentials: 'omit', redirect: 'error' });
    } catch (e) {
      cycle.statuses.push(0);
      throw new ApiError(0, 'unreachable: no answer from this census (' + e.message + ')');
    }
    const wait = Number(resp.headers.get('Retry-After'));
    if (resp.status !== 503 || !(wait > 0) || attempt >= 2) break;
    await new Promise((done) => setTimeout(done, Math.min(wait, 5) * 1000));
  }
  cycle.statuses.push(resp.status);
  let body = null;
  try { body = await resp.json(); } catch { body = null; }
  if (body && typeof body === 'object' && 'peers_asked' in body) {
    aggregator = true;
    for (const m of body.missing_peers || []) cycle.missing.set(m.peer, m);
  }
  if (resp.status === 401) throw new ApiError(401, '401 Unauthorized: this census needs its API token');
  if (!resp.ok) throw new ApiError(resp.status, `HTTP ${resp.status}` + (detailText(body) ? ': ' + detailText(body) : ''));
  return body;
}

async function knownTargets() {
  const doc = await api('/openapi.json');
  const op = doc.paths[API + '/upgrade-readiness'].get;
  const param = op.parameters.find((p) => p.name === 'target');
  return { list: param.schema.enum.map(String), fallback: String(param.schema.default) };
}

// --- sections ----------------------------------------------------------------------------------

function identityCell(sourceName, inferred) {
  const cell = el('td', { class: 'ident' }, dash(sourceName));
  if (inferred) {
    cell.append(el('br'), el('span', { class: 'inferred' },
      `inferred: ${inferred.name} ${inferred.version_range} (${Math.round(inferred.confidence * 100)}%)`));
  }
  return cell;
}

function renderCensus(body) {
  const rows = body.clients.map((c) => el('tr', {},
    td(c.client_software_name), td(c.client_software_version), td(c.client_id, 'wire'), td(c.principal, 'wire'),
    td(c.listener), td(num(c.open_connections), 'num'), td(num(c.total_connections), 'num'),
    identityCell(c.identity_source, c.inferred_software), tdWhen(c.last_seen),
    el('td', { class: 'act' }, el('button', { type: 'button', class: 'link', onclick: () => filterBy(c) },
      'connections'))));
  $('census-table').tBodies[0].replaceChildren(...rows);
  let count = `${body.total} rows`;
  if (body.census_overflow) count += `, ${num(body.census_overflow)} closed connections not folded (census full)`;
  $('census-count').textContent = '(' + count + ')';
}

function filterBy(client) {
  view.conn = new URLSearchParams();
  for (const key of ['listener', 'client_software_name', 'client_software_version', 'client_id', 'principal']) {
    if (client[key] !== null && client[key] !== undefined) view.conn.set(key, client[key]);
  }
  if (client.client_software_name === null && client.inferred_software) {
    view.conn.set('inferred_software_name', client.inferred_software.name);
  }
  go(true);
  $('connections-section').scrollIntoView();
}

// Clients opening connections at or over the threshold now: reconnect loops (GET /api/v1/churn).
function renderChurn(body) {
  const rows = body.churning.map((c) => el('tr', { class: 'trouble' },
    el('td', { class: 'id' }, c.client_address,
      c.peers === undefined ? null : el('span', { class: 'peer' }, 'on ' + c.peers.join(', '))),  // the aggregator's
    td(c.client_id, 'wire'), td(c.connections_per_minute.toFixed(1), 'num'), td(num(c.connections_total), 'num'),
    tdWhen(c.first_seen), tdWhen(c.last_seen),
    el('td', { class: 'act' }, el('button', { type: 'button', class: 'link', onclick: () => connectionsOf(c) },
      'connections'))));
  $('churn-table').tBodies[0].replaceChildren(...rows);
  $('churn-table').hidden = rows.length === 0;
  const empty = $('churn-empty');
  empty.hidden = rows.length > 0;
  empty.textContent = `No client is opening ${num(body.threshold_per_minute)} connections a minute or more.`;
  let count = `${body.total} at ${num(body.threshold_per_minute)}+ connections/min; ` +
    `${num(body.tracked_clients)} of ${num(body.max_tracked_clients)} clients tracked`;
  if (body.evicted) count += `, ${num(body.evicted)} forgotten at the bound`;
  $('churn-count').textContent = '(' + count + ')';
}

function connectionsOf(client) {  // a null client_id cannot be a filter: its address alone
  view.conn = new URLSearchParams({ address: client.client_address });
  if (client.client_id !== null) view.conn.set('client_id', client.client_id);
  go(true);
  $('connections-section').scrollIntoView();
}

// Who writes and who reads each topic (GET /api/v1/topics); one opens with its clients
// (GET /api/v1/topics/{name}), each client a link to its connections filtered by topic and client.
const topicName = (t) => (t.topic !== null ? t.topic : t.topic_id);
const topicLabel = (t) => (t.topic !== null ? t.topic : `${t.topic_id} (id, unnamed)`);
const distinct = (rows) => new Set(rows.map((c) => JSON.stringify([c.software_name, c.software_version, c.client_id,
  c.principal, c.client_address, c.group_id, c.transactional_id]))).size;  // the aggregator lists one per peer
const INFERRED = new Set(['sibling', 'fingerprint', 'restored_sibling', 'restored_fingerprint']);
const ROLES = [['producers', 'Who writes'], ['consumers', 'Who reads'], ['admins', 'Admin clients'],
  ['others', 'Other clients (metadata only, replication)']];

function renderTopics(body) {
  const rows = body.topics.map((t) => el('tr', { 'data-topic': topicName(t) },
    el('td', { class: 'wire' }, el('a', { href: topicUrl(topicName(t)), onclick: (e) => {
      e.preventDefault();
      openTopic(topicName(t));
    } }, topicLabel(t))),
    td(distinct(t.producers), 'num'), td(distinct(t.consumers), 'num'), td(num(t.bytes_produced), 'num'),
    td(num(t.bytes_fetched), 'num'), tdWhen(t.last_seen)));
  $('topics-table').tBodies[0].replaceChildren(...rows);
  $('topics-table').hidden = rows.length === 0;
  $('topics-empty').hidden = rows.length > 0;
  let count = `${rows.length} topics`;
  if (body.topics_overflowed) count += `, ${num(body.topics_overflowed)} more counted under <other>`;
  if (body.unresolved_ids) count += `, ${num(body.unresolved_ids)} ids not named yet`;
  $('topics-count').textContent = '(' + count + ')';
}

function topicUrl(name) {  // the view with that topic open (a link: it can be copied, and prints)
  const saved = view.topic;
  view.topic = name;
  const url = urlOf();
  view.topic = saved;
  return url;
}

function openTopic(name) {
  view.topic = name;
  go(true);
  $('topic-section').scrollIntoView();
}

function topicConnections(t, c) {  // a null client_id or address cannot be a filter: left out
  view.conn = new URLSearchParams({ topic: topicName(t) });
  if (c.client_id !== null) view.conn.set('client_id', c.client_id);
  if (c.client_address !== null) view.conn.set('address', c.client_address);
  go(true);
  $('connections-section').scrollIntoView();
}

function topicClients(t, role) {
  const heads = ['software', 'client_id', 'principal', 'address', 'group', 'transactional id', 'uses', 'bytes',
    'connections (open)', 'last seen (UTC)', ''];
  return el('table', { id: 'topic-' + role }, el('thead', {}, el('tr', {}, ...heads.map((h) => el('th', {}, h)))),
    el('tbody', {}, ...t[role].map((c) => el('tr', {},
      td([c.software_name, c.software_version].filter((v) => v !== null).join(' ') +
        (INFERRED.has(c.identity_source) ? ' (inferred)' : '') || null),
      td(c.client_id, 'wire'), td(c.principal, 'wire'),
      el('td', { class: 'id' }, dash(c.client_address), c.peer === undefined ? null : el('span', { class: 'peer' }, 'on ' + c.peer)),
      td(c.group_id, 'wire'), td(c.transactional_id, 'wire'), td(c.uses.join(', ')), td(num(c.bytes), 'num'),
      td(`${num(c.connections)} (${num(c.open_connections)})`, 'num'), tdWhen(c.last_seen),
      el('td', { class: 'act' }, el('button', { type: 'button', class: 'link', onclick: () => topicConnections(t, c) },
        'connections'))))));
}

function renderTopic(t) {
  $('topic-title').textContent = topicLabel(t);
  const parts = [el('p', {}, (t.topic !== null && t.topic_id ? `id ${t.topic_id}; ` : '') +
    `${num(t.bytes_produced)} bytes produced, ${num(t.bytes_fetched)} fetched; first seen ${when(t.first_seen)}, ` +
    `last seen ${when(t.last_seen)}`)];
  for (const [role, title] of ROLES) {
    if (!t[role].length && (role === 'admins' || role === 'others')) continue;
    parts.push(el('h3', {}, `${title}: ${distinct(t[role])} client(s)`),
      t[role].length ? topicClients(t, role) : el('p', { class: 'note' }, 'none seen'));
  }
  $('topic-detail').replaceChildren(...parts);
}

const COLUMNS = [  // [heading, order_by field or null, cell, shown only if (rows) => true]
  ['client', 'client_address', (c) => el('td', { class: 'id' },
    el('a', { href: '#conn=' + encodeURIComponent(c.id), title: c.id, 'data-conn-id': c.id },
      `${c.client_address}:${c.client_port}`),
    c.peer === undefined ? null : el('span', { class: 'peer' }, 'on ' + c.peer))],  // the aggregator's sidecar
  ['client_id', 'client_id', (c) => td(c.client_id, 'wire')],
  ['software', 'client_software_name', (c) => td(c.client_software_name)],
  ['version', 'client_software_version', (c) => td(c.client_software_version)],
  ['identity', null, (c) => identityCell(c.identity_source, c.inferred_software)],
  ['principal', null, (c) => td(c.principal, 'wire'), (rows) => rows.some((c) => c.principal !== null)],
  ['listener', 'listener', (c) => td(c.listener)],
  ['state', 'state', (c) => td(c.state + (c.close_reason ? ` (${c.close_reason})` : ''), 'ts')],
  ['first seen (UTC)', 'first_seen', (c) => tdWhen(c.first_seen)],
  ['last seen (UTC)', 'last_seen', (c) => tdWhen(c.last_seen)],
  ['idle s', 'idle_seconds', (c) => td(c.idle_seconds === null ? null : c.idle_seconds.toFixed(1), 'num')],
  ['bytes in', 'bytes_from_client', (c) => td(num(c.bytes_from_client), 'num')],
  ['bytes out', 'bytes_from_broker', (c) => td(num(c.bytes_from_broker), 'num')],
  ['requests', null, (c) => td(num(c.requests.reduce((n, r) => n + r.count, 0)), 'num')],
];

function currentOrder() {
  const first = (view.conn.get('order_by') || '').split(',')[0].trim().split(/ +/);
  return { field: first[0] || 'first_seen', desc: first[1] === 'desc' };
}

function sortBy(field) {
  const now = currentOrder();
  view.conn.set('order_by', now.field === field && !now.desc ? `${field} desc` : field);
  go(true);
}

function renderHead(columns) {
  const order = currentOrder();
  const cells = columns.map(([heading, field]) => {
    if (!field || !ORDERABLE.has(field)) return el('th', {}, heading);
    const sorted = order.field === field;
    return el('th', { 'aria-sort': sorted ? (order.desc ? 'descending' : 'ascending') : null },
      el('button', { type: 'button', class: 'sort', title: `order_by ${field}`, onclick: () => sortBy(field) },
        heading + (sorted ? (order.desc ? ' ▼' : ' ▲') : '')));
  });
  $('connections-head').replaceChildren(...cells);
}

function renderConnections(body) {
  const columns = COLUMNS.filter(([, , , shown]) => !shown || shown(body.connections));
  renderHead(columns);
  const rows = body.connections.map((c) => {
    const row = el('tr', { 'data-conn-id': c.id, class: c.state }, ...columns.map(([, , cell]) => cell(c)));
    if (c.decode_errors || c.desyncs) row.classList.add('trouble');
    return row;
  });
  $('connections-table').tBodies[0].replaceChildren(...rows);
  $('connections-count').textContent = `(${body.connections.length} shown of ${body.total} matching, limit ${body.limit})`;
}

function kv(pairs) {
  return el('table', { class: 'kv' }, el('tbody', {}, ...pairs.map(([k, v]) => el('tr', {}, el('th', {}, k),
    v instanceof Node ? el('td', {}, v) : td(v)))));
}

function requestsTable(requests, extra) {
  return el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'api'), el('th', { class: 'num' }, 'key'),
    el('th', { class: 'num' }, 'version'), el('th', { class: 'num' }, 'count'), extra ? el('th', {}, extra[0]) : null)),
  el('tbody', {}, ...requests.map((r) => el('tr', {}, td(r.api), td(r.api_key, 'num'), td(r.api_version, 'num'),
    td(num(r.count), 'num'), extra ? td(extra[1](r)) : null))));
}

// The connections judged with this one (inferred_software.client_connections, the first 8 of
// its client): each asked for on its own, one after another (the census serves
// --http-max-requests API requests at once, and the page's other sections are asked meanwhile).
// A sidecar's ids: on the aggregator, whose ids are PEER/ID, they are prefixed with the peer.
// null: forgotten (closed past the census's retention).
async function clientMembers(c) {
  const ids = (c.inferred_software && c.inferred_software.client_connections) || [];
  const members = [];
  for (const id of ids) {
    const full = c.peer === undefined ? id : `${c.peer}/${id}`;
    let conn = c;
    if (full !== c.id) {
      try {
        conn = await api(API + '/connections/' + encodeURIComponent(full));
      } catch (e) {
        if (!(e instanceof ApiError) || e.status !== 404) throw e;
        conn = null;
      }
    }
    members.push({ id: full, conn });
  }
  return members;
}

const requestList = (rs) => rs.map((r) => `${r.api} v${r.api_version}`);

// "client of N connections from ..." (exporter.census.fingerprint.CLIENT_EVIDENCE): the client's count,
// which the listed ids (at most 8) may fall short of.
function clientCount(inferred, listed) {
  const line = (inferred.evidence || []).find((e) => e.startsWith('client of '));
  const m = line ? /^client of (\d+) connections? /.exec(line) : null;
  return m ? Math.max(Number(m[1]), listed) : listed;
}

function clientTable(c, members) {
  const total = clientCount(c.inferred_software, members.length);
  const rows = members.map(({ id, conn }) => {
    const label = conn ? `${conn.client_address}:${conn.client_port}` : id;
    return el('tr', { 'data-conn-id': id, class: conn ? conn.state : 'closed' },
      el('td', { class: 'id' }, id === c.id ? el('span', { title: id }, label + ' (this one)')
        : el('a', { href: '#conn=' + encodeURIComponent(id), title: id, 'data-conn-id': id }, label)),
      td(conn ? conn.state + (conn.close_reason ? ` (${conn.close_reason})` : '')
        : 'forgotten (closed past the retention)', 'ts'),
      td(conn ? requestList(conn.first_requests).join(', ') : null),
      td(conn ? num(conn.requests.reduce((n, r) => n + r.count, 0)) : null, 'num'));
  });
  const together = [...new Set(members.flatMap(({ conn }) => (conn ? requestList(conn.first_requests) : [])))];
  const more = total - members.length;
  return [el('h3', {}, `Its client: ${num(total)} connections judged together`),
    el('p', { class: 'note' }, 'The inference is the client\'s: the connections of one client address, client_id ' +
      'and principal, judged together on the requests of them all; each of them shows it.'),
    el('table', { id: 'client-table' }, el('thead', {}, el('tr', {}, el('th', {}, 'connection'), el('th', {}, 'state'),
      el('th', {}, 'first requests'), el('th', { class: 'num' }, 'requests'))), el('tbody', {}, ...rows)),
    more > 0 ? el('p', { id: 'client-more' }, `and ${num(more)} more, not listed (the API lists the first ` +
      `${members.length})`) : null,
    together.length ? el('p', { id: 'client-requests' }, 'first requests of the listed connections: ' +
      together.join(', ')) : null];
}

function renderDetail(c, members) {
  $('detail-id').textContent = c.id;
  const parts = [kv([
    ['client', `${c.client_address}:${c.client_port}`], ['broker', `${c.broker_address}:${c.broker_port}`],
    ['peer', c.peer], ['listener', `${c.listener} (${c.security_protocol})`], ['state', c.state],
    ['close reason', c.close_reason], ['closed at', c.unsupported_request
      ? `${c.unsupported_request.api} v${c.unsupported_request.api_version}: a version the broker refuses` : null],
    ['client_id', c.client_id],
    ['software', [c.client_software_name, c.client_software_version].filter((v) => v !== null).join(' ') || null],
    ['identity source', c.identity_source], ['principal', c.principal], ['SASL mechanism', c.sasl_mechanism],
    ['first seen', when(c.first_seen)], ['last seen', when(c.last_seen)],
    ['idle', c.idle_seconds === null ? null : `${c.idle_seconds.toFixed(3)} s`],
    ['bytes from client / broker', `${num(c.bytes_from_client)} / ${num(c.bytes_from_broker)}`],
    ['decode errors / desyncs', `${c.decode_errors} / ${c.desyncs}`],
    ['ApiVersions request version', c.api_versions_request_version],
    ['first requests', c.first_requests.map((r) => `${r.api} v${r.api_version}`).join(', ')],
  ].filter(([k, v]) => (k !== 'peer' || v !== undefined) && (k !== 'closed at' || v)))];
  if (c.inferred_software) {
    const s = c.inferred_software;
    parts.push(el('h3', {}, 'Inferred identity'), kv([
      ['software', `${s.name} ${s.version_range}`], ['confidence', `${Math.round(s.confidence * 100)}%`],
      ['source', s.source], ['first compatible with 4.0', s.min_compatible],
      ['sibling connection', s.sibling_connection_id], ['evidence', el('ul', {}, ...(s.evidence || []).map((e) => el('li', {}, e)))]]));
    if (members && members.length) parts.push(...clientTable(c, members));
  }
  if (c.fingerprint_unknown) {  // no name: why, and the libraries that could have sent it (evidence, not a name)
    const u = c.fingerprint_unknown;
    parts.push(el('h3', {}, 'Not named'), kv([
      ['why', u.reason], ['candidates', el('ul', {}, ...u.candidates.map((e) => el('li', {}, e)))]]));
  }
  parts.push(el('h3', {}, 'Requests by API and version'), requestsTable(c.requests));
  $('detail').replaceChildren(...parts);
}

function renderUpgrade(body) {
  if (!targets.includes(body.target)) targets.push(body.target);
  fillTargets(body.target);
  const verdict = $('verdict');
  const groups = body.clients_by_software.length;
  verdict.className = body.ready ? 'ok' : 'bad';
  if (body.ready) verdict.textContent = `READY for Kafka ${body.target}: no client used an API version it removes.`;
  else if (body.partial && groups === 0) verdict.textContent = `NO VERDICT for Kafka ${body.target}: some peers did not answer.`;
  else verdict.textContent = `NOT READY for Kafka ${body.target}: ${groups} client group(s) used API versions it removes.`;
  if (body.partial) verdict.className = 'bad';
  const rows = body.clients_by_software.map((g) => el('tr', {},
    td(g.software_name), td(g.software_version), td(g.identity_source), td(g.client_id, 'wire'), td(g.principal, 'wire'),
    td(g.listeners.join(', ')), td(num(g.open_connections), 'num'), td(num(g.total_connections), 'num'),
    td(g.removed_requests.map((r) => `${r.api} v${r.api_version} ×${r.count} (` +
      (r.minimum_version === null ? 'removed' : `≥ v${r.minimum_version}`) + ')').join(', ')),
    td(g.min_compatible)));
  $('upgrade-table').tBodies[0].replaceChildren(...rows);
  $('upgrade-table').hidden = rows.length === 0;  // READY: nobody to list
}

function fillTargets(selected) {
  const select = $('target');
  const list = targets;
  if (select.options.length !== list.length || [...select.options].some((o, i) => o.value !== list[i])) {
    select.replaceChildren(...list.map((t) => el('option', { value: t }, t)));
  }
  select.value = selected;
}

function renderBrokers(body) {
  const blocks = body.brokers.map((b) => el('details', { class: 'broker' },
    el('summary', {}, `${b.broker}` + (b.peer ? ` on ${b.peer}` : '') +
      ` — ${b.api_ranges.length} APIs, seen ${when(b.seen_at)}`),
    el('table', {}, el('thead', {}, el('tr', {}, el('th', {}, 'api'), el('th', { class: 'num' }, 'key'),
      el('th', { class: 'num' }, 'min'), el('th', { class: 'num' }, 'max'))),
    el('tbody', {}, ...b.api_ranges.map((r) => el('tr', {}, td(r.api), td(r.api_key, 'num'), td(r.min_version, 'num'),
      td(r.max_version, 'num'))))),
    b.features.length ? el('p', {}, 'features: ' + b.features.map((f) =>
      `${f.name} ${f.min_version}–${f.max_version}` + (f.finalized_max_level === null ? '' : ` (finalized ${f.finalized_max_level})`)).join(', ')) : null));
  // Keep open what the reader opened: a refresh must not fold the table being read.
  const open = new Set([...document.querySelectorAll('#brokers details[open] summary')].map((s) => s.textContent.split(' — ')[0]));
  for (const d of blocks) if (open.has(d.firstChild.textContent.split(' — ')[0])) d.open = true;
  $('brokers').replaceChildren(...(blocks.length ? blocks : [el('p', {}, 'No broker answer seen yet (an ApiVersions response).')]));
}

function counts(title, map) {
  const entries = Object.entries(map).filter(([, v]) => v);  // the kinds seen; zero ones say nothing
  const total = entries.reduce((n, [, v]) => n + v, 0);
  return el('div', { class: 'card' + (total ? ' warn' : '') }, el('h3', {}, `${title}: ${num(total)}`),
    entries.length ? el('ul', {}, ...entries.map(([k, v]) => el('li', {}, `${k}: ${num(v)}`))) : null);
}

function renderHealth(h) {
  const bounds = h.dropped_by_bounds;
  const boundPairs = Object.entries(bounds).flatMap(([k, v]) => (typeof v === 'number' ? [[k, v]] :
    Object.entries(v).map(([sub, n]) => [`${k} ${sub}`, n])));
  const cards = [
    el('div', { class: 'card' }, el('h3', {}, 'read'), `${num(h.packets)} packets, ${num(h.bytes)} bytes`),
    counts('drops', h.drops), counts('desyncs', h.desyncs), counts('decode errors', h.decode_errors),
    counts('dropped by bounds', Object.fromEntries(boundPairs)),
    el('div', { class: 'card' + (h.kernel_dropped ? ' warn' : '') }, el('h3', {}, `kernel drops: ${num(h.kernel_dropped)}`)),
  ];
  if (h.http) {  // this process's HTTP side: what its bounds refused (docs/hardening.md)
    const refused = { ...h.http.connections_closed_by_bound,
      ...Object.fromEntries(Object.entries(h.http.requests_shed).map(([c, n]) => [`503 ${c}`, n])),
      'responses cut': h.http.responses_cut };
    const card = counts(`HTTP refused or closed (${num(h.http.connections_open)} of ${num(h.http.max_connections)} connections open)`, refused);
    card.id = 'http-card';
    cards.push(card);
  }
  const sources = el('table', { id: 'sources-table' }, el('thead', {}, el('tr', {}, aggregator ? el('th', {}, 'peer') : null,
    el('th', {}, 'source'), el('th', { class: 'num' }, 'packets'), el('th', { class: 'num' }, 'bytes'),
    el('th', { class: 'num' }, 'gaps'), el('th', { class: 'num' }, 'flows open'), el('th', { class: 'num' }, 'flows evicted'),
    el('th', { class: 'num' }, 'TLS flows'), el('th', { class: 'num' }, 'kernel dropped'))),
  el('tbody', {}, ...h.capture.map((s) => el('tr', {}, aggregator ? td(s.peer) : null, td(s.source),
    td(num(s.packets), 'num'), td(num(s.bytes), 'num'), td(num(s.gaps), 'num'), td(num(s.flows_open), 'num'),
    td(num(s.flows_evicted), 'num'), td(num(s.tls_flows), 'num'), td(s.kernel_dropped === null ? null : num(s.kernel_dropped), 'num')))));
  $('health').replaceChildren(el('div', { class: 'cards' }, ...cards), sources);
  const total = (map) => Object.values(map).reduce((n, v) => n + v, 0);
  const lost = total(h.drops) + h.kernel_dropped;
  const broken = total(h.desyncs) + total(h.decode_errors);
  const line = $('health-line');
  line.textContent = `capture: ${num(h.packets)} packets read, ${num(lost)} dropped, ${num(total(h.desyncs))} desyncs, ` +
    `${num(total(h.decode_errors))} decode errors` + (h.capture.length ? '' : ' (no capture source reported yet)');
  line.className = lost || broken ? 'warn-text' : '';
}

function renderPeers(body) {
  const rows = body.peers.map((p) => el('tr', { class: p.up ? null : 'trouble' }, td(p.peer), td(p.up ? 'up' : 'DOWN'),
    tdWhen(p.last_answer), td(p.latency_seconds === null ? null : `${(p.latency_seconds * 1000).toFixed(0)} ms`, 'num'),
    td(p.error ? `${p.kind}: ${p.error}` : null)));
  $('peers-table').tBodies[0].replaceChildren(...rows);
}

function renderMissing() {
  const banner = $('partial');
  if (!cycle.missing.size) { banner.hidden = true; return; }
  banner.replaceChildren('Partial answers: these peers did not answer — ',
    ...[...cycle.missing.values()].flatMap((m, i) => [i ? '; ' : '', el('strong', {}, m.peer), ` (${m.kind}: ${m.error})`]));
  banner.hidden = false;
}

function clearData() {
  // Refused: nothing read with an earlier token stays on the screen.
  for (const id of ['census-table', 'churn-table', 'topics-table', 'connections-table', 'upgrade-table', 'peers-table']) {
    $(id).tBodies[0].replaceChildren();
  }
  for (const id of ['health', 'health-line', 'brokers', 'detail', 'verdict', 'census-count', 'churn-count', 'churn-empty',
    'connections-count', 'topics-count', 'topic-title', 'topic-detail']) {
    $(id).replaceChildren();
  }
  $('partial').hidden = true;
}

// --- the refresh cycle -------------------------------------------------------------------------

async function refresh() {
  if (running) { again = true; return; }
  running = true;
  document.body.dataset.started = String(Number(document.body.dataset.started || 0) + 1);  // tests: none pending
  clearTimeout(timer);
  cycle.missing = new Map();
  cycle.statuses = [];
  const connQuery = view.conn.toString();
  const target = view.target ? '?target=' + encodeURIComponent(view.target) : '';
  const jobs = [
    ['census-section', () => api(API + '/clients').then(renderCensus)],
    ['churn-section', () => api(API + '/churn').then(renderChurn)],
    ['topics-section', () => api(API + '/topics').then(renderTopics)],
    ['connections-section', () => api(API + '/connections' + (connQuery ? '?' + connQuery : '')).then(renderConnections)],
    ['upgrade-section', () => api(API + '/upgrade-readiness' + target).then(renderUpgrade)],
    ['brokers-section', () => api(API + '/brokers').then(renderBrokers)],
    ['health-section', () => api(API + '/health').then(renderHealth)],
  ];
  if (!targetsKnown) {
    jobs.push([null, () => knownTargets().then((t) => {
      targets = t.list;
      targetsKnown = true;
      fillTargets(view.target || t.fallback);
    })]);
  }
  if (view.detail) {
    jobs.push(['detail-section', () => api(API + '/connections/' + encodeURIComponent(view.detail))
      .then(async (c) => renderDetail(c, await clientMembers(c)))]);
  }
  if (view.topic) jobs.push(['topic-section', () => api(API + '/topics/' + encodeURIComponent(view.topic)).then(renderTopic)]);
  $('topic-section').hidden = !view.topic;
  if (view.topic) $('topic-title').textContent = view.topic;
  else $('topic-detail').replaceChildren();
  if (aggregator) jobs.push(['peers-section', () => api(API + '/peers').then(renderPeers)]);
  $('detail-section').hidden = !view.detail;
  if (!view.detail) $('detail').replaceChildren();
  const results = await Promise.allSettled(jobs.map(([, job]) => job()));
  if (aggregator && !jobs.some(([id]) => id === 'peers-section')) {  // learnt from this cycle's answers
    jobs.push(['peers-section', () => api(API + '/peers').then(renderPeers)]);
    results.push((await Promise.allSettled([jobs[jobs.length - 1][1]()]))[0]);
  }
  let unauthorized = false;
  let unreachable = false;
  results.forEach((r, i) => {
    const id = jobs[i][0];
    if (r.status === 'rejected') {
      const err = r.reason;
      if (err.status === 401) unauthorized = true;
      if (err.status === 0) unreachable = true;
      if (id && !(err instanceof ApiError)) console.error(err);
      if (id) showError(id, err instanceof ApiError ? err.message : 'could not draw this answer: ' + err);
    } else if (id) {
      showError(id, '');
    }
  });
  $('peers-section').hidden = !aggregator;
  renderMissing();
  const token = sessionStorage.getItem(TOKEN_KEY);
  $('token-form').hidden = !unauthorized;
  if (unauthorized) clearData();
  $('forget-token').hidden = !token;
  const status = $('status');
  const at = new Date().toLocaleTimeString('en-GB');
  if (unauthorized) {
    status.textContent = token ? `${at}: 401 Unauthorized — the token was refused; enter the API token again.`
      : `${at}: 401 Unauthorized — this census needs its API token.`;
    status.className = 'bad';
    if (token) $('token-input').focus();
  } else if (unreachable) {
    status.textContent = `${at}: the census is unreachable; what is shown is from the last answer.`;
    status.className = 'bad';
  } else {
    const failed = results.some((r) => r.status === 'rejected');
    status.textContent = `last updated ${at}` + (aggregator ? ' (aggregator)' : '') +
      (failed ? ' — some sections failed (see below)' : '') +
      (cycle.missing.size ? ` — partial: ${cycle.missing.size} peer(s) did not answer` : '') +
      (view.refresh ? `; refreshing every ${view.refresh} s` : '; refresh paused');
    status.className = failed || cycle.missing.size ? 'bad' : 'ok';
  }
  document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);  // tests wait on it
  running = false;
  if (again) { again = false; refresh(); return; }
  if (view.refresh > 0 && !unauthorized) timer = setTimeout(refresh, view.refresh * 1000);
}

// --- wiring ------------------------------------------------------------------------------------

function init() {
  $('where').textContent = location.host;
  drawnUrl = location.href;
  readUrl();
  showControls();
  $('filters').addEventListener('submit', (e) => {
    e.preventDefault();
    const form = e.target;
    view.conn = new URLSearchParams();
    for (const name of CONN_PARAMS) {
      const value = form.elements[name].value.trim();
      if (value !== '') view.conn.set(name, value);
    }
    go(true);
  });
  $('clear').addEventListener('click', () => { view.conn = new URLSearchParams(); go(true); });
  $('refresh').addEventListener('change', (e) => {
    view.refresh = Number(e.target.value);
    if (view.refresh > 0) lastRefresh = view.refresh;
    go(false);
  });
  $('pause').addEventListener('click', () => {
    view.refresh = view.refresh > 0 ? 0 : lastRefresh;
    go(false);
  });
  $('refresh-now').addEventListener('click', () => refresh());
  $('target').addEventListener('change', (e) => { view.target = e.target.value; go(true); });
  $('detail-close').addEventListener('click', () => { view.detail = null; go(true); });
  $('topic-close').addEventListener('click', () => { view.topic = null; go(true); });
  $('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const input = $('token-input');
    const token = input.value.trim();
    input.value = '';
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    refresh();
  });
  $('forget-token').addEventListener('click', () => { sessionStorage.removeItem(TOKEN_KEY); refresh(); });
  // Back, Forward and a #conn= link; a link fires both events: the view is read and refreshed once.
  const followUrl = () => {
    if (location.href === drawnUrl) return;
    drawnUrl = location.href;
    readUrl();
    showControls();
    refresh();
  };
  window.addEventListener('popstate', followUrl);
  window.addEventListener('hashchange', () => {
    followUrl();
    if (view.detail) $('detail-section').scrollIntoView();
  });
  // Printing: every broker's table unfolded.
  window.addEventListener('beforeprint', () => { for (const d of document.querySelectorAll('details')) d.open = true; });
  refresh();
}

document.addEventListener('DOMContentLoaded', init);
