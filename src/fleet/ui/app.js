// plexus dashboard.  Every string that came from the fleet (job and node
// names, logs, errors, reasons) reaches the page as a text node through
// h() below: nothing is ever parsed as HTML.  The page calls the JSON API
// with its session cookie; a call that changes anything carries the
// X-Plexus-CSRF header.  Updates arrive by server-sent events (/ui/events).
'use strict';

const S = {
  snap: null,          // the latest snapshot
  page: '',            // fleet, jobs, job, deployments, deployment, incidents, incident
  arg: '',             // the job or incident id of a detail page
  attempt: null,       // the attempt a job page's log is filtered to
  es: null,            // the EventSource
  esJob: null,         // the job the stream follows the log of
  log: [],             // log chunks of the job page
  logDone: false,
  detail: null,        // GET /v1/jobs/<id> of the job page
  explain: null,
  artifacts: null,
  detailKey: '',       // state+attempt+updated the detail was fetched for
  detailError: null,
  reports: null,       // a deployment page's observations and incidents
  reportsKey: '',      // the deployment and its reported sequence numbers fetched
  confirm: null,       // resolves the question the dialog asks
};

// ---- DOM helpers (text only) ----

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

function svg(tag, attrs, ...kids) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

const badge = (state) => h('span', { class: 'badge s-' + String(state).split(' ')[0] }, state);

function bytes(n) {
  if (n === null || n === undefined) return '—';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + ' ' + u[i];
}

const secs = (s) => (s === null || s === undefined) ? '—' : Number(s).toFixed(s < 10 ? 2 : 1) + ' s';
function ms(s) {
  if (s === null || s === undefined) return '—';
  const v = Number(s);
  return v < 1e-3 ? (v * 1e6).toFixed(1) + ' µs' : (v * 1000).toFixed(2) + ' ms';
}
const table = (head, rows, cls) => h('div', { class: 'table-wrap' },
  h('table', { class: cls || '' }, h('thead', {}, h('tr', {}, head.map((c) => h('th', {}, c)))),
    h('tbody', {}, rows)));

function toast(text) {
  const t = document.getElementById('toast');
  const p = h('p', {}, text);
  t.append(p);
  setTimeout(() => p.remove(), 6000);
}

// ---- the API ----

async function api(method, path) {
  const init = { method, credentials: 'same-origin', headers: {} };
  if (method !== 'GET') init.headers['X-Plexus-CSRF'] = '1';
  const r = await fetch(path, init);
  if (r.status === 401) { location.assign('/ui/login'); throw new Error('session ended'); }
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || (method + ' ' + path + ': HTTP ' + r.status));
  return body;
}

// One question at a time, answered the moment a button of the dialog is
// pressed (its form's submit) or it is dismissed (Escape): not by its
// close event, which runs as a task of its own and can come after the
// next question was asked.  A question still pending when another is
// asked is answered no.
function confirmSettle(ok) {
  const answer = S.confirm;
  S.confirm = null;
  if (answer) answer(ok);
}

function confirmAction(text) {
  const d = document.getElementById('confirm');
  if (!d.dataset.wired) {
    d.dataset.wired = '1';
    d.querySelector('form').addEventListener('submit',
      (e) => confirmSettle(!!e.submitter && e.submitter.value === 'ok'));
    d.addEventListener('cancel', () => confirmSettle(false));
    d.addEventListener('close', () => { if (!d.open) confirmSettle(false); });
  }
  confirmSettle(false);
  document.getElementById('confirm-text').textContent = text;
  return new Promise((resolve) => {
    S.confirm = resolve;
    d.showModal();
  });
}

async function act(question, method, path, done) {
  if (!await confirmAction(question)) return;
  try {
    await api(method, path);
    toast(done);
  } catch (e) {
    toast(e.message);
  }
}

function actionButton(label, question, method, path, done, cls) {
  return h('button', { class: cls || 'danger', 'data-action': label.toLowerCase(),
                       onclick: () => act(question, method, path, done) }, label);
}

// ---- the live stream ----

function connect() {
  const job = (S.page === 'job') ? S.arg : null;
  if (S.es && S.esJob === job) return;
  if (S.es) S.es.close();
  S.esJob = job;
  S.log = [];
  S.logDone = false;
  const es = new EventSource('/ui/events' + (job ? '?job=' + encodeURIComponent(job) : ''));
  S.es = es;
  const live = document.getElementById('live');
  es.addEventListener('open', () => { live.textContent = 'live'; live.className = 'live on'; });
  es.addEventListener('error', () => {
    live.textContent = 'reconnecting'; live.className = 'live off';
    // A stream refused for want of a session: the login page.
    fetch('/ui/api/incidents', { credentials: 'same-origin' }).then((r) => {
      if (r.status === 401) location.assign('/ui/login');
    }).catch(() => {});
  });
  es.addEventListener('snapshot', (ev) => {
    S.snap = JSON.parse(ev.data);
    render();
  });
  es.addEventListener('log', (ev) => {
    S.log.push(JSON.parse(ev.data));
    renderLog();
  });
  es.addEventListener('logend', () => { S.logDone = true; renderLog(); });
}

// ---- routing ----

function route() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, query] = hash.split('?');
  const parts = path.split('/').map(decodeURIComponent);
  const top = parts[0] || 'fleet';
  const pages = { fleet: 'fleet', jobs: 'jobs', deployments: 'deployments', incidents: 'incidents' };
  S.page = pages[top] || 'fleet';
  S.arg = parts[1] || '';
  if (S.arg && S.page === 'jobs') S.page = 'job';
  if (S.arg && S.page === 'deployments') S.page = 'deployment';
  if (S.arg && S.page === 'incidents') S.page = 'incident';
  const m = /(?:^|&)attempt=(\d+)/.exec(query || '');
  S.attempt = m ? Number(m[1]) : null;
  S.detail = S.explain = S.artifacts = S.reports = null;
  S.detailKey = S.reportsKey = '';
  S.detailError = null;
  for (const a of document.querySelectorAll('#nav a'))
    a.classList.toggle('active', a.dataset.page === top);
  connect();
  render();
}

