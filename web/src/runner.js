// Where layout jobs run: a Web Worker built from the worker's own bundle (embedded in the
// report's script as text, so the report stays one file, and started from a Blob), or, where a
// page may not start one, the same bundle on the page itself.
import workerSource from "../build/worker.txt";

/** Three items in a chain with a port on each side and labels: every path of layout.js. */
const WARM_UP = {
  root: false, title: 80, ports: { in: true, out: true },
  items: [{ w: 60, h: 24, ai: 0, ao: 0 }, { w: 90, h: 38, ai: 0, ao: 0 }, { w: 60, h: 24, ai: 0, ao: 0 }],
  edges: [[-1, 0, 0, 0], [0, 1, 40, 15], [1, 2, 40, 15], [0, 2, 0, 0], [2, -2, 0, 0]],
};

/** The bundle of worker.js run on this page, with an object standing in for the worker's `self`. */
function inline() {
  const self = { postMessage: (m) => (self.last = m) };
  // the bundle is this file's own text, built with it: not data from the model
  new Function("self", workerSource)(self);
  return (jobs) => {
    self.onmessage({ data: { id: 0, jobs } });
    const m = self.last;
    return m.error ? Promise.reject(new Error(m.error)) : Promise.resolve(m.results);
  };
}

/** A function that runs a batch of layout jobs and resolves to their results. `where()` says
 * "worker" or "page". */
export function layoutRunner() {
  let run = null;
  let where = "page";
  const pending = new Map();
  let next = 1;
  let worker = null;
  const fallBack = () => {
    where = "page";
    worker = null;
    run = inline();
    for (const [, p] of pending) run(p.jobs).then(p.resolve, p.reject);
    pending.clear();
  };
  try {
    const url = URL.createObjectURL(new Blob([workerSource], { type: "text/javascript" }));
    worker = new Worker(url);
    where = "worker";
    worker.onmessage = (ev) => {
      const p = pending.get(ev.data.id);
      if (!p) return;
      pending.delete(ev.data.id);
      if (ev.data.error) p.reject(new Error(ev.data.error));
      else p.resolve(ev.data.results);
    };
    // a worker the page's policy refuses fails here, after it was made
    worker.onerror = (ev) => {
      ev.preventDefault();
      fallBack();
    };
    run = (jobs) => new Promise((resolve, reject) => {
      if (!worker) {
        run(jobs).then(resolve, reject);
        return;
      }
      const id = next++;
      pending.set(id, { jobs, resolve, reject });
      worker.postMessage({ id, jobs });
    });
  } catch {
    run = inline();
  }
  // a first small layout, so that dagre's code is compiled before the first view needs it
  if (where === "worker") run([WARM_UP]).catch(() => {});
  const api = (jobs) => run(jobs);
  api.where = () => where;
  return api;
}
