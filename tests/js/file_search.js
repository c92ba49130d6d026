// Runs docs/javascripts/iframe-worker.js in a page opened from a file (a minimal stand-in
// for the browser's window, document and iframe), starts Material's real search worker
// through it, indexes the built site's search index and prints the first result of a query.
// Usage: node file_search.js SHIM WORKER INDEX QUERY   (tests/test_docs_offline.py runs it)
"use strict";
const fs = require("fs");
const vm = require("vm");
const { pathToFileURL } = require("url");

const [shim, worker, index, query] = process.argv.slice(2);

function scope() {
  const events = new EventTarget();
  const win = { MessageEvent, setTimeout, clearTimeout, URL, Error, console, Promise };
  win.addEventListener = events.addEventListener.bind(events);
  win.removeEventListener = events.removeEventListener.bind(events);
  win.dispatchEvent = events.dispatchEvent.bind(events);
  win.window = win;
  win.self = win;
  return win;
}

function element(listeners = {}) {
  return {
    style: {}, listeners, setAttribute() {}, remove() {},
    addEventListener(type, f) { this.listeners[type] = f; },
  };
}

const page = scope();
page.location = { protocol: "file:" };
page.document = {
  baseURI: pathToFileURL(worker).href,
  body: {
    appendChild(frame) { setTimeout(() => frame.listeners.load(), 0); },
  },
  createElement() {  // an iframe: its own global scope, the page's origin
    const win = scope();
    win.parent = page;
    vm.createContext(win);
    win.document = {
      createElement: () => element(),
      querySelector: () => ({ src: pathToFileURL(worker).href }),
      head: {
        appendChild(tag) {
          vm.runInContext(fs.readFileSync(new URL(tag.src), "utf8"), win);
          setTimeout(() => tag.listeners.load(), 0);
        },
      },
    };
    const frame = element();
    frame.contentWindow = win;
    return frame;
  },
};
vm.createContext(page);
vm.runInContext(fs.readFileSync(shim, "utf8"), page);

const search = new page.Worker(pathToFileURL(worker).href);
const timer = setTimeout(() => { console.log("no answer"); process.exit(2); }, 20000);
search.addEventListener("message", (event) => {
  const { type, data } = event.data;
  if (type === 1) {  // ready: ask
    search.postMessage({ type: 2, data: query });
  } else if (type === 3) {
    clearTimeout(timer);
    const first = data.items.length ? data.items[0][0] : null;
    console.log(JSON.stringify({ worker: page.Worker.name, results: data.items.length,
                                 first: first && first.location }));
    process.exit(0);
  }
});
const { config, docs } = JSON.parse(fs.readFileSync(index, "utf8"));
search.postMessage({ type: 0, data: { config, docs, options: { suggest: false } } });