// ---- pages ----

function render() {
  const main = document.getElementById('main');
  if (!S.snap) return;
  document.getElementById('user').textContent =
    S.snap.user.name + (S.snap.user.admin ? ' (admin)' : '');
  const pages = { fleet: pageFleet, jobs: pageJobs, job: pageJob, deployments: pageDeployments,
                  deployment: pageDeployment, incidents: pageIncidents, incident: pageIncident };
  const body = pages[S.page]();
  // Keep the log element (and its scroll) across re-renders of a job page.
  const keep = document.getElementById('log');
  const kids = body.flat(Infinity).filter((x) => x !== null && x !== undefined && x !== false);
  // Unchanged content is left alone, so that a click or a selection in
  // progress survives an event that changed nothing on this page.
  const next = h('main', {}, kids);
  if (next.innerHTML === main.innerHTML && !document.getElementById('log-slot')) return;
  main.replaceChildren(...next.childNodes);
  const slot = document.getElementById('log-slot');
  if (slot) {
    slot.replaceWith(keep || h('pre', { class: 'log', id: 'log' }));
    renderLog();
  }
  if (S.snap.store_error) main.prepend(h('p', { class: 'notice' }, 'Store: ' + S.snap.store_error));
}

function nodeCard(n) {
  const admin = S.snap.user.admin;
  const cpuShare = n.cpus ? n.cpus_allocated / n.cpus : 0;
  const memShare = n.memory ? n.memory_allocated / n.memory : 0;
  const live = n.live || {};
  const devices = (n.devices || []).map((d) => h('tr', {},
    h('td', { class: 'mono' }, d.id), h('td', {}, d.class), h('td', { class: 'hide-narrow' }, d.vendor || '—'),
    h('td', {}, d.model || '—'), h('td', {}, bytes(d.memory)), h('td', {}, bytes(d.memory_free)),
    h('td', {}, d.allocated_to || '—')));
  const actions = [];
  if (admin && n.state === 'online')
    actions.push(actionButton('Drain', 'Drain node "' + n.name + '"? Its running work stays; it gets nothing new.',
      'POST', '/v1/nodes/' + encodeURIComponent(n.name) + '/drain', 'Draining ' + n.name));
  if (admin && n.state === 'draining')
    actions.push(actionButton('Undrain', 'Let node "' + n.name + '" take new work again?',
      'POST', '/v1/nodes/' + encodeURIComponent(n.name) + '/undrain', n.name + ' takes work again', 'plain'));
  return h('section', { class: 'card node', 'data-node': n.name },
    h('h3', {}, h('span', {}, n.name), badge(n.state)),
    n.emulated ? h('p', { class: 'notice' }, 'Emulated devices: figures describe emulated hardware.') : null,
    h('dl', { class: 'kv' },
      h('dt', {}, 'address'), h('dd', {}, n.address || '—'),
      h('dt', {}, 'CPUs'), h('dd', {}, (n.cpus_allocated || 0) + ' of ' + (n.cpus || 0) + ' allocated',
        h('meter', { min: 0, max: 1, value: cpuShare })),
      h('dt', {}, 'memory'), h('dd', {}, bytes(n.memory_allocated) + ' of ' + bytes(n.memory) + ' allocated',
        h('meter', { min: 0, max: 1, value: memShare })),
      h('dt', {}, 'load'), h('dd', {}, live.load === null || live.load === undefined ? '—' : Number(live.load).toFixed(2)),
      h('dt', {}, 'free memory'), h('dd', {}, bytes(live.memory_free)),
      h('dt', {}, 'heartbeat'), h('dd', {}, n.seconds_since_heartbeat === null || n.seconds_since_heartbeat === undefined
        ? '—' : Number(n.seconds_since_heartbeat).toFixed(1) + ' s ago'),
      h('dt', {}, 'resident models'), h('dd', { class: 'mono' },
        (n.resident || []).length ? n.resident.map((d) => String(d).slice(0, 12)).join(', ') : 'none'),
      h('dt', {}, 'running'), h('dd', {}, (n.running || []).length
        ? n.running.map((r, i) => [i ? ', ' : '', h('a', { href: '#/jobs/' + encodeURIComponent(r.job) }, r.job),
          ' #' + r.attempt + '.' + r.rank])
        : 'nothing')),
    devices.length ? table(['device', 'class', 'vendor', 'model', 'memory', 'free', 'allocated to'], devices) : null,
    actions.length ? h('div', { class: 'row' }, actions) : null);
}

function pageFleet() {
  const nodes = S.snap.nodes;
  const by = (s) => nodes.filter((n) => n.state === s);
  const devs = nodes.reduce((a, n) => a + (n.devices || []).length, 0);
  const out = [h('h1', {}, 'Fleet'),
    h('p', { class: 'muted', id: 'fleet-summary' }, nodes.length + ' nodes: ' + by('online').length + ' online, ' +
      by('draining').length + ' draining, ' + by('offline').length + ' lost or offline; ' + devs + ' devices')];
  if (!nodes.length)
    out.push(h('p', { class: 'notice' }, 'No node has joined yet: start an agent with plexus agent --server URL --join-token-file F.'));
  const lost = by('offline'), draining = by('draining');
  if (lost.length || draining.length)
    out.push(h('h2', {}, 'Lost and draining'), h('div', { class: 'cards' }, [...lost, ...draining].map(nodeCard)));
  const online = by('online');
  if (online.length) out.push(h('h2', {}, 'Online'), h('div', { class: 'cards' }, online.map(nodeCard)));
  return out;
}

const active = (s) => s === 'queued' || s === 'assigned' || s === 'running';

function cancelButton(j) {
  return actionButton('Cancel', 'Cancel job ' + j.id + ' ("' + j.name + '")?', 'POST',
    '/v1/jobs/' + encodeURIComponent(j.id) + '/cancel', 'Cancelled ' + j.id);
}

