// The fxviz report: reads the embedded view-model and draws it (report.js), or, for the data of
// `fxviz diff --html`, both graphs side by side (diffview.js). The page holds this script before
// the data: it runs first and starts the layout worker; the first view starts when the page has
// read the data's first block (an "fxviz-data" event right after it) and draws while the page
// reads the second (what only details and colourings need: html.split_view_model). Performance
// marks time it: "fxviz:first-paint" (from navigation start to the first view on screen),
// "fxviz:read" (the page has read the first block), "fxviz:expand" (a toggle, to the frame after
// it is drawn), "fxviz:go" (a search jump), "fxviz:layout".
import { DiffPage } from "./diffview.js";
import { mergeLater } from "./nodes.js";
import { Report } from "./report.js";
import { layoutRunner } from "./runner.js";
import { afterPaint } from "./viewer.js";

performance.mark("fxviz:start");
// the worker starts (and warms up) on another core while this one reads the data: a worker
// started after the data was read is still loading when the first layout is asked for
const run = layoutRunner();

/** Resolves when the page has read the data's second block, merged into `data`. */
function readLater(data) {
  return new Promise((resolve, reject) => {
    const read = () => {
      try {
        const el = document.getElementById("fxviz-later");
        if (el) mergeLater(data, JSON.parse(el.textContent));
        resolve();
      } catch (err) {
        reject(err);
      }
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", read);
    else read();
  });
}

let booted = false;

function boot() {
  if (booted) return;
  booted = true;
  performance.mark("fxviz:read");
  const root = document.getElementById("fxviz-app");
  const data = JSON.parse(document.getElementById("fxviz-data").textContent);
  const later = data.diff ? null : readLater(data);
  const app = data.diff ? new DiffPage(root, data.diff, run) : new Report(root, data, run, later);
  // a handle for the browser tests and the console; nothing else reads it
  window.fxvizReport = app;
  root.dataset.layoutIn = run.where();
  app.start().then(() => afterPaint(() => {
    performance.mark("fxviz:first-paint");
    // from navigation start: reading the file and parsing the JSON count too
    performance.measure("fxviz:first-paint", { start: 0, end: "fxviz:first-paint" });
    root.dataset.layoutIn = run.where();
    root.dataset.ready = "true";
  }), (err) => app.fail(err));
}

document.addEventListener("fxviz-data", boot);
// a page without the event (data edited by hand, an older template) starts once it is read
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
else boot();
