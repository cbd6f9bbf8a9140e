// What the reader sets once and keeps: the theme and how source lines become links. Kept in
// localStorage where the page may use it (a sandboxed notebook frame may not: then for the
// session only).

const KEY = "fxviz.settings";
/** Source link patterns offered; {file}, {line} and {func} are filled in. "" shows plain text. */
export const LINK_PATTERNS = {
  off: "",
  file: "file://{file}",
  vscode: "vscode://file/{file}:{line}",
};
const DEFAULTS = { theme: "auto", link: LINK_PATTERNS.file };

function storage() {
  try {
    const s = window.localStorage;
    s.getItem(KEY);
    return s;
  } catch {
    return null;
  }
}

export function loadSettings() {
  const s = storage();
  let saved = {};
  try {
    saved = JSON.parse((s && s.getItem(KEY)) || "{}") || {};
  } catch {
    saved = {};
  }
  return { ...DEFAULTS, ...saved };
}

export function saveSettings(settings) {
  const s = storage();
  if (!s) return;
  try {
    s.setItem(KEY, JSON.stringify(settings));
  } catch {
    // full or refused: the settings last for this page only
  }
}

/** The link for a source line, or null when links are off or the pattern makes no URL a
 * browser should open (only file:, vscode: and the like; never javascript:). */
export function sourceLink(pattern, file, line, func = "") {
  if (!pattern) return null;
  const enc = (v) => encodeURI(String(v)).replace(/#/g, "%23").replace(/\?/g, "%3F");
  const url = pattern.replace(/\{file\}/g, enc(file)).replace(/\{line\}/g, String(Number(line) || 0)).replace(/\{func\}/g, encodeURIComponent(func || ""));
  const scheme = /^([a-z][a-z0-9+.-]*):/i.exec(url);
  if (!scheme || /^(javascript|data|vbscript|blob)$/i.test(scheme[1])) return null;
  return url;
}

/** "light" or "dark": the setting, or the system's preference for "auto". */
export function resolvedTheme(setting) {
  if (setting === "light" || setting === "dark") return setting;
  try {
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  } catch {
    return "light";
  }
}
