// The layout worker: the report builds it from this file's bundle (a Blob, so the report stays
// one file) and sends it batches of level layouts (layout.js). Where a worker cannot start, the
// same bundle runs on the page with a stand-in for `self` (see engine.js).
import { layoutBatch } from "./layout.js";

self.onmessage = (ev) => {
  const { id, jobs } = ev.data;
  try {
    self.postMessage({ id, results: layoutBatch(jobs) });
  } catch (err) {
    self.postMessage({ id, error: String((err && err.stack) || err) });
  }
};