function pageJobs() {
  const rows = S.snap.jobs.map((j) => h('tr', { 'data-job': j.id },
    h('td', { class: 'mono' }, h('a', { href: '#/jobs/' + encodeURIComponent(j.id) }, j.id)),
    h('td', { class: 'job-name' }, j.name), h('td', { class: 'hide-narrow' }, j.owner || '—'),
    h('td', {}, badge(j.state)), h('td', { class: 'hide-narrow' }, j.attempt),
    h('td', {}, (j.nodes || []).join(', ') || '—'), h('td', { class: 'hide-narrow' }, j.updated || '—'),
    h('td', {}, j.exit_code === null || j.exit_code === undefined ? '' : j.exit_code),
    h('td', {}, active(j.state) ? cancelButton(j) : '')));
  return [h('h1', {}, 'Jobs'),
    rows.length ? table(['id', 'name', 'owner', 'state', 'attempt', 'nodes', 'updated', 'exit', ''], rows)
      : h('p', { class: 'muted' }, 'No jobs yet: plexus submit -- CMD.')];
}

function fetchDetail(j) {
  const key = j ? j.state + '/' + j.attempt + '/' + j.updated : 'none';
  if (key === S.detailKey) return;
  S.detailKey = key;
  const id = encodeURIComponent(S.arg);
  Promise.all([api('GET', '/v1/jobs/' + id), api('GET', '/v1/jobs/' + id + '/explain'),
               api('GET', '/v1/jobs/' + id + '/artifacts')])
    .then(([d, e, a]) => { S.detail = d; S.explain = e; S.artifacts = a.artifacts; S.detailError = null; render(); })
    .catch((e) => { S.detailError = e.message; render(); });
}

function whyNotHere(e) {
  const chosen = new Set(((e.decision || {}).nodes) || []);
  const rows = [];
  for (const s of e.scored || [])
    rows.push(h('tr', {}, h('td', {}, s.node), h('td', {}, badge(chosen.has(s.node) ? 'chosen' : 'feasible')),
      h('td', {}, chosen.has(s.node) ? 'placed here' : 'scored lower'),
      h('td', { class: 'mono' }, 'score ' + Number(s.score).toFixed(1) + ': headroom ' + s.headroom +
        ', locality ' + s.locality + ', load ' + s.load + ', topology ' + s.topology)));
  for (const r of e.rejected || [])
    rows.push(h('tr', {}, h('td', {}, r.node), h('td', {}, badge('rejected')), h('td', {}, r.reason), h('td', {}, r.detail)));
  return [h('p', {}, (e.decision || {}).summary || ''),
    h('p', { class: 'muted' }, (e.nodes_considered || 0) + ' nodes considered, ' + (e.nodes_feasible || 0) +
      ' feasible, ' + (e.nodes_scored || 0) + ' scored' + (e.rejected_more ? '; ' + e.rejected_more + ' more rejected' : '')),
    rows.length ? table(['node', 'verdict', 'reason', 'detail'], rows, 'why') : null];
}

function pageJob() {
  const j = S.snap.jobs.find((x) => x.id === S.arg);
  fetchDetail(j);
  const d = S.detail;
  const out = [h('p', {}, h('a', { href: '#/jobs' }, '← Jobs'))];
  if (S.detailError) return [...out, h('p', { class: 'error' }, S.detailError)];
  if (!d) return [...out, h('p', { class: 'muted' }, 'Loading ' + S.arg + '…')];
  out.push(h('h1', {}, h('span', { class: 'job-title' }, d.name), ' ', badge(d.state)),
    h('dl', { class: 'kv' },
      h('dt', {}, 'id'), h('dd', { class: 'mono' }, d.id),
      h('dt', {}, 'owner'), h('dd', {}, d.owner || '—'),
      h('dt', {}, 'attempt'), h('dd', {}, d.attempt + (d.restarts ? ' (' + d.restarts + ' restarts)' : '')),
      h('dt', {}, 'created'), h('dd', {}, d.created || '—'),
      h('dt', {}, 'updated'), h('dd', {}, d.updated || '—'),
      h('dt', {}, 'exit code'), h('dd', {}, d.exit_code === null || d.exit_code === undefined ? '—' : d.exit_code),
      h('dt', {}, 'command'), h('dd', { class: 'mono' }, JSON.stringify((d.spec || {}).command || (d.spec || {}).python || null))),
    d.error ? h('p', { class: 'error' }, 'Error: ', d.error) : null,
    active(d.state) ? h('div', { class: 'row' }, cancelButton(d)) : null,
    h('h2', {}, 'Placement'),
    (d.members || []).length ? table(['rank', 'node', 'devices', 'state', 'exit'], d.members.map((m) => h('tr', {},
      h('td', {}, m.rank), h('td', {}, m.node || '—'), h('td', { class: 'mono' }, (m.devices || []).join(', ') || '—'),
      h('td', {}, m.state || '—'), h('td', {}, m.exit_code === null || m.exit_code === undefined ? '' : m.exit_code))))
      : h('p', { class: 'muted' }, 'Not placed.'),
    h('h2', {}, 'Why here and not there'),
    S.explain ? whyNotHere(S.explain) : h('p', { class: 'muted' }, 'No decision yet.'),
    h('h2', {}, 'Log' + (S.attempt ? ' of attempt ' + S.attempt : '')),
    h('div', { id: 'log-slot' }),
    h('h2', {}, 'Artifacts'),
    (S.artifacts || []).length ? table(['name', 'size', 'sha256', 'attempt'], S.artifacts.map((a) => h('tr', {},
      h('td', {}, h('a', { href: '/v1/jobs/' + encodeURIComponent(d.id) + '/artifacts/' + encodeURIComponent(a.name),
        download: a.name.split('/').pop() }, a.name)),
      h('td', {}, bytes(a.size)), h('td', { class: 'mono' }, String(a.sha256).slice(0, 16)), h('td', {}, a.attempt))))
      : h('p', { class: 'muted' }, 'None.'),
    d.result !== null && d.result !== undefined ? [h('h2', {}, 'Result'), h('pre', { class: 'log' }, JSON.stringify(d.result, null, 2))] : null);
  return out;
}

