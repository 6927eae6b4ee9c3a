// Opens a trace2html page (catapult's trace viewer: the code chrome://tracing serves) in
// headless Chromium, waits for its import, and prints what the viewer's model holds as JSON:
// processes, threads, slices, counter tracks, import warnings and page errors.
//   node chrome_tracing.js file:///.../trace.html OUT.png
const puppeteer = require('puppeteer-core');

async function model(page) {
  return page.evaluate(() => {
    const view = document.querySelector('tr-ui-timeline-view');
    const m = view && view.model;
    if (!m) return null;
    let threads = 0, slices = 0, counters = 0;
    for (const t of m.getAllThreads()) { threads++; slices += t.sliceGroup.length; }
    for (const p of Object.values(m.processes)) counters += Object.keys(p.counters).length;
    return {processes: Object.keys(m.processes).length, threads, slices, counters,
            importWarnings: (m.importWarnings || []).map(w => w.message)};
  });
}

(async () => {
  const [url, shot] = process.argv.slice(2);
  const browser = await puppeteer.launch({executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true, args: ['--no-sandbox', '--disable-gpu', '--allow-file-access-from-files']});
  const page = await browser.newPage();
  await page.setViewport({width: 1600, height: 1000});
  const errors = [];
  page.on('pageerror', e => errors.push(String(e)));
  await page.goto(url);
  let got = null;
  for (const t0 = Date.now(); !got && Date.now() - t0 < 120000;) {
    got = await model(page);
    if (!got) await new Promise(r => setTimeout(r, 250));
  }
  await new Promise(r => setTimeout(r, 1500));  // let it draw before the screenshot
  await page.screenshot({path: shot});
  console.log(JSON.stringify({model: got, errors}));
  await browser.close();
})();
