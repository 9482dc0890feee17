// Drives the dashboard of a real `plexus server` in headless Chromium over
// the DevTools protocol (puppeteer-core), for tests/integration/test_fleet_ui.c.
//
// The C test owns the fleet: this script asks it for agents by writing
// one line to stdout ("start-agent NAME", "kill-agent NAME") and reads "ok"
// from stdin.  Its last stdout line is "result {...}" with what it saw;
// it exits 1 with the reason on stderr at the first check that fails.
//
// Environment: PLEXUS_URL, PLEXUS_TOKEN (an admin's user token),
// PLEXUS_OTHER_TOKEN (a plain user's), CHROMIUM (the browser),
// UI_SHOTS (the folder for screenshots); with PLEXUS_MODEL (the shared
// tiny model) also PLEXUS_INCIDENT (a plexus.incident/1 record).
import { createInterface } from 'node:readline';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import puppeteer from 'puppeteer-core';

const URL_ = process.env.PLEXUS_URL;
const TOKEN = process.env.PLEXUS_TOKEN;
const OTHER = process.env.PLEXUS_OTHER_TOKEN;
const SHOTS = process.env.UI_SHOTS;
const XSS = '<img src=x onerror=alert(1)>';
const WIDE = { width: 1280, height: 800 };
const NARROW = { width: 390, height: 844 };

rmSync(SHOTS, { recursive: true, force: true });
mkdirSync(SHOTS, { recursive: true });
const lines = createInterface({ input: process.stdin });
const replies = [];
let waiter = null;
lines.on('line', (l) => { if (waiter) { const w = waiter; waiter = null; w(l); } else replies.push(l); });

async function ask(command) {
  process.stdout.write(command + '\n');
  const answer = replies.length ? replies.shift() : await new Promise((r) => { waiter = r; });
  if (answer !== 'ok') throw new Error(command + ': the test answered ' + answer);
}

const consoleErrors = [];
let current = null; // the page a failure screenshot is taken of
const dialogs = [];
const seen = {};
function fail(msg) { throw new Error(msg); }

async function api(method, path, body, token) {
  const r = await fetch(URL_ + path, {
    method, headers: { Authorization: 'Bearer ' + (token || TOKEN), 'Content-Type': 'application/json' },
    body: body ? JSON.stringify(body) : undefined,
  });
  const v = await r.json();
  if (!r.ok) fail(method + ' ' + path + ': ' + r.status + ' ' + JSON.stringify(v));
  return v;
}

async function until(what, fn, timeoutMs) {
  const end = Date.now() + (timeoutMs || 60000);
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) fail('timed out waiting for ' + what);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function shot(page, name) {
  await page.screenshot({ path: SHOTS + '/' + name + '.png', fullPage: true });
}

// A page is usable at a width when nothing makes the document wider than
// the window (tables scroll inside their own box) and its navigation and
// main content are on screen.
async function checkFits(page, label) {
  const m = await page.evaluate(() => ({
    doc: document.documentElement.scrollWidth, win: window.innerWidth,
    nav: !!document.querySelector('#nav a') && document.querySelector('#nav a').getBoundingClientRect().right <= window.innerWidth,
    main: document.querySelector('main') ? document.querySelector('main').getBoundingClientRect().width : 0,
  }));
  if (m.doc > m.win + 1) fail(label + ': the page is ' + m.doc + ' px wide in a ' + m.win + ' px window');
  if (!m.nav || m.main < 200) fail(label + ': navigation or content off screen ' + JSON.stringify(m));
}

// Clicks in the page itself: the dashboard redraws on every event, so a
// handle taken a moment before may be gone.
async function click(page, sel) {
  await page.waitForSelector(sel);
  await page.$eval(sel, (e) => e.click());
}

async function text(page, sel) {
  return page.$eval(sel, (e) => e.textContent).catch(() => null);
}

