// Export the drawing as it is now (what is open, the overlay's colours, the theme) as a
// standalone SVG with the report's styles inside, or as a PNG rendered from that SVG.
import { ROOT } from "./model.js";

/** A standalone SVG document of the viewer's drawing at scale 1. */
export function svgText(viewer, css, theme) {
  const [w, h] = viewer.engine.size();
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("xmlns", "http://www.w3.org/2000/svg");
  svg.setAttribute("width", String(Math.ceil(w)));
  svg.setAttribute("height", String(Math.ceil(h)));
  svg.setAttribute("viewBox", `0 0 ${Math.ceil(w)} ${Math.ceil(h)}`);
  svg.setAttribute("class", "fxviz fx-export");
  svg.setAttribute("data-theme", theme);
  const style = document.createElementNS("http://www.w3.org/2000/svg", "style");
  style.textContent = css;
  const bg = document.createElementNS("http://www.w3.org/2000/svg", "rect");
  bg.setAttribute("width", "100%");
  bg.setAttribute("height", "100%");
  bg.setAttribute("class", "fx-export-bg");
  svg.append(style, bg, viewer.svg.querySelector("defs").cloneNode(true), viewer.scene.level(ROOT).cloneNode(true));
  for (const el of svg.querySelectorAll(".fx-selected, .fx-linked, .fx-flash")) el.classList.remove("fx-selected", "fx-linked", "fx-flash");
  return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(svg);
}

function download(blob, name) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

export function exportSvg(viewer, css, theme, name) {
  download(new Blob([svgText(viewer, css, theme)], { type: "image/svg+xml" }), `${name}.svg`);
}

/** Canvas sides above this are refused by browsers; a larger drawing is scaled down. */
const MAX_SIDE = 16000;
const MAX_AREA = 120e6;

export function exportPng(viewer, css, theme, name) {
  const [w, h] = viewer.engine.size();
  const scale = Math.min(2, MAX_SIDE / Math.max(w, 1), MAX_SIDE / Math.max(h, 1), Math.sqrt(MAX_AREA / Math.max(w * h, 1)));
  const img = new Image();
  const url = URL.createObjectURL(new Blob([svgText(viewer, css, theme)], { type: "image/svg+xml" }));
  return new Promise((resolve, reject) => {
    img.onload = () => {
      const canvas = document.createElement("canvas");
      canvas.width = Math.max(1, Math.round(w * scale));
      canvas.height = Math.max(1, Math.round(h * scale));
      const g = canvas.getContext("2d");
      g.scale(scale, scale);
      g.drawImage(img, 0, 0);
      URL.revokeObjectURL(url);
      canvas.toBlob((blob) => {
        if (!blob) return reject(new Error("the browser could not make a PNG of this size"));
        download(blob, `${name}.png`);
        resolve();
      }, "image/png");
    };
    img.onerror = () => reject(new Error("the drawing could not be rendered as an image"));
    img.src = url;
  });
}