function renderLog() {
  const pre = document.getElementById('log');
  if (!pre) return;
  const chunks = S.attempt ? S.log.filter((c) => c.attempt === S.attempt) : S.log;
  const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.replaceChildren(...chunks.map((c) => h('span', { class: c.stream }, c.data)));
  if (!chunks.length) pre.append(S.logDone ? '(no output)' : '(waiting for output…)');
  pre.dataset.done = S.logDone ? '1' : '0';
  if (stick) pre.scrollTop = pre.scrollHeight;
}

// A deployment's name is never a job id (j- and digits): the server
// refuses such names, so #/deployments/ARG tells the two apart.
const isJobId = (s) => /^j-\d+$/.test(s);

function pageDeployments() {
  const deps = S.snap.deployments || [];
  const planned = S.snap.jobs.filter((j) => j.has_plan);
  const out = [h('h1', {}, 'Deployments')];
  out.push(deps.length ? table(['name', 'model', 'state', 'owner', 'replicas', 'stages', 'nodes', ''],
    deps.map((d) => h('tr', { 'data-deployment': d.name },
      h('td', {}, h('a', { href: '#/deployments/' + encodeURIComponent(d.name) }, d.name)),
      h('td', { class: 'mono', title: d.model }, String(d.model).slice(0, 12)), h('td', {}, badge(d.state)),
      h('td', { class: 'hide-narrow' }, d.owner || '—'), h('td', { class: 'hide-narrow' }, d.replicas),
      h('td', { class: 'hide-narrow' }, d.stages), h('td', {}, (d.nodes || []).join(', ') || '—'),
      h('td', {}, undeployButton(d)))))
    : h('p', { class: 'muted' }, 'No deployments: plexus deploy --model FILE NAME.'));
  if (planned.length)
    out.push(h('h2', {}, 'Jobs planned across the fleet'),
      table(['job', 'name', 'state', 'nodes', ''], planned.map((j) => h('tr', { 'data-job': j.id },
        h('td', { class: 'mono' }, h('a', { href: '#/deployments/' + encodeURIComponent(j.id) }, j.id)),
        h('td', {}, j.name), h('td', {}, badge(j.state)), h('td', {}, (j.nodes || []).join(', ') || '—'),
        h('td', {}, active(j.state) ? cancelButton(j) : '')))));
  return out;
}

function undeployButton(d) {
  return actionButton('Undeploy', 'Undeploy "' + d.name + '"? Its plan is dropped and its nodes let the model go.',
    'DELETE', '/v1/deployments/' + encodeURIComponent(d.name), 'Undeployed ' + d.name);
}

// The plan drawn as SVG: a row per replica, a box per stage naming its
// node (when the plan says which), devices and layers, and the links
// between stages with the predicted transfer per token.  All text goes
// in as text nodes.
function drawPlan(plan, assignment) {
  const first = plan.stages || [];
  const replicas = (plan.replicas || []).length ? plan.replicas : [{ index: 0, stages: first }];
  const nodeOf = new Map((assignment || []).map((a) => [a.replica + '/' + a.stage, a.node]));
  const w = 210, gap = 84, hgt = 96, pad = 10, rowGap = 18;
  const cols = Math.max(1, ...replicas.map((r) => (r.stages || []).length));
  const width = cols * (w + gap) - gap + 2 * pad;
  const height = replicas.length * (hgt + rowGap) - rowGap + 2 * pad;
  const kids = [];
  replicas.forEach((r, ri) => {
    const y = pad + ri * (hgt + rowGap);
    const stages = r.stages || [];
    stages.forEach((s, i) => {
      const x = pad + i * (w + gap);
      const node = nodeOf.get(ri + '/' + i);
      const full = ri === 0 ? (first[i] || s) : s;
      const layers = s.layers ? 'layers ' + s.layers.first + '–' + s.layers.last : '';
      const dec = ((full.predicted || {}).decode_s_per_token || {}).p50;
      kids.push(svg('g', { class: 'stage', 'data-node': node || '' },
        svg('rect', { x, y, width: w, height: hgt, rx: 6 }),
        svg('text', { x: x + 8, y: y + 18, class: 'strong' },
          (replicas.length > 1 ? 'r' + ri + ' ' : '') + 'stage ' + s.index + (full.emulated ? ' (emulated)' : '')),
        svg('text', { x: x + 8, y: y + 36 }, node ? 'node ' + String(node).slice(0, 22) : ''),
        svg('text', { x: x + 8, y: y + 54 }, (s.devices || []).join(', ').slice(0, 28)),
        svg('text', { x: x + 8, y: y + 72 }, layers),
        svg('text', { x: x + 8, y: y + 90 }, [full.backend || '', ((full.precision || {}).weights || ''),
          dec === undefined ? '' : 'decode ' + ms(dec)].filter(Boolean).join(' · ').slice(0, 32))));
      if (i + 1 < stages.length) {
        const next = nodeOf.get(ri + '/' + (i + 1));
        const cross = node && next && node !== next;
        const t = ((full.predicted || {}).transfer_s_per_token);
        kids.push(svg('line', { class: 'link' + (cross ? ' cross' : ''), x1: x + w, y1: y + hgt / 2,
                                x2: x + w + gap, y2: y + hgt / 2 }),
          svg('text', { x: x + w + 4, y: y + hgt / 2 - 6 }, t === undefined ? '' : ms(t)),
          svg('text', { x: x + w + 4, y: y + hgt / 2 + 16, class: 'muted' }, cross ? 'network' : 'local'));
      }
    });
  });
  return h('div', { class: 'plan' }, svg('svg', { viewBox: '0 0 ' + width + ' ' + height, width, role: 'img',
    'aria-label': 'the plan: ' + replicas.length + ' replicas of ' + first.length + ' stages' }, kids));
}