async function main() {
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
  });
  try {
    const page = await browser.newPage();
    current = page;
    await page.setViewport(WIDE);
    page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text() + ' @ ' + page.url()); });
    page.on('pageerror', (e) => consoleErrors.push('page error: ' + e.message));
    page.on('dialog', async (d) => { dialogs.push(d.message()); await d.dismiss(); });

    // 1. Unauthenticated: only the login page, whatever is asked.
    for (const path of ['/ui/', '/ui/#/jobs', '/ui/app.js', '/ui/index.html']) {
      await page.goto(URL_ + path, { waitUntil: 'networkidle0' });
      if (!page.url().startsWith(URL_ + '/ui/login')) fail(path + ' without a session went to ' + page.url());
      if (await page.$('#nav')) fail(path + ' without a session showed the dashboard');
    }
    if (!await page.$('form[action="/ui/login"] input[name=token]')) fail('no login form');
    await shot(page, 'login');

    // 2. A wrong token is refused with a message; the token never enters a URL.
    await page.type('#token', 'not-a-token-of-this-server-0000');
    await Promise.all([page.waitForNavigation(), page.click('#login')]);
    const refusal = await text(page, '.error');
    if (!refusal || !/Unknown token/.test(refusal)) fail('a wrong token was not refused: ' + refusal);
    await page.type('#token', TOKEN);
    await Promise.all([page.waitForNavigation(), page.click('#login')]);
    if (page.url().includes(TOKEN) || page.url() !== URL_ + '/ui/') fail('after login: ' + page.url());
    await page.waitForSelector('#fleet-summary');
    if (await page.evaluate(() => document.cookie) !== '') fail('the session cookie is readable by scripts');
    const cookies = await page.cookies();
    const c = cookies.find((x) => x.name === 'plexus_session');
    if (!c || !c.httpOnly || c.sameSite !== 'Strict') fail('session cookie: ' + JSON.stringify(c));
    await page.waitForFunction(() => document.getElementById('live').textContent === 'live');
    await shot(page, 'fleet-empty');

    // 3. A node appears when its agent starts.
    await ask('start-agent a');
    await page.waitForSelector('[data-node="a"]', { timeout: 60000 });
    await ask('start-agent b');
    await page.waitForSelector('[data-node="b"]', { timeout: 60000 });
    await page.waitForFunction(() => document.querySelectorAll('.node .s-online').length >= 2, { timeout: 60000 });
    seen.nodes = await page.$$eval('.node', (n) => n.map((e) => e.dataset.node));
    await shot(page, 'fleet-1280');

    // 4. A job named like markup renders as text; it finishes with its log.
    const job = await api('POST', '/v1/jobs', {
      name: XSS, command: ['/bin/sh', '-c', 'echo hello-from-the-dashboard-test; echo to-stderr >&2; sleep 1; echo done-ok'],
    });
    await page.goto(URL_ + '/ui/#/jobs', { waitUntil: 'networkidle2' });
    await page.waitForSelector(`tr[data-job="${job.id}"]`);
    const shown = await page.$eval(`tr[data-job="${job.id}"] .job-name`, (e) => e.textContent);
    if (shown !== XSS) fail('the job name rendered as ' + JSON.stringify(shown));
    if (await page.$('main img')) fail('the job name became an element');
    await page.goto(URL_ + '/ui/#/jobs/' + job.id, { waitUntil: 'networkidle2' });
    await page.waitForFunction(() => document.getElementById('log') &&
      document.getElementById('log').textContent.includes('done-ok'), { timeout: 90000 });
    await page.waitForFunction(() => document.querySelector('h1 .s-succeeded'), { timeout: 60000 });
    if (await text(page, 'h1 .job-title') !== XSS) fail('the job title is not the name as text');
    const log = await text(page, '#log');
    if (!log.includes('hello-from-the-dashboard-test') || !log.includes('to-stderr')) fail('log: ' + log);
    await page.waitForSelector('table.why');
    seen.why = await page.$$eval('table.why tbody tr', (r) => r.map((e) => e.textContent));
    if (dialogs.length) fail('a dialog opened: ' + dialogs.join('; '));
    await shot(page, 'job-1280');

    // 5. A device (node) loss: the agent running a job is killed; the
    // incident follows the job to the other node.
    const long = await api('POST', '/v1/jobs', {
      name: 'survivor', command: ['/bin/sh', '-c', 'echo started; sleep 120'], resources: { gpus: 1 },
    });
    const placed = await until('the long job to run', async () => {
      const j = await api('GET', '/v1/jobs/' + long.id);
      return j.state === 'running' ? j : null;
    });
    const victim = placed.members[0].node;
    await page.goto(URL_ + '/ui/#/incidents', { waitUntil: 'networkidle2' });
    await ask('kill-agent ' + victim);
    await page.waitForSelector('tr[data-incident]', { timeout: 60000 });
    const incId = await page.$eval('tr[data-incident]', (e) => e.dataset.incident);
    await page.goto(URL_ + '/ui/#/incidents/' + incId, { waitUntil: 'networkidle2' });
    await page.waitForFunction(() => document.querySelector('h1 .s-recovered'), { timeout: 90000 });
    seen.incident = {
      id: incId, victim, rto: await text(page, '#rto'),
      timeline: await page.$$eval('.timeline li', (l) => l.map((e) => e.textContent)),
      candidates: await page.$$eval('.incident-job tbody tr', (r) => r.map((e) => e.textContent)),
    };
    if (!seen.incident.timeline.some((t) => t.includes('detected'))) fail('no detection in the timeline');
    if (!seen.incident.candidates.some((t) => t.includes('accepted'))) fail('no accepted candidate');
    if (!(await text(page, '#lost-devices')).includes(victim + '.gpu0')) fail('the lost device is not named');
    await shot(page, 'incident-1280');
    await page.goto(URL_ + '/ui/#/fleet', { waitUntil: 'networkidle2' });
    await page.waitForFunction((v) => document.querySelector(`[data-node="${v}"] .s-offline`), {}, victim);
    await shot(page, 'fleet-lost-1280');

    // 6. A job planned across the fleet and a deployment (with the shared
    // tiny model): plans drawn as stages on devices, or the planner's
    // reason for none.
    const pages = ['fleet', 'jobs', 'jobs/' + job.id, 'deployments', 'incidents', 'incidents/' + incId];
    if (process.env.PLEXUS_MODEL) {
      const bytes = readFileSync(process.env.PLEXUS_MODEL);
      const up = await fetch(URL_ + '/v1/blobs', { method: 'POST', headers: { Authorization: 'Bearer ' + TOKEN }, body: bytes });
      const blob = await up.json();
      if (up.status !== 201) fail('upload: ' + JSON.stringify(blob));
      // 6a. A deployment planned over three nodes (two more agents join, and
      // no node holds the model yet, so none is preferred):
      // each stage drawn on its node; its front end's observations,
      // posted over the API, drawn as charts and set against the plan's
      // predictions; an incident it reports appears live, its strings as
      // text.
      await ask('start-agent x');
      await ask('start-agent y');
      await until('three nodes online', async () => (await api('GET', '/v1/nodes')).nodes
        .filter((n) => n.state === 'online').length >= 3, 90000);
      const multi = await api('POST', '/v1/deployments', { name: 'multi', model: blob.digest, policy: 'llamacpp' });
      const planNodes = [...new Set(multi.plan.assignment.map((a) => a.node))];
      if (planNodes.length < 3) fail('the plan over three nodes uses ' + JSON.stringify(planNodes));
      await page.goto(URL_ + '/ui/#/deployments/multi', { waitUntil: 'networkidle2' });
      await page.waitForSelector('.plan svg .stage', { timeout: 30000 });
      const drawn = await page.$$eval('.plan .stage', (g) => g.map((e) => e.dataset.node));
      const want = multi.plan.assignment.filter((a) => a.replica === 0).map((a) => a.node);
      if (JSON.stringify(drawn.slice(0, want.length)) !== JSON.stringify(want)) fail('stages drawn on ' + drawn + ', planned on ' + want);
      if (await page.$$eval('.plan .link.cross', (l) => l.length) < 2) fail('the links between nodes are not drawn as network links');
      if (await page.$('#chart-tps')) fail('a chart before any observation');
      const stages = multi.plan.plan.stages.length;
      for (let k = 0; k < 4; k++) {
        await api('POST', '/v1/deployments/multi/observations', {
          tokens_per_s: 300 + 40 * k, ttft_s: { p50: 0.08 + 0.01 * k, p99: 0.2 }, tpot_s: { p50: 0.012, p99: 0.018 + 0.001 * k },
          running: 4 + k, queued: k, requests: 20,
          stages: Array.from({ length: stages }, (_, i) => ({ stage: i, step_s: { p50: 0.004 + 0.001 * i, p99: 0.006 + 0.001 * i } })),
        });
      }
      await page.waitForFunction(() => document.querySelectorAll('#chart-tps path.series').length === 1 &&
        document.querySelectorAll('#chart-ttft path.series').length === 2 && document.querySelector('#chart-tpot') &&
        document.querySelector('#chart-batch') && /4 observations/.test(document.querySelector('main').textContent), { timeout: 30000 });
      const observed = await page.$$eval('td.observed', (t) => t.map((e) => e.textContent));
      if (observed.length !== stages || !observed.every((t) => /predicted/.test(t))) fail('observed per stage: ' + observed);
      if (!/420\.0 tokens\/s/.test(await text(page, '#latest-observed'))) fail('latest: ' + await text(page, '#latest-observed'));
      const incident = JSON.parse(readFileSync(process.env.PLEXUS_INCIDENT, 'utf8'));
      incident.id = 'inc-ui-1';
      incident.signature.evidence = XSS;
      incident.candidates[1].reject_reason = XSS;
      await api('POST', '/v1/deployments/multi/incidents', incident);
      await page.waitForSelector('.reported-incident[data-incident="inc-ui-1"]', { timeout: 30000 });
      const inc = await text(page, '.reported-incident');
      if (!inc.includes(XSS) || await page.$('main img')) fail('the incident\'s strings did not render as text');
      for (const want of ['accepted', 'rejected', 'recovered', '0.90 s', 'canary', 'plexus replay run.trace'])
        if (!inc.includes(want)) fail('the incident lacks "' + want + '": ' + inc);
      seen.multi = { nodes: planNodes, stages: drawn.length, observed, incident: inc.slice(0, 200) };
      seen.nodes = [...new Set([...seen.nodes, ...planNodes])];
      await shot(page, 'deployment-multi-1280');
      pages.push('deployments/multi');
      const planned = await api('POST', '/v1/jobs', {
        name: 'planned', command: ['/bin/sh', '-c', 'echo serving; sleep 2'], plan: 'auto',
        model: { digest: blob.digest }, resources: { gpus: 1 },
      });
      await page.goto(URL_ + '/ui/#/deployments/' + planned.id, { waitUntil: 'networkidle2' });
      await page.waitForSelector('.plan svg, main .notice', { timeout: 60000 });
      seen.plan = await page.$('.plan svg') ? 'planned: ' + (await page.$$eval('.plan .stage', (g) => g.length)) + ' stages'
        : await text(page, 'main .notice');
      await shot(page, 'deployment-1280');
      pages.push('deployments/' + planned.id);

      // 6b. A deployment of the same model (its file named like markup):
      // listed with its model and state, its plan drawn as stages on the
      // nodes' devices, its predicted figures and incidents.
      await api('POST', '/v1/deployments', { name: 'tiny', model: { digest: blob.digest, name: XSS } });
      await page.goto(URL_ + '/ui/#/deployments', { waitUntil: 'networkidle2' });
      await page.waitForSelector('tr[data-deployment="tiny"] button[data-action=undeploy]', { timeout: 30000 });
      const row = await text(page, 'tr[data-deployment="tiny"]');
      if (!row.includes(blob.digest.slice(0, 12))) fail('the deployment row lacks its model: ' + row);
      await click(page, 'tr[data-deployment="tiny"] a');
      await page.waitForSelector('.plan svg .stage', { timeout: 30000 });
      if (await text(page, 'h1 .deployment-title') !== 'tiny') fail('the deployment page is not titled by name');
      if (!(await text(page, 'main dl')).includes(XSS) || await page.$('main img')) fail('the model name did not render as text');
      const stageNodes = await page.$$eval('.plan .stage', (g) => g.map((e) => e.dataset.node));
      if (!stageNodes.length || stageNodes.some((n) => !seen.nodes.includes(n))) fail('stages on unknown nodes: ' + stageNodes);
      const predicted = await text(page, '#predicted');
      if (!/predicted/.test(predicted)) fail('no predicted figures: ' + predicted);
      await page.waitForSelector('#no-incidents, main table [data-incident]');
      seen.deployment = { stages: stageNodes.length, nodes: [...new Set(stageNodes)], predicted };
      await shot(page, 'deployment-tiny-1280');
      pages.push('deployments/tiny');

    }
    // 7. Every page at 1280x800 and on a narrow screen.
    for (const [vp, tag] of [[WIDE, '1280'], [NARROW, 'narrow']]) {
      await page.setViewport(vp);
      for (const p of pages) {
        await page.goto(URL_ + '/ui/#/' + p, { waitUntil: 'networkidle2' });
        await page.waitForSelector('main h1');
        await checkFits(page, p + ' at ' + tag);
        await shot(page, p.replace('/', '-') + '-' + tag);
      }
    }
    await page.setViewport(WIDE);

    // 8. Actions ask first: undeploy kept, then confirmed; cancel kept,
    // then confirmed; drain confirmed.
    if (process.env.PLEXUS_MODEL) {
      await page.goto(URL_ + '/ui/#/deployments/tiny', { waitUntil: 'networkidle2' });
      await click(page, 'button[data-action=undeploy]');
      await page.waitForSelector('dialog[open]');
      await shot(page, 'confirm-undeploy');
      // Kept, and asked again before the dialog's close event of the
      // first answer has run (one task does both): the second answer
      // must still count (a busy page once lost it this way).
      await page.evaluate(() => {
        document.getElementById('confirm-no').click();
        document.querySelector('button[data-action=undeploy]').click();
      });
      await new Promise((r) => setTimeout(r, 300));
      await api('GET', '/v1/deployments/tiny'); // still there
      if (!(await page.$('dialog[open]'))) fail('the second undeploy did not ask');
      await click(page, '#confirm-yes');
      // On a timeout, say what the page said (its toast) and the
      // deployment's state.
      const gone = async () => (await api('GET', '/v1/deployments')).deployments
        .every((d) => d.name !== 'tiny');
      try {
        await until('the deployment to go', gone);
      } catch (e) {
        const dep = await api('GET', '/v1/deployments/tiny').catch((x) => ({ error: x.message }));
        fail(e.message + '; the page\'s toast: ' + JSON.stringify(await text(page, '#toast')) +
          '; the dialog ' + ((await page.$('dialog[open]')) ? 'still open' : 'closed') +
          '; the deployment: ' + JSON.stringify({ state: dep.state, detail: dep.detail, error: dep.error }));
      }
      await page.waitForSelector('#gone', { timeout: 30000 });
      await page.goto(URL_ + '/ui/#/deployments', { waitUntil: 'networkidle2' });
      await page.waitForSelector('main h1');
      if (await page.$('tr[data-deployment="tiny"]')) fail('the undeployed deployment is still listed');
      seen.undeployed = true;
    }
    // Cancel: kept, then confirmed.
    await page.goto(URL_ + '/ui/#/jobs/' + long.id, { waitUntil: 'networkidle2' });
    await page.waitForSelector('button[data-action=cancel]');
    await click(page, 'button[data-action=cancel]');
    await page.waitForSelector('dialog[open]');
    await shot(page, 'confirm-cancel');
    await click(page, '#confirm-no');
    await new Promise((r) => setTimeout(r, 500));
    if ((await api('GET', '/v1/jobs/' + long.id)).state === 'cancelled') fail('cancelled without confirmation');
    await click(page, 'button[data-action=cancel]');
    await page.waitForSelector('dialog[open]');
    await click(page, '#confirm-yes');
    await until('the job to be cancelled', async () => (await api('GET', '/v1/jobs/' + long.id)).state === 'cancelled');
    await page.waitForFunction(() => document.querySelector('h1 .s-cancelled'), { timeout: 30000 });
    const survivor = seen.nodes.find((n) => n !== victim);
    await page.goto(URL_ + '/ui/#/fleet', { waitUntil: 'networkidle2' });
    await page.waitForSelector(`[data-node="${survivor}"] button[data-action=drain]`);
    await click(page, `[data-node="${survivor}"] button[data-action=drain]`);
    await page.waitForSelector('dialog[open]');
    await click(page, '#confirm-yes');
    await page.waitForFunction((v) => document.querySelector(`[data-node="${v}"] .s-draining`), { timeout: 30000 }, survivor);
    await shot(page, 'fleet-draining');

    // 9. Another user sees neither the admin's jobs nor the drain button.
    const ctx = await browser.createBrowserContext();
    const p2 = await ctx.newPage();
    p2.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text() + ' @ ' + p2.url()); });
    p2.on('pageerror', (e) => consoleErrors.push('page error: ' + e.message));
    await p2.setViewport(WIDE);
    await p2.goto(URL_ + '/ui/login', { waitUntil: 'networkidle0' });
    await p2.type('#token', OTHER);
    await Promise.all([p2.waitForNavigation(), p2.click('#login')]);
    await p2.goto(URL_ + '/ui/#/jobs', { waitUntil: 'networkidle2' });
    await p2.waitForSelector('main h1');
    if (await p2.$(`tr[data-job="${job.id}"]`)) fail('another user sees the admin\'s job');
    await p2.goto(URL_ + '/ui/#/fleet', { waitUntil: 'networkidle2' });
    await p2.waitForSelector('[data-node]');
    if (await p2.$('button[data-action=drain], button[data-action=undrain]')) fail('a plain user got node actions');
    await ctx.close();

    // 10. Logging out ends the session: only the login page again.
    await Promise.all([page.waitForNavigation(), page.click('#logout')]);
    if (!page.url().startsWith(URL_ + '/ui/login')) fail('after logout: ' + page.url());
    await page.goto(URL_ + '/ui/#/fleet', { waitUntil: 'networkidle0' });
    if (!page.url().startsWith(URL_ + '/ui/login') || await page.$('#nav')) fail('the dashboard after logout');

    if (consoleErrors.length) fail('console errors:\n' + consoleErrors.join('\n'));
    if (dialogs.length) fail('dialogs opened: ' + dialogs.join('; '));
    process.stdout.write('result ' + JSON.stringify(seen) + '\n');
  } catch (e) {
    if (current) {
      await current.screenshot({ path: SHOTS + '/failure.png', fullPage: true }).catch(() => {});
      const body = await current.evaluate(() => document.body.innerText).catch(() => '');
      e.message += '\nat ' + current.url() + '\n' + body.slice(0, 3000);
    }
    throw e;
  } finally {
    await browser.close();
  }
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write('ui_browser: ' + e.message + '\n' + (consoleErrors.length ? 'console errors:\n' + consoleErrors.join('\n') + '\n' : ''));
  process.exit(1);
});
