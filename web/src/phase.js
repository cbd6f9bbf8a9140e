// Forward, backward or both: which drawn items a training step's report hides when it shows one
// pass (the toolbar's phase choice; the model leaves them out of the levels, levels.js, so the
// layout closes up). Python writes `phases` in the view-model, the node indices of each pass
// other than the forward (absent on a forward-only graph); every other node is a forward one.
// Ops and outputs belong to their pass, and so do the backward's own inputs (the loss's
// gradient); the model's inputs and parameters stay, as both passes read them. A box whose every
// node is hidden is hidden too. No DOM: web/tests runs it.

export const PHASE_CHOICES = ["both", "forward", "backward"];

/** Whether the graph has backward nodes, so that the choice means something. */
export function hasPhases(data) {
  return !!data.phases && Object.values(data.phases).some((l) => l && l.length);
}

/** The pass node i shows under: "forward" or "backward" (recompute is drawn with the backward). */
export function nodePhases(data) {
  const out = new Array(data.nodes.n.length).fill("forward");
  for (const [phase, list] of Object.entries(data.phases || {})) {
    for (const i of list || []) out[i] = phase === "forward" ? "forward" : "backward";
  }
  return out;
}

/** The keys ("n<i>", "g<j>") that the choice hides: nothing for "both". */
export function hiddenKeys(data, choice) {
  const hidden = new Set();
  if (!PHASE_CHOICES.includes(choice) || choice === "both" || !hasPhases(data)) return hidden;
  const phases = nodePhases(data);
  const kinds = data.nodes.f.map((f) => data.ops[f][0]);
  const G = data.groups.length;
  const shown = new Int32Array(G);
  const any = new Int32Array(G);
  for (let i = 0; i < phases.length; i++) {
    const off = phases[i] !== choice && (kinds[i] === "op" || kinds[i] === "output" || (kinds[i] === "input" && phases[i] !== "forward"));
    if (off) hidden.add(`n${i}`);
    for (let g = data.nodes.g[i]; g >= 0 && g < G; g = data.groups[g].p) {
      any[g] = 1;
      if (!off) shown[g] = 1;
    }
  }
  for (let g = 0; g < G; g++) if (any[g] && !shown[g]) hidden.add(`g${g}`);
  return hidden;
}