// The sections every plan shows: stages drawn, predicted figures per
// stage and for the service, the replicas and the planner's reasons.
function planSections(plan, assignment, reports) {
  const pred = plan.predictions || {};
  const observed = latestStages(reports);
  return [
    plan.emulated ? h('p', { class: 'notice' }, plan.notice || 'The plan runs on emulated devices.') : null,
    h('h2', {}, 'Stages on devices'), drawPlan(plan, assignment),
    (assignment || []).some((a, i, all) => all.some((b) => b.replica === a.replica && b.node !== a.node))
      ? h('p', { class: 'muted' }, 'Links between nodes are assumed (10 GbE); the network is not measured.') : null,
    h('h2', {}, 'Predicted and observed per stage'),
    table(['stage', 'devices', 'decode p50', 'decode p99', 'prefill p50', 'transfer', 'observed'], (plan.stages || []).map((s) => {
      const pr = s.predicted || {};
      return h('tr', {}, h('td', {}, s.index), h('td', { class: 'mono' }, (s.devices || []).join(', ')),
        h('td', {}, ms((pr.decode_s_per_token || {}).p50)), h('td', {}, ms((pr.decode_s_per_token || {}).p99)),
        h('td', {}, ms((pr.prefill_s || {}).p50)), h('td', {}, ms(pr.transfer_s_per_token)),
        observedCell(observed, s.index, (pr.decode_s_per_token || {}).p50));
    })),
    h('h2', {}, 'Service'),
    h('dl', { class: 'kv', id: 'predicted' },
      h('dt', {}, 'tokens/s'), h('dd', {}, pred.throughput_tokens_per_s ? Number(pred.throughput_tokens_per_s.p50).toFixed(1) + ' predicted' : '—'),
      h('dt', {}, 'TTFT'), h('dd', {}, pred.ttft_s ? ms(pred.ttft_s.p50) + ' predicted (p99 ' + ms(pred.ttft_s.p99) + ')' : '—'),
      h('dt', {}, 'TPOT'), h('dd', {}, pred.tpot_s ? ms(pred.tpot_s.p50) + ' predicted (p99 ' + ms(pred.tpot_s.p99) + ')' : '—'),
      h('dt', {}, 'over time'), reports ? h('dd', {}, observedSummary(reports))
        : h('dd', { class: 'muted' }, 'no observations: serving figures are not reported to the server')),
    reports ? serviceCharts(reports, pred) : null,
    h('h2', {}, 'Replicas'),
    table(['replica', 'stages', 'nodes', 'TPOT', 'tokens/s', 'observed'], (plan.replicas || []).map((r, ri) => h('tr', { 'data-replica': ri },
      h('td', {}, r.index), h('td', { class: 'mono' }, (r.stages || []).map((s) => (s.devices || []).join('+')).join(' → ')),
      h('td', {}, [...new Set((assignment || []).filter((a) => a.replica === ri).map((a) => a.node))].join(', ') || '—'),
      h('td', {}, ms(typeof r.tpot_s === 'object' ? (r.tpot_s || {}).p50 : r.tpot_s)),
      h('td', {}, typeof r.throughput === 'object' ? Number((r.throughput || {}).p50).toFixed(1) : Number(r.throughput).toFixed(1)),
      h('td', {}, replicaObserved(reports, ri))))),
    (plan.explanation || []).length ? [h('h2', {}, 'Why this plan'), h('ul', {}, plan.explanation.map((e) => h('li', {}, e)))] : null];
}

function pageDeployment() {
  return isJobId(S.arg) ? pageJobPlan() : pageDeploymentNamed();
}

// A job submitted with plan: "auto" and the plan made for it.
function pageJobPlan() {
  const j = S.snap.jobs.find((x) => x.id === S.arg);
  fetchDetail(j);
  const d = S.detail;
  const out = [h('p', {}, h('a', { href: '#/deployments' }, '← Deployments'))];
  if (S.detailError) return [...out, h('p', { class: 'error' }, S.detailError)];
  if (!d) return [...out, h('p', { class: 'muted' }, 'Loading…')];
  out.push(h('h1', {}, d.name, ' ', badge(d.state)));
  if (active(d.state)) out.push(h('div', { class: 'row' }, cancelButton(d)));
  const p = d.plan || {};
  if (p.status !== 'planned')
    out.push(h('p', { class: 'notice' }, 'No plan: ', p.status || 'none', p.detail ? ': ' + p.detail : ''));
  else
    out.push(planSections(p.plan, null));
  return out;
}

// GET /v1/deployments/NAME again when its summary in the snapshot
// changed.  The snapshot lists what the user may see, so a name missing
// from it is not asked for.
function fetchDeployment(sum) {
  const key = sum.state + '/' + sum.updated + '/' + (sum.model_resident_on || []).join(',');
  if (key === S.detailKey) return;
  S.detailKey = key;
  api('GET', '/v1/deployments/' + encodeURIComponent(S.arg))
    .then((d) => { S.detail = d; S.detailError = null; render(); })
    .catch((e) => { S.detail = null; S.detailError = e.message; render(); });
}

