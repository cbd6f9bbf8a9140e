// Small DOM helpers. Every string that comes from the model goes through textContent or
// setAttribute, never innerHTML: module names are data, not markup. Text and the attributes a
// reader sees (title, aria-label, placeholder) go through `visible`, so a bidi override or a
// control character in a name is spelled out wherever the script writes it.
import { grouped, visible } from "./text.js";

export { grouped };

const SVG_NS = "http://www.w3.org/2000/svg";
const SHOWN = new Set(["title", "aria-label", "placeholder", "alt"]);

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
  for (const k in attrs) {
    const v = attrs[k];
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.setAttribute("class", v);
    else if (k === "text") el.textContent = visible(v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : SHOWN.has(k) ? visible(v) : String(v));
  }
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(typeof c === "string" || typeof c === "number" ? document.createTextNode(visible(c)) : c);
  }
}

/** Elements marked data-ref="name" inside root, by name. */
export function refs(root) {
  const out = {};
  for (const el of root.querySelectorAll("[data-ref]")) out[el.dataset.ref] = el;
  return out;
}

/** A link that runs `fn` instead of navigating. */
export function action(text, fn, attrs = {}) {
  return h("a", { href: "#", ...attrs, onclick: (e) => { e.preventDefault(); fn(e); }, text });
}
