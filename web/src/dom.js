// Small DOM helpers. Every string that comes from the model goes through textContent or
// setAttribute, never innerHTML: module names are data, not markup.

const SVG_NS = "http://www.w3.org/2000/svg";

/** An HTML element with attributes and children (strings become text nodes). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

/** An SVG element with attributes and children. */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.setAttribute("class", v);
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
}

/** Elements marked data-ref="name" inside root, by name. */
export function refs(root) {
  const out = {};
  for (const el of root.querySelectorAll("[data-ref]")) out[el.dataset.ref] = el;
  return out;
}

/** Thousands separators: 124439808 -> "124,439,808". */
export function grouped(n) {
  return Number(n).toLocaleString("en-US");
}