function pageDeploymentNamed() {
  const sum = (S.snap.deployments || []).find((x) => x.name === S.arg);
  const out = [h('p', {}, h('a', { href: '#/deployments' }, '← Deployments'))];
  if (!sum) {
    S.detail = null;
    S.detailKey = '';
    return [...out, h('h1', {}, S.arg), h('p', { class: 'notice', id: 'gone' },
      'No deployment "' + S.arg + '": it was undeployed, or it is another user\'s.')];
  }
  fetchDeployment(sum);
  const d = S.detail;
  if (S.detailError) return [...out, h('h1', {}, S.arg), h('p', { class: 'error' }, S.detailError)];
  if (!d) return [...out, h('p', { class: 'muted' }, 'Loading ' + S.arg + '…')];
  const spec = d.spec || {};
  const model = spec.model || {};
  out.push(h('h1', {}, h('span', { class: 'deployment-title' }, d.name), ' ', badge(d.state)),
    h('div', { class: 'row' }, undeployButton(d)),
    h('dl', { class: 'kv' },
      h('dt', {}, 'owner'), h('dd', {}, d.owner || '—'),
      h('dt', {}, 'model'), h('dd', { class: 'mono' }, (model.name ? model.name + ' ' : '') + d.model),
      h('dt', {}, 'replicas'), h('dd', {}, d.replicas),
      h('dt', {}, 'objective'), h('dd', {}, spec.objective || 'default'),
      h('dt', {}, 'policy'), h('dd', {}, spec.policy || 'plexus'),
      h('dt', {}, 'contract'), h('dd', {}, typeof spec.contract === 'string' ? spec.contract
        : spec.contract ? 'a plexus.contract/1 document' : 'default'),
      h('dt', {}, 'nodes'), h('dd', {}, (d.nodes || []).join(', ') || '—'),
      h('dt', {}, 'model resident on'), h('dd', { id: 'resident' }, (d.model_resident_on || []).join(', ') || 'none yet'),
      h('dt', {}, 'created'), h('dd', {}, new Date(d.created * 1000).toLocaleString()),
      h('dt', {}, 'updated'), h('dd', {}, new Date(d.updated * 1000).toLocaleString())));
  const p = d.plan || {};
  const why = p.residency || {};
  if (why.why) out.push(h('p', { class: 'muted', id: 'placement-why' }, why.why));
  fetchReports(sum);
  if (p.status === 'planned' && p.plan) out.push(planSections(p.plan, p.assignment, S.reports));
  else out.push(h('p', { class: 'notice' }, 'No plan: ', p.status || 'none', p.detail ? ': ' + p.detail : ''));
  out.push(h('h2', {}, 'Incidents'), deploymentIncidents(d),
    reportedIncidents(S.reports));
  if (p.report) out.push(h('details', {}, h('summary', {}, 'The planner\'s report'), h('pre', { class: 'report' }, p.report)));
  return out;
}

// ---- a deployment's reports: observed serving figures and incidents ----

// GET the deployment's observations (those after the last one held) and
// incidents when the snapshot says more were reported.
function fetchReports(sum) {
  const rep = sum.reported || {};
  const key = sum.name + '/' + sum.created + '/' + (rep.observations || 0) + '/' + (rep.incidents || 0);
  if (key === S.reportsKey) return;
  const same = S.reports && S.reports.key0 === sum.name + '/' + sum.created;
  S.reportsKey = key;
  const base = '/v1/deployments/' + encodeURIComponent(sum.name);
  const after = same ? S.reports.last : 0;
  Promise.all([api('GET', base + '/observations?after=' + after), api('GET', base + '/incidents')])
    .then(([o, i]) => {
      const prev = same ? S.reports.observations : [];
      const all = prev.concat(o.observations || []).slice(-(o.kept || 720));
      S.reports = { key0: sum.name + '/' + sum.created, observations: all, predicted: o.predicted || {},
                    last: all.length ? all[all.length - 1].seq : after, incidents: i.incidents || [] };
      render();
    })
    // Said once; the next report (a new key) asks again.
    .catch((e) => toast('Reports of ' + sum.name + ': ' + e.message));
}

const fig = (v, digits) => (v === null || v === undefined) ? '—' : Number(v).toFixed(digits === undefined ? 1 : digits);

// The latest observed step time of each stage (replica 0 or the only one
// reported), by stage index.
function latestStages(reports) {
  const out = new Map();
  for (const r of (reports || {}).observations || [])
    for (const s of (r.observation || {}).stages || [])
      if (!out.has(s.stage) || s.replica === 0) out.set(s.stage, s.step_s);
  return out;
}

function observedCell(observed, stage, predicted) {
  const o = observed.get(stage);
  if (!o) return h('td', { class: 'muted' }, 'not reported');
  const ratio = predicted ? o.p50 / predicted : null;
  return h('td', { class: 'observed' + (ratio && ratio > 1.25 ? ' slow' : '') },
    ms(o.p50) + (o.p99 !== undefined ? ' (p99 ' + ms(o.p99) + ')' : ''),
    ratio ? h('span', { class: 'muted' }, ' ' + ratio.toFixed(2) + '× predicted') : null);
}

function replicaObserved(reports, ri) {
  const list = ((reports || {}).observations || []).filter((r) => (r.observation || {}).replica === ri ||
    ((r.observation || {}).replica === undefined && ri === 0));
  const last = list.length ? list[list.length - 1].observation : null;
  return last && last.tokens_per_s !== undefined ? fig(last.tokens_per_s) + ' tokens/s' : '—';
}

function observedSummary(reports) {
  const obs = reports.observations;
  if (!obs.length) return h('span', { class: 'muted' }, 'no observation reported yet');
  const last = obs[obs.length - 1];
  const o = last.observation || {};
  const by = last.reporter || {};
  return [obs.length + ' observations; the latest ', new Date(last.at * 1000).toLocaleTimeString(),
    ' from ', by.node ? 'node ' + by.node : 'user ' + (by.user || '?'), ': ',
    h('span', { id: 'latest-observed' },
      fig(o.tokens_per_s) + ' tokens/s, TTFT ' + ms((o.ttft_s || {}).p50) + ', TPOT ' + ms((o.tpot_s || {}).p50) +
      ', running ' + fig(o.running, 0) + ', queued ' + fig(o.queued, 0))];
}

