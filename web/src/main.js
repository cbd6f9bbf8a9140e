// The fxviz report: reads the embedded view-model and draws it (report.js), or, for the data of
// `fxviz diff --html`, both graphs side by side (diffview.js). The page holds this script before
// the data: it runs first, starts the layout worker, and waits for the data to be read. Performance
// marks time it: "fxviz:first-paint" (from navigation start to the first view on screen),
// "fxviz:read" (the page has read the data), "fxviz:expand" (a toggle, to the frame after it is
// drawn), "fxviz:go" (a search jump), "fxviz:layout".
import { DiffPage } from "./diffview.js";
import { Report } from "./report.js";
import { layoutRunner } from "./runner.js";
import { afterPaint } from "./viewer.js";

performance.mark("fxviz:start");
// the worker starts (and warms up) on another core while this one reads the data: a worker
// started after the data was read is still loading when the first layout is asked for
const run = layoutRunner();

function boot() {
  performance.mark("fxviz:read");
  const root = document.getElementById("fxviz-app");
  const data = JSON.parse(document.getElementById("fxviz-data").textContent);
  const app = data.diff ? new DiffPage(root, data.diff, run) : new Report(root, data, run);
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

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
else boot();