// A line chart as inline SVG: series of [t, v] over a shared time axis,
// a dashed line for the prediction.  Text goes in as text nodes.
function lineChart(id, title, unit, series, predicted) {
  const W = 560, H = 180, L = 56, R = 10, T = 22, B = 26;
  const pts = series.flatMap((s) => s.points);
  if (!pts.length) return null;
  const t0 = Math.min(...pts.map((p) => p[0])), t1 = Math.max(...pts.map((p) => p[0]));
  let vmax = Math.max(...pts.map((p) => p[1]), predicted || 0);
  vmax = vmax > 0 ? vmax * 1.1 : 1;
  const x = (t) => L + (t1 > t0 ? (t - t0) / (t1 - t0) : 0.5) * (W - L - R);
  const y = (v) => T + (1 - v / vmax) * (H - T - B);
  const kids = [svg('text', { x: L, y: 14, class: 'title' }, title),
    svg('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }),
    svg('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' })];
  for (const f of [0, 0.5, 1])
    kids.push(svg('text', { x: L - 4, y: y(vmax * f) + 4, class: 'tick', 'text-anchor': 'end' }, unit(vmax * f)));
  kids.push(svg('text', { x: L, y: H - 8, class: 'tick' }, new Date(t0 * 1000).toLocaleTimeString()),
    svg('text', { x: W - R, y: H - 8, class: 'tick', 'text-anchor': 'end' }, new Date(t1 * 1000).toLocaleTimeString()));
  if (predicted)
    kids.push(svg('line', { x1: L, y1: y(predicted), x2: W - R, y2: y(predicted), class: 'predicted' }),
      svg('text', { x: W - R, y: y(predicted) - 4, class: 'tick', 'text-anchor': 'end' }, 'predicted ' + unit(predicted)));
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const d = s.points.map((p, k) => (k ? 'L' : 'M') + x(p[0]).toFixed(1) + ' ' + y(p[1]).toFixed(1)).join(' ');
    kids.push(svg('path', { d, class: 'series s' + i }));
    if (s.points.length === 1)
      kids.push(svg('circle', { cx: x(s.points[0][0]), cy: y(s.points[0][1]), r: 3, class: 'dot s' + i }));
    kids.push(svg('text', { x: L + 8 + i * 90, y: T + 12, class: 'legend s' + i }, s.label));
  });
  return h('figure', { class: 'chart', id },
    svg('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': title + ' over time' }, kids));
}

function serviceCharts(reports, pred) {
  const obs = reports.observations;
  if (!obs.length) return null;
  const pick = (f) => obs.map((r) => [r.at, f(r.observation || {})]).filter((p) => typeof p[1] === 'number');
  const msFmt = (v) => ms(v);
  return h('div', { class: 'charts' },
    lineChart('chart-tps', 'tokens/s', (v) => v.toFixed(v < 10 ? 1 : 0),
      [{ label: 'observed', points: pick((o) => o.tokens_per_s) }],
      (pred.throughput_tokens_per_s || {}).p50),
    lineChart('chart-ttft', 'TTFT', msFmt,
      [{ label: 'p50', points: pick((o) => (o.ttft_s || {}).p50) }, { label: 'p99', points: pick((o) => (o.ttft_s || {}).p99) }],
      (pred.ttft_s || {}).p50),
    lineChart('chart-tpot', 'TPOT', msFmt,
      [{ label: 'p50', points: pick((o) => (o.tpot_s || {}).p50) }, { label: 'p99', points: pick((o) => (o.tpot_s || {}).p99) }],
      (pred.tpot_s || {}).p50),
    lineChart('chart-batch', 'running batch and queue', (v) => v.toFixed(0),
      [{ label: 'running', points: pick((o) => o.running) }, { label: 'queued', points: pick((o) => o.queued) }]));
}

// An incident the deployment's front end reported (plexus.incident/1):
// detection, the candidates accepted and rejected with their reasons, the
// choice, the canary, the outcome, RTO and lost work.
function incidentOutcome(i) {
  if (i.rollback) return 'rolled back';
  if ((i.choice || {}).index >= 0 && i.rto_s !== null) return 'recovered';
  return 'not recovered';
}

function reportedIncidents(reports) {
  const list = ((reports || {}).incidents || []).slice().reverse();
  if (!list.length) return null;
  return [h('h2', {}, 'Incidents reported by the front end'), list.map((r) => {
    const i = r.incident || {};
    const det = i.detection || {}, sig = i.signature || {}, lw = i.lost_work || {}, can = i.canary || {};
    const by = r.reporter || {};
    return h('section', { class: 'card reported-incident', 'data-incident': i.id },
      h('h3', {}, h('span', {}, i.id + ': ' + i.kind + ', ' + ((i.cause || {}).class || '?')), badge(incidentOutcome(i))),
      h('dl', { class: 'kv' },
        h('dt', {}, 'reported'), h('dd', {}, new Date(r.at * 1000).toLocaleString() + ' by ' + (by.node ? 'node ' + by.node : 'user ' + (by.user || '?'))),
        h('dt', {}, 'evidence'), h('dd', {}, sig.evidence || '—'),
        h('dt', {}, 'detection'), h('dd', {}, (det.detector || '?') + ', ' + secs(det.time_to_detect_s) + ' to detect'),
        h('dt', {}, 'choice'), h('dd', {}, (i.choice || {}).label || 'none', (i.choice || {}).why ? ': ' + i.choice.why : ''),
        h('dt', {}, 'canary'), h('dd', {}, badge(can.verdict || 'none'), can.observed_p50_s !== undefined && can.observed_p50_s !== null
          ? ' observed ' + ms(can.observed_p50_s) + ' against ' + ms(can.predicted_p50_s) + ' predicted' : ''),
        h('dt', {}, 'RTO'), h('dd', { class: 'rto' }, secs(i.rto_s)),
        h('dt', {}, 'lost work'), h('dd', {}, (lw.tokens || 0) + ' tokens, ' + (lw.steps || 0) + ' steps, ' + secs(lw.seconds)),
        i.rollback ? [h('dt', {}, 'rollback'), h('dd', {}, i.rollback.why || '')] : null,
        h('dt', {}, 'replay'), h('dd', { class: 'mono' }, (i.reproducer || {}).command || '—')),
      table(['candidate', 'verdict', 'reason'], (i.candidates || []).map((c) => h('tr', {},
        h('td', {}, c.label || c.action), h('td', {}, badge(c.accepted ? 'accepted' : 'rejected')),
        h('td', {}, c.accepted ? (c.tpot_p99_s !== undefined && c.tpot_p99_s !== null ? 'p99 ' + ms(c.tpot_p99_s) : '')
          : (c.reject_code || '') + ': ' + (c.reject_reason || ''))))),
      h('ol', { class: 'timeline' }, (i.timeline || []).map((t) => h('li', {},
        h('span', { class: 't' }, '+' + Number(t.t_s).toFixed(2) + ' s'), t.event))));
  })];
}

// The deployment's recorded incidents and the node losses on its nodes
// since it was made.
function deploymentIncidents(d) {
  const nodes = new Set(d.nodes || []);
  const losses = S.snap.incidents.filter((i) => nodes.has(i.node) && i.detected_unix >= d.created);
  const rows = losses.map((i) => h('tr', { 'data-incident': i.id },
    h('td', { class: 'mono' }, h('a', { href: '#/incidents/' + encodeURIComponent(i.id) }, i.id)),
    h('td', {}, i.class), h('td', {}, i.node), h('td', {}, badge(i.outcome)), h('td', {}, secs(i.rto_s))));
  for (const r of d.incidents || [])
    rows.push(h('tr', {}, h('td', { class: 'mono' }, r.id || '—'), h('td', {}, r.class || r.kind || '—'),
      h('td', {}, r.node || '—'), h('td', {}, r.outcome ? badge(r.outcome) : '—'), h('td', {}, secs(r.rto_s))));
  return rows.length ? table(['id', 'class', 'node', 'outcome', 'RTO'], rows)
    : h('p', { class: 'muted', id: 'no-incidents' }, 'No node loss on this deployment\'s nodes since it was made.');
}

function pageIncidents() {
  const rows = S.snap.incidents.map((i) => h('tr', { 'data-incident': i.id },
    h('td', { class: 'mono' }, h('a', { href: '#/incidents/' + encodeURIComponent(i.id) }, i.id)),
    h('td', {}, i.class), h('td', {}, i.node), h('td', { class: 'hide-narrow' }, new Date(i.detected_unix * 1000).toLocaleString()),
    h('td', {}, badge(i.outcome)), h('td', {}, secs(i.rto_s)), h('td', {}, secs(i.lost_work_s)),
    h('td', {}, (i.jobs || []).map((j) => j.job).join(', ') || '—')));
  return [h('h1', {}, 'Incidents'),
    rows.length ? table(['id', 'class', 'node', 'detected', 'outcome', 'RTO', 'lost work', 'jobs'], rows)
      : h('p', { class: 'muted' }, 'No incident since the server started.')];
}

function pageIncident() {
  const i = S.snap.incidents.find((x) => x.id === S.arg);
  const out = [h('p', {}, h('a', { href: '#/incidents' }, '← Incidents'))];
  if (!i) return [...out, h('p', { class: 'error' }, 'No incident ' + S.arg + '.')];
  out.push(h('h1', {}, i.id + ': ' + i.class + ' of ' + i.node + ' ', badge(i.outcome)),
    h('dl', { class: 'kv' },
      h('dt', {}, 'detection'), h('dd', {}, i.detection.detector + ': ' + i.detection.evidence),
      h('dt', {}, 'time to detect'), h('dd', {}, secs(i.detection.time_to_detect_s)),
      h('dt', {}, 'devices lost'), h('dd', { class: 'mono', id: 'lost-devices' }, (i.devices || []).join(', ') || 'none'),
      h('dt', {}, 'RTO'), h('dd', { id: 'rto' }, secs(i.rto_s)),
      h('dt', {}, 'lost work'), h('dd', {}, secs(i.lost_work_s)),
      h('dt', {}, 'record'), h('dd', {}, h('a', { href: '/ui/api/incidents/' + encodeURIComponent(i.id), download: i.id + '.json' }, i.id + '.json'))),
    i.other_jobs ? h('p', { class: 'muted' }, i.other_jobs + ' jobs of other users were on the node.') : null,
    h('h2', {}, 'Timeline'),
    h('ol', { class: 'timeline' }, i.timeline.map((t) => h('li', {}, h('span', { class: 't' }, '+' + Number(t.t_s).toFixed(2) + ' s'), t.event))));
  for (const j of i.jobs || []) {
    out.push(h('section', { class: 'card incident-job' },
      h('h3', {}, h('span', {}, h('a', { href: '#/jobs/' + encodeURIComponent(j.job) }, j.job), ' ', j.name), badge(j.outcome)),
      h('dl', { class: 'kv' },
        h('dt', {}, 'lost'), h('dd', {}, 'attempt ' + j.lost_attempt + ', ranks ' + j.ranks.join(', ') + ', ' + secs(j.lost_work_s) + ' of work'),
        h('dt', {}, 'new attempt'), h('dd', {}, j.new_attempt === null ? 'not yet' : j.new_attempt),
        h('dt', {}, 'placed on'), h('dd', {}, (j.placed_on || []).join(', ') || 'not yet'),
        h('dt', {}, 'canary'), h('dd', {}, j.canary ? [badge(j.canary.verdict), ' ', j.canary.check] : 'not yet'),
        h('dt', {}, 'RTO'), h('dd', {}, secs(j.rto_s)),
        h('dt', {}, 'replay'), h('dd', {}, h('a', { href: '#/jobs/' + encodeURIComponent(j.job) + '?attempt=' + j.lost_attempt },
          'the lost attempt\'s log'))),
      (j.candidates || []).length ? table(['candidate', 'verdict', 'reason', 'detail'], j.candidates.map((c) => h('tr', {},
        h('td', {}, c.node), h('td', {}, badge(c.accepted ? 'accepted' : 'rejected')), h('td', {}, c.reason || ''),
        h('td', {}, c.detail || (c.score !== undefined && c.score !== null ? 'score ' + Number(c.score).toFixed(1) : '')))))
        : h('p', { class: 'muted' }, 'No candidates weighed yet.')));
  }
  return out;
}

window.addEventListener('hashchange', route);
document.addEventListener('DOMContentLoaded', route);
